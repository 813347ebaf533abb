package server_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

func TestFreshFiberServesOneRequest(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	c := inst.Client
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, c, f.ID, "/")
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, c, f.ID, "/")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), contract.ReasonFiberSpent.String()) {
		t.Fatalf("second request into a fresh fiber: %d %s, want 409 %s", resp.StatusCode, body, contract.ReasonFiberSpent)
	}
	// Every acquisition gets a never-used fiber: each one's first request
	// is that process's first.
	seen := map[int]bool{}
	for i := 0; i < 5; i++ {
		g, err := c.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if g.ID == f.ID {
			t.Fatalf("acquire returned the spent fiber %s again", f.ID)
		}
		_, body := get(t, c, g.ID, "/")
		h := decodeHello(t, body)
		if h.Served != 1 {
			t.Fatalf("fresh fiber %s had served %d requests before this one", g.ID, h.Served-1)
		}
		seen[h.PID] = true
		if err := c.Release(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
}

func TestReuseServesManyAndReleasesWhenIdle(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: time.Second})
	c := inst.Client
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last hello
	for i := 1; i <= 3; i++ {
		resp, body := get(t, c, f.ID, "/")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		last = decodeHello(t, body)
		if last.Served != int64(i) {
			t.Fatalf("request %d was the fiber process's request %d: reuse must keep the same live fiber", i, last.Served)
		}
	}
	start := time.Now()
	waitFor(t, "the idle reuse fiber to be released", 5*time.Second, func() bool {
		l, err := c.List(ctx)
		return err == nil && !hasFiber(l, f.ID)
	})
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Fatalf("fiber released after %s idle, before idleTimeout 1s", d)
	}
}

func TestOneRequestAtATimePerFiber(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: 30 * time.Second})
	c := inst.Client
	f, err := c.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		get(t, c, f.ID, "/sleep?ms=500")
	}()
	time.Sleep(150 * time.Millisecond)
	resp, body := get(t, c, f.ID, "/")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), contract.ReasonFiberBusy.String()) {
		t.Fatalf("concurrent request: %d %s, want 409 %s", resp.StatusCode, body, contract.ReasonFiberBusy)
	}
	<-done
	if resp, body := get(t, c, f.ID, "/"); resp.StatusCode != 200 {
		t.Fatalf("after the first request ended: %d %s", resp.StatusCode, body)
	}
}

func TestMaxFibersEnforced(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{MaxFibers: 3, WarmFibers: 2})
	c := inst.Client
	ctx := context.Background()
	var ids []string
	for i := 0; i < 3; i++ {
		f, err := c.Acquire(ctx)
		if err != nil {
			t.Fatalf("acquire %d of 3: %v", i+1, err)
		}
		ids = append(ids, f.ID)
	}
	_, err := c.Acquire(ctx)
	var apiErr *client.Error
	if !client.IsMaxFibers(err) || !errors.As(err, &apiErr) || apiErr.RetryAfter <= 0 {
		t.Fatalf("fourth acquire: %v, want 429 with Retry-After", err)
	}
	l, _ := c.List(ctx)
	if len(l.Fibers) > 3 {
		t.Fatalf("%d fibers alive with maxFibers 3: %+v", len(l.Fibers), l.Fibers)
	}
	if err := c.Release(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx); err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
}

func TestKilledFiberIsReplaced(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{WarmFibers: 2})
	c := inst.Client
	ctx := context.Background()
	l, _ := c.List(ctx)
	if len(l.Fibers) != 2 {
		t.Fatalf("want 2 warm fibers, got %+v", l.Fibers)
	}
	victim := l.Fibers[0].ID
	// Kill the fiber from outside, as the OOM killer or an operator would:
	// its helper is PID 1 of the fiber, so killing it ends the fiber.
	pid := helperPID(t, victim)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed fiber to be replaced by a new warm one", 10*time.Second, func() bool {
		l, err := c.List(ctx)
		if err != nil || hasFiber(l, victim) {
			return false
		}
		warm := 0
		for _, f := range l.Fibers {
			if f.State == client.StateWarm {
				warm++
			}
		}
		return warm == 2
	})

	// A leased fiber whose handler crashes mid-request answers 502 and is gone.
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, c, f.ID, "/exit")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("request that crashes the handler: %d %s, want 502", resp.StatusCode, body)
	}
	waitFor(t, "the crashed fiber to disappear", 5*time.Second, func() bool {
		l, err := c.List(ctx)
		return err == nil && !hasFiber(l, f.ID)
	})
	if _, err := c.Acquire(ctx); err != nil {
		t.Fatalf("acquire after a crash: %v", err)
	}
}

