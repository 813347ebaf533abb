// Package pool keeps one Revision's fibers: a warm pool of pre-started,
// never-used fibers (so a fresh acquisition is a list pop, not a process
// start), the fibers leased to fiber-router, the grant's maximum, the
// one-request-at-a-time rule, fresh vs reuse, idle release and replacement of
// fibers that die.
package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"lampyr.dev/serving/impl/fiberd/backend"
)

// Modes.
const (
	ModeFresh = "fresh"
	ModeReuse = "reuse"
)

// Errors the pool returns; the API maps each to a status code.
var (
	ErrMaxFibers = errors.New("the grant's maxFibers fibers are all leased")
	ErrUnknown   = errors.New("no such fiber (released, reaped or died)")
	ErrBusy      = errors.New("fiber is serving another request (one request at a time per fiber)")
	ErrSpent     = errors.New("fiber already served its request (fresh mode: one request per fiber); acquire a new one")
	ErrClosed    = errors.New("pool closed")
	ErrNotLeased = errors.New("fiber is in the warm pool, not leased; acquire it first")
	// ErrTunnelFresh: a tunnel cannot count requests, and a fresh fiber
	// must serve exactly one.
	ErrTunnelFresh = errors.New("tunnels are for execution mode reuse; a fresh fiber serves one proxied request")
)

// Config is one Revision's pool policy.
type Config struct {
	Spec    *backend.Spec
	Backend backend.Backend
	// Mode is fresh or reuse.
	Mode string
	// IdleTimeout releases reuse-mode fibers idle that long.
	IdleTimeout time.Duration
	// MaxFibers bounds warm + leased fibers together, so the pool never
	// holds more memory than the grant admitted.
	MaxFibers int
	// WarmTarget is how many never-used fibers to keep ready.
	WarmTarget int
	// LeaseTimeout reaps leased fibers nobody used for that long (a router
	// that died between acquiring a fiber and sending it the request must
	// not leak it); a fiber that served its request and was never released
	// is reaped 10 s after. Fresh mode only; reuse uses IdleTimeout.
	LeaseTimeout time.Duration
	// StartConcurrency bounds the fiber starts running at once, for the
	// warm pool and for acquisitions alike: a burst of requests on an empty
	// pool waits for a start slot instead of starting up to MaxFibers
	// sandboxes together, which on a small node made every start miss its
	// start-up timeout (HandlerNotListening, "helper did not report ready").
	StartConcurrency int
	// WarmIdle empties the warm pool once the pool has been idle that long
	// (IdleFor: no fiber leased, no Acquire under way): its warm fibers
	// end and it starts none until the next Acquire, which starts its own
	// fiber as on an empty pool and then re-arms the refill to WarmTarget.
	// An idle Home then holds no fiber at all (issue 32, density). 0:
	// never, the warm pool is kept however long nothing is asked.
	WarmIdle time.Duration
	// Observer, if set, is told about events (for metrics).
	Observer Observer
	Logf     func(format string, args ...any)
}

// Observer receives pool events.
type Observer interface {
	FiberStarted(d time.Duration, err error)
	FiberAcquired(d time.Duration, warm bool)
	FiberEnded(reason string)
}

// WarmIdleObserver is an Observer that is also told when the warm pool is
// emptied after WarmIdle, with how many warm fibers ended then.
type WarmIdleObserver interface {
	WarmPoolEmptied(fibers int)
}

// reasonWarmIdle is the FiberEnded reason of the warm fibers ended when
// the pool goes quiet (WarmIdle).
const reasonWarmIdle = "warm idle"

// Fiber is a fiber the pool holds.
type Fiber struct {
	backend.Fiber
	StartedAt time.Time

	state    string // warm, acquired, busy, spent
	lastUsed time.Time
	requests int64
	ending   bool
	tunneled bool // busy with an open tunnel rather than one request

	tOnce     sync.Once
	transport *http.Transport
}

