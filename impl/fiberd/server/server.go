// Package server is fiberd: it holds the signed grant the grant controller
// issued to this Home (with the template the grant controller opened and
// checked), pulls and verifies the snapshot artifact, keeps the fiber pool
// and serves the API of docs/contracts.md §4 to fiber-router, which proves
// itself with a credential minted for this Home (docs/security.md §3).
package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/helper"
	"lampyr.dev/serving/impl/fiberd/pool"
	"lampyr.dev/serving/impl/fiberd/routercred"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
	"lampyr.dev/serving/impl/fiberd/sockmap"
)

// Config configures fiberd.
type Config struct {
	// RouterKeyFile holds fiber-router's public key(s) (PEM; the Home
	// Secret's router-keys.pub), re-read with the grant. Credentials must
	// verify with one of them and name this Home (the grant's home).
	RouterKeyFile string
	// RouterKeys are used when RouterKeyFile is empty (tests).
	RouterKeys []ed25519.PublicKey
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
	// home is this Home's name from the last grant that verified: the
	// audience router credentials must name.
	home       string
	routerKeys []ed25519.PublicKey
	grantErr   error
	loaded     *loaded // template opened, snapshot unpacked, pool running
	loadErr    error
	loadKey    string
	lastTry    time.Time
	stopOnce   sync.Once
	stop       chan struct{}
	loopDone   chan struct{}
	httpSrv    *http.Server
	listeners  []net.Listener

	spliceOnce sync.Once
	splicer    *sockmap.Splicer
}

type loaded struct {
	snapshot *artifact.Snapshot
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
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET "+client.HealthzPath, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET "+client.ReadyzPath, s.readyz)
	s.mux.Handle("GET "+client.MetricsPath, s.auth(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})))
	s.mux.Handle("POST "+client.FibersPath, s.auth(http.HandlerFunc(s.acquire)))
	s.mux.Handle("GET "+client.FibersPath, s.auth(http.HandlerFunc(s.list)))
	s.mux.Handle("DELETE "+client.FibersPath+"/{id}", s.auth(http.HandlerFunc(s.release)))
	s.mux.Handle("POST "+client.FibersPath+"/{id}/tunnel", s.auth(http.HandlerFunc(s.tunnel)))
	s.mux.Handle("GET "+client.GrantPath, s.auth(http.HandlerFunc(s.grantInfo)))
	go s.grantLoop()
	return s, nil
}

// Handler is fiberd's HTTP handler (API and fiber proxy).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Serve serves on ln until Close. HTTP/1.1 and h2c are both accepted so
// fiber-router can carry gRPC through.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.httpSrv == nil {
		// Only fiber-router and the grant controller reach this port, but
		// a connection that never finishes its headers, or idles forever
		// between requests, still holds fiberd's memory and descriptors.
		s.httpSrv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
		s.httpSrv.Protocols = new(http.Protocols)
		s.httpSrv.Protocols.SetHTTP1(true)
		s.httpSrv.Protocols.SetUnencryptedHTTP2(true)
	}
	srv := s.httpSrv
	s.mu.Unlock()
	err := srv.Serve(ln)
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

// ---- grant, template and snapshot ----

func (s *Server) grantLoop() {
	defer close(s.loopDone)
	for {
		s.syncGrant()
		select {
		case <-s.stop:
			return
		case <-time.After(s.cfg.GrantPollInterval):
		}
	}
}

// SyncGrant re-reads the grant file now (tests; the loop does it on its own).
func (s *Server) SyncGrant() { s.syncGrant() }

