// Package server is fiberd: it holds the signed grant the grant controller
// issued to this Home (with the template the grant controller opened and
// checked), pulls and verifies the snapshot artifact, keeps the fiber pool
// and serves the API of docs/contracts.md §4 to fiber-router, which proves
// itself with a credential minted for this Home (docs/security.md §3).
//
// Along a request: server.go holds the Server, its HTTP server and the
// dispatch (a request naming a fiber is proxied, any other goes to the
// API); load.go polls the grant, verifies it and loads its snapshot into a
// pool; api.go is the API (credentials, readyz, acquire, release, list,
// grant); proxy.go carries a request into its fiber, tunnel.go a fiber's
// byte tunnel, answerfirst.go the early-answer case; metrics.go counts.
package server

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/pool"
	"lampyr.dev/serving/impl/fiberd/sockmap"
	"lampyr.dev/serving/impl/internal/linger"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// Config configures fiberd.
type Config struct {
	// RouterKeyFile holds fiber-router's public key(s) (PEM; the Home
	// Secret's router-keys.pub), re-read with the grant. Credentials must
	// verify with one of them and name this Home (the grant's home).
	RouterKeyFile string
	// RouterKeys are used when RouterKeyFile is empty (tests).
	RouterKeys []ed25519.PublicKey
	// TLSKeyFile holds the Home's TLS key (PEM, the Home Secret's
	// home-key.pem), re-read with the grant. When set, the API is served
	// only over TLS with a self-signed certificate of that key, and only
	// a grant naming that key (homeKeySHA256) is used: fiber-router
	// accepts no other key from this Home (docs/security.md §3). Empty:
	// plain HTTP and h2c (tests, and fiberd run by hand).
	TLSKeyFile string
	// GrantFile holds the signed grant (the grant controller's Secret, mounted).
	GrantFile string
	// GrantKey verifies the grant's signature.
	GrantKey ed25519.PublicKey
	// StateDir keeps unpacked snapshots.
	StateDir string
	// Backend runs fibers.
	Backend backend.Backend
	// WarmFibers is the warm pool's target size (capped by maxFibers).
	WarmFibers int
	// WarmIdle empties the warm pool after that long without a request
	// (pool.Config.WarmIdle); 0: never.
	WarmIdle time.Duration
	// RegistryOptions are passed to every registry call (auth, transport).
	RegistryOptions []remote.Option
	// GrantPollInterval is how often the grant file is re-read; default 1s.
	GrantPollInterval time.Duration
	// StartupTimeout bounds a fiber's start when the snapshot does not say.
	StartupTimeout time.Duration
	Logf           func(format string, args ...any)
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// ArtifactLimits bound the snapshot fiberd fetches and unpacks (zero
	// fields: artifact.DefaultLimits). A snapshot beyond them is refused
	// with reason SnapshotTooLarge and a message naming the limit.
	ArtifactLimits artifact.Limits
	// KernelSplice joins each tunnel's two sockets in the kernel (a BPF
	// sockmap, package sockmap) so tunneled bytes never pass through fiberd.
	// Where the kernel or privileges refuse it, tunnels copy in user space
	// and the reason is logged once.
	KernelSplice bool
	// OnGrant is called with every grant that verified, before a load it
	// leads to (under the load's lock): a spare Home learns there which
	// namespace it serves (its fibers' DNS search path). Nil: nothing.
	OnGrant func(signedgrant.Claims)
}

// Server is a running fiberd.
type Server struct {
	cfg     Config
	metrics *metrics
	mux     *http.ServeMux

	syncMu   sync.Mutex
	mu       sync.Mutex
	grant    *signedgrant.Claims
	grantRaw []byte
	// pushed is the last grant the grant controller pushed (PUT
	// /v1/grant): a spare Home claimed for a Revision has no grant file
	// until the kubelet refreshes its Secret volume, so the grant comes
	// over the API; the newer of the two is used.
	pushed []byte
	// home is this Home's name from the last grant that verified: the
	// audience router credentials must name.
	home       string
	routerKeys []ed25519.PublicKey
	// tlsCert is the certificate of the Home key (TLSKeyFile), tlsKeyPEM
	// what it was made from, tlsKeySHA256 its fingerprint.
	tlsCert      *tls.Certificate
	tlsKeyPEM    []byte
	tlsKeySHA256 string
	grantErr     error
	loaded       *loaded // template opened, snapshot unpacked, pool running
	loadErr      error
	loadKey      string
	lastTry      time.Time
	stopOnce     sync.Once
	stop         chan struct{}
	loopDone     chan struct{}
	httpSrv      *http.Server
	listeners    []net.Listener

	spliceOnce sync.Once
	splicer    *sockmap.Splicer

	// draining: Drain was called; no fiber is acquired any more.
	draining atomic.Bool
	// lastAcquire is when the last acquisition arrived (Unix ns), which
	// Handover watches.
	lastAcquire atomic.Int64
	// active counts proxied requests and tunnels under way, which Drain
	// waits for.
	active atomic.Int64
}