// Transport returns the fiber's HTTP transport, made by mk on first use, so
// requests to a reused fiber share its connections; the pool closes them
// when the fiber ends.
func (f *Fiber) Transport(mk func() *http.Transport) *http.Transport {
	f.tOnce.Do(func() { f.transport = mk() })
	return f.transport
}

// Snapshot is a fiber's state at one moment.
type Snapshot struct {
	ID        string
	State     string
	StartedAt time.Time
	Requests  int64
}

// Pool holds one Revision's fibers.
type Pool struct {
	cfg Config

	mu       sync.Mutex
	fibers   map[string]*Fiber
	warm     []*Fiber // FIFO: the oldest warm fiber is handed out first
	starting int
	closed   bool
	changed  chan struct{} // closed and replaced on every state change
	warmOnce bool          // the warm target has been reached once

	// acquiring counts Acquire calls under way; idleSince is when the
	// pool last had neither a leased fiber nor an Acquire under way (zero
	// while it has one); quiet: the warm pool was emptied after WarmIdle
	// and is not refilled until the next Acquire.
	acquiring int
	idleSince time.Time
	quiet     bool

	// Consecutive failed starts: the handler's own failure of the last
	// one (nil if the sandbox failed), how many, and when the next start
	// may begin (see recordStartLocked).
	failure   *backend.StartFailure
	failures  int
	backoff   time.Duration
	notBefore time.Time

	// starts holds one token per running Backend.Start (StartConcurrency).
	starts chan struct{}

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup

	// rounds counts the reaper's and the refill loop's passes (tests: an
	// idle pool does not wake).
	rounds atomic.Int64
}

// New starts the pool's refill and reaper loops.
func New(cfg Config) (*Pool, error) {
	if cfg.Spec == nil || cfg.Backend == nil {
		return nil, errors.New("pool: Spec and Backend are required")
	}
	if cfg.MaxFibers <= 0 {
		return nil, fmt.Errorf("pool: MaxFibers %d must be > 0", cfg.MaxFibers)
	}
	switch cfg.Mode {
	case ModeFresh:
	case ModeReuse:
		if cfg.IdleTimeout <= 0 {
			return nil, errors.New("pool: reuse mode needs IdleTimeout > 0")
		}
	default:
		return nil, fmt.Errorf("pool: mode %q: want fresh or reuse", cfg.Mode)
	}
	if cfg.WarmTarget < 0 {
		cfg.WarmTarget = 0
	}
	if cfg.StartConcurrency <= 0 {
		// Starting a fiber mostly waits (exec, handler start-up), so a few
		// in parallel refill the pool faster even on two cores.
		cfg.StartConcurrency = 4
	}
	if cfg.LeaseTimeout <= 0 {
		cfg.LeaseTimeout = 5 * time.Minute
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	p := &Pool{
		// Without a warm pool there is nothing to wait for before serving.
		warmOnce:  cfg.WarmTarget == 0,
		idleSince: time.Now(),
		cfg:       cfg,
		fibers:    map[string]*Fiber{},
		changed:   make(chan struct{}),
		starts:    make(chan struct{}, cfg.StartConcurrency),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	p.wg.Add(2)
	go p.refillLoop()
	go p.reapLoop()
	p.kick()
	if pr, ok := cfg.Backend.(backend.Preparer); ok {
		pr.Prepare(cfg.Spec)
	}
	return p, nil
}

// Mode is the pool's execution mode.
func (p *Pool) Mode() string { return p.cfg.Mode }

// MaxFibers is the pool's maximum.
func (p *Pool) MaxFibers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.MaxFibers
}

// SetMaxFibers applies a renewed grant's maximum; surplus warm fibers are
// destroyed, leased ones are left to finish.
func (p *Pool) SetMaxFibers(n int) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	p.cfg.MaxFibers = n
	var surplus []*Fiber
	for len(p.fibers)+p.starting > n && len(p.warm) > 0 {
		f := p.warm[len(p.warm)-1]
		p.warm = p.warm[:len(p.warm)-1]
		surplus = append(surplus, f)
		f.ending = true
		delete(p.fibers, f.ID())
	}
	p.notifyLocked()
	p.mu.Unlock()
	for _, f := range surplus {
		go p.end(f, "max lowered")
	}
}

