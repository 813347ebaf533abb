package server

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/pool"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

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
		return http.StatusServiceUnavailable, contract.ReasonNoValidGrant, msg
	}
	cred, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return http.StatusUnauthorized, contract.ReasonUnauthorized, "missing bearer credential: fiberd accepts only credentials fiber-router minted for this Home"
	}
	if _, err := routercred.Verify(keys, cred, home, s.cfg.Now()); err != nil {
		s.metrics.refusedCredentials.Inc()
		return http.StatusUnauthorized, contract.ReasonUnauthorized, "credential refused: " + err.Error()
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
		return nil, g, http.StatusServiceUnavailable, contract.ReasonNoValidGrant, msg
	}
	if l == nil {
		msg, reason := "snapshot not loaded yet", contract.ReasonNotReady
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
	if p := s.Pool(); p != nil {
		// Whatever the answer, once a Revision is loaded: the grant
		// controller resizes idle Homes by it.
		w.Header().Set(client.IdleSecondsHeader, client.FormatIdleSeconds(p.IdleFor()))
	}
	if s.draining.Load() {
		writeErr(w, http.StatusServiceUnavailable, contract.ReasonNotReady, drainingMsg)
		return
	}
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
		writeErr(w, http.StatusServiceUnavailable, contract.ReasonNotReady, "warm pool not filled yet")
		return
	}
	if !strings.Contains(r.Header.Get("Accept"), "application/json") {
		w.Write([]byte("ok\n"))
		return
	}
	out := client.Readiness{Ready: true}
	if p, ok := s.cfg.Backend.(backend.Preinitializer); ok && p.PreinitEnabled() {
		out.Preinit = &client.Preinit{Restored: true}
		if err := p.Preinit(l.spec); err != nil {
			out.Preinit = &client.Preinit{Pending: errors.Is(err, backend.ErrPreinitPending), Message: err.Error()}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	s.lastAcquire.Store(t0.UnixNano())
	if s.draining.Load() {
		writeErr(w, http.StatusServiceUnavailable, contract.ReasonNotReady, drainingMsg)
		return
	}
	l, _, status, reason, msg := s.current()
	if l == nil {
		writeErr(w, status, reason, msg)
		return
	}
	// The router's request bounds the wait (its acquire call gives up
	// after 30 s); a fiber start, once it has a start slot, is bounded by
	// the pool (start-up timeout plus 10 s).
	f, err := l.pool.Acquire(r.Context())
	switch {
	case errors.Is(err, pool.ErrMaxFibers):
		s.metrics.refused.Inc()
		writeErr(w, http.StatusTooManyRequests, contract.ReasonMaxFibersReached, fmt.Sprintf("all %d fibers the grant allows are leased; release one or retry", l.pool.MaxFibers()))
		return
	case err != nil:
		writeErr(w, http.StatusServiceUnavailable, contract.ReasonFiberFailed, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, client.Fiber{ID: f.ID(), State: client.StateAcquired, StartedAt: f.StartedAt, AcquireMicros: max(1, time.Since(t0).Microseconds())})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	p := s.Pool()
	if p == nil {
		writeErr(w, http.StatusNotFound, contract.ReasonUnknownFiber, "no fibers: nothing loaded")
		return
	}
	switch err := p.Release(r.PathValue("id")); {
	case errors.Is(err, pool.ErrUnknown):
		writeErr(w, http.StatusNotFound, contract.ReasonUnknownFiber, err.Error())
	case errors.Is(err, pool.ErrNotLeased):
		writeErr(w, http.StatusConflict, contract.ReasonUnknownFiber, err.Error())
	case err != nil:
		writeErr(w, http.StatusInternalServerError, contract.ReasonFiberFailed, err.Error())
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
		writeErr(w, http.StatusServiceUnavailable, contract.ReasonNoValidGrant, msg)
		return
	}
	writeJSON(w, http.StatusOK, client.GrantInfo{
		GrantID: g.GrantID, Namespace: g.Namespace, Revision: g.Revision,
		SnapshotArtifact: g.SnapshotArtifact, Template: g.Template,
		MaxFibers: g.MaxFibers, MemoryPerFiber: g.MemoryPerFiberBytes, Mode: g.Execution.Mode,
		IssuedAt: g.IssuedAt, ExpiresAt: g.ExpiresAt, TemplateLoaded: l != nil, LoadReason: loadReason, LoadError: loadErr,
	})
}
