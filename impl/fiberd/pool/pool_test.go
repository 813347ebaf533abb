package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
)

// fakeBackend starts in-memory fibers: the pool's logic is tested here
// without processes (and under -race); the process backend has its own
// tests and fiberd's integration tests run both together.
type fakeBackend struct {
	started atomic.Int64
	// running and peak count starts in progress (peak: the most at once).
	running, peak atomic.Int64
	delay         time.Duration
	mu            sync.Mutex
	live          map[string]*fakeFiber
	// fail, while set, is the error of every start.
	fail error
}

type fakeFiber struct {
	id   string
	done chan struct{}
	once sync.Once
}

func (f *fakeFiber) ID() string                                 { return f.id }
func (f *fakeFiber) Dial(ctx context.Context) (net.Conn, error) { return nil, errors.New("fake") }
func (f *fakeFiber) Done() <-chan struct{}                      { return f.done }
func (f *fakeFiber) Err() error                                 { return nil }
func (f *fakeFiber) Destroy() error                             { f.kill(); return nil }
func (f *fakeFiber) kill()                                      { f.once.Do(func() { close(f.done) }) }

func (b *fakeBackend) Name() string { return "fake" }
func (b *fakeBackend) Start(ctx context.Context, id string, _ *backend.Spec) (backend.Fiber, error) {
	b.started.Add(1)
	n := b.running.Add(1)
	for {
		if p := b.peak.Load(); n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(b.delay)
	b.running.Add(-1)
	b.mu.Lock()
	fail := b.fail
	b.mu.Unlock()
	if fail != nil {
		return nil, fmt.Errorf("starting fiber %s: %w", id, fail)
	}
	f := &fakeFiber{id: id, done: make(chan struct{})}
	b.mu.Lock()
	if b.live == nil {
		b.live = map[string]*fakeFiber{}
	}
	b.live[id] = f
	b.mu.Unlock()
	return f, nil
}

func (b *fakeBackend) alive() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, f := range b.live {
		select {
		case <-f.done:
		default:
			n++
		}
	}
	return n
}