// Warm reports whether the warm target was reached at least once (readiness:
// once warm, a Home stays ready while its fibers are all leased).
func (p *Pool) Warm() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.warmOnce
}

func newID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// notifyLocked tells the waiters on p.changed (Acquire, Begin, the reaper)
// and the refill loop that the pool's state changed.
func (p *Pool) notifyLocked() {
	p.idleLocked()
	close(p.changed)
	p.changed = make(chan struct{})
	p.kick()
}

func (p *Pool) leasedLocked() int { return len(p.fibers) - len(p.warm) }

// idleLocked keeps idleSince: zero while a fiber is leased or an Acquire is
// under way, else when that last stopped. Every change of the leased count
// goes through notifyLocked, which calls it; Acquire calls it for its own
// start and end.
func (p *Pool) idleLocked() {
	switch {
	case p.leasedLocked() > 0 || p.acquiring > 0:
		p.idleSince = time.Time{}
	case p.idleSince.IsZero():
		p.idleSince = time.Now()
	}
}

// IdleFor is how long the pool has had no fiber leased (acquired, busy,
// tunneled or spent and not yet released) and no Acquire under way; 0 while
// it has. A pool never used counts from its creation.
func (p *Pool) IdleFor() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idleSince.IsZero() {
		return 0
	}
	return time.Since(p.idleSince)
}

// Quiet reports whether the warm pool was emptied after WarmIdle without a
// request and is not refilled until the next Acquire.
func (p *Pool) Quiet() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.quiet
}

// quietDeadlineLocked is when the pool goes quiet (WarmIdle after it
// became idle), or zero if it does not in its present state: WarmIdle off,
// no warm pool to empty, already quiet, busy, or never warm yet (a pool
// whose starts keep failing is left to its back-off and its readiness
// answer, not silenced).
func (p *Pool) quietDeadlineLocked() time.Time {
	if p.cfg.WarmIdle <= 0 || p.cfg.WarmTarget == 0 || p.quiet || !p.warmOnce || p.closed || p.idleSince.IsZero() {
		return time.Time{}
	}
	return p.idleSince.Add(p.cfg.WarmIdle)
}

func (p *Pool) warmTargetLocked() int {
	if p.quiet {
		return 0
	}
	t := p.cfg.WarmTarget
	if room := p.cfg.MaxFibers - p.leasedLocked(); t > room {
		t = room
	}
	return t
}

// Acquire leases a never-used fiber: from the warm pool if one is ready,
// otherwise by starting one (or waiting for one being started). It fails
// with ErrMaxFibers when MaxFibers fibers are leased. On a quiet pool
// (WarmIdle) it starts the fiber for its request first and then re-arms
// the refill, so the warm starts do not compete with the one the request
// waits for.
func (p *Pool) Acquire(ctx context.Context) (*Fiber, error) {
	p.mu.Lock()
	p.acquiring++
	p.idleLocked()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.acquiring--
		rearm := p.quiet && !p.closed
		p.quiet = false
		p.idleLocked()
		if rearm {
			// Wakes the refill loop (and the reaper: no quiet deadline
			// until the pool is idle again).
			p.notifyLocked()
		}
		p.mu.Unlock()
		if rearm {
			p.cfg.Logf("a request after the warm pool was emptied: refilling it to %d fibers", p.cfg.WarmTarget)
		}
	}()
	return p.acquire(ctx)
}

