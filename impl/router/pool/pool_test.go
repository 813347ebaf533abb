package pool

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/router/fibers"
)

// memFiberd is an in-memory fibers.Client: the pool's unit tests need exact
// control over when acquisitions complete and whether releases fail.
type memFiberd struct {
	mu        sync.Mutex
	next      int
	live      map[string]bool
	gate      chan struct{} // when set, Acquire waits for it
	failRel   atomic.Bool
	acquires  atomic.Int64
	releaseOK atomic.Int64
}

var testHome = fibers.Home{Endpoint: "home:9090", Name: "home"}

func newMem() *memFiberd { return &memFiberd{live: map[string]bool{}} }

func (m *memFiberd) Acquire(ctx context.Context, home fibers.Home) (fibers.Fiber, error) {
	m.mu.Lock()
	gate := m.gate
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return fibers.Fiber{}, ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	id := "f" + strconv.Itoa(m.next)
	m.live[id] = true
	m.acquires.Add(1)
	return fibers.Fiber{ID: id, Home: home}, nil
}

func (m *memFiberd) Release(_ context.Context, f fibers.Fiber) error {
	if m.failRel.Load() {
		return errors.New("fiberd unreachable")
	}
	m.mu.Lock()
	delete(m.live, f.ID)
	m.mu.Unlock()
	m.releaseOK.Add(1)
	return nil
}

func (m *memFiberd) PrepareProxy(*http.Request, fibers.Fiber) {}

func (m *memFiberd) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

type countObs struct{ acquired, released, leaked, queue atomic.Int64 }

func (o *countObs) Acquired(time.Duration, time.Duration) { o.acquired.Add(1) }
func (o *countObs) Released()                             { o.released.Add(1) }
func (o *countObs) Leaked()                               { o.leaked.Add(1) }
func (o *countObs) QueueDepth(delta int)                  { o.queue.Add(int64(delta)) }

func newPool(t *testing.T, cfg Config) (*Pool, *memFiberd, *countObs) {
	t.Helper()
	if cfg.Home == (fibers.Home{}) {
		cfg.Home = testHome
	}
	if cfg.Mode == "" {
		cfg.Mode = Fresh
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = time.Minute
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 10
	}
	m, o := newMem(), &countObs{}
	p := New(cfg, m, o, nil)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, m, o
}

func settle(t *testing.T, p *Pool) {
	t.Helper()
	if err := p.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func waitQueued(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue never reached %d: %+v", n, p.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFreshReleasesEveryFiber(t *testing.T) {
	p, m, o := newPool(t, Config{})
	for i := 0; i < 3; i++ {
		l, err := p.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if l.Reused {
			t.Fatal("fresh lease reused a fiber")
		}
		l.Done(true) // even a clean request's fiber is released in fresh mode
		l.Done(true) // and a second Done is harmless
	}
	settle(t, p)
	if m.liveCount() != 0 || o.acquired.Load() != 3 || o.released.Load() != 3 || p.Stats().Live != 0 {
		t.Fatalf("live %d, acquired %d, released %d, stats %+v", m.liveCount(), o.acquired.Load(), o.released.Load(), p.Stats())
	}
}

func TestMaxFibersQueuesAndHandsOverTheSlot(t *testing.T) {
	p, m, o := newPool(t, Config{MaxFibers: 2})
	a, _ := p.Get(context.Background())
	b, _ := p.Get(context.Background())
	got := make(chan *Lease)
	go func() {
		l, err := p.Get(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, p, 1)
	if o.queue.Load() != 1 {
		t.Fatalf("queue depth metric %d", o.queue.Load())
	}
	if m.acquires.Load() != 2 {
		t.Fatalf("%d acquisitions at max 2", m.acquires.Load())
	}
	a.Done(false)
	c := <-got
	if c.Fiber.ID == a.Fiber.ID || c.Fiber.ID == b.Fiber.ID {
		t.Fatal("queued request got a used fiber in fresh mode")
	}
	b.Done(false)
	c.Done(false)
	settle(t, p)
	if p.Stats() != (Stats{}) || m.liveCount() != 0 || o.queue.Load() != 0 {
		t.Fatalf("stats %+v, live %d, queue %d", p.Stats(), m.liveCount(), o.queue.Load())
	}
}

func TestQueueTimeoutAndQueueFull(t *testing.T) {
	p, _, _ := newPool(t, Config{MaxFibers: 1, QueueTimeout: 20 * time.Millisecond, MaxQueue: 1})
	a, _ := p.Get(context.Background())
	if _, err := p.Get(context.Background()); !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("at max-scale: %v, want ErrQueueTimeout", err)
	}
	// One waiter fills the queue; the next is refused at once.
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { _, err := p.Get(ctx); waited <- err }()
	waitQueued(t, p, 1)
	if _, err := p.Get(context.Background()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("queue full: %v, want ErrQueueFull", err)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) && !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	a.Done(false)
	settle(t, p)
	if st := p.Stats(); st.Live != 0 || st.Queued != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestReuseKeepsCleanFibersAndHandsThemToWaiters(t *testing.T) {
	p, m, _ := newPool(t, Config{Mode: Reuse, MaxFibers: 1})
	a, _ := p.Get(context.Background())
	a.Done(true)
	b, _ := p.Get(context.Background())
	if !b.Reused || b.Fiber.ID != a.Fiber.ID {
		t.Fatalf("reuse did not return the idle fiber: %+v", b)
	}
	got := make(chan *Lease)
	go func() { l, _ := p.Get(context.Background()); got <- l }()
	waitQueued(t, p, 1)
	b.Done(true)
	c := <-got
	if c.Fiber.ID != a.Fiber.ID {
		t.Fatal("waiter did not get the fiber handed back")
	}
	// A request that failed leaves its fiber unfit: released, not kept.
	c.Done(false)
	settle(t, p)
	if m.liveCount() != 0 || p.Stats().Idle != 0 {
		t.Fatalf("live %d, stats %+v", m.liveCount(), p.Stats())
	}
	if m.acquires.Load() != 1 {
		t.Fatalf("%d acquisitions, want 1", m.acquires.Load())
	}
}

func TestIdleFibersAreReaped(t *testing.T) {
	p, m, _ := newPool(t, Config{Mode: Reuse, IdleTimeout: time.Minute})
	a, _ := p.Get(context.Background())
	a.Done(true)
	p.reapIdleAt(time.Now()) // not idle long enough
	if p.Stats().Idle != 1 {
		t.Fatalf("%+v", p.Stats())
	}
	p.reapIdleAt(time.Now().Add(time.Minute))
	settle(t, p)
	if p.Stats().Idle != 0 || m.liveCount() != 0 {
		t.Fatalf("idle fiber not released: %+v live %d", p.Stats(), m.liveCount())
	}
}

func TestCancelWhileAcquiringReleasesTheOrphan(t *testing.T) {
	p, m, o := newPool(t, Config{MaxFibers: 1})
	gate := make(chan struct{})
	m.mu.Lock()
	m.gate = gate
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := p.Get(ctx); done <- err }()
	for p.Stats().Live != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("%v", err)
	}
	close(gate) // fiberd completes the acquisition nobody waits for any more
	settle(t, p)
	if m.liveCount() != 0 || o.acquired.Load() != 1 || o.released.Load() != 1 || p.Stats().Live != 0 {
		t.Fatalf("orphan: live %d acquired %d released %d stats %+v", m.liveCount(), o.acquired.Load(), o.released.Load(), p.Stats())
	}
}

