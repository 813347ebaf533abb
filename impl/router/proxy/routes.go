package proxy

import (
	"strconv"
	"sync"
	"sync/atomic"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/pool"
	"lampyr.dev/serving/impl/router/revision"
)

// route is a Revision as the request path needs it.
type route struct {
	meta routermeta.Metadata
	pool *pool.Pool // nil while not ready
	obs  *metrics.RevisionObserver
	reqs map[int]requestSeries // status code -> series, filled lazily
	mu   sync.Mutex
	dur  interface{ Observe(float64) }
	// held counts the requests held for the Revision's Home (hold.go);
	// shared by every version of the route.
	held *atomic.Int32
}

type requestSeries interface{ Inc() }

// Changed implements revision.Listener: it creates, retunes or retires the
// Revision's pool.
func (r *Router) Changed(old, cur *routermeta.Metadata) {
	if cur == nil {
		k := revision.Key{Namespace: old.Namespace, Name: old.Revision}
		r.mu.Lock()
		rt := r.routes[k]
		delete(r.routes, k)
		unused, ok := r.unuseHome(rt)
		r.notifyChangedLocked()
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
		nr.obs, nr.dur, nr.reqs, nr.held = prev.obs, prev.dur, prev.reqs, prev.held
	} else {
		nr.held = new(atomic.Int32)
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
	r.notifyChangedLocked()
	r.mu.Unlock()
	r.retire(retire)
	if forget {
		r.forgetHome(unused)
	}
	r.metrics.Revisions.Set(float64(r.routeCount()))
}

// homeOf is the Home a Revision's metadata names.
func homeOf(m routermeta.Metadata) fibers.Home {
	return fibers.Home{Endpoint: m.HomeEndpoint, Name: m.Home, KeySHA256: m.HomeKeySHA256}
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

func (r *Router) routeCount() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.routes)
}

func (r *Router) lookup(k revision.Key) *route {
	r.mu.RLock()
	rt := r.routes[k]
	r.mu.RUnlock()
	return rt
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

var _ revision.Listener = (*Router)(nil)
