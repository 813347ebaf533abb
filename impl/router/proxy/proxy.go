// Package proxy is fiber-router's request path: resolve the Revision the
// gateway selected, lease a fiber for it, run the request inside the fiber
// through fiberd, and release the fiber when the response, stream or
// WebSocket ends.
//
// Along a request: proxy.go is the handler (Router, ServeHTTP, resolving the
// selected Revision, probes, the router's own error answers); forward.go
// sends the request to the fiber through fiberd (transports, tunnels, fiberd's
// own answers and proxy errors); routes.go keeps one route per Revision from
// the routermeta table (revision.Listener) and counts the Homes they name;
// pools.go sizes, retires and drains each route's fiber pool (impl/router/pool).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"knative.dev/networking/pkg/http/header"

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
	// HomeWait is how long a request is held while its Revision has no
	// Home that can start fibers: the Home Pod was deleted, evicted or
	// drained and its replacement is starting (the Revision's metadata is
	// not ready, or its Home refuses or cannot be reached). Knative's
	// activator holds requests for a Revision without a ready Pod the same
	// way. At most MaxQueue requests per Revision are held; 0 holds none.
	HomeWait time.Duration
	// FiberTunnels carries reuse-mode requests over a byte tunnel per fiber
	// (fiberd's tunnel call) instead of through fiberd's HTTP proxy, when
	// the client supports it. Homes without the call fall back by
	// themselves.
	FiberTunnels bool
}

// DefaultConfig matches Knative's defaults where one exists
// (revision-timeout-seconds 300).
func DefaultConfig() Config {
	return Config{DefaultTimeout: 300 * time.Second, QueueTimeout: 10 * time.Second, HomeWait: 30 * time.Second, MaxQueue: 1000, FiberTunnels: true}
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
	// changed is closed (and replaced) whenever a route changes, waking
	// the requests held for a Home.
	changed chan struct{}

	// hardStop ends every request still running when draining gives up.
	hardStop context.Context
	stopAll  context.CancelFunc
	inFlight atomic.Int64
}

// New returns a Router. Feed it through a revision.Table created with the
// Router as listener.
func New(cfg Config, client fibers.Client, m *metrics.Metrics, logger *slog.Logger) *Router {
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Router{
		cfg: cfg, client: client, metrics: m, log: logger,
		routes: map[revision.Key]*route{}, homes: map[fibers.Home]int{}, changed: make(chan struct{}),
		hardStop: ctx, stopAll: cancel,
	}
	h1, h2 := busyRetry{newHTTP1Transport()}, busyRetry{newH2CTransport()}
	if pt, ok := client.(fibers.ProxyTransports); ok {
		// Each Home over its own connections, TLS pinned to its key.
		h1, h2 = busyRetry{homeTransport{pt, false}}, busyRetry{homeTransport{pt, true}}
	}
	// A closure, not the method value: a Router without a client (tests of
	// the probe path) must still construct.
	viaFiberd := func(out *http.Request, f fibers.Fiber) { r.client.PrepareProxy(out, f) }
	r.http1 = r.newReverseProxy(h1, viaFiberd)
	r.h2c = r.newReverseProxy(h2, viaFiberd)
	if tc, ok := client.(fibers.Tunnels); ok && cfg.FiberTunnels {
		r.tunnel = r.newReverseProxy(tunnelTransport{tunnels: tc, client: client, fallback: h1}, tc.PrepareTunnel)
	}
	return r
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
	// Like queue-proxy (pkg/queue/handler.go): a gateway that rewrote the
	// host (a DomainMapping's KIngress, RewriteHost) sent the client's in
	// K-Original-Host; the handler sees the host the client used.
	header.RewriteHostOut(req)

	k, rt, status, msg := r.resolve(nsVals, revVals)
	if rt == nil {
		r.fail(w, reqID, status, msg)
		r.countUnrouted(status)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	counted := false
	defer func() {
		if counted {
			rt.dur.Observe(time.Since(start).Seconds())
			rt.count(r.metrics, k, sw.code())
		}
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
	sw.deadline = ctx

	lease, err := r.lease(ctx, start, nsVals, revVals, &k, &rt)
	switch {
	case rt == nil:
		// The Revision went away while the request was held.
		r.fail(w, reqID, http.StatusNotFound, fmt.Sprintf("revision %s is not known to fiber-router", quoteKey(k)))
		r.countUnrouted(http.StatusNotFound)
		return
	case errors.Is(err, errNotRoutable):
		if req.Context().Err() != nil {
			w.WriteHeader(499)
			return
		}
		w.Header().Set("Retry-After", "1")
		r.fail(w, reqID, http.StatusServiceUnavailable, fmt.Sprintf("revision %s is not ready", quoteKey(k)))
		r.countUnrouted(http.StatusServiceUnavailable)
		return
	}
	counted = true
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
	code := http.StatusOK
	defer func() { r.metrics.Probes.WithLabelValues(strconv.Itoa(code)).Inc() }()
	reqID := req.Header.Get(RequestIDHeader)
	if value != header.ProbeValue {
		code = http.StatusBadRequest
		r.fail(w, reqID, code, fmt.Sprintf("unexpected %s value %q", header.ProbeKey, truncateString(value, 64)))
		return
	}
	hash := req.Header.Get(header.HashKey)
	if hash == "" {
		code = http.StatusBadRequest
		r.fail(w, reqID, code, fmt.Sprintf("a probe request must contain a non-empty %q header", header.HashKey))
		return
	}
	if len(nsVals) > 0 || len(revVals) > 0 {
		if _, rt, status, msg := r.resolve(nsVals, revVals); rt == nil || rt.pool == nil {
			if status == http.StatusNotFound {
				// The prober only retries 404 and 503; both mean "not yet".
				status = http.StatusServiceUnavailable
			}
			code = status
			r.fail(w, reqID, code, msg)
			return
		}
	}
	w.Header().Set(header.HashKey, hash)
	w.WriteHeader(code)
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