type loaded struct {
	// snapshot is the digest of the unpacked snapshot. The verified,
	// compressed layer itself is not kept: held for the Home's whole
	// life it was an idle Home's largest allocation after the Go runtime
	// (issue 32).
	snapshot string
	pool     *pool.Pool
	spec     *backend.Spec
	protocol string
}

// New validates cfg and returns a server; call Serve to run it.
func New(cfg Config) (*Server, error) {
	var errs []string
	if cfg.GrantFile == "" {
		errs = append(errs, "GrantFile (--grant-file) is empty")
	}
	if len(cfg.GrantKey) != ed25519.PublicKeySize {
		errs = append(errs, "GrantKey (--grant-key-file) is not an Ed25519 public key")
	}
	if cfg.RouterKeyFile == "" && len(cfg.RouterKeys) == 0 {
		errs = append(errs, "RouterKeyFile (--router-keys-file) is empty")
	}
	if cfg.StateDir == "" {
		errs = append(errs, "StateDir (--state-dir) is empty")
	}
	if cfg.Backend == nil {
		errs = append(errs, "Backend is nil")
	}
	if len(errs) > 0 {
		return nil, errors.New("fiberd config: " + strings.Join(errs, "; "))
	}
	if cfg.GrantPollInterval <= 0 {
		cfg.GrantPollInterval = time.Second
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 10 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, metrics: newMetrics(), stop: make(chan struct{}), loopDone: make(chan struct{}), routerKeys: cfg.RouterKeys}
	if cfg.RouterKeyFile != "" {
		keys, err := readRouterKeys(cfg.RouterKeyFile)
		if err != nil {
			return nil, fmt.Errorf("fiberd config: %w", err)
		}
		s.routerKeys = keys
	}
	if cfg.TLSKeyFile != "" {
		if err := s.loadTLSKey(); err != nil {
			return nil, fmt.Errorf("fiberd config: %w", err)
		}
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET "+client.HealthzPath, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET "+client.ReadyzPath, s.readyz)
	s.mux.Handle("GET "+client.MetricsPath, s.auth(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})))
	s.mux.Handle("POST "+client.FibersPath, s.auth(http.HandlerFunc(s.acquire)))
	s.mux.Handle("GET "+client.FibersPath, s.auth(http.HandlerFunc(s.list)))
	s.mux.Handle("DELETE "+client.FibersPath+"/{id}", s.auth(http.HandlerFunc(s.release)))
	s.mux.Handle("POST "+client.FibersPath+"/{id}/tunnel", s.auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Add(-1)
		s.tunnel(w, r)
	})))
	s.mux.Handle("GET "+client.GrantPath, s.auth(http.HandlerFunc(s.grantInfo)))
	// No router credential: the grant's signature and its home key are
	// what authenticate a push (push.go).
	s.mux.HandleFunc("PUT "+client.GrantPath, s.putGrant)
	go s.grantLoop()
	return s, nil
}

// Handler is fiberd's HTTP handler (API and fiber proxy).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Serve serves on ln until Close. HTTP/1.1 and HTTP/2 are both accepted so
// fiber-router can carry gRPC through: over TLS with the Home key (h2 by
// ALPN) when TLSKeyFile is set, else in clear (h2c).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.httpSrv == nil {
		// Only fiber-router and the grant controller reach this port, but
		// a connection that never finishes its headers, or idles forever
		// between requests, still holds fiberd's memory and descriptors.
		s.httpSrv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
		s.httpSrv.Protocols = new(http.Protocols)
		s.httpSrv.Protocols.SetHTTP1(true)
		if s.cfg.TLSKeyFile != "" {
			s.httpSrv.Protocols.SetHTTP2(true)
			s.httpSrv.TLSConfig = homekey.ServerConfig(s.certificate)
		} else {
			s.httpSrv.Protocols.SetUnencryptedHTTP2(true)
		}
	}
	srv := s.httpSrv
	s.mu.Unlock()
	// A connection closed after an answer whose request body fiber-router
	// is still sending is read to its end, not reset (package linger).
	ln = linger.Listener(ln)
	var err error
	if srv.TLSConfig != nil {
		// The certificate comes from TLSConfig.GetCertificate.
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving and destroys every fiber.
func (s *Server) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.loopDone
	s.mu.Lock()
	srv, l := s.httpSrv, s.loaded
	s.loaded = nil
	s.mu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		srv.Shutdown(ctx)
		cancel()
		srv.Close()
	}
	if l != nil {
		l.pool.Close()
	}
	s.spliceOnce.Do(func() {}) // no splicer from here on
	if s.splicer != nil {
		s.splicer.Close()
	}
	return nil
}

