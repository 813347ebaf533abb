package process_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/helper"
)

// newBackend makes a backend with the test handler's root; opts adjust its
// Config.
func newBackend(t testing.TB, opts ...func(*process.Config)) (*process.Backend, *backend.Spec) {
	be, spec, _ := newBackendConfig(t, opts...)
	return be, spec
}

// newBackendConfig is newBackend, and the Config it made the backend with.
func newBackendConfig(t testing.TB, opts ...func(*process.Config)) (*process.Backend, *backend.Spec, process.Config) {
	if err := process.Supported(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	helperBin := fiberdtest.Build(t, fiberdtest.HelperPackage)
	handler := fiberdtest.Build(t, fiberdtest.TestHandlerPackage)
	state, _ := os.MkdirTemp("/tmp", "pb")
	os.Chmod(state, 0o711) // the helper runs as the fiber's own host uid
	t.Cleanup(func() { os.RemoveAll(state) })
	root := filepath.Join(state, "root")
	for _, d := range append(helper.MountPoints, "app", "etc") {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, helper.ResolvConfPath), nil, 0o644) // as fiberd's unpack leaves it
	b, _ := os.ReadFile(handler)
	os.WriteFile(filepath.Join(root, "app", "handler"), b, 0o755)
	cg := filepath.Join(process.DefaultCgroupParent, filepath.Base(state))
	pids := filepath.Join(process.DefaultPidsRoot, "lampyr-fiberd", filepath.Base(state))
	cpu := filepath.Join(process.DefaultCPURoot, "lampyr-fiberd", filepath.Base(state))
	t.Cleanup(func() { os.Remove(cg); os.Remove(pids); os.Remove(cpu) })
	cfg := process.Config{HelperPath: helperBin, StateDir: filepath.Join(state, "f"), CgroupParent: cg, PidsParent: pids, CPUParent: cpu}
	for _, o := range opts {
		o(&cfg)
	}
	be, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be, &backend.Spec{RootFS: root, Entrypoint: []string{"/app/handler"}, Port: 8080,
		Env: map[string]string{"PORT": "8080"}, MemoryBytes: 128 << 20, StartupTimeout: 5 * time.Second}, cfg
}

// BenchmarkStartDestroy is the cost of one fiber without the pool or API.
func BenchmarkStartDestroy(b *testing.B) {
	be, spec := newBackend(b)
	var start, destroy time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		f, err := be.Start(context.Background(), fmt.Sprintf("b%d", i), spec)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		f.Destroy()
		start += t1.Sub(t0)
		destroy += time.Since(t1)
	}
	b.ReportMetric(float64(start.Microseconds())/float64(b.N)/1000, "start-ms")
	b.ReportMetric(float64(destroy.Microseconds())/float64(b.N)/1000, "destroy-ms")
}

func TestStartFailsClearly(t *testing.T) {
	be, spec := newBackend(t)
	bad := *spec
	bad.Entrypoint = []string{"/app/missing"}
	if _, err := be.Start(context.Background(), "bad1", &bad); err == nil {
		t.Fatal("fiber with a missing entrypoint started")
	} else {
		t.Log(err)
	}
	bad = *spec
	bad.ReadinessPath = "/read?path=/missing" // answers 404
	bad.StartupTimeout = 300 * time.Millisecond
	if _, err := be.Start(context.Background(), "bad3", &bad); err == nil || !strings.Contains(err.Error(), "2xx") {
		t.Fatalf("fiber whose readiness path fails: %v", err)
	}
	good := *spec
	good.ReadinessPath = "/"
	f, err := be.Start(context.Background(), "good1", &good)
	if err != nil {
		t.Fatalf("fiber with a passing readiness path: %v", err)
	}
	f.Destroy()
	bad = *spec
	bad.Port = 9999 // the handler listens on $PORT=8080, never on 9999
	bad.StartupTimeout = 300 * time.Millisecond
	if _, err := be.Start(context.Background(), "bad2", &bad); err == nil {
		t.Fatal("fiber that never listens reported ready")
	} else {
		t.Log(err)
	}
}

