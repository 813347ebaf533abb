package proxy_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"knative.dev/networking/pkg/http/header"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/trust/routercred"
)

type fixture struct {
	fd     *fakefiberd.Server
	minter *routercred.Minter
	router *proxy.Router
	table  *revision.Table
	front  *httptest.Server
	meta   routermeta.Metadata
	m      *metrics.Metrics
}

// routerKey makes an installation's router key: the Minter the router signs
// with and the public key fake Homes trust.
func routerKey(t testing.TB) (ed25519.PublicKey, *routercred.Minter) {
	t.Helper()
	pub, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub, routercred.NewMinter(key)
}

func newFixture(t *testing.T, h http.Handler, mutate func(*routermeta.Metadata)) *fixture {
	t.Helper()
	return newFixtureConfig(t, h, mutate, nil)
}

// newFixtureConfig is newFixture with the router's Config changed by
// config.
func newFixtureConfig(t *testing.T, h http.Handler, mutate func(*routermeta.Metadata), config func(*proxy.Config)) *fixture {
	t.Helper()
	pub, minter := routerKey(t)
	fd := fakefiberd.Start("hello-00001-home", pub, h)
	t.Cleanup(fd.Close)
	cfg := proxy.DefaultConfig()
	cfg.QueueTimeout = 200 * time.Millisecond
	// Short, so the refusals below answer quickly; hold_test.go holds
	// for longer.
	cfg.HomeWait = 300 * time.Millisecond
	if config != nil {
		config(&cfg)
	}
	mx := metrics.New()
	rt := proxy.New(cfg, fibers.NewFiberdClient(minter), mx, nil)
	tbl := revision.NewTable(rt)
	m := routermeta.Metadata{
		Revision: "hello-00001", Namespace: "demo", Ready: true, HomeEndpoint: fd.Endpoint(), HomeKeySHA256: fd.KeySHA256, Home: fd.Home,
		MaxFibers: 5, TimeoutSeconds: 30, Mode: "fresh", Protocol: routermeta.ProtocolHTTP1, Generation: 1,
	}
	if mutate != nil {
		mutate(&m)
	}
	tbl.Upsert(m)
	front := httptest.NewServer(rt)
	t.Cleanup(front.Close)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = rt.Drain(ctx)
	})
	return &fixture{fd: fd, minter: minter, router: rt, table: tbl, front: front, meta: m, m: mx}
}

func (f *fixture) home() fibers.Home {
	return fibers.Home{Endpoint: f.meta.HomeEndpoint, Name: f.meta.Home, KeySHA256: f.meta.HomeKeySHA256}
}

func (f *fixture) get(t *testing.T, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.front.URL+path, nil)
	req.Header.Set(proxy.RevisionHeader, f.meta.Revision)
	req.Header.Set(proxy.NamespaceHeader, f.meta.Namespace)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func ok(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }

// What fiberd receives from the router: the Knative forwarding headers the
// handler is promised, the router's credentials in fiberd's own header, and
// none of the gateway's selection headers.
func TestHeadersAsFiberdReceivesThem(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	resp, body := f.get(t, "/", map[string]string{
		"X-Forwarded-For":   "203.0.113.7",
		"X-Forwarded-Proto": "https",
		"X-Forwarded-Host":  "hello.demo.example.com",
		"Authorization":     "Bearer user",
		"Lampyr-Fiber":      "f999",
		header.HashKey:      "h",
	})
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	h := f.fd.LastProxied()
	cred, err := f.minter.For(f.fd.Home)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"X-Forwarded-For":             "203.0.113.7, 127.0.0.1",
		"X-Forwarded-Proto":           "https",
		"X-Forwarded-Host":            "hello.demo.example.com",
		"Forwarded":                   "for=203.0.113.7;host=hello.demo.example.com;proto=https",
		"Authorization":               "Bearer user",
		"Lampyr-Fiber":                f.fd.Home + "-f1",
		"Lampyr-Fiberd-Authorization": "Bearer " + cred,
	}
	for k, v := range want {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s = %v, want %q", k, got, v)
		}
	}
	for _, k := range []string{proxy.RevisionHeader, proxy.NamespaceHeader, header.HashKey} {
		if v := h.Values(k); len(v) != 0 {
			t.Errorf("%s reached fiberd: %v", k, v)
		}
	}
	if len(h.Get("X-Request-Id")) != 32 {
		t.Errorf("X-Request-Id %q, want a generated id", h.Get("X-Request-Id"))
	}
}

