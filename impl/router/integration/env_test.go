package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/router/server"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
)

const handlerPackage = "lampyr.dev/serving/impl/router/internal/testhandler"

// env is one real fiberd (process backend, loopback) and one fiber-router
// in front of it, fed the Revision's metadata directly. The router holds
// the fiberd's router key (fd.RouterKey) and mints its credentials as in a
// cluster; another Home started with Options.RouterKey = fd.RouterKey
// belongs to the same installation.
type env struct {
	t    testing.TB
	fd   *fiberdtest.Instance
	srv  *server.Server
	meta routermeta.Metadata
	key  revision.Key
	http *http.Client
}

type envOptions struct {
	fiberd fiberdtest.Options
	// meta adjusts the metadata the router gets (timeout, max-scale...).
	meta  func(*routermeta.Metadata)
	proxy func(*proxy.Config)
	// addrs pins the router's ports (router replacement test).
	httpAddr, h2cAddr, adminAddr string
}

func startEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	o.fiberd.HandlerPackage = handlerPackage
	if o.fiberd.Logf == nil {
		// Fibers are chatty: their logs and fiberd's are kept, and shown
		// only when the test fails (or always with ROUTER_TEST_DEBUG).
		o.fiberd.Logf = failureLog(t)
	}
	if o.fiberd.HomeKey == nil {
		// As in a cluster: fiberd serves TLS with its Home key and the
		// metadata names it.
		o.fiberd.HomeKey, _ = homekey.Generate()
	}
	fd := fiberdtest.StartInstance(t, o.fiberd)
	meta := routermeta.Metadata{
		Revision:           fd.Claims.Revision,
		Namespace:          fd.Claims.Namespace,
		Ready:              true,
		HomeEndpoint:       fd.Endpoint,
		HomeKeySHA256:      fd.HomeKeySHA256,
		Home:               fd.Home,
		MaxFibers:          fd.Claims.MaxFibers,
		TimeoutSeconds:     fd.Claims.MaxRequestSeconds,
		Mode:               fd.Claims.Execution.Mode,
		IdleTimeoutSeconds: fd.Claims.Execution.IdleTimeoutSeconds,
		Protocol:           routermeta.ProtocolHTTP1,
		Generation:         1,
	}
	if o.fiberd.Protocol == "h2c" {
		meta.Protocol = routermeta.ProtocolH2C
	}
	if o.meta != nil {
		o.meta(&meta)
	}
	e := &env{t: t, fd: fd, meta: meta, key: revision.Key{Namespace: meta.Namespace, Name: meta.Revision}}
	e.srv = startRouter(t, fd, o, revision.NewStatic(meta))
	e.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(e.http.CloseIdleConnections)
	return e
}

func startRouter(t testing.TB, fd *fiberdtest.Instance, o envOptions, src revision.Source) *server.Server {
	t.Helper()
	srv := newRouter(t, fd, o, src)
	waitFor(t, "router ready", 10*time.Second, srv.Ready)
	return srv
}

// startRouterUnready starts a router that replaces e's, on addrs, without
// waiting for readiness.
func startRouterUnready(t testing.TB, e *env, addrs envOptions, src revision.Source) *server.Server {
	t.Helper()
	return newRouter(t, e.fd, addrs, src)
}

func newRouter(t testing.TB, fd *fiberdtest.Instance, o envOptions, src revision.Source) *server.Server {
	t.Helper()
	pc := proxy.DefaultConfig()
	pc.QueueTimeout = 2 * time.Second
	// Requests to a Revision without a serving Home are held this long
	// (hold_test.go in proxy covers the hold itself).
	pc.HomeWait = time.Second
	if o.proxy != nil {
		o.proxy(&pc)
	}
	addr := func(a string) string {
		if a == "" {
			return "127.0.0.1:0"
		}
		return a
	}
	level := slog.LevelError
	if os.Getenv("ROUTER_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	srv := server.New(server.Options{
		HTTPAddr: addr(o.httpAddr), H2CAddr: addr(o.h2cAddr), AdminAddr: addr(o.adminAddr),
		Proxy:        pc,
		Source:       src,
		Client:       fibers.NewFiberdClient(routercred.NewMinter(fd.RouterKey)),
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		DrainTimeout: 5 * time.Second,
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}

// failureLog collects fiberd's and the fibers' log lines and writes them to
// the test's log if it fails (every line as it comes with ROUTER_TEST_DEBUG).
func failureLog(t testing.TB) func(string, ...any) {
	var mu sync.Mutex
	var lines []string
	debug := os.Getenv("ROUTER_TEST_DEBUG") != ""
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() && !debug {
			t.Logf("fiberd and fiber logs (%d lines):\n%s", len(lines), strings.Join(lines, "\n"))
		}
		lines = nil
	})
	return func(format string, args ...any) {
		line := time.Now().Format("15:04:05.000 ") + fmt.Sprintf(format, args...)
		if debug {
			fmt.Fprintln(os.Stderr, "fiberd:", line)
			return
		}
		mu.Lock()
		if len(lines) < 20000 {
			lines = append(lines, line)
		}
		mu.Unlock()
	}
}