// A handler that fails at start-up is reported as a typed StartFailure
// with its exit code (128+N for a signal, as kubelet reports) and the end
// of its own output, bounded and without control characters; a good
// handler on the same backend is unaffected.
func TestStartFailureIsTyped(t *testing.T) {
	be, spec := newBackend(t)
	start := func(id string, args ...string) *backend.StartFailure {
		t.Helper()
		s := *spec
		s.Entrypoint = append([]string{"/app/handler"}, args...)
		s.StartupTimeout = time.Second
		f, err := be.Start(context.Background(), id, &s)
		if err == nil {
			f.Destroy()
			t.Fatalf("%v: fiber started", args)
		}
		var sf *backend.StartFailure
		if !errors.As(err, &sf) {
			t.Fatalf("%v: %v is not a StartFailure", args, err)
		}
		t.Logf("%v: %+v", args, *sf)
		return sf
	}

	sf := start("exit5", "exit:5")
	if sf.Reason != contract.ReasonHandlerExited || sf.ExitCode != 5 || sf.Signal != "" {
		t.Errorf("exit 5: %+v", *sf)
	}
	if want := "Started...\n\ufffd[31mabout to crash\ufffd[0m\ufffd\nCrashed..."; sf.Output != want {
		t.Errorf("exit 5 output %q, want %q", sf.Output, want)
	}
	if strings.Contains(sf.Message, "127.0.0.1") {
		t.Errorf("message names the fiber's loopback address: %q", sf.Message)
	}

	sf = start("kill", "kill")
	if sf.Reason != contract.ReasonHandlerExited || sf.ExitCode != 137 || sf.Signal != "SIGKILL" || !strings.Contains(sf.Output, "killing myself") {
		t.Errorf("killed: %+v", *sf)
	}

	t0 := time.Now()
	sf = start("nolisten", "nolisten")
	if sf.Reason != contract.ReasonHandlerNotListening || sf.Output != "listening nowhere" || !strings.Contains(sf.Message, "$PORT (8080)") {
		t.Errorf("never listening: %+v", *sf)
	}
	if d := time.Since(t0); d < time.Second || d > 4*time.Second {
		t.Errorf("never listening reported after %s; want the start-up timeout (1s)", d)
	}

	sf = start("flood", "flood")
	if len(sf.Output) > backend.MaxFailureOutput || strings.Count(sf.Output, "\n") >= backend.MaxFailureOutputLines ||
		!strings.HasSuffix(sf.Output, "line 199 "+strings.Repeat("x", 90)) || !strings.HasPrefix(sf.Output, "line ") {
		t.Errorf("flood output (%d bytes) not the whole last lines within bounds: %q", len(sf.Output), sf.Output)
	}

	f, err := be.Start(context.Background(), "good", spec)
	if err != nil {
		t.Fatalf("a good handler after failing ones: %v", err)
	}
	f.Destroy()
}

// BenchmarkStartParallel is the backend's fiber throughput: concurrent
// start+destroy cycles (as the warm pool refills), with the CPU each fiber
// costs this process and its children (fiberd, helper, handler; the
// kernel's deferred namespace and cgroup teardown is not included).
//
//	go test ./impl/fiberd/backend/process -run '^$' -bench StartParallel -benchtime 200x
func BenchmarkStartParallel(b *testing.B) {
	be, spec := newBackend(b)
	var n atomic.Int64
	before := cpuTime()
	b.SetParallelism(2) // x GOMAXPROCS starters
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			f, err := be.Start(context.Background(), fmt.Sprintf("p%d", n.Add(1)), spec)
			if err != nil {
				b.Error(err)
				return
			}
			f.Destroy()
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	be.Close()
	cpu := cpuTime() - before
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "fibers/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms/fiber")
}

