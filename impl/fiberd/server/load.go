package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/helper"
	"lampyr.dev/serving/impl/fiberd/pool"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

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
	if s.cfg.TLSKeyFile != "" {
		if err := s.loadTLSKey(); err != nil {
			s.cfg.Logf("keeping the previous home key: %v", err)
		}
	}
	now := s.cfg.Now()
	raw, claims, err := s.newestGrant(now)
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
	onGrant := s.cfg.OnGrant
	cur := s.loaded
	needLoad := cur == nil || key != s.loadKey
	retryDue := now.Sub(s.lastTry) >= 5*time.Second
	s.mu.Unlock()
	s.metrics.grantValid.Set(1)
	s.metrics.grantExpiry.Set(float64(claims.ExpiresAt.Unix()))
	if onGrant != nil {
		onGrant(claims)
	}
	// The Home-wide task bound follows the grant's maxFibers (a no-op
	// while it is unchanged).
	if ht, ok := s.cfg.Backend.(backend.HomeTasks); ok {
		if _, err := ht.BoundHomeTasks(int(claims.MaxFibers)); err != nil {
			s.cfg.Logf("%v", err)
		}
	}

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

// FreshLeaseTimeout is how long a fresh-mode fiber may stay leased before
// its request arrives. fiber-router sends the request as soon as the
// acquisition answers (its acquire call is itself bounded at 30 s), and a
// fiber serving a request is busy, not leased, however long the request
// runs; so a lease unused this long belongs to a router that died in
// between. It was timeoutSeconds + 60 s (6 minutes by default); issue 33
// asks that a killed router's leases be freed within 60 s.
const FreshLeaseTimeout = 30 * time.Second

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
	root, err := s.unpack(ctx, snap)
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
		WarmIdle:     s.cfg.WarmIdle,
		LeaseTimeout: FreshLeaseTimeout,
		Observer:     idleObserver{s.metrics},
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
	// What the load used (the layer, its decompression, the unpack) is
	// garbage once it returns, but the Go runtime hands freed pages back
	// to the kernel only slowly: an idle Home kept them (issue 32).
	time.AfterFunc(releaseAfterLoad, debug.FreeOSMemory)
	return &loaded{snapshot: snap.Digest(), pool: p, spec: spec, protocol: proto}, nil
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

// releaseAfterLoad is when, after a load, fiberd returns its freed memory
// to the kernel: the warm fibers have started by then.
const releaseAfterLoad = 10 * time.Second

// idleObserver is the pool's observer: fiberd's metrics, and when the
// warm pool empties (the Home is idle) fiberd returns its freed memory to
// the kernel.
type idleObserver struct{ *metrics }

func (o idleObserver) WarmPoolEmptied(n int) {
	o.metrics.WarmPoolEmptied(n)
	go debug.FreeOSMemory()
}

// unpack extracts a snapshot once per digest and adds the mount
// points the helper needs. The tree is the tenant's: fiberd (root) never
// follows a symlink in it. A mount point or /etc that is anything but a
// directory is refused (the helper would mount over the symlink's target
// on the host's side of pivot_root), and /etc/hosts is only ever created.
func (s *Server) unpack(ctx context.Context, snap *artifact.Snapshot) (string, error) {
	dir := filepath.Join(s.cfg.StateDir, "snapshots", strings.ReplaceAll(snap.Digest(), ":", "-"))
	root := filepath.Join(dir, "rootfs")
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return root, nil
	}
	os.RemoveAll(dir)
	// The layer streams from the registry into the tree and is verified
	// at its end; a tree whose layer did not verify is removed here.
	if err := snap.UnpackContext(ctx, root); err != nil {
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