// Pool returns the current pool (nil until loaded); for tests and fiberctl.
func (s *Server) Pool() *pool.Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded == nil {
		return nil
	}
	return s.loaded.pool
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(client.FiberHeader); id != "" {
		s.active.Add(1)
		defer s.active.Add(-1)
		s.proxy(w, r, id)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Handover is fiberd's first answer to SIGTERM (its Home Pod deleted,
// evicted or drained from its node): the Home goes on serving, new fibers
// included, and /readyz stays ready, so that the Pod stays Ready and the
// grant controller keeps naming it while its replacement starts (make
// before break, as for an upgrade). It returns once no acquisition has
// arrived for quiet (fiber-router follows the replacement, or nothing is
// asked), after max, or when ctx ends, and says how long it lasted. Before
// it, an evicted Home refused new fibers at once and its Revision had no
// Home until the replacement was Ready: 12 s on a loaded three-node
// cluster, past a client's 10 s timeout (the operations suite's eviction,
// 2026-12-05).
func (s *Server) Handover(ctx context.Context, max, quiet time.Duration) time.Duration {
	start := time.Now()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		last := max64(s.lastAcquire.Load(), start.UnixNano())
		if time.Since(start) >= max || time.Since(time.Unix(0, last)) >= quiet {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			return time.Since(start)
		case <-t.C:
		}
	}
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// Drain follows Handover: from now on no fiber is acquired (503 NotReady,
// which fiber-router holds requests on until the replacement Home serves)
// and /readyz fails, while the requests and tunnels under way go on, and
// so do fresh fibers leased and not yet used: their router sends the
// request right after the lease (before, a fiber leased just before
// SIGTERM met a Home that had already exited: 502, "the fiber could not be
// reached"). It returns once none is left, or when ctx ends; then call
// Close.
func (s *Server) Drain(ctx context.Context) (left int64) {
	s.draining.Store(true)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if n := s.Active(); n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return s.Active()
		case <-t.C:
		}
	}
}

// Active is the number of proxied requests and tunnels under way, and of
// fresh fibers leased and not yet used (reaped after FreshLeaseTimeout).
func (s *Server) Active() int64 {
	n := s.active.Load()
	if p := s.Pool(); p != nil {
		n += int64(p.UnusedLeases())
	}
	return n
}

// HandoverMax bounds Handover: long enough for a replacement to start on a
// busy node (a node drain moves every Pod at once: the three-node drain run
// saw a replacement Ready 31 s after its predecessor's SIGTERM), short
// against the Pod's grace, which adds it.
const HandoverMax = 60 * time.Second

// HandoverQuiet ends Handover early: no acquisition for this long. A client
// that sends one request at a time, one of them slow, leaves gaps of
// seconds while the router still names this Home: with 2 s the drain run's
// handover ended at once and three requests waited past their 10 s for
// the replacement.
const HandoverQuiet = 10 * time.Second

// DrainTimeout is how long Drain may wait: the grant's timeoutSeconds
// (maxRequestSeconds) plus 2 s, inside the Home Pod's termination grace
// (timeoutSeconds plus 5 s); 5 s without a grant.
func (s *Server) DrainTimeout() time.Duration {
	s.mu.Lock()
	g := s.grant
	s.mu.Unlock()
	if g == nil || g.MaxRequestSeconds <= 0 {
		return 5 * time.Second
	}
	return time.Duration(g.MaxRequestSeconds)*time.Second + 2*time.Second
}

// drainingMsg is what a draining Home answers.
const drainingMsg = "this Home is shutting down (its Pod is being deleted) and starts no fiber; its replacement serves the Revision"
