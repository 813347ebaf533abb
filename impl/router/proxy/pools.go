package proxy

import (
	"context"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/pool"
	"lampyr.dev/serving/impl/router/revision"
)

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