func (p *Pool) acquire(ctx context.Context) (*Fiber, error) {
	t0 := time.Now()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if p.leasedLocked() >= p.cfg.MaxFibers {
			p.mu.Unlock()
			return nil, ErrMaxFibers
		}
		if n := len(p.warm); n > 0 {
			f := p.warm[0]
			p.warm = p.warm[1:]
			f.state, f.lastUsed = "acquired", time.Now()
			p.notifyLocked()
			p.mu.Unlock()
			p.kick()
			if p.cfg.Observer != nil {
				p.cfg.Observer.FiberAcquired(time.Since(t0), true)
			}
			return f, nil
		}
		if wait := time.Until(p.notBefore); wait > 0 && p.failure != nil {
			// A handler that keeps failing is not started again for every
			// request: the last failure stands until the back-off ends.
			f := *p.failure
			p.mu.Unlock()
			return nil, &f
		}
		if len(p.fibers)+p.starting < p.cfg.MaxFibers {
			p.starting++
			p.mu.Unlock()
			f, err := p.startOne(ctx, "acquired")
			if err != nil {
				return nil, err
			}
			if p.cfg.Observer != nil {
				p.cfg.Observer.FiberAcquired(time.Since(t0), false)
			}
			return f, nil
		}
		// Every remaining slot is a fiber being started: wait for it.
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// startOne starts a fiber for a slot already reserved in p.starting. It
// waits (as long as ctx allows) for one of the StartConcurrency start slots;
// the start itself then has the spec's start-up timeout plus 10 s, however
// long the wait was.
func (p *Pool) startOne(ctx context.Context, state string) (*Fiber, error) {
	select {
	case p.starts <- struct{}{}:
	case <-ctx.Done():
		p.unreserveStart()
		return nil, ctx.Err()
	case <-p.stop:
		p.unreserveStart()
		return nil, ErrClosed
	}
	id := newID()
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, p.cfg.Spec.StartupTimeout+10*time.Second)
	bf, err := p.cfg.Backend.Start(sctx, id, p.cfg.Spec)
	cancel()
	<-p.starts
	if p.cfg.Observer != nil {
		p.cfg.Observer.FiberStarted(time.Since(t0), err)
	}
	p.mu.Lock()
	p.starting--
	p.recordStartLocked(err)
	if err != nil {
		p.notifyLocked()
		p.mu.Unlock()
		return nil, err
	}
	if p.closed {
		p.mu.Unlock()
		bf.Destroy()
		return nil, ErrClosed
	}
	if state == "warm" && p.quiet {
		// Started for the warm pool before it was emptied (a warm fiber
		// that died and was being replaced): not kept.
		p.notifyLocked()
		p.mu.Unlock()
		bf.Destroy()
		if p.cfg.Observer != nil {
			p.cfg.Observer.FiberEnded(reasonWarmIdle)
		}
		return nil, errQuiet
	}
	now := time.Now()
	f := &Fiber{Fiber: bf, StartedAt: now, state: state, lastUsed: now}
	p.fibers[id] = f
	if state == "warm" {
		p.warm = append(p.warm, f)
		if len(p.warm) >= p.warmTargetLocked() {
			p.warmOnce = true
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
	go p.watch(f)
	return f, nil
}

// errQuiet: a warm fiber finished starting after the warm pool was emptied
// (WarmIdle) and was ended at once.
var errQuiet = errors.New("the warm pool was emptied meanwhile (warm idle)")

// unreserveStart gives back a start slot reserved in p.starting that never
// began.
func (p *Pool) unreserveStart() {
	p.mu.Lock()
	p.starting--
	p.notifyLocked()
	p.mu.Unlock()
}

// Back-off between failed starts: doubling from the first to the longest,
// reset by a start that succeeds. A handler that fails by itself (exits,
// never listens) will fail the same way next time, so it is retried at
// most once a minute, like kubelet's crash-loop back-off but sooner to
// notice a dependency that came back; a sandbox failure may be transient
// (ids, cgroups) and is retried within seconds.
const (
	firstStartBackoff   = 100 * time.Millisecond
	maxStartBackoff     = 5 * time.Second
	maxHandlerFailDelay = time.Minute
)

// recordStartLocked updates the failure record and back-off with the
// outcome of a start.
func (p *Pool) recordStartLocked(err error) {
	if err == nil {
		p.failure, p.failures, p.backoff, p.notBefore = nil, 0, 0, time.Time{}
		return
	}
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) {
		return
	}
	p.failures++
	limit := maxStartBackoff
	var sf *backend.StartFailure
	if errors.As(err, &sf) {
		f := *sf
		p.failure = &f
		limit = maxHandlerFailDelay
	} else {
		p.failure = nil
	}
	p.backoff = min(max(2*p.backoff, firstStartBackoff), limit)
	p.notBefore = time.Now().Add(p.backoff)
}

// StartFailure is the handler's own failure that ended the last fiber
// start, if every start since the last one that succeeded failed and the
// last failed that way, with the number of consecutive failed starts. A
// start that succeeds clears it.
func (p *Pool) StartFailure() (*backend.StartFailure, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failure == nil {
		return nil, 0
	}
	f := *p.failure
	return &f, p.failures
}

// watch replaces a fiber that dies on its own (killed, OOM, crashed).
func (p *Pool) watch(f *Fiber) {
	select {
	case <-f.Done():
	case <-p.stop:
		return
	}
	p.mu.Lock()
	if f.ending {
		p.mu.Unlock()
		return
	}
	f.ending = true
	p.removeLocked(f)
	p.mu.Unlock()
	p.cfg.Logf("fiber %s died (%v); replacing it", f.ID(), f.Err())
	p.end(f, "died")
	p.kick()
}

func (p *Pool) removeLocked(f *Fiber) {
	delete(p.fibers, f.ID())
	for i, w := range p.warm {
		if w == f {
			p.warm = append(p.warm[:i], p.warm[i+1:]...)
			break
		}
	}
	p.notifyLocked()
}

func (p *Pool) end(f *Fiber, reason string) {
	f.tOnce.Do(func() {}) // no transport may be made from here on
	if f.transport != nil {
		f.transport.CloseIdleConnections()
	}
	if err := f.Destroy(); err != nil {
		p.cfg.Logf("destroying fiber %s: %v", f.ID(), err)
	}
	if p.cfg.Observer != nil {
		p.cfg.Observer.FiberEnded(reason)
	}
	p.kick()
}

// Release destroys a leased fiber; it returns once its processes are gone.
func (p *Pool) Release(id string) error {
	p.mu.Lock()
	f, ok := p.fibers[id]
	if !ok || f.ending {
		p.mu.Unlock()
		return ErrUnknown
	}
	if f.state == "warm" {
		p.mu.Unlock()
		return ErrNotLeased
	}
	f.ending = true
	p.removeLocked(f)
	p.mu.Unlock()
	p.end(f, "released")
	return nil
}

// BusyWait is how long Begin waits for a reused fiber's previous request
// to end. A client that has read a whole response may send its next
// request before the proxy has marked the fiber free; that request waits
// this long instead of failing with ErrBusy.
const BusyWait = 100 * time.Millisecond

// Begin marks a leased fiber busy for one request. The returned func ends
// the request; in fresh mode the fiber is then spent. A fiber busy with
// another request is waited for up to BusyWait (or ctx) before ErrBusy.
func (p *Pool) Begin(ctx context.Context, id string) (*Fiber, func(), error) {
	return p.begin(ctx, id, false)
}

// BeginTunnel marks a leased reuse-mode fiber busy for a tunnel: it stays
// busy (List reports it tunneled) until the returned func is called, so no
// other request or tunnel reaches it meanwhile. Fresh-mode fibers refuse
// with ErrTunnelFresh.
func (p *Pool) BeginTunnel(ctx context.Context, id string) (*Fiber, func(), error) {
	if p.cfg.Mode != ModeReuse {
		return nil, nil, ErrTunnelFresh
	}
	return p.begin(ctx, id, true)
}

func (p *Pool) begin(ctx context.Context, id string, tunnel bool) (*Fiber, func(), error) {
	deadline := time.NewTimer(BusyWait)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		f, ok := p.fibers[id]
		if ok && !f.ending && f.state == "busy" {
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-deadline.C:
			case <-ctx.Done():
			}
			p.mu.Lock()
		}
		f2, end, err := p.beginLocked(id, tunnel)
		p.mu.Unlock()
		return f2, end, err
	}
}

