//go:build linux

package gvisor_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/helper"
)

// TestBackendsSideBySide (issue 35) starts fibers of three handlers (the
// test handler as it is, one that sleeps 1 s before it listens, one that
// allocates and touches 100 MiB first) on the process backend, the gvisor
// backend cold and the gvisor backend restoring a checkpoint, in turns
// (each round runs the sides in a rotated order), and prints per side the
// start p50/p99 (Start until the handler listens), the first request's
// latency, start+first request (a fresh-mode request that finds no warm
// fiber), fibers started per second one after another, and each fiber's
// memory (its cgroup's usage after the first request). A table, not a
// verdict: LAMPYR_GVISOR_SIDE_BY_SIDE=N runs N rounds.
func TestBackendsSideBySide(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("LAMPYR_GVISOR_SIDE_BY_SIDE"))
	if rounds <= 0 {
		t.Skip("skipping: set LAMPYR_GVISOR_SIDE_BY_SIDE=N (rounds) to measure the backends side by side")
	}
	pb, pspec, pcg := processBackend(t)
	gcold, gspec := newBackend(t, false)
	gpre, _ := newBackend(t, true)
	fixtures := []struct {
		name string
		env  map[string]string
	}{
		{"handler", nil},
		{"sleeps 1 s", map[string]string{"TESTHANDLER_INIT_SLEEP": "1s"}},
		{"touches 100 MiB", map[string]string{"TESTHANDLER_INIT_ALLOC_MIB": "100"}},
	}
	type side struct {
		name string
		be   backend.Backend
		spec *backend.Spec
		mem  func(id string) int64
	}
	for _, fx := range fixtures {
		mk := func(base *backend.Spec) *backend.Spec {
			s := *base
			s.Env = map[string]string{}
			for k, v := range base.Env {
				s.Env[k] = v
			}
			for k, v := range fx.env {
				s.Env[k] = v
			}
			s.MemoryBytes = 512 << 20
			return &s
		}
		sides := []side{
			{"process", pb, mk(pspec), func(id string) int64 { return cgroupUsage(filepath.Join(pcg, id)) }},
			{"gvisor cold", gcold, mk(gspec), gcold.MemoryUsage},
			{"gvisor restore", gpre, mk(gspec), gpre.MemoryUsage},
		}
		// The restore side's checkpoint is made before the rounds.
		if f, err := gpre.Start(context.Background(), "warm-"+strings.ReplaceAll(fx.name, " ", ""), sides[2].spec); err != nil {
			t.Fatal(err)
		} else {
			f.Destroy()
		}
		type fig struct {
			start, first, total []time.Duration
			mem                 []int64
			wall                time.Duration
		}
		figs := make([]fig, len(sides))
		for r := range rounds {
			for k := range sides {
				i := (k + r) % len(sides)
				s := sides[i]
				id := fmt.Sprintf("%d%d%s", r, i, strings.Fields(fx.name)[0])
				t0 := time.Now()
				f, err := s.be.Start(context.Background(), id, s.spec)
				if err != nil {
					t.Fatalf("%s %s: %v", s.name, fx.name, err)
				}
				t1 := time.Now()
				if err := firstRequest(f); err != nil {
					t.Fatalf("%s %s: first request: %v", s.name, fx.name, err)
				}
				t2 := time.Now()
				figs[i].start = append(figs[i].start, t1.Sub(t0))
				figs[i].first = append(figs[i].first, t2.Sub(t1))
				figs[i].total = append(figs[i].total, t2.Sub(t0))
				figs[i].mem = append(figs[i].mem, s.mem(id))
				figs[i].wall += t2.Sub(t0)
				f.Destroy()
			}
		}
		load, _ := os.ReadFile("/proc/loadavg")
		t.Logf("%s, %d rounds, load %s", fx.name, rounds, strings.Join(strings.Fields(string(load))[:3], " "))
		t.Logf("| side | start p50 | start p99 | first request p50 | start+request p50 | p99 | fibers/s (one at a time) | memory per fiber p50 |")
		for i, s := range sides {
			f := figs[i]
			t.Logf("| %s | %s | %s | %s | %s | %s | %.2f | %.1f MiB |", s.name, pct(f.start, 50), pct(f.start, 99), pct(f.first, 50), pct(f.total, 50), pct(f.total, 99),
				float64(rounds)/f.wall.Seconds(), float64(median(f.mem))/(1<<20))
		}
	}
}

func firstRequest(f backend.Fiber) error {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return f.Dial(ctx)
	}, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://fiber/")
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func pct(d []time.Duration, p int) string {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i].Round(100 * time.Microsecond).String()
}

func median(v []int64) int64 {
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func cgroupUsage(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return -1
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// processBackend is the process backend as its own tests make it.
func processBackend(t testing.TB) (backend.Backend, *backend.Spec, string) {
	if err := process.Supported(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	helperBin := fiberdtest.Build(t, fiberdtest.HelperPackage)
	handler := fiberdtest.Build(t, fiberdtest.TestHandlerPackage)
	state, _ := os.MkdirTemp("/tmp", "pb")
	os.Chmod(state, 0o711)
	t.Cleanup(func() { os.RemoveAll(state) })
	root := filepath.Join(state, "root")
	for _, d := range append(helper.MountPoints, "app", "etc") {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, helper.ResolvConfPath), nil, 0o644)
	b, _ := os.ReadFile(handler)
	os.WriteFile(filepath.Join(root, "app", "handler"), b, 0o755)
	cg := filepath.Join(process.DefaultCgroupParent, filepath.Base(state))
	pids := filepath.Join(process.DefaultPidsRoot, "lampyr-fiberd", filepath.Base(state))
	cpu := filepath.Join(process.DefaultCPURoot, "lampyr-fiberd", filepath.Base(state))
	t.Cleanup(func() { os.Remove(cg); os.Remove(pids); os.Remove(cpu) })
	be, err := process.New(process.Config{HelperPath: helperBin, StateDir: filepath.Join(state, "f"), CgroupParent: cg, PidsParent: pids, CPUParent: cpu})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be, &backend.Spec{RootFS: root, Entrypoint: []string{"/app/handler"}, Port: 8080,
		Env: map[string]string{"PORT": "8080"}, MemoryBytes: 128 << 20, StartupTimeout: 10 * time.Second}, cg
}