func TestFailedReleaseIsCountedAsLeak(t *testing.T) {
	var errs atomic.Int64
	m, o := newMem(), &countObs{}
	p := New(Config{Home: testHome, Mode: Fresh, QueueTimeout: time.Second, MaxQueue: 1}, m, o, func(error) { errs.Add(1) })
	defer p.Close(context.Background())
	m.failRel.Store(true)
	l, _ := p.Get(context.Background())
	l.Done(false)
	settle(t, p)
	if o.leaked.Load() != 1 || errs.Load() != 1 || p.Stats().Live != 0 {
		t.Fatalf("leaked %d errors %d stats %+v", o.leaked.Load(), errs.Load(), p.Stats())
	}
}

func TestCloseFailsWaitersAndReleasesIdle(t *testing.T) {
	m, o := newMem(), &countObs{}
	p := New(Config{Home: testHome, Mode: Reuse, MaxFibers: 2, QueueTimeout: time.Minute, MaxQueue: 5}, m, o, nil)
	a, _ := p.Get(context.Background())
	b, _ := p.Get(context.Background())
	a.Done(true) // idle
	c, _ := p.Get(context.Background())
	waiter := make(chan error)
	go func() { _, err := p.Get(context.Background()); waiter <- err }()
	waitQueued(t, p, 1)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-waiter; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiter: %v", err)
	}
	if _, err := p.Get(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	b.Done(true) // a busy fiber ending after Close is released, not kept
	c.Done(true)
	settle(t, p)
	if m.liveCount() != 0 {
		t.Fatalf("%d fibers live after close", m.liveCount())
	}
}

func TestRaisingMaxFibersWakesWaiters(t *testing.T) {
	p, _, _ := newPool(t, Config{MaxFibers: 1})
	a, _ := p.Get(context.Background())
	got := make(chan error)
	go func() {
		l, err := p.Get(context.Background())
		if err == nil {
			l.Done(false)
		}
		got <- err
	}()
	waitQueued(t, p, 1)
	p.Update(Config{Home: testHome, Mode: Fresh, MaxFibers: 2, QueueTimeout: time.Minute, MaxQueue: 10})
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	a.Done(false)
}

// A Home with another name at the same endpoint is another Home (the old
// one was replaced and its address reused): idle fibers of the old one are
// released, not offered, and a busy one ending later is not kept.
func TestRenamedHomeIsAReplacedHome(t *testing.T) {
	p, m, _ := newPool(t, Config{Mode: Reuse})
	idle, _ := p.Get(context.Background())
	busy, _ := p.Get(context.Background())
	idle.Done(true)
	renamed := testHome
	renamed.Name = "home-2"
	p.Update(Config{Home: renamed, Mode: Reuse, QueueTimeout: time.Minute, MaxQueue: 10})
	busy.Done(true)
	settle(t, p)
	if m.liveCount() != 0 || p.Stats().Idle != 0 {
		t.Fatalf("%d fibers of the replaced Home still live, %d idle", m.liveCount(), p.Stats().Idle)
	}
	l, err := p.Get(context.Background())
	if err != nil || l.Reused || l.Fiber.Home != renamed {
		t.Fatalf("lease %+v, %v: want a new fiber of %v", l, err, renamed)
	}
	l.Done(false)
}