func (p *Pool) beginLocked(id string, tunnel bool) (*Fiber, func(), error) {
	f, ok := p.fibers[id]
	if !ok || f.ending {
		return nil, nil, ErrUnknown
	}
	switch f.state {
	case "warm":
		return nil, nil, ErrNotLeased
	case "busy":
		return nil, nil, ErrBusy
	case "spent":
		return nil, nil, ErrSpent
	}
	f.state = "busy"
	f.tunneled = tunnel
	f.requests++
	return f, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		f.lastUsed = time.Now()
		f.tunneled = false
		if f.state != "busy" {
			return
		}
		if p.cfg.Mode == ModeFresh {
			f.state = "spent"
		} else {
			f.state = "acquired"
		}
		p.notifyLocked()
	}, nil
}

// UnusedLeases counts fresh fibers leased and not yet used: a router that
// leased one sends its request next. Reuse-mode fibers the router keeps
// idle are not counted: it may keep them until their idle timeout.
func (p *Pool) UnusedLeases() int {
	if p.cfg.Mode != ModeFresh {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, f := range p.fibers {
		if f.state == "acquired" && !f.ending {
			n++
		}
	}
	return n
}

// List returns every fiber, oldest first.
func (p *Pool) List() []Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Snapshot, 0, len(p.fibers))
	for _, f := range p.fibers {
		st := f.state
		if f.tunneled {
			st = "tunneled"
		}
		out = append(out, Snapshot{ID: f.ID(), State: st, StartedAt: f.StartedAt, Requests: f.requests})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out
}

