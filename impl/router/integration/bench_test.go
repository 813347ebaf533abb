package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/router/proxy"
)

// BenchmarkRouter measures requests/s and latency for the same handler:
//
//	direct       client -> handler process on loopback (no sandbox, no router)
//	direct-procs client -> one handler process per worker, each serving one
//	             request at a time as a fiber does (the floor for
//	             containerConcurrency 1, before any proxy hop)
//	fiberd       client -> fiberd -> a fiber leased once (no router)
//	router-reuse client -> fiber-router -> tunnel through fiberd -> a reused
//	             fiber (fiberd joins the tunnel in the kernel;
//	             LAMPYR_USER_SPACE_TUNNELS=1 makes it copy instead)
//	router-fresh client -> fiber-router -> acquire, proxy, release per request
//
// added_p50_ms / added_p99_ms are each case's latency minus direct's.
// Concurrency is BENCH_CONCURRENCY (default 4). Figures and their reading:
// docs/performance.md.
//
//	go test ./impl/router/integration -run '^$' -bench Router -benchtime 3s
func BenchmarkRouter(b *testing.B) {
	conc := 4
	if v := os.Getenv("BENCH_CONCURRENCY"); v != "" {
		fmt.Sscan(v, &conc)
	}
	var base latencies
	b.Run("direct", func(b *testing.B) {
		addr := startBareHandler(b)
		hc := benchClient()
		base = run(b, conc, func() error {
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
			return doDiscard(hc, req)
		})
		base.report(b, latencies{})
	})
	b.Run("direct-procs", func(b *testing.B) {
		addrs := make(chan string, conc)
		for i := 0; i < conc; i++ {
			addrs <- startBareHandler(b)
		}
		hc := benchClient()
		l := run(b, conc, func() error {
			addr := <-addrs
			defer func() { addrs <- addr }()
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
			return doDiscard(hc, req)
		})
		l.report(b, base)
	})
	b.Run("fiberd", func(b *testing.B) {
		fd := fiberdtest.StartInstance(b, fiberdtest.Options{Mode: "reuse", HandlerPackage: handlerPackage, Logf: func(string, ...any) {}})
		hc := benchClient()
		// One leased fiber per worker: fiberd allows one request per fiber.
		ids := make(chan string, conc)
		for i := 0; i < conc; i++ {
			f, err := fd.Client.Acquire(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			ids <- f.ID
		}
		l := run(b, conc, func() error {
			id := <-ids
			defer func() { ids <- id }()
			req, _ := http.NewRequest(http.MethodGet, "http://"+fd.Endpoint+"/", nil)
			client.SetFiberHeaders(req.Header, id, fd.Token)
			return doDiscard(hc, req)
		}, poolSettled(b, fd))
		l.report(b, base)
	})
	for _, mode := range []string{"reuse", "fresh"} {
		b.Run("router-"+mode, func(b *testing.B) {
			e := startEnv(b, envOptions{fiberd: fiberdOpts(mode)})
			hc := benchClient()
			l := run(b, conc, func() error {
				req, _ := http.NewRequest(http.MethodGet, e.url("/"), nil)
				req.Header.Set(proxy.RevisionHeader, e.meta.Revision)
				req.Header.Set(proxy.NamespaceHeader, e.meta.Namespace)
				return doDiscard(hc, req)
			}, poolSettled(b, e.fd))
			l.report(b, base)
			b.StopTimer()
			e.assertNoLeasedFibersIfFresh(mode)
		})
	}
}

func (e *env) assertNoLeasedFibersIfFresh(mode string) {
	if mode == "fresh" {
		e.assertNoLeasedFibers()
	}
}

type latencies struct {
	samples []time.Duration
	elapsed time.Duration
}

func (l latencies) pct(p float64) time.Duration {
	if len(l.samples) == 0 {
		return 0
	}
	s := slices.Clone(l.samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (l latencies) report(b *testing.B, base latencies) {
	b.ReportMetric(float64(len(l.samples))/l.elapsed.Seconds(), "req/s")
	b.ReportMetric(ms(l.pct(0.50)), "p50_ms")
	b.ReportMetric(ms(l.pct(0.99)), "p99_ms")
	if len(base.samples) > 0 {
		b.ReportMetric(ms(l.pct(0.50)-base.pct(0.50)), "added_p50_ms")
		b.ReportMetric(ms(l.pct(0.99)-base.pct(0.99)), "added_p99_ms")
	}
	// The ns/op go test prints is wall time over concurrent requests; the
	// metrics above are the meaningful ones.
}

// run issues b.N requests from conc workers and records each latency.
// settle, if given, runs after the warm-up requests, before timing starts.
func run(b *testing.B, conc int, do func() error, settle ...func()) latencies {
	b.Helper()
	// Warm connections (and, for fresh mode, fiberd's pool) outside the
	// measurement.
	var wg0 sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg0.Add(1)
		go func() {
			defer wg0.Done()
			if err := do(); err != nil {
				b.Error(err)
			}
		}()
	}
	wg0.Wait()
	if b.Failed() {
		b.FailNow()
	}
	for _, f := range settle {
		f()
	}
	var next atomic.Int64
	samples := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := do(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				samples[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return latencies{samples: samples, elapsed: elapsed}
}

// poolSettled waits until fiberd starts no fibers: the warm-up's leases
// make it refill its warm pool, process starts that would otherwise land in
// the first seconds of the measurement.
func poolSettled(b *testing.B, fd *fiberdtest.Instance) func() {
	return func() {
		quiet := 0
		for deadline := time.Now().Add(60 * time.Second); quiet < 5; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("fiberd's pool kept starting fibers for 60s")
			}
			if _, _, starting := fd.Server.Pool().Counts(); starting == 0 {
				quiet++
			} else {
				quiet = 0
			}
		}
	}
}

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
}

func doDiscard(hc *http.Client, req *http.Request) error {
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	return err
}

// startBareHandler runs the test handler as a plain process on loopback:
// the baseline every other case is compared with.
func startBareHandler(b *testing.B) string {
	b.Helper()
	bin := fiberdtest.Build(b, handlerPackage)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PORT="+port, "K_REVISION=bare")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(b, "bare handler", 10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}
