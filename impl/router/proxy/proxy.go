// Package proxy is fiber-router's request path: resolve the Revision the
// gateway selected, lease a fiber for it, run the request inside the fiber
// through fiberd, and release the fiber when the response, stream or
// WebSocket ends.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"knative.dev/networking/pkg/http/header"

	fiberdclient "lampyr.dev/serving/impl/fiberd/client"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/pool"
	"lampyr.dev/serving/impl/router/revision"
)

// Config holds the router-wide settings (flags).
type Config struct {
	// DefaultTimeout applies when a Revision's timeoutSeconds is 0.
	DefaultTimeout time.Duration
	// QueueTimeout is how long a request waits for a fiber at max-scale
	// before it gets 503 with Retry-After.
	QueueTimeout time.Duration
	// MaxQueue bounds waiting requests per Revision.
	MaxQueue int
	// DefaultMaxFibers applies when a Revision's maxFibers is 0; 0 leaves
	// the cap to fiberd.
	DefaultMaxFibers int
	// FiberTunnels carries reuse-mode requests over a byte tunnel per fiber
	// (fiberd's tunnel call) instead of through fiberd's HTTP proxy, when
	// the client supports it. Homes without the call fall back by
	// themselves.
	FiberTunnels bool
}

// DefaultConfig matches Knative's defaults where one exists
// (revision-timeout-seconds 300).
func DefaultConfig() Config {
	return Config{DefaultTimeout: 300 * time.Second, QueueTimeout: 10 * time.Second, MaxQueue: 1000, FiberTunnels: true}
}

// Router is the http.Handler behind ports 80 and 81. It is also the
// revision.Listener that keeps one fiber pool per routable Revision.
type Router struct {
	cfg     Config
	client  fibers.Client
	metrics *metrics.Metrics
	log     *slog.Logger

	http1 *httputil.ReverseProxy
	h2c   *httputil.ReverseProxy
	// tunnel serves reuse-mode HTTP/1.1 requests and upgrades over a
	// tunnel per fiber; nil when tunnels are off or unsupported.
	tunnel *httputil.ReverseProxy

	mu     sync.RWMutex
	routes map[revision.Key]*route
	// homes counts the routes naming each Home, so the client's per-Home
	// state is dropped when the last of them goes (fibers.Forgetter).
	homes map[fibers.Home]int

	// hardStop ends every request still running when draining gives up.
	hardStop context.Context
	stopAll  context.CancelFunc
	inFlight atomic.Int64
}

// route is a Revision as the request path needs it.
type route struct {
	meta routermeta.Metadata
	pool *pool.Pool // nil while not ready
	obs  *metrics.RevisionObserver
	reqs map[int]requestSeries // status code -> series, filled lazily
	mu   sync.Mutex
	dur  interface{ Observe(float64) }
}

type requestSeries interface{ Inc() }

// New returns a Router. Feed it through a revision.Table created with the
// Router as listener.
func New(cfg Config, client fibers.Client, m *metrics.Metrics, logger *slog.Logger) *Router {
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Router{
		cfg: cfg, client: client, metrics: m, log: logger,
		routes: map[revision.Key]*route{}, homes: map[fibers.Home]int{},
		hardStop: ctx, stopAll: cancel,
	}
	h1 := busyRetry{newHTTP1Transport()}
	// A closure, not the method value: a Router without a client (tests of
	// the probe path) must still construct.
	viaFiberd := func(out *http.Request, f fibers.Fiber) { r.client.PrepareProxy(out, f) }
	r.http1 = r.newReverseProxy(h1, viaFiberd)
	r.h2c = r.newReverseProxy(busyRetry{newH2CTransport()}, viaFiberd)
	if tc, ok := client.(fibers.Tunnels); ok && cfg.FiberTunnels {
		r.tunnel = r.newReverseProxy(tunnelTransport{tunnels: tc, client: client, fallback: h1}, tc.PrepareTunnel)
	}
	return r
}

// tunnelTransport sends a request over its fiber's tunnel; when the Home
// turns out to have no tunnel call (an older fiberd during an upgrade) it
// sends it through the proxy path instead. Nothing was sent then, so the
// request is whole.
type tunnelTransport struct {
	tunnels  fibers.Tunnels
	client   fibers.Client
	fallback http.RoundTripper
}