// Counts returns warm, leased and starting fiber counts.
func (p *Pool) Counts() (warm, leased, starting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.warm), p.leasedLocked(), p.starting
}

// refillLoop starts warm fibers up to the warm target. It runs when the
// pool's state changes (notifyLocked, kick) and when a start back-off ends,
// not on a fixed tick: an idle Home does not wake (it polled every second).
func (p *Pool) refillLoop() {
	defer p.wg.Done()
	backoff := time.NewTimer(time.Hour)
	defer backoff.Stop()
	for {
		// No start begins before the back-off of the last failure ends
		// (recordStartLocked), whoever wakes the loop: a broken snapshot
		// or handler must not spin the CPU.
		var due <-chan time.Time
		p.mu.Lock()
		if d := time.Until(p.notBefore); d > 0 {
			backoff.Reset(d)
			due = backoff.C
		}
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-p.wake:
		case <-due:
		}
		backoff.Stop()
		p.rounds.Add(1)
		for {
			p.mu.Lock()
			need := !p.closed && !time.Now().Before(p.notBefore) && len(p.warm)+p.starting < p.warmTargetLocked() && len(p.fibers)+p.starting < p.cfg.MaxFibers
			if need {
				p.starting++
			}
			p.mu.Unlock()
			if !need {
				break
			}
			go func() {
				// startOne waits for a start slot and bounds the start.
				if _, err := p.startOne(context.Background(), "warm"); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, errQuiet) {
					p.cfg.Logf("warming a fiber: %v", err)
				}
				p.kick()
			}()
		}
	}
}

// spentGrace is how long a fresh fiber that served its request may stay
// unreleased before the reaper ends it.
const spentGrace = 10 * time.Second