func TestForwardedWithoutGateway(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	f.get(t, "/", nil)
	h := f.fd.LastProxied()
	if got := h.Get("Forwarded"); got != "for=127.0.0.1;proto=http" {
		t.Fatalf("Forwarded = %q", got)
	}
}

func TestSelectionErrors(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	f.table.Upsert(routermeta.Metadata{Revision: "down-00001", Namespace: "demo", Ready: false, Mode: "fresh", Protocol: "http1"})
	cases := []struct {
		name   string
		hdr    map[string]string
		status int
		body   string
	}{
		{"no headers", map[string]string{proxy.RevisionHeader: "", proxy.NamespaceHeader: ""}, 404, "no Revision selected"},
		{"no namespace", map[string]string{proxy.NamespaceHeader: ""}, 404, "no Revision selected"},
		{"unknown revision", map[string]string{proxy.RevisionHeader: "nope-00001"}, 404, `"demo/nope-00001" is not known`},
		{"other namespace", map[string]string{proxy.NamespaceHeader: "other"}, 404, `"other/hello-00001" is not known`},
		{"not ready", map[string]string{proxy.RevisionHeader: "down-00001"}, 503, `"demo/down-00001" is not ready`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := f.get(t, "/", c.hdr)
			if resp.StatusCode != c.status || !strings.Contains(body, c.body) || !strings.HasPrefix(body, "fiber-router: ") {
				t.Fatalf("%d %q, want %d containing %q", resp.StatusCode, body, c.status, c.body)
			}
			if c.status == 503 && resp.Header.Get("Retry-After") == "" {
				t.Fatal("503 without Retry-After")
			}
		})
	}
	if a, _ := f.fd.Counts(); a != 0 {
		t.Fatalf("%d fibers acquired for requests that selected no routable Revision", a)
	}
}

func TestAmbiguousSelectionIsRefused(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	req, _ := http.NewRequest(http.MethodGet, f.front.URL+"/", nil)
	req.Header.Add(proxy.RevisionHeader, "hello-00001")
	req.Header.Add(proxy.RevisionHeader, "other-00001")
	req.Header.Set(proxy.NamespaceHeader, "demo")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("two Revision headers: %d, want 400", resp.StatusCode)
	}
}

func TestProbes(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	resp, body := f.get(t, "/healthz", map[string]string{header.ProbeKey: header.ProbeValue, header.HashKey: "abc123", "User-Agent": header.IngressReadinessUserAgent})
	if resp.StatusCode != 200 || resp.Header.Get(header.HashKey) != "abc123" {
		t.Fatalf("ingress probe: %d %q hash %q", resp.StatusCode, body, resp.Header.Get(header.HashKey))
	}
	resp, _ = f.get(t, "/healthz", map[string]string{header.ProbeKey: header.ProbeValue, header.HashKey: "abc", proxy.RevisionHeader: "nope-00001"})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("probe for an unknown Revision: %d, want 503 so the prober retries", resp.StatusCode)
	}
	resp, _ = f.get(t, "/healthz", map[string]string{header.ProbeKey: header.ProbeValue})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("probe without hash: %d, want 400", resp.StatusCode)
	}
	resp, _ = f.get(t, "/", map[string]string{header.ProbeKey: "queue"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown probe value: %d, want 400", resp.StatusCode)
	}
	if a, _ := f.fd.Counts(); a != 0 {
		t.Fatalf("probes acquired %d fibers", a)
	}
	// lampyr_router_probes_total says how a KIngress's probes were
	// answered: one 200, one 503 (retried by the prober), two 400.
	for code, want := range map[string]float64{"200": 1, "503": 1, "400": 2} {
		var got dto.Metric
		if err := f.m.Probes.WithLabelValues(code).Write(&got); err != nil || got.GetCounter().GetValue() != want {
			t.Errorf("lampyr_router_probes_total{code=%q} = %v (%v), want %v", code, got.GetCounter().GetValue(), err, want)
		}
	}
}