func (t tunnelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.tunnels.TunnelTransport().RoundTrip(req)
	var nt *fibers.NoTunnelError
	if err == nil || !errors.As(err, &nt) {
		return resp, err
	}
	lease := req.Context().Value(leaseKey{}).(*pool.Lease)
	out := req.Clone(req.Context())
	t.client.PrepareProxy(out, lease.Fiber)
	return t.fallback.RoundTrip(out)
}

func newHTTP1Transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		// Bodies pass through untouched; the handler owns compression.
		DisableCompression: true,
		// As Knative's transports (http.DefaultTransport's value): the body
		// of an "Expect: 100-continue" request goes once fiberd (and so the
		// handler) asks for it, and the client sees the handler's 100
		// Continue, or none if it answers without reading, as on stock.
		ExpectContinueTimeout: time.Second,
	}
}

// newH2CTransport speaks HTTP/2 with prior knowledge to fiberd, so gRPC
// streams (full duplex, trailers) keep their semantics end to end.
func newH2CTransport() *http.Transport {
	t := newHTTP1Transport()
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

type leaseKey struct{}

func (r *Router) newReverseProxy(t http.RoundTripper, prepare func(*http.Request, fibers.Fiber)) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: t,
		Rewrite: func(pr *httputil.ProxyRequest) {
			lease := pr.In.Context().Value(leaseKey{}).(*pool.Lease)
			prepare(pr.Out, lease.Fiber)
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody && pr.Out.ContentLength > 0 {
				pr.Out.Body = &declaredLengthBody{rc: pr.Out.Body, left: pr.Out.ContentLength}
			}
			pr.Out.Host = pr.In.Host // the handler sees the Host the client used
			setForwarded(pr)
		},
		// As queue-proxy (knative.dev/networking/pkg/http/proxy.FlushInterval):
		// 0 still flushes every write of a streamed response (no
		// Content-Length) and of text/event-stream at once, and saves a
		// syscall per write for bodies of known length.
		FlushInterval:  0,
		BufferPool:     bufferPool{},
		ErrorHandler:   r.proxyError,
		ModifyResponse: r.fiberdAnswer,
		ErrorLog:       log.New(slogWriter{r.log}, "", 0),
	}
}

