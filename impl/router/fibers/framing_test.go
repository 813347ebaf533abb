package fibers

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawFiber is a misbehaving handler behind a tunnel: serve gets each
// accepted connection.
func rawFiber(t *testing.T, serve func(c net.Conn)) (*tunnelTransport, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	var dials atomic.Int64
	return newTunnelTransport(func(ctx context.Context, id string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}), &dials
}

// readRequests reads requests off c, discarding bodies, calling answer
// for each.
func readRequests(c net.Conn, answer func(n int, req *http.Request)) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		answer(n, req)
	}
}

// A handler that writes a body on a HEAD answer (or any bytes past its
// response) must not shift the next user's answer: the tunnel is dropped.
func TestTunnelLeftoverBytesEndTheTunnel(t *testing.T) {
	tt, dials := rawFiber(t, func(c net.Conn) {
		readRequests(c, func(n int, req *http.Request) {
			if req.Method == http.MethodHead {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle")
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer")
		})
	})
	ctx := context.Background()
	resp, err := tt.RoundTrip(tunnelReq(t, ctx, http.MethodHead, nil))
	readAll(t, resp, err)
	time.Sleep(20 * time.Millisecond) // the stray bytes arrive
	if got := roundTrip(t, tt, tunnelReq(t, ctx, http.MethodGet, nil)); got != "answer" {
		t.Fatalf("the request after a HEAD answered with a body got %q, want its own answer", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d tunnels, want 2 (the one with stray bytes dropped)", n)
	}
}

// Bytes a handler sends while its tunnel sits idle are not the next
// request's answer.
func TestTunnelUnsolicitedBytesEndTheTunnel(t *testing.T) {
	tt, dials := rawFiber(t, func(c net.Conn) {
		readRequests(c, func(n int, req *http.Request) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer")
			if n == 1 {
				go func() {
					time.Sleep(10 * time.Millisecond)
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforge")
				}()
			}
		})
	})
	ctx := context.Background()
	roundTrip(t, tt, tunnelReq(t, ctx, http.MethodGet, nil))
	time.Sleep(50 * time.Millisecond)
	if got := roundTrip(t, tt, tunnelReq(t, ctx, http.MethodGet, nil)); got != "answer" {
		t.Fatalf("got %q after the handler wrote an unsolicited response, want a fresh answer", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d tunnels, want 2", n)
	}
}

// A request that may have reached the handler is never sent twice unless
// that is harmless: a kept tunnel that closes without an answer replays
// GET, never POST or DELETE (with or without a body).
func TestTunnelReplaysOnlyIdempotentRequests(t *testing.T) {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		t.Run(m, func(t *testing.T) {
			var seen atomic.Int64
			tt, _ := rawFiber(t, func(c net.Conn) {
				readRequests(c, func(n int, req *http.Request) {
					if n == 1 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						return
					}
					// The second request reaches the handler, which dies
					// before answering.
					seen.Add(1)
					c.Close()
				})
			})
			ctx := context.Background()
			roundTrip(t, tt, tunnelReq(t, ctx, http.MethodGet, nil))
			resp, err := tt.RoundTrip(tunnelReq(t, ctx, m, nil))
			if err == nil {
				resp.Body.Close()
			}
			want := int64(1)
			if m == http.MethodGet {
				want = 2 // replayed once on a new tunnel (which answers)
			}
			if got := seen.Load(); got != want && !(m == http.MethodGet && got == 1 && err == nil) {
				t.Fatalf("%s reached the handler %d times (err %v), want %d", m, got, err, want)
			}
			if m != http.MethodGet && err == nil {
				t.Fatalf("%s after a dropped tunnel answered %d; want an error, not a replay", m, resp.StatusCode)
			}
		})
	}
}

// A handler that answers before reading the body and closes: its answer
// is the response, not a write error.
func TestTunnelAnswerBeforeBody(t *testing.T) {
	tt, _ := rawFiber(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
		c.Close() // unread body: the kernel resets the connection
	})
	for i := 0; i < 20; i++ {
		req := tunnelReq(t, context.Background(), http.MethodPost, bytes.NewReader(bytes.Repeat([]byte("x"), 4<<20)))
		resp, err := tt.RoundTrip(req)
		if err != nil {
			t.Fatalf("round %d: %v, want the handler's 413", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 || string(b) != "too big\n" {
			t.Fatalf("round %d: %d %q", i, resp.StatusCode, b)
		}
	}
}

// "Expect: 100-continue": the body is held until the handler asks for it;
// a handler that answers without asking never gets it, and the client
// sees no 100 Continue it did not send.
func TestTunnelExpectContinue(t *testing.T) {
	var gotBody atomic.Int64
	tt, _ := rawFiber(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.URL.Path == "/read" {
				io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
				b, _ := io.ReadAll(req.Body)
				gotBody.Add(int64(len(b)))
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nread")
				continue
			}
			// Answers at once; a body that arrives anyway would be read
			// here as the next request line.
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nskip")
			if n, _ := br.Peek(1); len(n) > 0 {
				gotBody.Add(1000000)
			}
			return
		}
	})
	for _, path := range []string{"/read", "/skip"} {
		var conts int
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			conts++
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://f1"+tunnelHostSuffix+path, strings.NewReader("payload"))
		req.Header.Set("Expect", "100-continue")
		start := time.Now()
		resp, err := tt.RoundTrip(req)
		got := readAll(t, resp, err)
		switch path {
		case "/read":
			if got != "read" || conts != 1 || gotBody.Load() != 7 {
				t.Fatalf("/read: %q, %d 1xx, handler got %d bytes", got, conts, gotBody.Load())
			}
		case "/skip":
			if got != "skip" || conts != 0 || gotBody.Load() != 7 {
				t.Fatalf("/skip: %q, %d 1xx, body bytes reaching the handler %d", got, conts, gotBody.Load()-7)
			}
			if d := time.Since(start); d > 900*time.Millisecond {
				t.Fatalf("/skip took %s: the answer waited for the continue timeout", d)
			}
		}
	}
}