func (s *Server) syncGrant() {
	// One sync at a time: a load may take a while and must not race a
	// second load of the same grant.
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.cfg.RouterKeyFile != "" {
		if keys, err := readRouterKeys(s.cfg.RouterKeyFile); err != nil {
			s.cfg.Logf("keeping the previous router keys: %v", err)
		} else {
			s.mu.Lock()
			s.routerKeys = keys
			s.mu.Unlock()
		}
	}
	raw, err := os.ReadFile(s.cfg.GrantFile)
	now := s.cfg.Now()
	var claims signedgrant.Claims
	if err == nil {
		claims, err = signedgrant.Verify(s.cfg.GrantKey, bytes.TrimSpace(raw), now)
	} else if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("no grant yet at %s (the grant controller writes it once the CapacityGrant is admitted)", s.cfg.GrantFile)
	}
	s.mu.Lock()
	if err != nil {
		if s.grantErr == nil || s.grantErr.Error() != err.Error() {
			s.cfg.Logf("grant not valid: %v", err)
		}
		s.grant, s.grantErr = nil, err
		s.mu.Unlock()
		s.metrics.grantValid.Set(0)
		return
	}
	if !bytes.Equal(raw, s.grantRaw) {
		s.cfg.Logf("grant %s for %s/%s valid until %s", claims.GrantID, claims.Namespace, claims.Revision, claims.ExpiresAt.Format(time.RFC3339))
	}
	s.grant, s.grantErr, s.grantRaw, s.home = &claims, nil, raw, claims.Home
	key := loadKey(claims)
	cur := s.loaded
	needLoad := cur == nil || key != s.loadKey
	retryDue := now.Sub(s.lastTry) >= 5*time.Second
	s.mu.Unlock()
	s.metrics.grantValid.Set(1)
	s.metrics.grantExpiry.Set(float64(claims.ExpiresAt.Unix()))

	if !needLoad {
		cur.pool.SetMaxFibers(int(claims.MaxFibers))
		return
	}
	s.mu.Lock()
	if s.loadKey == key && s.loadErr != nil && !retryDue {
		s.mu.Unlock()
		return
	}
	s.lastTry = now
	s.mu.Unlock()
	l, err := s.load(claims)
	s.mu.Lock()
	s.loadKey = key
	s.loadErr = err
	// The previous template/snapshot is no longer what the grant covers,
	// so it stops serving whether or not the new one loaded.
	old := s.loaded
	s.loaded = l
	s.mu.Unlock()
	if old != nil {
		old.pool.Close()
	}
	if err != nil {
		s.cfg.Logf("cannot run %s/%s: %v", claims.Namespace, claims.Revision, err)
	}
}

// loadKey identifies what a loaded Revision was built from; a renewed grant
// with the same key keeps the running pool (only maxFibers may change live).
func loadKey(c signedgrant.Claims) string {
	env := make([]string, 0, len(c.Env))
	for k, v := range c.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return strings.Join([]string{c.Home, c.Namespace, c.Revision, c.Template, c.SnapshotArtifact, c.Helper.Protocol, strconv.Itoa(int(c.Helper.Port)), c.Execution.Mode,
		strconv.FormatInt(c.Execution.IdleTimeoutSeconds, 10), strconv.FormatInt(c.MemoryPerFiberBytes, 10), strings.Join(env, "\x00")}, "|")
}

// LoadError is a refusal to run a grant's Revision, with a CamelCase reason.
type LoadError struct {
	Reason contract.Reason
	Err    error
}

func (e *LoadError) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *LoadError) Unwrap() error { return e.Err }

func (s *Server) load(c signedgrant.Claims) (*loaded, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	snap, err := artifact.FetchWithLimits(ctx, c.SnapshotArtifact, s.cfg.ArtifactLimits, s.cfg.RegistryOptions...)
	if err != nil {
		return nil, snapshotErr(err)
	}
	uid, gid, err := snap.Config.UserIDs()
	if err != nil {
		return nil, &LoadError{contract.ReasonSnapshotUnavailable, err}
	}
	// The port and protocol are the Revision's (Knative's runtime contract:
	// PORT is the containerPort, a port named h2c means HTTP/2), carried by
	// the grant; the snapshot's are what its build declared, used where a
	// grant names no protocol.
	port := c.Helper.Port
	root, err := s.unpack(snap)
	if err != nil {
		return nil, snapshotErr(err)
	}
	env := map[string]string{}
	for k, v := range c.Env {
		env[k] = v
	}
	env["PORT"] = strconv.Itoa(int(port))
	env["HOME"] = "/tmp"
	env["TMPDIR"] = "/tmp"
	env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
	if _, ok := env["K_REVISION"]; !ok {
		env["K_REVISION"] = c.Revision
	}
	startup := s.cfg.StartupTimeout
	if snap.Config.StartupTimeoutSeconds > 0 {
		startup = time.Duration(snap.Config.StartupTimeoutSeconds) * time.Second
	}
	spec := &backend.Spec{
		Revision:       c.Revision,
		RootFS:         root,
		Entrypoint:     snap.Config.Entrypoint,
		Port:           port,
		Env:            env,
		MemoryBytes:    c.MemoryPerFiberBytes,
		StartupTimeout: startup,
		ReadinessPath:  snap.Config.ReadinessPath,
		UID:            uid,
		GID:            gid,
	}
	p, err := pool.New(pool.Config{
		Spec:         spec,
		Backend:      s.cfg.Backend,
		Mode:         c.Execution.Mode,
		IdleTimeout:  time.Duration(c.Execution.IdleTimeoutSeconds) * time.Second,
		MaxFibers:    int(c.MaxFibers),
		WarmTarget:   s.cfg.WarmFibers,
		LeaseTimeout: time.Duration(c.MaxRequestSeconds)*time.Second + time.Minute,
		Observer:     s.metrics,
		Logf:         s.cfg.Logf,
	})
	if err != nil {
		return nil, &LoadError{contract.ReasonInvalidGrant, err}
	}
	proto := c.Helper.Protocol
	if proto == "" {
		proto = snap.Config.Protocol
	}
	if proto == "" {
		proto = "http1"
	}
	s.cfg.Logf("loaded %s/%s: snapshot %s verified, mode %s, max %d fibers", c.Namespace, c.Revision, snap.Digest(), c.Execution.Mode, c.MaxFibers)
	return &loaded{snapshot: snap, pool: p, spec: spec, protocol: proto}, nil
}