// fiberdAnswer turns an answer fiberd made itself (fiberdclient.AnswerHeader:
// the fiber failed, ended or timed out, the credential was refused) into the
// router's own error, as proxyError does for a fiber it could not reach:
// fiberd's message names fiber ids and loopback addresses, which go to the
// log, never to the client. The lease ends: the fiber is not put back.
func (r *Router) fiberdAnswer(resp *http.Response) error {
	if resp.Header.Get(fiberdclient.AnswerHeader) == "" {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	var fe fiberdclient.Error
	_ = json.Unmarshal(b, &fe)
	req := resp.Request
	reqID := req.Header.Get(RequestIDHeader)
	err := fmt.Errorf("fiberd answered %d %s: %s", resp.StatusCode, fe.Reason, truncateString(fe.Message, 512))
	if pe, ok := req.Context().Value(proxyErrKey{}).(*proxyErr); ok {
		pe.err = err
	}
	status, msg := http.StatusBadGateway, "the fiber failed before it answered"
	switch {
	case fe.Reason == fiberdclient.ReasonRequestTimeout || resp.StatusCode == http.StatusGatewayTimeout:
		status, msg = http.StatusGatewayTimeout, "request exceeded the Revision's timeoutSeconds"
	case fe.Reason == fiberdclient.ReasonFiberBusy:
		status, msg = http.StatusServiceUnavailable, "the fiber is busy"
	}
	r.log.Warn("fiberd answered instead of the handler", "request", reqID, "status", resp.StatusCode, "reason", fe.Reason, "err", err)
	body := fmt.Sprintf("fiber-router: %s\n", msg)
	h := http.Header{}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	if reqID != "" {
		h.Set(RequestIDHeader, reqID)
	}
	resp.StatusCode, resp.Status = status, fmt.Sprintf("%d %s", status, http.StatusText(status))
	resp.Header, resp.Trailer = h, nil
	resp.ContentLength = int64(len(body))
	resp.TransferEncoding = nil
	resp.Body = io.NopCloser(strings.NewReader(body))
	return nil
}

// Changed implements revision.Listener: it creates, retunes or retires the
// Revision's pool.
func (r *Router) Changed(old, cur *routermeta.Metadata) {
	if cur == nil {
		k := revision.Key{Namespace: old.Namespace, Name: old.Revision}
		r.mu.Lock()
		rt := r.routes[k]
		delete(r.routes, k)
		unused, ok := r.unuseHome(rt)
		r.mu.Unlock()
		r.retire(rt)
		if ok {
			r.forgetHome(unused)
		}
		r.metrics.Forget(k.Namespace, k.Name)
		r.metrics.Revisions.Set(float64(r.routeCount()))
		return
	}
	k := revision.Key{Namespace: cur.Namespace, Name: cur.Revision}
	r.mu.Lock()
	prev := r.routes[k]
	nr := &route{meta: *cur, reqs: map[int]requestSeries{}}
	if prev != nil {
		nr.obs, nr.dur, nr.reqs = prev.obs, prev.dur, prev.reqs
	} else {
		nr.obs = r.metrics.Revision(cur.Namespace, cur.Revision)
		nr.dur = r.metrics.RequestDuration.WithLabelValues(cur.Namespace, cur.Revision)
	}
	var retire *route
	if cur.Ready && cur.HomeEndpoint != "" {
		pc := r.poolConfig(*cur)
		if prev != nil && prev.pool != nil {
			prev.pool.Update(pc)
			nr.pool = prev.pool
		} else {
			nr.pool = pool.New(pc, r.client, nr.obs, func(err error) {
				r.log.Error("fiber release failed; fiberd will reap it at its request timeout", "revision", k.String(), "err", err)
			})
		}
	} else if prev != nil {
		retire = prev
	}
	// The new Home is counted before the old one is let go, so a Home
	// that stays is never forgotten in between.
	r.useHome(nr)
	unused, forget := r.unuseHome(prev)
	r.routes[k] = nr
	r.mu.Unlock()
	r.retire(retire)
	if forget {
		r.forgetHome(unused)
	}
	r.metrics.Revisions.Set(float64(r.routeCount()))
}

// homeOf is the Home a Revision's metadata names.
func homeOf(m routermeta.Metadata) fibers.Home {
	return fibers.Home{Endpoint: m.HomeEndpoint, Name: m.Home}
}

// useHome counts rt's use of its Home; r.mu is held.
func (r *Router) useHome(rt *route) {
	if rt != nil && rt.meta.HomeEndpoint != "" {
		r.homes[homeOf(rt.meta)]++
	}
}

// unuseHome undoes useHome and returns rt's Home when no route names it
// any more; r.mu is held.
func (r *Router) unuseHome(rt *route) (fibers.Home, bool) {
	if rt == nil || rt.meta.HomeEndpoint == "" {
		return fibers.Home{}, false
	}
	h := homeOf(rt.meta)
	if r.homes[h]--; r.homes[h] > 0 {
		return h, false
	}
	delete(r.homes, h)
	return h, true
}

// forgetHome drops the client's state for a Home no route names. Fibers it
// still serves finish and are released all the same.
func (r *Router) forgetHome(h fibers.Home) {
	if f, ok := r.client.(fibers.Forgetter); ok {
		f.Forget(h)
	}
}

func (r *Router) retire(rt *route) {
	if rt == nil || rt.pool == nil {
		return
	}
	// Busy fibers are released by their requests; idle ones now.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = rt.pool.Close(ctx)
	}()
}

func (r *Router) routeCount() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.routes)
}

func (r *Router) poolConfig(m routermeta.Metadata) pool.Config {
	max := int(m.MaxFibers)
	if max == 0 {
		max = r.cfg.DefaultMaxFibers
	}
	mode := pool.Fresh
	if m.Mode == "reuse" {
		mode = pool.Reuse
	}
	return pool.Config{
		Home:         homeOf(m),
		Mode:         mode,
		MaxFibers:    max,
		IdleTimeout:  routerIdleTimeout(time.Duration(m.IdleTimeoutSeconds) * time.Second),
		QueueTimeout: r.cfg.QueueTimeout,
		MaxQueue:     r.cfg.MaxQueue,
	}
}

