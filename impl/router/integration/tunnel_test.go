package integration

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/fiberd/client"
)

// Reuse mode goes through one tunnel per fiber (fiberd's tunnel call and
// the router's tunnel client); these cover what the fresh-mode tests cover
// for the proxy path.

// tunnels reads fiberd_tunnels_total (both splice paths) from fiberd.
func (e *env) tunnels() float64 { return e.fd.Metric(e.t, "fiberd_tunnels_total{") }

func TestReuseTunnelCarriesBodiesBothWays(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse")})
	big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
	for i := int64(1); i <= 3; i++ {
		var body io.Reader = bytes.NewReader(big)
		if i == 2 {
			// Unknown length: sent chunked.
			body = io.MultiReader(bytes.NewReader(big))
		}
		req := e.request(context.Background(), http.MethodPost, "/", body)
		if i == 2 {
			req.ContentLength = -1
		}
		resp, b := e.do(req)
		if resp.StatusCode != 200 {
			t.Fatalf("POST %d: %d %.200s", i, resp.StatusCode, b)
		}
		s := decodeSeen(t, b)
		if s.Body != string(big) {
			t.Fatalf("POST %d: handler got %d bytes, want the 4 MiB sent", i, len(s.Body))
		}
		if s.Served != i {
			t.Fatalf("POST %d was its fiber's request %d: want one reused fiber", i, s.Served)
		}
		if _, ok := s.Headers[http.CanonicalHeaderKey(client.FiberHeader)]; ok {
			t.Fatalf("handler saw %s", client.FiberHeader)
		}
		if _, ok := s.Headers[http.CanonicalHeaderKey(client.ProxyAuthHeader)]; ok {
			t.Fatalf("handler saw %s", client.ProxyAuthHeader)
		}
		if s.Host != "hello.default.example.com" {
			t.Fatalf("handler saw Host %q", s.Host)
		}
	}
	if n := e.tunnels(); n != 1 {
		t.Fatalf("fiberd opened %v tunnels for three requests to one fiber, want 1", n)
	}
}

func TestReuseTunnelStreamCancelAndTimeout(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse"), meta: func(m *routermeta.Metadata) { m.TimeoutSeconds = 2 }})
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := e.http.Do(e.request(ctx, http.MethodGet, "/stream?n=3&hold=1", nil))
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		if line, err := r.ReadString('\n'); err != nil || line != "chunk "+strconv.Itoa(i)+"\n" {
			t.Fatalf("chunk %d: %q %v (streamed chunks must arrive as they are written)", i, line, err)
		}
	}
	cancel()
	resp.Body.Close()
	e.settle()
	// The cancelled request's fiber may still be working: it is released,
	// and the next request gets a new one that answers normally.
	if r := e.counter("released"); r != 1 {
		t.Fatalf("released %v after a cancelled stream, want 1", r)
	}
	_, b := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if s := decodeSeen(t, b); s.Served != 1 {
		t.Fatalf("request after the cancel ran in a used fiber (its request %d)", s.Served)
	}
	// timeoutSeconds ends a request over a tunnel too.
	resp, b = e.do(e.request(context.Background(), http.MethodGet, "/sleep?ms=600000", nil))
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("request past timeoutSeconds: %d %q, want 504", resp.StatusCode, b)
	}
	e.settle()
	if a := e.counter("acquired"); a != 2 {
		t.Fatalf("acquired %v, want 2 (one per ended fiber)", a)
	}
	if _, b := e.do(e.request(context.Background(), http.MethodGet, "/", nil)); decodeSeen(t, b).Served != 1 {
		t.Fatal("request after a timeout ran in the timed-out fiber")
	}
}

func TestReuseTunnelWebSocketThenRequests(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse")})
	_, b := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	pid := decodeSeen(t, b).PID
	c, resp, err := websocket.DefaultDialer.Dial("ws://"+e.srv.HTTPAddr()+"/ws", e.selection())
	if err != nil {
		t.Fatalf("dial: %v (response %+v)", err, resp)
	}
	for i, msg := range []string{"one", strings.Repeat("y", 256<<10)} {
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.ReadMessage()
		if err != nil || string(got) != "echo: "+msg {
			t.Fatalf("message %d: %.40q %v", i, got, err)
		}
	}
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	c.Close()
	e.settle()
	// The WebSocket ended cleanly: the same live fiber serves on. The
	// WebSocket took the first request's kept tunnel; an upgraded
	// connection is not reused, so this request opens a second one.
	_, b = e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if s := decodeSeen(t, b); s.PID != pid || s.Served != 2 {
		t.Fatalf("request after the WebSocket: pid %d request %d, want pid %d request 2", s.PID, s.Served, pid)
	}
	if a := e.counter("acquired"); a != 1 {
		t.Fatalf("acquired %v, want 1", a)
	}
	if n := e.tunnels(); n != 2 {
		t.Fatalf("fiberd opened %v tunnels, want 2", n)
	}
}

func TestReuseCrashMidStreamReleasesTheFiber(t *testing.T) {
	e := startEnv(t, envOptions{fiberd: fiberdOpts("reuse")})
	resp, err := e.http.Do(e.request(context.Background(), http.MethodGet, "/crash", nil))
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == 200 {
			t.Fatal("a handler that crashed mid-response produced a clean 200")
		}
	}
	e.settle()
	_, b := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if s := decodeSeen(t, b); s.Served != 1 {
		t.Fatalf("request after a crash: its fiber's request %d, want a new fiber", s.Served)
	}
}
