// Package fetchq runs I/O that a tenant directs (a fetch from whatever
// registry a tenant's object names) off a controller's reconcile workers.
//
// A reconciler asks Get what is known of a key; the answer is at once: the
// cached result, or Pending while an attempt is queued or running. Attempts
// run at most Options.PerNamespace at a time for each namespace, each
// bounded by Options.Timeout, and a key that failed is not tried again
// before an exponential backoff has passed. When an attempt ends, every
// object that asked for the key is handed to the notify function (a
// controller's EnqueueKey), so its next reconcile finds the result cached.
//
// So a registry that never answers holds one slot of the namespace that
// named it, for one timeout per attempt, and nothing of the workers or of
// other namespaces.
package fetchq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Options tune a Queue; zero fields take the defaults below.
type Options struct {
	// Timeout bounds one attempt (default 30s).
	Timeout time.Duration
	// PerNamespace is how many attempts of one namespace run at a time
	// (default 1).
	PerNamespace int
	// Backoff is the wait after a key's first failure; it doubles with each
	// failure in a row up to MaxBackoff (defaults 5s and 5m).
	Backoff, MaxBackoff time.Duration
	// MaxQueued bounds the attempts one namespace may have waiting (default
	// 256); beyond it Get answers Failed with ErrBusy.
	MaxQueued int
	// MaxCached bounds the results kept (default 4096); the least recently
	// used goes first.
	MaxCached int
	// Clock is for tests (default the real one).
	Clock clock.PassiveClock
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.PerNamespace <= 0 {
		o.PerNamespace = 1
	}
	if o.Backoff <= 0 {
		o.Backoff = 5 * time.Second
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(5*time.Minute, o.Backoff)
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = 256
	}
	if o.MaxCached <= 0 {
		o.MaxCached = 4096
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// State of a key as Get sees it.
type State int

const (
	// Pending: an attempt is queued or running; the asker is notified when
	// it ends.
	Pending State = iota
	// Done: the last attempt succeeded; Value holds its result.
	Done
	// Failed: the last attempt failed with Err; none starts before RetryAt.
	Failed
)

func (s State) String() string {
	switch s {
	case Pending:
		return "Pending"
	case Done:
		return "Done"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Result is what Get knows of a key.
type Result[V any] struct {
	State State
	// Value is the result of a successful attempt (Done).
	Value V
	// Err is the failed attempt's error (Failed), or while Pending the error
	// of the attempt before, if one failed.
	Err error
	// RetryAt is when Get starts the next attempt of a Failed key.
	RetryAt time.Time
	// Ahead is, while Pending, how many attempts of the namespace run or
	// wait before this one.
	Ahead int
}

// ErrBusy is the Failed error when a namespace has Options.MaxQueued
// attempts waiting.
var ErrBusy = errors.New("too many checks of this namespace are waiting")

// TimeoutError is a failed attempt that did not end within Options.Timeout.
type TimeoutError struct {
	After time.Duration
	Err   error
}

func (e *TimeoutError) Error() string { return fmt.Sprintf("no answer within %s", e.After) }
func (e *TimeoutError) Unwrap() error { return e.Err }

// Queue is keyed asynchronous work; see the package comment.
type Queue[V any] struct {
	ctx    context.Context
	fetch  func(ctx context.Context, key string) (V, error)
	notify func(types.NamespacedName)
	o      Options

	mu      sync.Mutex
	results map[string]*result[V]
	// tick orders results by use, for eviction.
	tick       uint64
	namespaces map[string]*namespace
}

type result[V any] struct {
	value    V
	err      error
	failures int
	retryAt  time.Time
	used     uint64
	// at is when the attempt that gave this result ended.
	at time.Time
}

// namespace holds one namespace's attempts: running, then waiting in order.
type namespace struct {
	running int
	waiting []*job
	jobs    map[string]*job // running or waiting, by key
}

type job struct {
	key     string
	waiters map[types.NamespacedName]struct{}
	queued  time.Time
	running bool
}

// New returns a Queue that runs fetch, and calls notify with every object
// that asked for a key once an attempt for it ends. fetch must return soon
// after its context is done (the context carries Options.Timeout and ends
// with ctx). notify is called without the Queue's lock held.
func New[V any](ctx context.Context, fetch func(ctx context.Context, key string) (V, error), notify func(types.NamespacedName), o Options) *Queue[V] {
	return &Queue[V]{
		ctx:        ctx,
		fetch:      fetch,
		notify:     notify,
		o:          o.withDefaults(),
		results:    map[string]*result[V]{},
		namespaces: map[string]*namespace{},
	}
}

// Get returns what is known of key for waiter, whose namespace the attempt
// is counted against. It never blocks on I/O. A Pending answer means an
// attempt is queued or running and waiter will be notified when it ends;
// a Failed key whose RetryAt has passed is tried again (Pending).
func (q *Queue[V]) Get(waiter types.NamespacedName, key string) Result[V] {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.o.Clock.Now()
	r := q.results[key]
	if r != nil {
		q.tick++
		r.used = q.tick
		if r.err == nil {
			return Result[V]{State: Done, Value: r.value}
		}
		if now.Before(r.retryAt) {
			return Result[V]{State: Failed, Err: r.err, RetryAt: r.retryAt}
		}
	}
	var last error
	if r != nil {
		last = r.err
	}
	ns := q.namespaces[waiter.Namespace]
	if ns == nil {
		ns = &namespace{jobs: map[string]*job{}}
		q.namespaces[waiter.Namespace] = ns
	}
	j := ns.jobs[key]
	if j == nil {
		if len(ns.waiting) >= q.o.MaxQueued {
			return Result[V]{State: Failed, Err: ErrBusy, RetryAt: now.Add(q.o.Backoff)}
		}
		j = &job{key: key, waiters: map[types.NamespacedName]struct{}{}, queued: now}
		ns.jobs[key] = j
		ns.waiting = append(ns.waiting, j)
		q.startLocked(waiter.Namespace, ns)
	}
	j.waiters[waiter] = struct{}{}
	ahead := ns.running
	if j.running {
		ahead = 0
	} else {
		for _, w := range ns.waiting {
			if w == j {
				break
			}
			ahead++
		}
	}
	return Result[V]{State: Pending, Err: last, Ahead: ahead}
}

// startLocked starts waiting attempts of ns while it has free slots.
func (q *Queue[V]) startLocked(name string, ns *namespace) {
	for ns.running < q.o.PerNamespace && len(ns.waiting) > 0 {
		j := ns.waiting[0]
		ns.waiting = ns.waiting[1:]
		j.running = true
		ns.running++
		go q.run(name, ns, j)
	}
}

func (q *Queue[V]) run(name string, ns *namespace, j *job) {
	// Another namespace's attempt may have answered since this one queued.
	q.mu.Lock()
	r := q.results[j.key]
	fresh := r != nil && !r.at.Before(j.queued) && (r.err == nil || q.o.Clock.Now().Before(r.retryAt))
	q.mu.Unlock()

	if !fresh {
		ctx, cancel := context.WithTimeout(q.ctx, q.o.Timeout)
		v, err := q.fetch(ctx, j.key)
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = &TimeoutError{After: q.o.Timeout, Err: err}
		}
		cancel()
		q.store(j.key, v, err)
	}

	q.mu.Lock()
	ns.running--
	delete(ns.jobs, j.key)
	q.startLocked(name, ns)
	if ns.running == 0 && len(ns.waiting) == 0 && len(ns.jobs) == 0 {
		delete(q.namespaces, name)
	}
	waiters := j.waiters
	j.waiters = nil
	q.mu.Unlock()

	if q.notify != nil {
		for w := range waiters {
			q.notify(w)
		}
	}
}

func (q *Queue[V]) store(key string, v V, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.o.Clock.Now()
	r := q.results[key]
	if r == nil {
		r = &result[V]{}
		q.results[key] = r
	}
	q.tick++
	r.used, r.at = q.tick, now
	if err == nil {
		r.value, r.err, r.failures, r.retryAt = v, nil, 0, time.Time{}
	} else {
		var zero V
		r.value, r.err = zero, err
		r.failures++
		r.retryAt = now.Add(q.backoff(r.failures))
	}
	for len(q.results) > q.o.MaxCached {
		q.evictLocked()
	}
}

// backoff after n failures in a row: Backoff, doubling, up to MaxBackoff.
func (q *Queue[V]) backoff(n int) time.Duration {
	d := q.o.Backoff
	for i := 1; i < n && d < q.o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, q.o.MaxBackoff)
}

// evictLocked drops the least recently used result. O(n), and only when
// MaxCached is exceeded, which a controller's working set should not do.
func (q *Queue[V]) evictLocked() {
	var oldest string
	var used uint64
	first := true
	for k, r := range q.results {
		if first || r.used < used {
			oldest, used, first = k, r.used, false
		}
	}
	delete(q.results, oldest)
}