// routerIdleTimeout is when the router gives up an idle reuse-mode fiber.
// fiberd releases a fiber idle for idleTimeoutSeconds on its own (contracts
// §4); a router that offered such a fiber to a request at that moment would
// get fiberd's 404 UnknownFiber instead of the handler's answer. So the
// router lets go first, with a margin for its one-second reaper tick.
func routerIdleTimeout(idle time.Duration) time.Duration {
	if idle <= 0 {
		return 0
	}
	if idle > 4*time.Second {
		return idle - 2*time.Second
	}
	return idle / 2
}

func (r *Router) lookup(k revision.Key) *route {
	r.mu.RLock()
	rt := r.routes[k]
	r.mu.RUnlock()
	return rt
}

// ServeHTTP implements http.Handler.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	r.inFlight.Add(1)
	r.metrics.InFlight.Inc()
	defer func() {
		r.inFlight.Add(-1)
		r.metrics.InFlight.Dec()
	}()
	reqID := ensureRequestID(req.Header)

	// Pull the selection headers out first: whatever happens next, the
	// handler must never see them.
	nsVals, revVals := req.Header.Values(NamespaceHeader), req.Header.Values(RevisionHeader)
	req.Header.Del(NamespaceHeader)
	req.Header.Del(RevisionHeader)
	// A client must not pick a fiber, even one of its own Revision.
	req.Header.Del(fibers.FiberHeader)

	if pv := req.Header.Get(header.ProbeKey); pv != "" {
		r.serveProbe(w, req, pv, nsVals, revVals)
		return
	}
	// Like queue-proxy's probe handler: the hash is routing state, not the
	// handler's business.
	req.Header.Del(header.HashKey)

	k, rt, status, msg := r.resolve(nsVals, revVals)
	if rt == nil || rt.pool == nil {
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		r.fail(w, reqID, status, msg)
		r.countUnrouted(status)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		rt.dur.Observe(time.Since(start).Seconds())
		rt.count(r.metrics, k, sw.code())
	}()

	timeout := r.cfg.DefaultTimeout
	if rt.meta.TimeoutSeconds > 0 {
		timeout = time.Duration(rt.meta.TimeoutSeconds) * time.Second
	}
	// The deadline covers queueing too: timeoutSeconds is the longest the
	// client is kept, from arrival to the last byte or WebSocket frame.
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	defer cancel()
	stop := context.AfterFunc(r.hardStop, cancel)
	defer stop()

	lease, err := rt.pool.Get(ctx)
	if err != nil {
		r.leaseError(sw, req, reqID, k, err)
		return
	}
	clean := false
	// Deferred, so the fiber goes back or is released even when the proxy
	// panics (ReverseProxy aborts a broken stream with http.ErrAbortHandler).
	defer func() { lease.Done(clean) }()

	rp := r.http1
	switch {
	case rt.meta.Protocol == routermeta.ProtocolH2C && !isUpgrade(req):
		rp = r.h2c
	case r.tunnel != nil && rt.meta.Mode == "reuse":
		rp = r.tunnel
	}
	outCtx := context.WithValue(ctx, leaseKey{}, lease)
	pe := &proxyErr{client: req.Context()}
	rp.ServeHTTP(sw, req.WithContext(context.WithValue(outCtx, proxyErrKey{}, pe)))
	// Only a request that ran to completion leaves its fiber fit for reuse:
	// after a cancellation or timeout the handler may still be working.
	clean = pe.err == nil && ctx.Err() == nil
}

func (rt *route) count(m *metrics.Metrics, k revision.Key, code int) {
	rt.mu.Lock()
	c, ok := rt.reqs[code]
	if !ok {
		c = m.Requests.WithLabelValues(k.Namespace, k.Name, strconv.Itoa(code))
		rt.reqs[code] = c
	}
	rt.mu.Unlock()
	c.Inc()
}