func newPool(t *testing.T, be *fakeBackend, mode string, max, warm int) *Pool {
	p, err := New(Config{Spec: &backend.Spec{StartupTimeout: time.Second}, Backend: be, Mode: mode, IdleTimeout: 200 * time.Millisecond,
		MaxFibers: max, WarmTarget: warm, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestConcurrentAcquireNeverExceedsMax(t *testing.T) {
	be := &fakeBackend{delay: 2 * time.Millisecond}
	p := newPool(t, be, ModeFresh, 5, 3)
	var wg sync.WaitGroup
	var got, refused atomic.Int64
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := p.Acquire(context.Background())
			switch {
			case errors.Is(err, ErrMaxFibers):
				refused.Add(1)
			case err != nil:
				t.Error(err)
			default:
				got.Add(1)
				_ = f
			}
		}()
	}
	wg.Wait()
	if got.Load() != 5 || refused.Load() != 35 {
		t.Fatalf("acquired %d, refused %d; want 5 and 35", got.Load(), refused.Load())
	}
	time.Sleep(50 * time.Millisecond)
	if n := be.alive(); n > 5 {
		t.Fatalf("%d fibers alive with MaxFibers 5", n)
	}
}

func TestFreshSpentAndBusy(t *testing.T) {
	p := newPool(t, &fakeBackend{}, ModeFresh, 3, 1)
	f, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, end, err := p.Begin(context.Background(), f.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Begin(context.Background(), f.ID()); !errors.Is(err, ErrBusy) {
		t.Fatalf("second concurrent request: %v, want ErrBusy", err)
	}
	end()
	if _, _, err := p.Begin(context.Background(), f.ID()); !errors.Is(err, ErrSpent) {
		t.Fatalf("second request into a fresh fiber: %v, want ErrSpent", err)
	}
	if err := p.Release(f.ID()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Begin(context.Background(), f.ID()); !errors.Is(err, ErrUnknown) {
		t.Fatalf("request into a released fiber: %v", err)
	}
	if err := p.Release(f.ID()); !errors.Is(err, ErrUnknown) {
		t.Fatalf("double release: %v", err)
	}
}

func TestWarmPoolRefillsAndReplacesDeadFibers(t *testing.T) {
	be := &fakeBackend{}
	p := newPool(t, be, ModeFresh, 10, 3)
	eventually(t, "3 warm fibers", func() bool { w, _, _ := p.Counts(); return w == 3 })
	if !p.Warm() {
		t.Fatal("pool not reported warm")
	}
	be.mu.Lock()
	for _, f := range be.live {
		f.kill() // all warm fibers die at once
	}
	be.mu.Unlock()
	eventually(t, "the warm pool to be refilled", func() bool { w, _, _ := p.Counts(); return w == 3 && be.alive() == 3 })
	// Leasing shrinks the warm target so warm + leased stays within max.
	p.SetMaxFibers(4)
	for i := 0; i < 4; i++ {
		if _, err := p.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if w, l, s := p.Counts(); w+l+s > 4 {
		t.Fatalf("warm %d + leased %d + starting %d exceeds max 4", w, l, s)
	}
}

func TestReuseIdleRelease(t *testing.T) {
	p := newPool(t, &fakeBackend{}, ModeReuse, 3, 0)
	f, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		_, end, err := p.Begin(context.Background(), f.ID())
		if err != nil {
			t.Fatalf("request %d into a reuse fiber: %v", i, err)
		}
		end()
	}
	eventually(t, "idle release", func() bool { _, l, _ := p.Counts(); return l == 0 })
}

func TestNoWarmPoolIsReadyAndStartsOnDemand(t *testing.T) {
	be := &fakeBackend{}
	p := newPool(t, be, ModeFresh, 2, 0)
	if !p.Warm() {
		t.Fatal("a pool with no warm target must count as warm (ready)")
	}
	if _, err := p.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if be.started.Load() != 1 {
		t.Fatalf("started %d fibers, want 1 on demand", be.started.Load())
	}
}

// A client that has read a whole response can send its next request before
// the proxy ends the previous one: Begin waits for that end instead of
// answering ErrBusy, and never lets two requests into one fiber.
func TestReuseBeginWaitsForThePreviousRequestToEnd(t *testing.T) {
	p := newPool(t, &fakeBackend{}, ModeReuse, 3, 0)
	f, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, end, err := p.Begin(context.Background(), f.ID())
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan time.Time, 1)
	go func() { time.Sleep(20 * time.Millisecond); ended <- time.Now(); end() }()
	_, end2, err := p.Begin(context.Background(), f.ID())
	if err != nil {
		t.Fatalf("back-to-back request: %v, want it to wait for the previous one", err)
	}
	if began, at := time.Now(), <-ended; began.Before(at) {
		t.Fatal("second request began before the first ended")
	}
	// Still busy after BusyWait: ErrBusy, promptly.
	t0 := time.Now()
	if _, _, err := p.Begin(context.Background(), f.ID()); !errors.Is(err, ErrBusy) {
		t.Fatalf("concurrent request: %v, want ErrBusy", err)
	}
	if d := time.Since(t0); d < BusyWait || d > 10*BusyWait {
		t.Errorf("ErrBusy after %s, want about %s", d, BusyWait)
	}
	end2()
}

// A handler that fails at start-up is reported (StartFailure), retried
// with a growing back-off rather than as fast as the loop wakes, refused
// to Acquire during the back-off, and forgotten once a start succeeds.
func TestHandlerFailureBacksOff(t *testing.T) {
	exited := &backend.StartFailure{Reason: contract.ReasonHandlerExited, ExitCode: 5, Message: "the handler exited with code 5", Output: "Crashed..."}
	be := &fakeBackend{fail: exited}
	p := newPool(t, be, ModeFresh, 4, 2)
	eventually(t, "the failure is recorded", func() bool { f, _ := p.StartFailure(); return f != nil })
	f, n := p.StartFailure()
	if f.Reason != contract.ReasonHandlerExited || f.ExitCode != 5 || f.Output != "Crashed..." || n < 1 {
		t.Fatalf("StartFailure() = %+v, %d", f, n)
	}
	if p.Warm() {
		t.Fatal("pool reports warm although no fiber started")
	}
	// 100ms, 200ms, 400ms, 800ms ... doubling per failed start: in 1.5 s a
	// few starts, never one per wake-up.
	time.Sleep(1500 * time.Millisecond)
	if got := be.started.Load(); got > 8 {
		t.Fatalf("%d starts in 1.5s: the pool does not back off", got)
	}
	var sf *backend.StartFailure
	if _, err := p.Acquire(context.Background()); !errors.As(err, &sf) || sf.ExitCode != 5 {
		t.Fatalf("Acquire during the back-off = %v, want the handler's failure", err)
	}

	be.mu.Lock()
	be.fail = nil
	be.mu.Unlock()
	// The back-off has reached about a second by now; the next start works.
	eventually2 := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if cond() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	eventually2("the pool to warm", p.Warm)
	if f, n := p.StartFailure(); f != nil || n != 0 {
		t.Fatalf("after a good start StartFailure() = %+v, %d; want none", f, n)
	}
}

// A sandbox failure (not the handler's) is retried but not reported as the
// handler's.
func TestSandboxFailureIsNotAHandlerFailure(t *testing.T) {
	be := &fakeBackend{fail: errors.New("no host id range free")}
	p := newPool(t, be, ModeFresh, 4, 2)
	eventually(t, "a start to fail", func() bool { return be.started.Load() >= 2 })
	if f, _ := p.StartFailure(); f != nil {
		t.Fatalf("StartFailure() = %+v, want nil for a sandbox failure", f)
	}
}

// TestBurstOnAnEmptyPoolStartsAFewAtATime: 24 acquisitions at once on a pool
// with no warm fibers and room for all of them run at most StartConcurrency
// starts together (before, each started its own at once: on a small node
// hundreds of sandboxes starting together all missed their start-up
// timeout), and every one gets a fiber although the burst takes longer than
// one start's timeout.
func TestBurstOnAnEmptyPoolStartsAFewAtATime(t *testing.T) {
	be := &fakeBackend{delay: 150 * time.Millisecond}
	p, err := New(Config{Spec: &backend.Spec{StartupTimeout: 100 * time.Millisecond}, Backend: be, Mode: ModeFresh,
		MaxFibers: 24, StartConcurrency: 3, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := p.Acquire(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("acquire: %v", err)
	}
	if peak := be.peak.Load(); peak > 3 {
		t.Errorf("%d starts ran at once, want at most StartConcurrency 3", peak)
	}
	if got := be.started.Load(); got != 24 {
		t.Errorf("%d starts, want 24", got)
	}
}

// TestAStartWaitingForASlotGivesUpWithItsCaller: a caller whose context ends
// while every start slot is busy gets its context's error and gives its
// reserved slot back (the pool does not count a start that never began).
func TestAStartWaitingForASlotGivesUpWithItsCaller(t *testing.T) {
	be := &fakeBackend{delay: 500 * time.Millisecond}
	p, err := New(Config{Spec: &backend.Spec{StartupTimeout: time.Second}, Backend: be, Mode: ModeFresh,
		MaxFibers: 4, StartConcurrency: 1, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go p.Acquire(context.Background()) // holds the only slot for 500 ms
	eventually(t, "the first start running", func() bool { return be.running.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire = %v, want the context's deadline", err)
	}
	eventually(t, "only the first start counted", func() bool { _, _, starting := p.Counts(); return starting <= 1 })
}

// A router that dies after acquiring a fresh fiber never sends its request
// nor releases it: the lease is reaped after LeaseTimeout. A fiber busy
// with a request longer than that is not, and its lease ends with it.
func TestAnUnusedLeaseIsReapedAndABusyFiberIsNot(t *testing.T) {
	be := &fakeBackend{}
	var logs sync.Map
	p, err := New(Config{Spec: &backend.Spec{StartupTimeout: time.Second}, Backend: be, Mode: ModeFresh,
		MaxFibers: 3, LeaseTimeout: 150 * time.Millisecond, Logf: func(format string, args ...any) {
			logs.Store(fmt.Sprintf(format, args...), true)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	orphan, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	busy, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, end, err := p.Begin(context.Background(), busy.ID())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the unused lease to be reaped", func() bool {
		for _, f := range p.List() {
			if f.ID == orphan.ID() {
				return false
			}
		}
		return true
	})
	if _, ok := logs.Load(fmt.Sprintf("fiber %s reaped: lease unused", orphan.ID())); !ok {
		t.Error("the reap is not in the Home's log")
	}
	time.Sleep(300 * time.Millisecond) // twice LeaseTimeout, still busy
	if _, _, err := p.Begin(context.Background(), busy.ID()); !errors.Is(err, ErrBusy) {
		t.Fatalf("a fiber serving a request longer than LeaseTimeout: %v, want ErrBusy (still serving)", err)
	}
	end()
	if _, _, err := p.Begin(context.Background(), busy.ID()); !errors.Is(err, ErrSpent) {
		t.Fatalf("after its request: %v, want ErrSpent", err)
	}
}

// An idle pool (warm fibers only, nothing leased) does not wake: its loops
// wait for a change of state or a deadline, not a tick (issue 32: an idle
// Home woke every 100 ms). Fails with the fixed 100 ms reaper tick or the
// 1 s refill poll (at least 10 rounds in a second).
func TestAnIdlePoolDoesNotWake(t *testing.T) {
	p := newPool(t, &fakeBackend{}, ModeFresh, 3, 2)
	eventually(t, "the warm target", p.Warm)
	time.Sleep(100 * time.Millisecond) // the refill's last starts settle
	before := p.rounds.Load()
	time.Sleep(time.Second)
	if n := p.rounds.Load() - before; n > 0 {
		t.Fatalf("an idle pool's loops ran %d times in 1 s, want 0", n)
	}
}

// A reaper deadline is met when it falls, whatever else the pool does: a
// reuse fiber idle for IdleTimeout goes, and one used meanwhile stays until
// its own deadline.
func TestReaperMeetsEachFibersOwnDeadline(t *testing.T) {
	p := newPool(t, &fakeBackend{}, ModeReuse, 3, 0) // IdleTimeout 200 ms
	a, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	b, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	has := func(id string) bool {
		for _, f := range p.List() {
			if f.ID == id {
				return true
			}
		}
		return false
	}
	eventually(t, "the first fiber's idle timeout", func() bool { return !has(a.ID()) })
	if !has(b.ID()) {
		t.Fatal("the second fiber, idle for less than IdleTimeout, was reaped with the first")
	}
	_, end, err := p.Begin(context.Background(), b.ID())
	if err != nil {
		t.Fatal(err)
	}
	end() // used: its deadline moves to now + IdleTimeout
	used := time.Now()
	eventually(t, "the second fiber's idle timeout", func() bool { return !has(b.ID()) })
	if d := time.Since(used); d < 200*time.Millisecond {
		t.Fatalf("reaped %v after its last use, before its IdleTimeout (200 ms)", d)
	}
}

// newWarmIdlePool is newPool with WarmIdle and the pool's log lines kept.
func newWarmIdlePool(t *testing.T, be *fakeBackend, warmIdle time.Duration, max, warm int) (*Pool, func(substr string) bool) {
	var mu sync.Mutex
	var lines []string
	p, err := New(Config{Spec: &backend.Spec{StartupTimeout: time.Second}, Backend: be, Mode: ModeFresh,
		MaxFibers: max, WarmTarget: warm, WarmIdle: warmIdle, Logf: func(format string, args ...any) {
			mu.Lock()
			lines = append(lines, fmt.Sprintf(format, args...))
			mu.Unlock()
			t.Logf(format, args...)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	logged := func(substr string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, substr) {
				return true
			}
		}
		return false
	}
	return p, logged
}

// An idle pool with WarmIdle ends its warm fibers after WarmIdle without a
// request, says so once, and then neither refills nor wakes; the next
// Acquire gets a fiber started for it (never one of the ended ones) and the
// warm pool is refilled to WarmTarget after it, then empties again after
// another quiet WarmIdle.
func TestWarmPoolEmptiesAfterWarmIdleAndRefillsOnAcquire(t *testing.T) {
	be := &fakeBackend{}
	created := time.Now()
	p, logged := newWarmIdlePool(t, be, 200*time.Millisecond, 4, 2)
	eventually(t, "the warm target", p.Warm)
	eventually(t, "the warm pool emptied", func() bool { w, _, s := p.Counts(); return w == 0 && s == 0 && be.alive() == 0 })
	if d := time.Since(created); d < 200*time.Millisecond {
		t.Fatalf("warm pool emptied %s after the pool was made, before WarmIdle (200 ms)", d)
	}
	if !p.Quiet() {
		t.Error("Quiet() = false after the warm pool was emptied")
	}
	if !logged("warm pool emptied after ") || !logged("without a request: 2 fibers ended") {
		t.Error("the emptying is not in the Home's log")
	}
	if !p.Warm() {
		t.Error("an emptied pool must stay ready (Warm)")
	}
	// Quiet: no refill, no wake-up.
	time.Sleep(100 * time.Millisecond) // the ended fibers' last kicks settle
	before, started := p.rounds.Load(), be.started.Load()
	time.Sleep(500 * time.Millisecond)
	if n := p.rounds.Load() - before; n > 0 {
		t.Fatalf("a quiet pool's loops ran %d times in 500 ms, want 0", n)
	}
	if n := be.started.Load() - started; n != 0 {
		t.Fatalf("a quiet pool started %d fibers, want 0", n)
	}

	f, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ff := f.Fiber.(*fakeFiber); isDone(ff) {
		t.Fatal("Acquire on a quiet pool handed out an ended fiber")
	}
	if p.Quiet() {
		t.Error("Quiet() = true after an Acquire")
	}
	eventually(t, "the warm pool refilled after the Acquire", func() bool { w, l, _ := p.Counts(); return w == 2 && l == 1 })
	if !logged("refilling it to 2 fibers") {
		t.Error("the refill after a quiet period is not in the Home's log")
	}
	// Leased: never emptied, however long.
	time.Sleep(400 * time.Millisecond)
	if w, _, _ := p.Counts(); w != 2 || p.Quiet() {
		t.Fatalf("warm %d, quiet %v with a fiber leased; want 2 warm fibers kept", w, p.Quiet())
	}
	// Idle from inside Release: measured from before it.
	releasing := time.Now()
	if err := p.Release(f.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm pool emptied again", func() bool { w, _, _ := p.Counts(); return w == 0 && be.alive() == 0 })
	if d := time.Since(releasing); d < 200*time.Millisecond {
		t.Fatalf("emptied %s after the last release, before WarmIdle (200 ms)", d)
	}
}

func isDone(f *fakeFiber) bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// A fiber leased (acquired, busy or spent and not released) keeps the warm
// pool: WarmIdle counts from when the last lease ended.
func TestWarmIdleNeverEmptiesWhileAFiberIsLeased(t *testing.T) {
	be := &fakeBackend{}
	p, logged := newWarmIdlePool(t, be, 200*time.Millisecond, 4, 2)
	f, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm target", func() bool { w, _, _ := p.Counts(); return w == 2 })
	time.Sleep(400 * time.Millisecond)
	_, end, err := p.Begin(context.Background(), f.ID())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // busy
	end()
	time.Sleep(400 * time.Millisecond) // spent, not released
	if w, _, _ := p.Counts(); w != 2 || p.Quiet() || logged("warm pool emptied") {
		t.Fatalf("warm %d, quiet %v while a fiber was leased for 1.2 s; want the warm pool kept", w, p.Quiet())
	}
	if err := p.Release(f.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm pool emptied after the release", func() bool { w, _, _ := p.Counts(); return w == 0 && p.Quiet() })
}

// WarmIdle 0 (the default) keeps the warm pool forever.
func TestWarmIdleZeroNeverEmpties(t *testing.T) {
	be := &fakeBackend{}
	p, logged := newWarmIdlePool(t, be, 0, 4, 2)
	eventually(t, "the warm target", func() bool { w, _, _ := p.Counts(); return w == 2 })
	time.Sleep(600 * time.Millisecond)
	if w, _, _ := p.Counts(); w != 2 || be.alive() != 2 || p.Quiet() || logged("warm pool emptied") {
		t.Fatalf("warm %d, alive %d, quiet %v with WarmIdle 0; want the warm pool kept", w, be.alive(), p.Quiet())
	}
}

// IdleFor is 0 while an Acquire is under way or a fiber is leased, and
// counts from the end of the last one.
func TestIdleFor(t *testing.T) {
	be := &fakeBackend{delay: 150 * time.Millisecond}
	p := newPool(t, be, ModeFresh, 3, 0)
	time.Sleep(50 * time.Millisecond)
	if d := p.IdleFor(); d < 50*time.Millisecond {
		t.Fatalf("IdleFor() = %s for a pool never used for 50 ms", d)
	}
	got := make(chan *Fiber, 1)
	go func() {
		f, err := p.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	eventually(t, "the start for the Acquire", func() bool { return be.running.Load() == 1 })
	if d := p.IdleFor(); d != 0 {
		t.Fatalf("IdleFor() = %s during an Acquire, want 0", d)
	}
	f := <-got
	if f == nil {
		t.FailNow()
	}
	time.Sleep(50 * time.Millisecond)
	if d := p.IdleFor(); d != 0 {
		t.Fatalf("IdleFor() = %s with a fiber leased, want 0", d)
	}
	_, end, err := p.Begin(context.Background(), f.ID())
	if err != nil {
		t.Fatal(err)
	}
	end()
	if d := p.IdleFor(); d != 0 {
		t.Fatalf("IdleFor() = %s with a spent fiber not released, want 0", d)
	}
	releasing := time.Now()
	if err := p.Release(f.ID()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if d := p.IdleFor(); d < 100*time.Millisecond || d > time.Since(releasing) {
		t.Fatalf("IdleFor() = %s 100 ms after the last release", d)
	}
}