func TestFiberdRefusalsBecome503WithRetryAfter(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	f.fd.Unavailable.Store(true)
	resp, body := f.get(t, "/", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "cannot start fibers") {
		t.Fatalf("grant missing: %d %q", resp.StatusCode, body)
	}
}

func TestFiberdAt429IsRetriedThen503(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	// fiberd's cap is 1 and another router "holds" it: acquire directly.
	f.fd.MaxFibers.Store(1)
	c := fibers.NewFiberdClient(f.minter)
	held, err := c.Acquire(context.Background(), f.home())
	if err != nil {
		t.Fatal(err)
	}
	resp, body := f.get(t, "/", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "max-scale") {
		t.Fatalf("fiberd at maxFibers: %d %q", resp.StatusCode, body)
	}
	_ = c.Release(context.Background(), held)
	resp, _ = f.get(t, "/", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("after the held fiber was released: %d", resp.StatusCode)
	}
}

func TestUnreachableHomeIs503(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), func(m *routermeta.Metadata) { m.HomeEndpoint = "127.0.0.1:1" })
	resp, body := f.get(t, "/", nil)
	if resp.StatusCode != 503 || !strings.Contains(body, "cannot start fibers") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

func TestRevisionRemovedStopsRouting(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(ok), nil)
	if resp, _ := f.get(t, "/", nil); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	f.table.Delete(revision.Key{Namespace: "demo", Name: "hello-00001"})
	if resp, _ := f.get(t, "/", nil); resp.StatusCode != 404 {
		t.Fatalf("after delete: %d, want 404", resp.StatusCode)
	}
	m := f.meta
	m.Ready = false
	f.table.Upsert(m)
	if resp, _ := f.get(t, "/", nil); resp.StatusCode != 503 {
		t.Fatalf("not ready: %d, want 503", resp.StatusCode)
	}
	m.Ready = true
	f.table.Upsert(m)
	if resp, _ := f.get(t, "/", nil); resp.StatusCode != 200 {
		t.Fatalf("ready again: %d", resp.StatusCode)
	}
}

func TestDrainCutsWhatOutlivesIt(t *testing.T) {
	block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	f := newFixture(t, block, func(m *routermeta.Metadata) { m.MaxFibers = 1 })
	type result struct {
		code int
		body string
	}
	results := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			resp, body := f.get(t, "/", nil)
			results <- result{resp.StatusCode, body}
		}()
	}
	// One request holds the only fiber, the other queues behind it.
	for f.router.InFlight() != 2 || f.fd.Live() != 1 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.router.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r := <-results
		if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "shutting down") {
			t.Fatalf("request cut by drain: %d %q, want 503 shutting down", r.code, r.body)
		}
	}
	if f.fd.Live() != 0 {
		t.Fatalf("%d fibers left after drain", f.fd.Live())
	}
}

