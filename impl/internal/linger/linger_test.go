package linger_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"lampyr.dev/serving/impl/internal/linger"
)

// TestAClientStillSendingKeepsItsAnswer: a handler answers without reading
// a 10 MiB body; its client has sent 1 MiB, read the answer, then is
// starved for 1.5 s (longer than net/http's 500 ms wait) before it sends
// the rest. Behind a plain listener the server has closed with unread
// bytes, the kernel has reset the connection and the client's write fails
// (Go's Transport can report that instead of the answer: a proxy's 502).
// Behind linger the write completes and the client then reads the end of
// the connection.
func TestAClientStillSendingKeepsItsAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		linger bool
	}{{"linger", true}, {"plain listener", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if tc.linger {
				ln = linger.Listener(ln)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "answered")
			})}
			go srv.Serve(ln)
			defer srv.Close()

			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const size = 10 << 20
			fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: %d\r\n\r\n", size)
			if _, err := c.Write(make([]byte, 1<<20)); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if string(b) != "answered" {
				t.Fatalf("answer %q", b)
			}
			time.Sleep(1500 * time.Millisecond)
			_, werr := c.Write(make([]byte, size-(1<<20)))
			if tc.linger {
				if werr != nil {
					t.Fatalf("the rest of the body: %v; want it read and dropped", werr)
				}
				c.(*net.TCPConn).CloseWrite()
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if n, err := io.Copy(io.Discard, br); err != nil || n != 0 {
					t.Fatalf("after the answer: %d bytes, %v; want the server's clean end", n, err)
				}
				return
			}
			if werr == nil {
				t.Fatal("the plain listener took the rest of the body: the reset this package exists for did not happen")
			}
			t.Logf("plain listener: %v", werr)
		})
	}
}

// TestLingerIsBounded: a client that keeps its side open is cut off after
// MaxWait.
func TestLingerIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = linger.ListenerWith(ln, 200*time.Millisecond, 1<<20)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %v, want the server's FIN first", err)
	}
	// Never closing our side: the server ends the connection after its wait.
	for {
		if _, err := c.Write([]byte("x")); err != nil {
			break
		}
		if time.Since(t0) > 3*time.Second {
			t.Fatal("the server still reads after 3 s; MaxWait is 200 ms")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
