// Package pool leases fibers for one Revision: it enforces max-scale (the most
// fibers alive at once) and one active request per fiber, queues requests
// briefly when the Revision is at max-scale, and keeps idle fibers for reuse
// mode.
package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	"lampyr.dev/serving/impl/router/fibers"
)

// Mode is the Revision's execution mode.
type Mode string

// Execution modes (routermeta.Metadata.Mode).
const (
	Fresh Mode = "fresh"
	Reuse Mode = "reuse"
)

// Config is what a pool needs from the Revision's metadata and the router's
// flags.
type Config struct {
	// Home is where the Revision's fibers come from. A different Home
	// (another endpoint or another name) is a replaced Home: idle fibers of
	// the old one are not reused.
	Home fibers.Home
	Mode Mode
	// MaxFibers caps fibers alive at once (busy + idle + being acquired);
	// 0 leaves the cap to fiberd's own 429.
	MaxFibers int
	// IdleTimeout releases reuse-mode fibers nobody used for that long.
	IdleTimeout time.Duration
	// QueueTimeout is how long a request may wait for a slot.
	QueueTimeout time.Duration
	// MaxQueue bounds the waiters; beyond it requests fail at once.
	MaxQueue int
}

// Observer is told about every fiber the pool acquires and releases, and
// about queue depth, for metrics. All methods must be cheap and safe for
// concurrent use.
type Observer interface {
	// Acquired: fiberd leased a fiber after d (its POST's round trip,
	// including a fresh fiber's start), of which inFiberd in fiberd by its
	// own account (0: it did not say).
	Acquired(d, inFiberd time.Duration)
	Released()
	// Leaked: releasing failed for good; the fiber may still be alive.
	Leaked()
	QueueDepth(delta int)
}

// ErrQueueTimeout is returned when no slot freed up within QueueTimeout.
var ErrQueueTimeout = errors.New("revision at max-scale: no fiber freed up in time")

// ErrQueueFull is returned when MaxQueue requests are already waiting.
var ErrQueueFull = errors.New("revision at max-scale and its queue is full")

// ErrClosed is returned once the Revision was removed or became not ready.
var ErrClosed = errors.New("revision no longer routable")

// Pool leases fibers of one Revision.
type Pool struct {
	client  fibers.Client
	obs     Observer
	onError func(error) // release failures, for logs

	mu     sync.Mutex
	cfg    Config
	live   int           // slots held: fibers alive or being acquired
	idle   []idleFiber   // reuse mode, most recently used last
	queue  []chan *grant // FIFO waiters
	closed bool

	releases sync.WaitGroup // in-flight DELETEs, for Close/drain
	stop     chan struct{}
}

type idleFiber struct {
	f     fibers.Fiber
	since time.Time
}

// grant hands a waiter either an idle fiber (reuse) or a slot to acquire a
// new one with (fiber == nil). A slot is already counted in live.
type grant struct {
	fiber *fibers.Fiber
	// closed: the pool closed while the waiter queued; no slot is attached.
	closed bool
}

// New returns a pool. Call Close when the Revision goes away.
func New(cfg Config, client fibers.Client, obs Observer, onError func(error)) *Pool {
	if onError == nil {
		onError = func(error) {}
	}
	p := &Pool{client: client, obs: obs, onError: onError, cfg: cfg, stop: make(chan struct{})}
	go p.reapIdle()
	return p
}

// Update applies new metadata. Idle fibers of a different Home are released
// (the Home was replaced); busy ones finish where they are.
func (p *Pool) Update(cfg Config) {
	p.mu.Lock()
	old := p.cfg
	p.cfg = cfg
	var drop []idleFiber
	if old.Home != cfg.Home || cfg.Mode != Reuse {
		drop, p.idle = p.idle, nil
	}
	// A raised cap lets waiters proceed now rather than at the next release.
	var wake []chan *grant
	for len(p.queue) > 0 && (cfg.MaxFibers == 0 || p.live < cfg.MaxFibers) {
		wake = append(wake, p.queue[0])
		p.queue = p.queue[1:]
		p.live++
	}
	p.mu.Unlock()
	for _, w := range wake {
		w <- &grant{}
	}
	for _, f := range drop {
		p.releaseAsync(f.f)
	}
}