// helperPID finds the host PID of a fiber's helper through its memory cgroup.
func helperPID(t *testing.T, id string) int {
	t.Helper()
	matches, _ := filepath.Glob("/sys/fs/cgroup/memory/lampyr-fiberd/*/" + id + "/cgroup.procs")
	if len(matches) != 1 {
		t.Fatalf("cgroup of fiber %s: found %v", id, matches)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	// The helper joined first, so it is the lowest PID... not necessarily
	// after wraparound; pick the one whose parent is outside the cgroup.
	pids := strings.Fields(string(b))
	in := map[string]bool{}
	for _, p := range pids {
		in[p] = true
	}
	for _, p := range pids {
		st, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if !in[fields[1]] {
			var pid int
			for _, ch := range p {
				pid = pid*10 + int(ch-'0')
			}
			return pid
		}
	}
	t.Fatalf("no helper among %v", pids)
	return 0
}

func TestStreamingWebSocketAndH2C(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: 30 * time.Second})
	c := inst.Client
	f, err := c.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Streaming: chunks arrive before the response ends.
	req, _ := http.NewRequest(http.MethodGet, "http://app/stream?n=5", nil)
	resp, err := c.Do(req, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	t0 := time.Now()
	line, err := r.ReadString('\n')
	if err != nil || line != "chunk 0\n" {
		t.Fatalf("first chunk %q: %v", line, err)
	}
	if d := time.Since(t0); d > 35*time.Millisecond {
		t.Logf("first chunk took %s", d)
	}
	rest, _ := bufio.NewReader(r).ReadString(0)
	resp.Body.Close()
	if !strings.Contains(rest, "chunk 4") {
		t.Fatalf("stream ended early: %q", rest)
	}

	// WebSocket through the proxy.
	h := http.Header{}
	client.SetFiberHeaders(h, f.ID, inst.Token)
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+inst.Endpoint+"/ws", h)
	if err != nil {
		t.Fatalf("websocket dial: %v", err)
	}
	ws.WriteMessage(websocket.TextMessage, []byte("hi"))
	_, m, err := ws.ReadMessage()
	if err != nil || string(m) != "echo: hi" {
		t.Fatalf("websocket echo %q: %v", m, err)
	}
	ws.Close()

	// h2c from the router to fiberd.
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: h2}
	waitFor(t, "the fiber to be idle after the websocket", 2*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+inst.Endpoint+"/", nil)
		client.SetFiberHeaders(req.Header, f.ID, inst.Token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("h2c request: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 && resp.ProtoMajor != 2 {
			t.Fatalf("answer over %s, want HTTP/2", resp.Proto)
		}
		return resp.StatusCode == 200
	})
}

func TestAuthRequired(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	bad, _ := client.New(inst.Endpoint, "wrong")
	_, err := bad.Acquire(context.Background())
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
		t.Fatalf("acquire with a wrong token: %v, want 401", err)
	}
	f, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := bad.Do(mustReq(t, "/"), f.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("proxied request with a wrong token: %d, want 401", resp.StatusCode)
	}
	if err := bad.Healthy(context.Background()); err != nil {
		t.Fatalf("/healthz must not need the token: %v", err)
	}
}

func mustReq(t *testing.T, path string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, "http://app"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A snapshot whose handler speaks h2c (a named h2c port, gRPC) is reached
// over HTTP/2 cleartext all the way.
func TestH2CSnapshot(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Protocol: "h2c"})
	f, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, inst.Client, f.ID, "/")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if h := decodeHello(t, body); h.Proto != "HTTP/2.0" {
		t.Fatalf("handler saw %s, want HTTP/2.0 (h2c)", h.Proto)
	}
}