// snapshotErr is the LoadError of a snapshot that could not be fetched or
// unpacked: SnapshotTooLarge when it exceeds a limit (the message names
// it), SnapshotUnavailable otherwise.
func snapshotErr(err error) error {
	var le *artifact.LimitError
	if errors.As(err, &le) {
		return &LoadError{contract.ReasonSnapshotTooLarge, err}
	}
	return &LoadError{contract.ReasonSnapshotUnavailable, err}
}

// unpack extracts a verified snapshot once per digest and adds the mount
// points the helper needs. The tree is the tenant's: fiberd (root) never
// follows a symlink in it. A mount point or /etc that is anything but a
// directory is refused (the helper would mount over the symlink's target
// on the host's side of pivot_root), and /etc/hosts is only ever created.
func (s *Server) unpack(snap *artifact.Snapshot) (string, error) {
	dir := filepath.Join(s.cfg.StateDir, "snapshots", strings.ReplaceAll(snap.Digest(), ":", "-"))
	root := filepath.Join(dir, "rootfs")
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return root, nil
	}
	os.RemoveAll(dir)
	if err := snap.Unpack(root); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	for _, d := range append(append([]string{}, helper.MountPoints...), "etc") {
		p := filepath.Join(root, d)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(p, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case !fi.IsDir():
			os.RemoveAll(dir)
			kind := "file"
			if fi.Mode()&os.ModeSymlink != 0 {
				kind = "symlink"
			}
			return "", fmt.Errorf("snapshot %s: /%s is a %s, not a directory: the fiber's mount points and /etc must be directories", snap.Digest(), d, kind)
		}
	}
	// The root is read-only, so name resolution of "localhost" must work
	// without writing. O_EXCL|O_NOFOLLOW: an existing hosts file, or a
	// symlink named hosts, is left as it is.
	if f, err := os.OpenFile(filepath.Join(root, "etc", "hosts"), os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o644); err == nil {
		f.WriteString("127.0.0.1 localhost\n::1 localhost\n")
		f.Close()
	}
	// fiberd binds each fiber's resolver configuration over
	// /etc/resolv.conf (helper.Spec.ResolvConf), so it must be a regular
	// file of the root: an image's symlink (to a systemd stub, say) is
	// replaced, since the helper would follow it on the host's side.
	rc := filepath.Join(root, helper.ResolvConfPath)
	if fi, err := os.Lstat(rc); err == nil && !fi.Mode().IsRegular() {
		if err := os.RemoveAll(rc); err != nil {
			return "", err
		}
	}
	if f, err := os.OpenFile(rc, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o644); err == nil {
		f.Close()
	} else if !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("snapshot %s: creating /%s: %w", snap.Digest(), helper.ResolvConfPath, err)
	}
	// Only root may change the unpacked snapshot; fibers see it read-only anyway.
	os.Chmod(dir, 0o755)
	return root, os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644)
}

// ---- HTTP ----