// Reuse mode goes through a tunnel per fiber: what reaches the handler has
// the forwarding headers and the client's Authorization, and no fiberd
// headers at all (nobody between router and handler reads them). A fiberd
// without the tunnel call is served through its proxy.
func TestReuseTunnelAndFallback(t *testing.T) {
	for _, tunnels := range []bool{true, false} {
		t.Run(map[bool]string{true: "tunnel", false: "older-fiberd"}[tunnels], func(t *testing.T) {
			f := newFixture(t, http.HandlerFunc(ok), func(m *routermeta.Metadata) { m.Mode = "reuse"; m.IdleTimeoutSeconds = 30 })
			f.fd.Tunnels.Store(tunnels)
			for i := 0; i < 3; i++ {
				resp, body := f.get(t, "/", map[string]string{"X-Forwarded-For": "203.0.113.7", "Authorization": "Bearer user"})
				if resp.StatusCode != 200 || body != "ok" {
					t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
				}
			}
			h := f.fd.LastProxied()
			if h.Get("Authorization") != "Bearer user" || h.Get("X-Forwarded-For") != "203.0.113.7, 127.0.0.1" || h.Get("Forwarded") == "" {
				t.Errorf("headers at the handler: %v", h)
			}
			for _, k := range []string{proxy.RevisionHeader, proxy.NamespaceHeader} {
				if v := h.Values(k); len(v) != 0 {
					t.Errorf("%s reached the handler: %v", k, v)
				}
			}
			fiberHeaders := h.Get(client.FiberHeader) != "" || h.Get(client.ProxyAuthHeader) != ""
			if tunnels {
				if fiberHeaders {
					t.Errorf("fiberd headers sent through a tunnel: %v", h)
				}
				if n := f.fd.TunnelsOpened(); n != 1 {
					t.Errorf("%d tunnels for three requests to one reused fiber, want 1", n)
				}
			} else if !fiberHeaders || f.fd.TunnelsOpened() != 0 {
				t.Errorf("fallback did not use fiberd's proxy: headers %v", h)
			}
		})
	}
}

// fiberd's own answers (the fiber failed, ended, timed out) carry
// client.AnswerHeader: the client gets the router's error, never fiberd's
// message with its fiber ids and loopback addresses, and the fiber is let go
// rather than kept for the next request.
func TestFiberdAnswersBecomeRouterErrors(t *testing.T) {
	for _, c := range []struct {
		reason contract.Reason
		status int
		want   int
		msg    string
	}{
		{contract.ReasonFiberFailed, 502, 502, "the fiber failed before it answered"},
		{contract.ReasonRequestTimeout, 504, 504, "timeoutSeconds"},
		{contract.ReasonUnknownFiber, 404, 502, "the fiber failed before it answered"},
	} {
		t.Run(c.reason.String(), func(t *testing.T) {
			f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(client.AnswerHeader, "1")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				io.WriteString(w, `{"reason":"`+c.reason.String()+`","message":"fiber 3196e90573e5: readfrom tcp 127.0.0.1:47034->127.0.0.1:8080: write: connection reset by peer"}`)
			}), func(m *routermeta.Metadata) { m.Mode = "reuse"; m.IdleTimeoutSeconds = 30 })
			f.fd.Tunnels.Store(false) // fiberd's proxy path, where its answers travel
			resp, body := f.get(t, "/", nil)
			if resp.StatusCode != c.want || !strings.Contains(body, c.msg) || !strings.HasPrefix(body, "fiber-router: ") {
				t.Fatalf("%d %q, want %d with %q", resp.StatusCode, body, c.want, c.msg)
			}
			for _, leak := range []string{"127.0.0.1", "3196e90573e5", c.reason.String()} {
				if strings.Contains(body, leak) {
					t.Errorf("the client saw fiberd's detail %q: %q", leak, body)
				}
			}
			if resp.Header.Get(client.AnswerHeader) != "" {
				t.Errorf("%s reached the client", client.AnswerHeader)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				acq, rel := f.fd.Counts()
				if acq >= 1 && rel == acq {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("acquired %d, released %d: the failed reuse fiber was kept", acq, rel)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestOriginalHostRestored: behind a DomainMapping the gateway rewrites the
// host to the Route's and sends the client's in K-Original-Host; the handler
// sees the client's host and not the header, as behind queue-proxy
// (knative.dev/networking header.RewriteHostOut).
func TestOriginalHostRestored(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s", r.Host, r.Header.Get(header.OriginalHostKey))
	}), nil)
	_, body := f.get(t, "/", map[string]string{header.OriginalHostKey: "app.example.org"})
	if body != "app.example.org|" {
		t.Errorf("handler saw %q, want host app.example.org and no %s", body, header.OriginalHostKey)
	}
	_, body = f.get(t, "/", nil)
	if strings.HasSuffix(body, "|") && strings.HasPrefix(body, "app.example.org") {
		t.Errorf("without %s the host changed: %q", header.OriginalHostKey, body)
	}
}
