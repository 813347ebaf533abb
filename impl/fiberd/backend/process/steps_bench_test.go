package process_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// BenchmarkStartSteps is a fiber's start step by step, beside this
// machine's floor for the same handler, taken in turns (A B A B, the
// first side alternating): the fiber's start as fiberd's side sees it
// (process.Config.OnStart), its first response over Dial, and the same
// handler binary started with a plain fork+exec (no namespaces, cgroups,
// helper or mounts), waited for until it listens, sent one request, and
// killed. It answers what a cold request with no warm fiber pays over the
// floor of any process-per-fiber backend on this machine (issue 32). Each
// start follows 100 ms of quiet (benchtime 40x takes about 10 s); without
// and with a ready sandbox shell (Config.Shells).
//
//	go test ./impl/fiberd/backend/process -run '^$' -bench StartSteps -benchtime 100x
func BenchmarkStartSteps(b *testing.B) {
	for _, shells := range []int{0, 1} {
		b.Run(fmt.Sprintf("shells=%d", shells), func(b *testing.B) { benchmarkStartSteps(b, shells, nil) })
	}
	// As a Home with service bindings runs (each fiber's TUN and netstack).
	b.Run("shells=1,egress", func(b *testing.B) {
		benchmarkStartSteps(b, 1, &process.Egress{Policy: &egresspolicy.Policy{Domains: []string{"svc.cluster.local"}, Allow: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}})
	})
}

func benchmarkStartSteps(b *testing.B, shells int, eg *process.Egress) {
	const quiet = 100 * time.Millisecond
	var last []process.StartStep
	be, spec := newBackend(b, func(c *process.Config) {
		c.Shells = shells
		c.Egress = eg
		c.OnStart = func(_ string, steps []process.StartStep) { last = steps }
	})
	be.Prepare(spec)
	handler := fiberdtest.Build(b, fiberdtest.TestHandlerPackage)
	steps := map[string][]time.Duration{}
	var order []string
	var fiberReady, fiberFirst, plainListen, plainFirst []time.Duration
	port := 21000

	fiber := func(i int) {
		t0 := time.Now()
		f, err := be.Start(context.Background(), fmt.Sprintf("s%d", i), spec)
		if err != nil {
			b.Fatal(err)
		}
		ready := time.Since(t0)
		c, err := f.Dial(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := getOnce(c); err != nil {
			b.Fatal(err)
		}
		first := time.Since(t0)
		c.Close()
		f.Destroy()
		fiberReady, fiberFirst = append(fiberReady, ready), append(fiberFirst, first)
		for _, s := range last {
			if _, ok := steps[s.Name]; !ok {
				order = append(order, s.Name)
			}
			steps[s.Name] = append(steps[s.Name], s.D)
		}
	}
	plain := func() {
		port++
		p := strconv.Itoa(port)
		addr := "127.0.0.1:" + p
		t0 := time.Now()
		cmd := exec.Command(handler)
		cmd.Env = []string{"PORT=" + p}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		// As the helper waits for a fiber's handler: dial every 500 µs.
		var c net.Conn
		for {
			var err error
			if c, err = net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
				break
			}
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("plain handler never listened: %v", err)
			}
			time.Sleep(500 * time.Microsecond)
		}
		listen := time.Since(t0)
		if err := getOnce(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
		plainListen, plainFirst = append(plainListen, listen), append(plainFirst, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// A cold request comes after a quiet spell, not right after another
		// start: back to back, the kernel's cgroup lock stays in the state
		// the last migration left it in (rcu_sync), and the grace period
		// a move into a cgroup waits for after a quiet spell is hidden.
		time.Sleep(quiet)
		if i%2 == 0 {
			fiber(i)
			time.Sleep(quiet)
			plain()
		} else {
			plain()
			time.Sleep(quiet)
			fiber(i)
		}
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[(len(s)-1)/2].Microseconds()) / 1000
	}
	for _, name := range order {
		b.Logf("fiber step p50 %7.2f ms  %s", p50(steps[name]), name)
	}
	b.Logf("fiber: start p50 %.2f ms, first response p50 %.2f ms; plain fork+exec: listens p50 %.2f ms, first response p50 %.2f ms (%d each)",
		p50(fiberReady), p50(fiberFirst), p50(plainListen), p50(plainFirst), b.N)
	b.ReportMetric(p50(fiberFirst), "fiber-first-ms")
	b.ReportMetric(p50(plainFirst), "plain-first-ms")
	b.ReportMetric(p50(fiberFirst)/p50(plainFirst), "fiber/plain")
}

// getOnce sends one GET / on c and reads the whole response.
func getOnce(c net.Conn) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: fiber\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