func (r *Router) countUnrouted(code int) {
	r.metrics.Requests.WithLabelValues("", "", strconv.Itoa(code)).Inc()
}

// resolve finds the Revision the gateway selected. It never falls back to
// another Revision: a wrong fiber would run another tenant's code.
func (r *Router) resolve(nsVals, revVals []string) (revision.Key, *route, int, string) {
	if len(nsVals) == 0 || len(revVals) == 0 {
		return revision.Key{}, nil, http.StatusNotFound,
			fmt.Sprintf("no Revision selected: fiber-router serves requests that a Knative gateway routed, with the %s and %s headers", RevisionHeader, NamespaceHeader)
	}
	if len(nsVals) != 1 || len(revVals) != 1 {
		return revision.Key{}, nil, http.StatusBadRequest,
			fmt.Sprintf("ambiguous Revision selection: %d %s and %d %s headers; exactly one of each is allowed", len(revVals), RevisionHeader, len(nsVals), NamespaceHeader)
	}
	k := revision.Key{Namespace: nsVals[0], Name: revVals[0]}
	rt := r.lookup(k)
	if rt == nil {
		return k, nil, http.StatusNotFound, fmt.Sprintf("revision %s is not known to fiber-router", quoteKey(k))
	}
	if rt.pool == nil {
		return k, rt, http.StatusServiceUnavailable, fmt.Sprintf("revision %s is not ready", quoteKey(k))
	}
	return k, rt, 0, ""
}

// quoteKey keeps attacker-chosen header values short and printable in
// response bodies and logs.
func quoteKey(k revision.Key) string {
	s := k.Namespace + "/" + k.Name
	if len(s) > 130 {
		s = s[:130] + "..."
	}
	return strconv.Quote(s)
}

// serveProbe answers Knative's network probes without a fiber.
// K-Network-Probe: probe is KIngress readiness probing (knative.dev/networking
// pkg/status): answer 200 echoing K-Network-Hash, as queue-proxy does, so the
// prober sees the gateway has the Ingress version it expects. When the probe
// names a Revision this router cannot serve yet, answer 503, which the prober
// retries: the Route is not reported Ready before its backend is.
func (r *Router) serveProbe(w http.ResponseWriter, req *http.Request, value string, nsVals, revVals []string) {
	reqID := req.Header.Get(RequestIDHeader)
	if value != header.ProbeValue {
		r.fail(w, reqID, http.StatusBadRequest, fmt.Sprintf("unexpected %s value %q", header.ProbeKey, truncateString(value, 64)))
		return
	}
	hash := req.Header.Get(header.HashKey)
	if hash == "" {
		r.fail(w, reqID, http.StatusBadRequest, fmt.Sprintf("a probe request must contain a non-empty %q header", header.HashKey))
		return
	}
	if len(nsVals) > 0 || len(revVals) > 0 {
		if _, rt, status, msg := r.resolve(nsVals, revVals); rt == nil || rt.pool == nil {
			if status == http.StatusNotFound {
				// The prober only retries 404 and 503; both mean "not yet".
				status = http.StatusServiceUnavailable
			}
			r.fail(w, reqID, status, msg)
			return
		}
	}
	w.Header().Set(header.HashKey, hash)
	w.WriteHeader(http.StatusOK)
}

