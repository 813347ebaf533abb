package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/revision"
)

// gatedSource delivers its metadata only when opened, like an informer whose
// initial list has not arrived yet.
type gatedSource struct {
	meta   routermeta.Metadata
	open   chan struct{}
	synced atomic.Bool
}

func (g *gatedSource) Run(ctx context.Context, sink revision.Sink) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil
	}
	sink.Upsert(g.meta)
	g.synced.Store(true)
	<-ctx.Done()
	return nil
}

func (g *gatedSource) HasSynced() bool { return g.synced.Load() }

func adminGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRouterReplacement(t *testing.T) {
	e := startEnv(t, envOptions{})
	if resp, _ := e.do(e.request(context.Background(), http.MethodGet, "/", nil)); resp.StatusCode != 200 {
		t.Fatalf("before replacement: %d", resp.StatusCode)
	}
	if code, _ := adminGet(t, e.srv.AdminAddr(), "/readyz"); code != 200 {
		t.Fatalf("readyz %d", code)
	}
	if code, body := adminGet(t, e.srv.AdminAddr(), "/metrics"); code != 200 ||
		!strings.Contains(body, `lampyr_router_requests_total{code="200",namespace="default",revision="hello-00001"} 1`) ||
		!strings.Contains(body, "lampyr_router_request_duration_seconds_bucket") ||
		!strings.Contains(body, "lampyr_router_fibers_released_total") {
		t.Fatalf("metrics %d:\n%s", code, body)
	}

	// A finishing request and a never-ending stream are in flight when
	// the pod is told to stop.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.http.Do(e.request(ctx, http.MethodGet, "/stream?n=1&hold=1", nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	slow := make(chan int, 1)
	go func() {
		resp, _ := e.do(e.request(context.Background(), http.MethodGet, "/sleep?ms=1000", nil))
		slow <- resp.StatusCode
	}()
	waitFor(t, "both requests in flight", 30*time.Second, func() bool { return e.srv.Router.InFlight() == 2 })

	addrs := envOptions{httpAddr: e.srv.HTTPAddr(), h2cAddr: e.srv.H2CAddr(), adminAddr: e.srv.AdminAddr()}
	stopped := make(chan error, 1)
	go func() { stopped <- e.srv.Shutdown(context.Background()) }()
	waitFor(t, "readiness to fail while draining", 10*time.Second, func() bool { return !e.srv.Ready() })
	if code := <-slow; code != http.StatusOK {
		t.Fatalf("request in flight during drain: %d, want it to finish", code)
	}
	// The stream outlives DrainTimeout (5s) and is cut; its fiber goes too.
	if _, err := io.ReadAll(stream.Body); err == nil {
		t.Fatal("stream survived the router's shutdown")
	}
	if err := <-stopped; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if l := e.leased(); len(l) != 0 {
		t.Fatalf("fibers left leased after the router stopped: %+v", l)
	}

	// The replacement takes the same addresses (the Service's endpoints)
	// and is not ready until it has the metadata.
	src := &gatedSource{meta: e.meta, open: make(chan struct{})}
	b := startRouterUnready(t, e, addrs, src)
	if code, body := adminGet(t, b.AdminAddr(), "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not synced") {
		t.Fatalf("replacement readyz before sync: %d %q", code, body)
	}
	close(src.open)
	waitFor(t, "replacement ready", 10*time.Second, b.Ready)
	e.http.CloseIdleConnections()
	resp, body := e.do(e.request(context.Background(), http.MethodGet, "/", nil))
	if resp.StatusCode != 200 || decodeSeen(t, body).KRevision != e.meta.Revision {
		t.Fatalf("through the replacement: %d %s", resp.StatusCode, body)
	}
}
