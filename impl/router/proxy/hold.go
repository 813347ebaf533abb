package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/pool"
	"lampyr.dev/serving/impl/router/revision"
)

// errNotRoutable: the Revision had no pool (its metadata is not ready)
// when the request stopped being held.
var errNotRoutable = errors.New("revision not routable")

// lease gets a fiber for the request, holding it for up to HomeWait from
// its arrival while the Revision has no Home that can start fibers: its
// metadata is not ready (the Home Pod is being replaced), its pool was
// retired under the request, or its Home answers 503 or cannot be reached
// (deleted, evicted, draining, grant not yet renewed). Nothing was sent to
// a handler yet, so trying again is always safe. *k and *rt follow the
// Revision's current route; *rt is nil when the Revision went away.
func (r *Router) lease(ctx context.Context, arrived time.Time, nsVals, revVals []string, k *revision.Key, rt **route) (*pool.Lease, error) {
	until := arrived.Add(r.cfg.HomeWait)
	var held *atomic.Int32
	defer func() {
		if held != nil {
			held.Add(-1)
		}
	}()
	for attempt := 0; ; attempt++ {
		var err error
		if p := (*rt).pool; p != nil {
			l, gerr := p.Get(ctx)
			if gerr == nil || !homeUnavailable(gerr) {
				return l, gerr
			}
			err = gerr
		} else {
			err = errNotRoutable
		}
		if held == nil {
			// The first wait takes a place among the Revision's held
			// requests; beyond MaxQueue the request fails at once.
			w := (*rt).held
			if r.cfg.HomeWait <= 0 || w == nil || int(w.Add(1)) > r.cfg.MaxQueue {
				if w != nil {
					w.Add(-1)
				}
				return nil, err
			}
			held = w
		}
		if !r.awaitChange(ctx, until, holdBackoff(attempt)) {
			return nil, err
		}
		var cur *route
		*k, cur, _, _ = r.resolve(nsVals, revVals)
		if cur == nil {
			*rt = nil
			return nil, err
		}
		*rt = cur
	}
}

// homeUnavailable: the error says the Revision's Home cannot start a fiber
// now, not that the Revision is busy or the request is over.
func homeUnavailable(err error) bool {
	var ue *fibers.UnavailableError
	return errors.As(err, &ue) || errors.Is(err, pool.ErrClosed)
}

// holdBackoff is how long a held request waits before trying again when no
// route changes meanwhile: 50 ms doubling to 1 s.
func holdBackoff(attempt int) time.Duration {
	if attempt > 4 {
		return time.Second
	}
	return 50 * time.Millisecond << attempt
}

// awaitChange waits until a route changes, d passes, or until or ctx ends;
// it reports whether the request may try again.
func (r *Router) awaitChange(ctx context.Context, until time.Time, d time.Duration) bool {
	left := time.Until(until)
	if left <= 0 || ctx.Err() != nil {
		return false
	}
	r.mu.RLock()
	ch := r.changed
	r.mu.RUnlock()
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return ctx.Err() == nil && time.Now().Before(until)
}

// notifyChangedLocked wakes the held requests; r.mu is held.
func (r *Router) notifyChangedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}
