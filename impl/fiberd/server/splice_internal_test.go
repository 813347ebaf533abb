package server

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP sockets.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-ch
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// The tunnel's two ends, as splice sees them: the router's connection and
// the fiber's, each with the far side held by the test.
func spliceUnderTest(t *testing.T) (routerFar, fiberFar net.Conn, ended chan string) {
	routerFar, routerNear := tcpPair(t)
	fiberNear, fiberFar := tcpPair(t)
	ended = make(chan string, 1)
	go func() {
		ended <- splice(routerNear, bufio.NewReader(routerNear), fiberNear, make(chan struct{}), time.Minute, nil, nil, func() bool { return true })
	}()
	return routerFar, fiberFar, ended
}

// A handler that answers and closes while the router is still sending a
// body it never reads: the router gets the whole answer, then EOF.
func TestSpliceDeliversTheAnswerOfAHandlerThatClosed(t *testing.T) {
	router, fiber, ended := spliceUnderTest(t)
	go func() {
		buf := make([]byte, 32<<10)
		for i := 0; i < 256; i++ { // 8 MiB the handler never reads
			if _, err := router.Write(buf); err != nil {
				return
			}
		}
	}()
	io.ReadFull(fiber, make([]byte, 1024))
	answer := "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n"
	io.WriteString(fiber, answer)
	fiber.Close() // unread bytes: the kernel resets the connection
	got, err := io.ReadAll(router)
	if string(got) != answer {
		t.Fatalf("the router read %q (%v), want the handler's whole answer", got, err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the tunnel did not end after the handler closed")
	}
}

// When the router closes, a handler that ignores the end does not keep
// its fiber tunneled (busy) past lingerAfterFiber.
func TestSpliceEndsWhenTheRouterClosesEvenIfTheHandlerDoesNot(t *testing.T) {
	router, fiber, ended := spliceUnderTest(t)
	io.WriteString(router, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	io.ReadFull(fiber, make([]byte, 10))
	start := time.Now()
	router.Close()
	select {
	case <-ended:
		if d := time.Since(start); d > lingerAfterFiber+2*time.Second {
			t.Fatalf("the tunnel ended %s after the router closed", d)
		}
	case <-time.After(lingerAfterFiber + 5*time.Second):
		t.Fatal("the tunnel outlived the router's close: a handler ignoring it keeps its fiber busy")
	}
	_ = fiber
}