func writeErr(w http.ResponseWriter, status int, reason contract.Reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(client.Error{Reason: reason, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// credentialOK checks a router credential ("Bearer <credential>") minted
// for this Home. Until a grant has verified, this fiberd does not know which
// Home it is, so no credential is accepted; the answer then is 503
// NoValidGrant (nothing to serve yet), never a 401 that would read as a key
// problem.
func (s *Server) credentialOK(h string) (status int, reason contract.Reason, msg string) {
	s.mu.Lock()
	home, keys := s.home, s.routerKeys
	gerr := s.grantErr
	s.mu.Unlock()
	if home == "" {
		msg := "no grant yet"
		if gerr != nil {
			msg = gerr.Error()
		}
		return http.StatusServiceUnavailable, client.ReasonNoGrant, msg
	}
	cred, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return http.StatusUnauthorized, client.ReasonUnauthorized, "missing bearer credential: fiberd accepts only credentials fiber-router minted for this Home"
	}
	if _, err := routercred.Verify(keys, cred, home, s.cfg.Now()); err != nil {
		s.metrics.refusedCredentials.Inc()
		return http.StatusUnauthorized, client.ReasonUnauthorized, "credential refused: " + err.Error()
	}
	return 0, "", ""
}

func (s *Server) auth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, reason, msg := s.credentialOK(r.Header.Get("Authorization")); status != 0 {
			writeErr(w, status, reason, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func readRouterKeys(path string) ([]ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router keys: %w", err)
	}
	keys, err := routercred.ParsePublicKeys(b)
	if err != nil {
		return nil, fmt.Errorf("router keys %s: %w", path, err)
	}
	return keys, nil
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(client.FiberHeader); id != "" {
		s.proxy(w, r, id)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// current returns the loaded Revision if the grant is valid now.
func (s *Server) current() (*loaded, *signedgrant.Claims, int, contract.Reason, string) {
	s.mu.Lock()
	g, gerr, l, lerr := s.grant, s.grantErr, s.loaded, s.loadErr
	s.mu.Unlock()
	if g == nil || !s.cfg.Now().Before(g.ExpiresAt) {
		msg := "no valid grant"
		if gerr != nil {
			msg = gerr.Error()
		} else if g != nil {
			msg = "grant expired at " + g.ExpiresAt.Format(time.RFC3339)
		}
		return nil, g, http.StatusServiceUnavailable, client.ReasonNoGrant, msg
	}
	if l == nil {
		msg, reason := "snapshot not loaded yet", client.ReasonNotReady
		var le *LoadError
		if errors.As(lerr, &le) {
			// The load error's own reason, so the grant controller reads
			// why from the reason, never from the message's text.
			msg, reason = lerr.Error(), le.Reason
		} else if lerr != nil {
			msg = lerr.Error()
		}
		return nil, g, http.StatusServiceUnavailable, reason, msg
	}
	return l, g, 0, "", ""
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	l, _, status, reason, msg := s.current()
	if l == nil {
		writeErr(w, status, reason, msg)
		return
	}
	if !l.pool.Warm() {
		// Before the pool was ever warm, a handler that fails every start
		// is why (stock Knative reports a crashing container at once):
		// the grant controller reads the typed failure from here.
		if f, n := l.pool.StartFailure(); f != nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(client.Error{Reason: f.Reason, Message: f.Message, Handler: &client.HandlerFailure{
				ExitCode: f.ExitCode, Signal: f.Signal, Output: f.Output, ConsecutiveFailures: n,
			}})
			return
		}
		writeErr(w, http.StatusServiceUnavailable, client.ReasonNotReady, "warm pool not filled yet")
		return
	}
	w.Write([]byte("ok\n"))
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	l, _, status, reason, msg := s.current()
	if l == nil {
		writeErr(w, status, reason, msg)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), l.spec.StartupTimeout+10*time.Second)
	defer cancel()
	f, err := l.pool.Acquire(ctx)
	switch {
	case errors.Is(err, pool.ErrMaxFibers):
		s.metrics.refused.Inc()
		writeErr(w, http.StatusTooManyRequests, client.ReasonMaxFibersReached, fmt.Sprintf("all %d fibers the grant allows are leased; release one or retry", l.pool.MaxFibers()))
		return
	case err != nil:
		writeErr(w, http.StatusServiceUnavailable, client.ReasonFiberFailed, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, client.Fiber{ID: f.ID(), State: client.StateAcquired, StartedAt: f.StartedAt})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	p := s.Pool()
	if p == nil {
		writeErr(w, http.StatusNotFound, client.ReasonUnknownFiber, "no fibers: nothing loaded")
		return
	}
	switch err := p.Release(r.PathValue("id")); {
	case errors.Is(err, pool.ErrUnknown):
		writeErr(w, http.StatusNotFound, client.ReasonUnknownFiber, err.Error())
	case errors.Is(err, pool.ErrNotLeased):
		writeErr(w, http.StatusConflict, client.ReasonUnknownFiber, err.Error())
	case err != nil:
		writeErr(w, http.StatusInternalServerError, client.ReasonFiberFailed, err.Error())
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	out := client.FiberList{Fibers: []client.Fiber{}}
	s.mu.Lock()
	l, g := s.loaded, s.grant
	s.mu.Unlock()
	if g != nil {
		out.Revision, out.Mode, out.Max = g.Revision, g.Execution.Mode, g.MaxFibers
	}
	if l != nil {
		now := time.Now()
		for _, f := range l.pool.List() {
			out.Fibers = append(out.Fibers, client.Fiber{ID: f.ID, State: f.State, StartedAt: f.StartedAt, AgeSeconds: now.Sub(f.StartedAt).Seconds(), Requests: f.Requests})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) grantInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	g, gerr, l, lerr := s.grant, s.grantErr, s.loaded, s.loadErr
	s.mu.Unlock()
	loadErr, loadReason := "", contract.Reason("")
	if lerr != nil {
		loadErr = lerr.Error()
		var le *LoadError
		if errors.As(lerr, &le) {
			loadReason = le.Reason
		}
	}
	if g == nil {
		msg := "no grant"
		if gerr != nil {
			msg = gerr.Error()
		}
		writeErr(w, http.StatusServiceUnavailable, client.ReasonNoGrant, msg)
		return
	}
	writeJSON(w, http.StatusOK, client.GrantInfo{
		GrantID: g.GrantID, Namespace: g.Namespace, Revision: g.Revision,
		SnapshotArtifact: g.SnapshotArtifact, Template: g.Template,
		MaxFibers: g.MaxFibers, MemoryPerFiber: g.MemoryPerFiberBytes, Mode: g.Execution.Mode,
		IssuedAt: g.IssuedAt, ExpiresAt: g.ExpiresAt, TemplateLoaded: l != nil, LoadReason: loadReason, LoadError: loadErr,
	})
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string) {
	// Every answer fiberd makes here, rather than the handler, is marked
	// (client.AnswerHeader) for the router.
	own := func() { w.Header().Set(client.AnswerHeader, "1") }
	if status, reason, msg := s.credentialOK(r.Header.Get(client.ProxyAuthHeader)); status != 0 {
		own()
		writeErr(w, status, reason, msg+" (proxied requests carry it in "+client.ProxyAuthHeader+")")
		return
	}
	l, g, status, reason, msg := s.current()
	if l == nil {
		own()
		writeErr(w, status, reason, msg)
		return
	}
	f, end, err := l.pool.Begin(r.Context(), id)
	if err != nil {
		own()
		writeBeginErr(w, err)
		return
	}
	defer end()
	ctx := r.Context()
	if g.MaxRequestSeconds > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(g.MaxRequestSeconds)*time.Second)
		defer cancel()
	}
	reuse := l.pool.Mode() == pool.ModeReuse
	mk := func() *http.Transport {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := f.Dial(ctx)
				if err != nil || l.protocol == "h2c" {
					return c, err
				}
				return &answerFirstConn{Conn: c}, nil
			},
			// A fresh fiber serves one request: no connection to keep.
			DisableKeepAlives: !reuse && l.protocol != "h2c",
			// The router already decompresses nothing; pass bytes through.
			DisableCompression:  true,
			MaxIdleConnsPerHost: 1,
			// As Knative's own transports (http.DefaultTransport's value):
			// a request with "Expect: 100-continue" gets its body sent
			// once the handler asks for it, so the client sees a 100
			// Continue only if the handler reads the body, as on stock.
			ExpectContinueTimeout: time.Second,
		}
		if l.protocol == "h2c" {
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		return tr
	}
	var tr *http.Transport
	if reuse {
		// A reused fiber keeps its connection between requests (the
		// helper bridges bytes, so keep-alive passes through); the pool
		// closes it when the fiber ends.
		tr = f.Transport(mk)
	}
	if tr == nil { // fresh mode, or the fiber ended meanwhile
		tr = mk()
		defer tr.CloseIdleConnections()
	}

	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "fiber-" + id
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(client.FiberHeader)
			pr.Out.Header.Del(client.ProxyAuthHeader)
			// Rewrite strips these from the outbound request, as a proxy
			// that cannot trust its client must. fiberd's data path is
			// reached only with the router's credential, and the router has set
			// them as Knative's runtime contract promises the handler
			// (Forwarded MUST, X-Forwarded-For/-Proto SHOULD): pass them on
			// unchanged, fiberd is not a hop the handler should see.
			for _, h := range forwardedHeaders {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		BufferPool:    copyBuffers{},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(client.AnswerHeader) // only fiberd's own answers carry it
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			own()
			log.Printf("fiber %s: %s %s: %v", id, r.Method, r.URL.Path, err)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				writeErr(w, http.StatusGatewayTimeout, client.ReasonRequestTimeout, fmt.Sprintf("request exceeded maxRequestSeconds %d", g.MaxRequestSeconds))
				return
			}
			if ferr := f.Err(); ferr != nil {
				err = fmt.Errorf("%w (%v)", err, ferr)
			}
			writeErr(w, http.StatusBadGateway, client.ReasonFiberFailed, "fiber "+id+": "+err.Error())
		},
	}
	s.metrics.requests.Inc()
	rp.ServeHTTP(w, r.WithContext(ctx))
}

func writeBeginErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, pool.ErrUnknown):
		writeErr(w, http.StatusNotFound, client.ReasonUnknownFiber, err.Error())
	case errors.Is(err, pool.ErrBusy):
		writeErr(w, http.StatusConflict, client.ReasonFiberBusy, err.Error())
	case errors.Is(err, pool.ErrSpent):
		writeErr(w, http.StatusConflict, client.ReasonFiberSpent, err.Error())
	case errors.Is(err, pool.ErrTunnelFresh):
		writeErr(w, http.StatusConflict, client.ReasonTunnelRefused, err.Error())
	default:
		writeErr(w, http.StatusConflict, client.ReasonUnknownFiber, err.Error())
	}
}