// Lease is one fiber held by one request.
type Lease struct {
	Fiber fibers.Fiber
	// Reused says the fiber served an earlier request (reuse mode).
	Reused bool
	pool   *Pool
	once   sync.Once
}

// Get leases a fiber for one request. It waits at most QueueTimeout (and never
// past ctx) for a slot when the Revision is at max-scale.
func (p *Pool) Get(ctx context.Context) (*Lease, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	cfg := p.cfg
	if n := len(p.idle); n > 0 {
		f := p.idle[n-1].f
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return &Lease{Fiber: f, Reused: true, pool: p}, nil
	}
	if cfg.MaxFibers == 0 || p.live < cfg.MaxFibers {
		p.live++
		p.mu.Unlock()
		return p.acquireInSlot(ctx, cfg)
	}
	if len(p.queue) >= cfg.MaxQueue {
		p.mu.Unlock()
		return nil, ErrQueueFull
	}
	w := make(chan *grant, 1)
	p.queue = append(p.queue, w)
	p.mu.Unlock()
	p.obs.QueueDepth(1)
	defer p.obs.QueueDepth(-1)

	timer := time.NewTimer(cfg.QueueTimeout)
	defer timer.Stop()
	var err error
	select {
	case g := <-w:
		return p.useGrant(ctx, cfg, g)
	case <-timer.C:
		err = ErrQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	for i, q := range p.queue {
		if q == w {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			p.mu.Unlock()
			return nil, err
		}
	}
	p.mu.Unlock()
	// Granted between the timeout and taking the lock: hand the grant on
	// rather than dropping a slot or an idle fiber.
	g := <-w
	switch {
	case g.closed:
	case g.fiber != nil:
		p.putBack(*g.fiber)
	default:
		p.freeSlot()
	}
	return nil, err
}

func (p *Pool) useGrant(ctx context.Context, cfg Config, g *grant) (*Lease, error) {
	if g.closed {
		return nil, ErrClosed
	}
	if g.fiber != nil {
		return &Lease{Fiber: *g.fiber, Reused: true, pool: p}, nil
	}
	return p.acquireInSlot(ctx, cfg)
}

// acquireInSlot asks fiberd for a fiber in a slot already counted in live.
// fiberd's 429 (its maxFibers is shared by every router replica) is retried
// until the queue budget is spent, as a local wait would be.
func (p *Pool) acquireInSlot(ctx context.Context, cfg Config) (*Lease, error) {
	deadline := time.Now().Add(cfg.QueueTimeout)
	for {
		f, err := p.acquireDetached(ctx, cfg.Home)
		if err == nil {
			return &Lease{Fiber: f, pool: p}, nil
		}
		var orphan errOrphaned
		if errors.As(err, &orphan) {
			return nil, orphan.error
		}
		ce, ok := fibers.IsCapacity(err)
		if !ok {
			p.freeSlot()
			return nil, err
		}
		wait := min(max(ce.RetryAfter/10, 5*time.Millisecond), 100*time.Millisecond)
		if time.Now().Add(wait).After(deadline) {
			p.freeSlot()
			return nil, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			p.freeSlot()
			return nil, ctx.Err()
		}
	}
}

// acquireTimeout bounds one acquire call when the request no longer waits.
const acquireTimeout = 30 * time.Second

type acquired struct {
	f   fibers.Fiber
	err error
}

// acquireDetached runs the acquire call on a context the client cannot
// cancel. Cancelling the POST mid-flight would not undo it in fiberd: the
// fiber would be leased to nobody and live until fiberd's own reaper finds
// it. If the request gives up first it returns at once, and the fiber,
// when it arrives, is released in the slot it already holds.
func (p *Pool) acquireDetached(ctx context.Context, home fibers.Home) (fibers.Fiber, error) {
	res := make(chan acquired, 1)
	p.releases.Add(1) // Close waits for orphaned acquisitions too
	go func() {
		defer p.releases.Done()
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), acquireTimeout)
		defer cancel()
		t0 := time.Now()
		f, err := p.client.Acquire(actx, home)
		if err == nil {
			p.obs.Acquired(time.Since(t0), f.InFiberd)
		}
		res <- acquired{f, err}
	}()
	select {
	case r := <-res:
		return r.f, r.err
	case <-ctx.Done():
		p.releases.Add(1)
		go func() {
			defer p.releases.Done()
			if r := <-res; r.err == nil {
				p.releaseNow(r.f)
			}
			p.freeSlot()
		}()
		return fibers.Fiber{}, errOrphaned{ctx.Err()}
	}
}