func (e *env) url(path string) string { return "http://" + e.srv.HTTPAddr() + path }

// request builds a request the way a Knative gateway would forward it.
func (e *env) request(ctx context.Context, method, path string, body io.Reader) *http.Request {
	req, err := http.NewRequestWithContext(ctx, method, e.url(path), body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Host = "hello.default.example.com"
	req.Header = e.selection()
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Forwarded-Proto", "https")
	return req
}

// selection is the pair of headers a Knative gateway adds to select the
// Revision.
func (e *env) selection() http.Header {
	h := http.Header{}
	h.Set(proxy.RevisionHeader, e.meta.Revision)
	h.Set(proxy.NamespaceHeader, e.meta.Namespace)
	return h
}

func (e *env) do(req *http.Request) (*http.Response, []byte) {
	e.t.Helper()
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading body: %v (status %d, %d bytes read of Content-Length %d, headers %v)", req.Method, req.URL, err, resp.StatusCode, len(b), resp.ContentLength, resp.Header)
	}
	return resp, b
}

// seen is what the test handler reports about a request.
type seen struct {
	Served    int64               `json:"served"`
	PID       int                 `json:"pid"`
	KRevision string              `json:"k_revision"`
	Method    string              `json:"method"`
	Host      string              `json:"host"`
	Headers   map[string][]string `json:"headers"`
	Body      string              `json:"body"`
}

func decodeSeen(t testing.TB, b []byte) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("handler answer %q: %v", b, err)
	}
	return s
}

// settle waits until the router has nothing in flight and every release it
// started has been confirmed by fiberd.
func (e *env) settle() {
	e.t.Helper()
	waitFor(e.t, "router requests to finish", 30*time.Second, func() bool { return e.srv.Router.InFlight() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.srv.Router.WaitReleases(ctx); err != nil {
		e.t.Fatalf("releases did not finish: %v", err)
	}
}

// leased returns the fibers fiberd holds for routers: everything that is
// not warm (never used, in its pool).
func (e *env) leased() []client.Fiber {
	e.t.Helper()
	l, err := e.fd.Client.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []client.Fiber
	for _, f := range l.Fibers {
		if f.State != client.StateWarm {
			out = append(out, f)
		}
	}
	return out
}

func (e *env) assertNoLeasedFibers() {
	e.t.Helper()
	e.settle()
	if l := e.leased(); len(l) != 0 {
		e.t.Fatalf("fiberd still holds %d leased fibers after every request ended: %+v", len(l), l)
	}
	if st, ok := e.srv.Router.PoolStats(e.key); ok && (st.Live != 0 || st.Queued != 0) {
		e.t.Fatalf("router pool not empty: %+v", st)
	}
}

func (e *env) counter(name string) float64 {
	m := e.srv.Metrics
	l := []string{e.key.Namespace, e.key.Name}
	switch name {
	case "acquired":
		return value(m.FibersAcquired.WithLabelValues(l...))
	case "released":
		return value(m.FibersReleased.WithLabelValues(l...))
	case "leaked":
		return value(m.FibersLeaked.WithLabelValues(l...))
	case "live":
		return value(m.FibersLive.WithLabelValues(l...))
	case "queue":
		return value(m.QueueDepth.WithLabelValues(l...))
	}
	panic("unknown counter " + name)
}

func (e *env) requests(code string) float64 {
	return value(e.srv.Metrics.Requests.WithLabelValues(e.key.Namespace, e.key.Name, code))
}

// waitFor polls cond until it holds; the timeout only bounds a hung test.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hasHeader(h map[string][]string, name string) bool {
	for k := range h {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

func fiberdOpts(mode string) fiberdtest.Options {
	o := fiberdtest.Options{Mode: mode, UserSpaceTunnels: os.Getenv("LAMPYR_USER_SPACE_TUNNELS") != ""}
	if mode == "reuse" {
		o.IdleTimeout = 30 * time.Second
	}
	return o
}

// value reads one counter or gauge series. (prometheus/testutil would pull a
// module the build does not otherwise need.)
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	panic("not a counter or gauge")
}