// reapDeadlineLocked is when the reaper ends f and why, or zero if it never
// does in f's present state.
func (p *Pool) reapDeadlineLocked(f *Fiber) (time.Time, string) {
	switch {
	case f.ending:
	case f.state == "acquired" && p.cfg.Mode == ModeReuse:
		return f.lastUsed.Add(p.cfg.IdleTimeout), "idle timeout"
	case f.state == "acquired" && p.cfg.Mode == ModeFresh:
		return f.lastUsed.Add(p.cfg.LeaseTimeout), "lease unused"
	case f.state == "spent":
		return f.lastUsed.Add(spentGrace), "spent, not released"
	}
	return time.Time{}, ""
}

// reapLoop releases idle reuse fibers, spent fresh fibers the router never
// released, and leases nobody used, and empties the warm pool after
// WarmIdle without a request. It sleeps until the earliest of their
// deadlines or the next change of the pool's state, not on a fixed tick:
// an idle Home (warm fibers only) has at most the WarmIdle deadline and
// wakes once for it, then not at all (issue 32: it woke every 100 ms, on
// the same two cores as everything else), and a deadline is met when it
// falls, not up to a tick later.
func (p *Pool) reapLoop() {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.rounds.Add(1)
		now := time.Now()
		var victims []*Fiber
		var reasons []string
		var next time.Time
		p.mu.Lock()
		for _, f := range p.fibers {
			at, reason := p.reapDeadlineLocked(f)
			switch {
			case at.IsZero():
			case !now.Before(at):
				f.ending = true
				p.removeLocked(f)
				victims = append(victims, f)
				reasons = append(reasons, reason)
			case next.IsZero() || at.Before(next):
				next = at
			}
		}
		var emptied []*Fiber
		var quietAfter time.Duration
		if at := p.quietDeadlineLocked(); !at.IsZero() {
			if now.Before(at) {
				if next.IsZero() || at.Before(next) {
					next = at
				}
			} else {
				p.quiet = true
				quietAfter = now.Sub(p.idleSince)
				emptied = append(emptied, p.warm...)
				for _, f := range emptied {
					f.ending = true
					delete(p.fibers, f.ID())
				}
				p.warm = nil
				p.notifyLocked()
			}
		}
		changed := p.changed
		p.mu.Unlock()
		if quietAfter > 0 {
			p.cfg.Logf("warm pool emptied after %s without a request: %d fibers ended", quietAfter.Round(time.Millisecond), len(emptied))
			if o, ok := p.cfg.Observer.(WarmIdleObserver); ok {
				o.WarmPoolEmptied(len(emptied))
			}
			for _, f := range emptied {
				p.end(f, reasonWarmIdle)
			}
			continue
		}
		for i, f := range victims {
			// Said in the Home's log: a lease nobody used or released is
			// a router that died holding it (the operations suite kills
			// one and reads these lines).
			p.cfg.Logf("fiber %s reaped: %s", f.ID(), reasons[i])
			p.end(f, reasons[i])
		}
		if len(victims) > 0 {
			// removeLocked replaced p.changed: look again at once.
			continue
		}
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			due = timer.C
		}
		select {
		case <-p.stop:
			return
		case <-changed:
		case <-due:
		}
		// Since Go 1.23 Reset discards a value the timer sent and nobody
		// received, so the next round needs no draining.
		timer.Stop()
	}
}

// Close destroys every fiber and stops the loops.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	all := make([]*Fiber, 0, len(p.fibers))
	for _, f := range p.fibers {
		f.ending = true
		all = append(all, f)
	}
	p.fibers = map[string]*Fiber{}
	p.warm = nil
	p.notifyLocked()
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	var wg sync.WaitGroup
	for _, f := range all {
		wg.Add(1)
		go func() { defer wg.Done(); f.Destroy() }()
	}
	wg.Wait()
}