// forwardedHeaders are passed from the router to the fiber unchanged.
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// ---- metrics ----

type metrics struct {
	reg         *prometheus.Registry
	started     *prometheus.CounterVec
	startDur    prometheus.Histogram
	acquireDur  *prometheus.HistogramVec
	ended       *prometheus.CounterVec
	refused     prometheus.Counter
	requests    prometheus.Counter
	tunnels     *prometheus.CounterVec
	tunnelsOpen prometheus.Gauge
	grantValid  prometheus.Gauge
	grantExpiry prometheus.Gauge
	// refusedCredentials counts calls refused for a bad, expired or
	// other Home's credential: a rising count is someone trying.
	refusedCredentials prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		reg:                prometheus.NewRegistry(),
		started:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_fiber_starts_total", Help: "Fiber starts by result."}, []string{"result"}),
		startDur:           prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fiberd_fiber_start_seconds", Help: "Time to start a fiber until its handler listens.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		acquireDur:         prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fiberd_acquire_seconds", Help: "Acquisition latency by source (warm pool or cold start).", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18)}, []string{"source"}),
		ended:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_fibers_ended_total", Help: "Fibers ended by reason."}, []string{"reason"}),
		refused:            prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_acquire_refused_total", Help: "Acquisitions refused at maxFibers."}),
		requests:           prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_proxied_requests_total", Help: "Requests proxied into fibers."}),
		tunnels:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_tunnels_total", Help: "Tunnels opened to reuse-mode fibers (their requests are not counted one by one), by how bytes are carried: kernel (sockmap) or user (copied by fiberd)."}, []string{"splice"}),
		tunnelsOpen:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_tunnels_open", Help: "Tunnels open now."}),
		grantValid:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_grant_valid", Help: "1 while fiberd holds a valid grant."}),
		grantExpiry:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_grant_expiry_timestamp_seconds", Help: "Expiry of the current grant."}),
		refusedCredentials: prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_refused_credentials_total", Help: "API and proxied calls refused for a credential that is malformed, expired, signed by another key or minted for another Home."}),
	}
	m.reg.MustRegister(m.started, m.startDur, m.acquireDur, m.ended, m.refused, m.requests, m.tunnels, m.tunnelsOpen, m.grantValid, m.grantExpiry, m.refusedCredentials)
	return m
}

func (m *metrics) FiberStarted(d time.Duration, err error) {
	if err != nil {
		m.started.WithLabelValues("error").Inc()
		return
	}
	m.started.WithLabelValues("ok").Inc()
	m.startDur.Observe(d.Seconds())
}

func (m *metrics) FiberAcquired(d time.Duration, warm bool) {
	src := "cold"
	if warm {
		src = "warm"
	}
	m.acquireDur.WithLabelValues(src).Observe(d.Seconds())
}

func (m *metrics) FiberEnded(reason string) { m.ended.WithLabelValues(reason).Inc() }
