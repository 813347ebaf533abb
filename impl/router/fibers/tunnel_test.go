package fibers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"sync/atomic"
	"testing"
	"time"
)

// The tunnel client against a plain HTTP/1.1 server standing in for the
// fiber behind a tunnel (the dial function is the tunnel's).
func newTestTunnel(t *testing.T, h http.Handler, idleTimeout time.Duration) (*tunnelTransport, *atomic.Int64) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.IdleTimeout = idleTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	var dials atomic.Int64
	tt := newTunnelTransport(func(ctx context.Context, id string) (net.Conn, error) {
		if id != "f1" {
			t.Errorf("dial for fiber %q", id)
		}
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	})
	return tt, &dials
}

func tunnelReq(t *testing.T, ctx context.Context, method string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://f1"+tunnelHostSuffix+"/", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "app.example.com"
	return req
}

func roundTrip(t *testing.T, tt *tunnelTransport, req *http.Request) string {
	t.Helper()
	resp, err := tt.RoundTrip(req)
	return readAll(t, resp, err)
}

func readAll(t *testing.T, resp *http.Response, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTunnelClientKeepsOneConnection(t *testing.T) {
	tt, dials := newTestTunnel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Host+" "+r.Method+" "+string(b))
	}), 0)
	ctx := context.Background()
	for i, m := range []string{"GET", "POST", "HEAD", "GET"} {
		var body io.Reader
		if m == "POST" {
			body = bytes.NewReader([]byte("payload"))
		}
		got := roundTrip(t, tt, tunnelReq(t, ctx, m, body))
		want := map[string]string{"GET": "app.example.com GET ", "POST": "app.example.com POST payload", "HEAD": ""}[m]
		if got != want {
			t.Fatalf("request %d (%s): %q, want %q", i, m, got, want)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d tunnels dialed for four sequential requests, want 1", n)
	}
}

func TestTunnelClientRedialsAClosedKeptTunnel(t *testing.T) {
	// The server drops idle connections after 50ms, as fiberd ends a
	// tunnel at its silence bound.
	tt, dials := newTestTunnel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), 50*time.Millisecond)
	ctx := context.Background()
	roundTrip(t, tt, tunnelReq(t, ctx, "GET", nil))
	time.Sleep(300 * time.Millisecond)
	if got := roundTrip(t, tt, tunnelReq(t, ctx, "GET", nil)); got != "ok" {
		t.Fatalf("request on a redialed tunnel: %q", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("dials %d, want 2", n)
	}
}

func TestTunnelClientInformationalResponses(t *testing.T) {
	tt, _ := newTestTunnel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	}), 0)
	var hints []int
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, code)
		return nil
	}})
	resp, err := tt.RoundTrip(tunnelReq(t, ctx, "GET", nil))
	if got := readAll(t, resp, err); got != "final" || resp.StatusCode != 200 || len(hints) != 1 || hints[0] != 103 {
		t.Fatalf("status %d body %q 1xx %v, want 200 final after one 103", resp.StatusCode, got, hints)
	}
}

func TestTunnelClientDropsAConnectionWithAnUnsentBody(t *testing.T) {
	// A handler that answers before reading the body, and keeps the
	// connection open (net/http's server would close it itself).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.Method == "POST" {
						io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 0\r\n\r\n")
						// Never reads the body; stays open.
						time.Sleep(10 * time.Second)
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	var dials atomic.Int64
	tt := newTunnelTransport(func(ctx context.Context, id string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
	req := tunnelReq(t, context.Background(), "POST", io.MultiReader(bytes.NewReader(make([]byte, 8<<20))))
	req.ContentLength = -1
	resp, err := tt.RoundTrip(req)
	readAll(t, resp, err)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("early answer: %d", resp.StatusCode)
	}
	// The rest of that body must not reach the fiber's next request.
	if got := roundTrip(t, tt, tunnelReq(t, context.Background(), "GET", nil)); got != "ok" {
		t.Fatalf("next request: %q", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("dials %d: a connection with an unsent request body was reused", n)
	}
}

func TestTunnelClientCancellation(t *testing.T) {
	release := make(chan struct{})
	tt, _ := newTestTunnel(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), 0)
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := tt.RoundTrip(tunnelReq(t, ctx, "GET", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancellation took %s", d)
	}
}
