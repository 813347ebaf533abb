package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// maxPushedGrant bounds a pushed grant's body (a signed grant is a few
// KiB; the tenant's env is bounded by the CRD).
const maxPushedGrant = 256 << 10

// pushReadyWait bounds how long a push waits for the pool to be warm
// before it answers with fiberd's readiness.
const pushReadyWait = 20 * time.Second

// newestGrant is the grant fiberd runs on: the newest (by issue time) of
// the grant file and the pushed grant that verifies now and names this
// Home's key. With neither, the error says why (the file's reason first:
// it is what a Home started for its grant waits for).
func (s *Server) newestGrant(now time.Time) ([]byte, signedgrant.Claims, error) {
	check := func(raw []byte) (signedgrant.Claims, error) {
		c, err := signedgrant.Verify(s.cfg.GrantKey, bytes.TrimSpace(raw), now)
		if err == nil {
			err = s.checkHomeKey(c)
		}
		return c, err
	}
	fileRaw, err := os.ReadFile(s.cfg.GrantFile)
	var fileClaims signedgrant.Claims
	if err == nil {
		fileClaims, err = check(fileRaw)
	} else if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("no grant yet at %s (the grant controller writes it once the CapacityGrant is admitted)", s.cfg.GrantFile)
	}
	fileErr := err
	s.mu.Lock()
	pushed := s.pushed
	s.mu.Unlock()
	if pushed == nil {
		return fileRaw, fileClaims, fileErr
	}
	pushedClaims, pushedErr := check(pushed)
	switch {
	case pushedErr != nil && fileErr != nil:
		return nil, signedgrant.Claims{}, fileErr
	case pushedErr != nil:
		return fileRaw, fileClaims, nil
	case fileErr != nil || pushedClaims.IssuedAt.After(fileClaims.IssuedAt):
		return pushed, pushedClaims, nil
	}
	return fileRaw, fileClaims, nil
}

// GrantRaw is the signed grant fiberd runs on now (nil before one
// verified): the egress proxy presents it to the egress API.
func (s *Server) GrantRaw() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.grantRaw)
}

// putGrant takes a grant the grant controller pushes: a spare Home
// (started before any Revision needed it) gets its grant this way the
// moment it is claimed, instead of when the kubelet next refreshes its
// Secret volume. No router credential is asked: only a grant signed with
// the grant key and naming this Home's own TLS key is taken, which only
// the grant controller makes, for this Home. A Home that holds a grant
// takes no grant of another Revision (a Home that ran a tenant's code
// never serves anyone else). The answer is /readyz's once the grant is
// loaded and the pool warm (or after pushReadyWait).
func (s *Server) putGrant(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxPushedGrant+1))
	if err != nil {
		writeErr(w, http.StatusBadRequest, contract.ReasonInvalidGrant, "reading the grant: "+err.Error())
		return
	}
	if len(raw) > maxPushedGrant {
		writeErr(w, http.StatusRequestEntityTooLarge, contract.ReasonInvalidGrant, fmt.Sprintf("a grant is at most %d bytes", maxPushedGrant))
		return
	}
	raw = bytes.TrimSpace(raw)
	c, err := signedgrant.Verify(s.cfg.GrantKey, raw, s.cfg.Now())
	if err == nil {
		err = s.checkHomeKey(c)
	}
	if err != nil {
		writeErr(w, http.StatusForbidden, contract.ReasonInvalidGrant, "grant refused: "+err.Error())
		return
	}
	s.mu.Lock()
	held := s.grant
	if held != nil && (held.Namespace != c.Namespace || held.Revision != c.Revision) {
		s.mu.Unlock()
		writeErr(w, http.StatusConflict, contract.ReasonInvalidGrant, "this Home runs another Revision; a Home never takes a second one")
		return
	}
	if s.pushed != nil {
		if prev, err := signedgrant.Verify(s.cfg.GrantKey, s.pushed, s.cfg.Now()); err == nil && prev.IssuedAt.After(c.IssuedAt) {
			raw = s.pushed // an older grant arrived late: keep the newer
		}
	}
	s.pushed = raw
	s.mu.Unlock()
	start := time.Now()
	s.syncGrant()
	loaded := time.Since(start)
	deadline := time.Now().Add(pushReadyWait)
	for time.Now().Before(deadline) && r.Context().Err() == nil {
		l, _, status, _, _ := s.current()
		if status != 0 && l == nil {
			s.mu.Lock()
			failed := s.loadErr != nil
			s.mu.Unlock()
			if failed {
				break
			}
		}
		if l != nil && (l.pool.Warm() || func() bool { f, _ := l.pool.StartFailure(); return f != nil }()) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.cfg.Logf("pushed grant %s for %s/%s: loaded in %s, answered after %s", c.GrantID, c.Namespace, c.Revision, loaded.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	s.readyz(w, r)
}