// errOrphaned: the request ended while its fiber was being acquired; the
// slot is already being returned by the orphan's cleanup.
type errOrphaned struct{ error }

func (e errOrphaned) Unwrap() error { return e.error }

// Done ends the lease. reusable says the request ended cleanly, so in reuse
// mode the fiber may serve the next request; otherwise (fresh mode, an
// error, a cancellation, a timeout) the fiber is released. Done is safe to
// call more than once; only the first call counts.
func (l *Lease) Done(reusable bool) {
	l.once.Do(func() {
		p := l.pool
		p.mu.Lock()
		keep := reusable && !p.closed && p.cfg.Mode == Reuse && p.cfg.Home == l.Fiber.Home
		p.mu.Unlock()
		if keep {
			p.putBack(l.Fiber)
			return
		}
		p.releaseAsync(l.Fiber)
	})
}

// putBack makes a healthy fiber available: straight to the oldest waiter, or
// onto the idle list.
func (p *Pool) putBack(f fibers.Fiber) {
	p.mu.Lock()
	if p.closed || p.cfg.Mode != Reuse {
		p.mu.Unlock()
		p.releaseAsync(f)
		return
	}
	if len(p.queue) > 0 {
		w := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		w <- &grant{fiber: &f}
		return
	}
	p.idle = append(p.idle, idleFiber{f: f, since: time.Now()})
	p.mu.Unlock()
}

// releaseAsync kills the fiber off the request's goroutine, so the client's
// response is complete without waiting for fiberd's DELETE. The slot stays
// counted until fiberd confirms, so a queued request never races fiberd's
// own maxFibers count.
func (p *Pool) releaseAsync(f fibers.Fiber) {
	p.releases.Add(1)
	go func() {
		defer p.releases.Done()
		p.releaseNow(f)
		p.freeSlot()
	}()
}

// releaseNow retries a failed DELETE a few times: a fiber left behind would
// hold memory in the Home and count against max-scale until fiberd's own
// request timeout reaps it.
func (p *Pool) releaseNow(f fibers.Fiber) {
	backoff := 50 * time.Millisecond
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = p.client.Release(ctx, f)
		cancel()
		if err == nil {
			p.obs.Released()
			return
		}
		time.Sleep(backoff)
		backoff *= 2
	}
	p.obs.Leaked()
	p.onError(err)
}

// freeSlot returns a slot: to the oldest waiter, or to the free count.
func (p *Pool) freeSlot() {
	p.mu.Lock()
	if len(p.queue) > 0 && !p.closed && (p.cfg.MaxFibers == 0 || p.live <= p.cfg.MaxFibers) {
		w := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		w <- &grant{}
		return
	}
	p.live--
	p.mu.Unlock()
}

// reapIdle releases reuse-mode fibers idle longer than IdleTimeout.
func (p *Pool) reapIdle() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.reapIdleAt(now)
		}
	}
}

func (p *Pool) reapIdleAt(now time.Time) {
	p.mu.Lock()
	if p.cfg.IdleTimeout <= 0 {
		p.mu.Unlock()
		return
	}
	var drop []idleFiber
	kept := p.idle[:0]
	for _, f := range p.idle {
		if now.Sub(f.since) >= p.cfg.IdleTimeout {
			drop = append(drop, f)
		} else {
			kept = append(kept, f)
		}
	}
	p.idle = kept
	p.mu.Unlock()
	for _, f := range drop {
		p.releaseAsync(f.f)
	}
}

// Stats is a snapshot for tests and debugging.
type Stats struct {
	Live, Idle, Queued int
}

// Stats returns the pool's counts.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Live: p.live, Idle: len(p.idle), Queued: len(p.queue)}
}

// Close stops new leases, fails waiters, releases idle fibers and waits (up
// to ctx) for every release already under way. Busy fibers are released by
// their own Done.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	drop := p.idle
	p.idle = nil
	queue := p.queue
	p.queue = nil
	p.mu.Unlock()
	for _, w := range queue {
		w <- &grant{closed: true}
	}
	for _, f := range drop {
		p.releaseAsync(f.f)
	}
	return p.Wait(ctx)
}

// Wait blocks until releases under way finish or ctx ends.
func (p *Pool) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { p.releases.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