func truncateString(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// fail writes a router-made error. The body says which component answered,
// so nobody mistakes it for the handler's own error.
func (r *Router) fail(w http.ResponseWriter, reqID string, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	if reqID != "" {
		h.Set(RequestIDHeader, reqID)
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "fiber-router: %s\n", msg)
}

func (r *Router) leaseError(w http.ResponseWriter, req *http.Request, reqID string, k revision.Key, err error) {
	var ue *fibers.UnavailableError
	switch {
	case errors.Is(err, pool.ErrQueueTimeout), errors.Is(err, pool.ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, fmt.Sprintf("revision %s is at max-scale: %v", quoteKey(k), err))
	case isCapacity(err):
		ce, _ := fibers.IsCapacity(err)
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((ce.RetryAfter+time.Second-1)/time.Second))))
		r.fail(w, reqID, http.StatusServiceUnavailable, fmt.Sprintf("revision %s is at max-scale in its Home", quoteKey(k)))
	case errors.Is(err, pool.ErrClosed):
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, fmt.Sprintf("revision %s is not ready", quoteKey(k)))
	case errors.As(err, &ue):
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, fmt.Sprintf("revision %s: its Home cannot start fibers now", quoteKey(k)))
		r.log.Warn("acquire failed", "revision", k.String(), "request", reqID, "err", err)
	case req.Context().Err() != nil:
		// The client left while queued; nobody reads an answer.
		w.WriteHeader(499)
	case r.hardStop.Err() != nil:
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, "this fiber-router replica is shutting down")
	case errors.Is(err, context.DeadlineExceeded):
		r.fail(w, reqID, http.StatusGatewayTimeout, fmt.Sprintf("revision %s: no fiber within timeoutSeconds", quoteKey(k)))
	default:
		r.fail(w, reqID, http.StatusBadGateway, fmt.Sprintf("revision %s: acquiring a fiber failed", quoteKey(k)))
		r.log.Error("acquire failed", "revision", k.String(), "request", reqID, "err", err)
	}
}

func isCapacity(err error) bool { _, ok := fibers.IsCapacity(err); return ok }

type proxyErrKey struct{}

type proxyErr struct {
	err error
	// client is the client's own request context (the proxied request
	// carries the router's timeout/shutdown context instead).
	client context.Context
}

// proxyError is ReverseProxy's ErrorHandler: the fiber could not be reached
// or the response could not be read before anything was written.
func (r *Router) proxyError(w http.ResponseWriter, req *http.Request, err error) {
	clientGone := false
	if pe, ok := req.Context().Value(proxyErrKey{}).(*proxyErr); ok {
		pe.err = err
		clientGone = pe.client.Err() != nil
	}
	reqID := req.Header.Get(RequestIDHeader)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		r.fail(w, reqID, http.StatusGatewayTimeout, "request exceeded the Revision's timeoutSeconds")
	case r.hardStop.Err() != nil && !clientGone:
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, "this fiber-router replica is shutting down")
	case errors.Is(err, context.Canceled):
		// The client is gone: record it, nobody reads an answer.
		w.WriteHeader(499)
	default:
		r.log.Warn("proxy to fiber failed", "request", reqID, "err", err)
		r.fail(w, reqID, http.StatusBadGateway, "the fiber could not be reached")
	}
}

func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// InFlight is the number of requests being served.
func (r *Router) InFlight() int64 { return r.inFlight.Load() }

// Drain waits for in-flight requests to end until ctx does, then ends the
// rest, and finally releases every idle fiber. After Drain no fiber this
// router leased is left alive (barring a fiberd that cannot be reached).
func (r *Router) Drain(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
wait:
	for r.inFlight.Load() > 0 {
		select {
		case <-ctx.Done():
			break wait
		case <-t.C:
		}
	}
	// Requests still running lose their context now; their deferred
	// Done releases their fibers.
	r.stopAll()
	for r.inFlight.Load() > 0 {
		<-t.C
	}
	r.mu.Lock()
	var pools []*pool.Pool
	for _, rt := range r.routes {
		if rt.pool != nil {
			pools = append(pools, rt.pool)
		}
	}
	r.mu.Unlock()
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var firstErr error
	for _, p := range pools {
		if err := p.Close(closeCtx); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// PoolStats returns the pool counters of a Revision, for tests.
func (r *Router) PoolStats(k revision.Key) (pool.Stats, bool) {
	rt := r.lookup(k)
	if rt == nil || rt.pool == nil {
		return pool.Stats{}, false
	}
	return rt.pool.Stats(), true
}

// WaitReleases waits until every pool's releases under way are done.
func (r *Router) WaitReleases(ctx context.Context) error {
	r.mu.RLock()
	var pools []*pool.Pool
	for _, rt := range r.routes {
		if rt.pool != nil {
			pools = append(pools, rt.pool)
		}
	}
	r.mu.RUnlock()
	for _, p := range pools {
		if err := p.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

var _ revision.Listener = (*Router)(nil)