// cpuTime is user+system time of this process and its waited-for children.
func cpuTime() time.Duration {
	var self, kids unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

// BenchmarkPlainProcessFloor is the floor under any process-per-fiber
// backend on this machine: the same handler binary started with a plain
// fork+exec (no namespaces, cgroups, helper or mounts), waited for until it
// listens, sent one request, and killed, with the same concurrency as
// BenchmarkStartParallel. Fresh fibers cannot start faster than this
// without restoring a pre-initialized process image (fiberd's Hyperlight
// snapshots), which this backend cannot do.
func BenchmarkPlainProcessFloor(b *testing.B) {
	handler := fiberdtest.Build(b, fiberdtest.TestHandlerPackage)
	var port atomic.Int32
	port.Store(20000)
	before := cpuTime()
	b.SetParallelism(2)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		for pb.Next() {
			p := strconv.Itoa(int(port.Add(1)))
			cmd := exec.Command(handler)
			cmd.Env = []string{"PORT=" + p, "GOMAXPROCS=1"}
			if err := cmd.Start(); err != nil {
				b.Error(err)
				return
			}
			for {
				resp, err := cl.Get("http://127.0.0.1:" + p + "/")
				if err == nil {
					resp.Body.Close()
					break
				}
				time.Sleep(500 * time.Microsecond)
			}
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - before
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "fibers/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms/fiber")
}

// fiberd dials handlers from threads it switches into fibers' network
// namespaces: every such thread must come back, or fiberd's own
// connections (to the API's clients, the registry) would start failing at
// random. Interleaves fiber dials with dials of a listener only the host
// namespace has, and checks the fiber dial reaches the fiber's handler.
func TestDialEntersTheFiberAndComesBack(t *testing.T) {
	be, spec := newBackend(t)
	f, err := be.Start(context.Background(), "dial1", spec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Destroy()
	host := fiberdtest.HostListener(t)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := 0; i < 200; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := f.Dial(context.Background())
			if err != nil {
				errs <- fmt.Errorf("fiber dial: %w", err)
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: fiber\r\nConnection: close\r\n\r\n")
			b, _ := io.ReadAll(c)
			if !strings.Contains(string(b), `"hostname":"fiber-dial1"`) {
				errs <- fmt.Errorf("fiber dial reached something else: %.200q", b)
			}
		}()
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", host)
			if err != nil {
				errs <- fmt.Errorf("host dial after fiber dials (a thread left in a fiber's namespace?): %w", err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	f.Destroy()
	if _, err := f.Dial(context.Background()); err == nil {
		t.Error("dialled a destroyed fiber")
	}
}

// A helper (or anything holding its status pipe) that writes part of a
// line and then stalls must not hold a start past its timeout.
func TestStartTimeoutCoversPartialStatus(t *testing.T) {
	_, spec := newBackend(t)
	state, _ := os.MkdirTemp("/tmp", "pbs")
	os.Chmod(state, 0o711)
	t.Cleanup(func() { os.RemoveAll(state) })
	stall := filepath.Join(state, "stall-helper")
	os.WriteFile(stall, []byte("#!/bin/sh\nprintf rea >&4\nexec 4>&-\nexec sleep 60\n"), 0o755)
	base := filepath.Base(state)
	cg := filepath.Join(process.DefaultCgroupParent, base)
	pids := filepath.Join(process.DefaultPidsRoot, "lampyr-fiberd", base)
	cpu := filepath.Join(process.DefaultCPURoot, "lampyr-fiberd", base)
	be, err := process.New(process.Config{HelperPath: stall, SpawnerPath: fiberdtest.Build(t, fiberdtest.HelperPackage), StateDir: filepath.Join(state, "f"), CgroupParent: cg, PidsParent: pids, CPUParent: cpu})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	s := *spec
	s.StartupTimeout = 200 * time.Millisecond
	t0 := time.Now()
	_, err = be.Start(context.Background(), "stall1", &s)
	if err == nil || time.Since(t0) > 10*time.Second {
		t.Fatalf("start with a stalled status line: %v after %s", err, time.Since(t0))
	}
	t.Logf("%s: %v", time.Since(t0).Round(time.Millisecond), err)
}

// New refuses a host where fibers would get no task bound.
func TestNewRefusesWithoutPids(t *testing.T) {
	if err := process.Supported(); err != nil {
		t.Skip(err)
	}
	helperBin := fiberdtest.Build(t, fiberdtest.HelperPackage)
	_, err := process.New(process.Config{HelperPath: helperBin, StateDir: t.TempDir(), CPUParent: "/sys/fs/cgroup/cpu/x"})
	if err == nil || !strings.Contains(err.Error(), "without a bound on their tasks") {
		t.Fatalf("no PidsParent: %v", err)
	}
}

// The Home-wide task bound (pids.max above every fiber's pids cgroup) is
// there from New on, sized from the grant's maxFibers × the per-fiber
// bound and capped, or fixed, or off (issue 31).
func TestHomeTaskBoundSizing(t *testing.T) {
	if err := process.Supported(); err != nil {
		t.Skip(err)
	}
	helperBin := fiberdtest.Build(t, fiberdtest.HelperPackage)
	for _, tc := range []struct {
		name      string
		home      int
		maxFibers int
		atNew     string
		want      string
	}{
		{"sized from the grant", 0, 3, "4096", "300"},
		{"sized, capped", 0, 100, "4096", "4096"},
		{"fixed", 500, 100, "500", "500"},
		{"off", -1, 3, "max", "max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, _ := os.MkdirTemp("/tmp", "pb")
			t.Cleanup(func() { os.RemoveAll(state) })
			cfg := fiberdtest.BackendConfig(t, helperBin, state)
			cfg.PidsMax, cfg.HomePidsMax = 100, tc.home
			be, err := process.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { be.Close() })
			read := func() string {
				b, _ := os.ReadFile(filepath.Join(cfg.PidsParent, "pids.max"))
				return strings.TrimSpace(string(b))
			}
			if got := read(); got != tc.atNew {
				t.Fatalf("pids.max before any grant: %s, want %s", got, tc.atNew)
			}
			if _, err := be.BoundHomeTasks(tc.maxFibers); err != nil {
				t.Fatal(err)
			}
			if got := read(); got != tc.want {
				t.Fatalf("pids.max for maxFibers %d: %s, want %s", tc.maxFibers, got, tc.want)
			}
		})
	}
}
