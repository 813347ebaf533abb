package process_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/helper"
)

func newBackend(t testing.TB) (*process.Backend, *backend.Spec) {
	if err := process.Supported(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	helperBin := fiberdtest.Build(t, fiberdtest.HelperPackage)
	handler := fiberdtest.Build(t, fiberdtest.TestHandlerPackage)
	state, _ := os.MkdirTemp("/tmp", "pb")
	t.Cleanup(func() { os.RemoveAll(state) })
	root := filepath.Join(state, "root")
	for _, d := range append(helper.MountPoints, "app") {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	b, _ := os.ReadFile(handler)
	os.WriteFile(filepath.Join(root, "app", "handler"), b, 0o755)
	cg := filepath.Join(process.DefaultCgroupParent, filepath.Base(state))
	t.Cleanup(func() { os.Remove(cg) })
	be, err := process.New(process.Config{HelperPath: helperBin, StateDir: filepath.Join(state, "f"), CgroupParent: cg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be, &backend.Spec{RootFS: root, Entrypoint: []string{"/app/handler"}, Port: 8080,
		Env: map[string]string{"PORT": "8080"}, MemoryBytes: 128 << 20, StartupTimeout: 5 * time.Second}
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
