package integration

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/proxy"
)

func TestWebSocketEchoBothWays(t *testing.T) {
	e := startEnv(t, envOptions{})
	c, resp, err := websocket.DefaultDialer.Dial("ws://"+e.srv.HTTPAddr()+"/ws", e.selection())
	if err != nil {
		t.Fatalf("dial: %v (response %+v)", err, resp)
	}
	for i, msg := range []string{"one", "two", strings.Repeat("x", 64<<10)} {
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if string(got) != "echo: "+msg {
			t.Fatalf("message %d echoed as %.40q", i, got)
		}
	}
	if live := e.counter("live"); live != 1 {
		t.Fatalf("fibers live during the WebSocket = %v, want 1", live)
	}
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	c.Close()
	e.assertNoLeasedFibers()
	if n := e.requests("101"); n != 1 {
		t.Fatalf("requests_total{code=101} = %v, want 1", n)
	}
}

func TestClientCancellationReleasesTheFiber(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		resp, err := e.http.Do(e.request(ctx, http.MethodGet, "/sleep?ms=600000", nil))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the request to hold a busy fiber", 30*time.Second, func() bool {
		for _, f := range e.leased() {
			if f.State == "busy" {
				return true
			}
		}
		return false
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v, want context.Canceled", err)
	}
	e.assertNoLeasedFibers()
	if a, r := e.counter("acquired"), e.counter("released"); a != 1 || r != 1 {
		t.Fatalf("acquired %v released %v, want 1 and 1", a, r)
	}
	if n := e.requests("499"); n != 1 {
		t.Fatalf("requests_total{code=499} = %v, want the cancelled request counted once", n)
	}
}

func TestTimeoutEndsRequestAtTheLimit(t *testing.T) {
	e := startEnv(t, envOptions{meta: func(m *routermeta.Metadata) { m.TimeoutSeconds = 1 }})
	start := time.Now()
	resp, body := e.do(e.request(context.Background(), http.MethodGet, "/sleep?ms=600000", nil))
	elapsed := time.Since(start)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), "timeoutSeconds") {
		t.Fatalf("%d %q, want 504 naming timeoutSeconds", resp.StatusCode, body)
	}
	// Not a speed check: the request must not end before its limit, and
	// must end long before the handler's 10 minutes.
	if elapsed < time.Second || elapsed > 30*time.Second {
		t.Fatalf("request ended after %s, want at the 1s limit", elapsed)
	}

	// A stream that outlives the limit is cut, not completed.
	resp, err := e.http.Do(e.request(context.Background(), http.MethodGet, "/stream?n=1&hold=1", nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("a stream past timeoutSeconds ended cleanly; want it cut")
	}
	e.assertNoLeasedFibers()
	if r := e.counter("released"); r != 2 {
		t.Fatalf("released %v, want 2", r)
	}
}

func TestWebSocketTimeout(t *testing.T) {
	e := startEnv(t, envOptions{meta: func(m *routermeta.Metadata) { m.TimeoutSeconds = 1 }})
	c, _, err := websocket.DefaultDialer.Dial("ws://"+e.srv.HTTPAddr()+"/ws", e.selection())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, _, err := c.ReadMessage(); err == nil {
		t.Fatal("read a message nobody sent")
	} else if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
		t.Fatal("the WebSocket outlived timeoutSeconds by far: still open after 30s")
	}
	e.assertNoLeasedFibers()
}

func TestMaxScaleQueuesThen503(t *testing.T) {
	e := startEnv(t, envOptions{
		meta:  func(m *routermeta.Metadata) { m.MaxFibers = 2 },
		proxy: func(c *proxy.Config) { c.QueueTimeout = 2 * time.Second },
	})
	// Two streams hold both fibers.
	var holders []context.CancelFunc
	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		holders = append(holders, cancel)
		defer cancel()
		resp, err := e.http.Do(e.request(ctx, http.MethodGet, "/stream?n=1&hold=1", nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	// The third waits in the queue, then gets 503 with Retry-After.
	var queued sync.WaitGroup
	queued.Add(1)
	go func() {
		defer queued.Done()
		waitFor(t, "the third request to queue", 30*time.Second, func() bool { return e.counter("queue") == 1 })
	}()
	resp, body := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	queued.Wait()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "max-scale") {
		t.Fatalf("N+1th request: %d %q (Retry-After %q), want 503 at max-scale with Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if a := e.counter("acquired"); a != 2 {
		t.Fatalf("acquired %v fibers with max-scale 2", a)
	}

	// A queued request gets the slot a finished one frees.
	got := make(chan int, 1)
	go func() {
		resp, _ := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
		got <- resp.StatusCode
	}()
	waitFor(t, "a request to queue", 30*time.Second, func() bool { return e.counter("queue") == 1 })
	holders[0]()
	if code := <-got; code != http.StatusOK {
		t.Fatalf("queued request after a slot freed: %d, want 200", code)
	}
	holders[1]()
	e.assertNoLeasedFibers()
}
