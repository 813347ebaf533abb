package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

func leaseReuse(t *testing.T, opts fiberdtest.Options) (*fiberdtest.Instance, string) {
	t.Helper()
	opts.Mode = "reuse"
	inst := fiberdtest.StartInstance(t, opts)
	f, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return inst, f.ID
}

func TestIsolationFilesystem(t *testing.T) {
	inst, id := leaseReuse(t, fiberdtest.Options{})
	c := inst.Client
	// A world-readable file on the host: only the mount namespace and the
	// pivoted root keep it from the fiber.
	dir, err := os.MkdirTemp("", "fiberd-secret-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if resp, body := get(t, c, id, "/read?path=/app/handler"); resp.StatusCode != 200 || len(body) < 1000 {
		t.Fatalf("control: the fiber cannot read its own handler: %d", resp.StatusCode)
	}
	for _, p := range []string{secret, "/etc/shadow", "/var/run/secrets/kubernetes.io/serviceaccount/token", "/proc/1/root" + secret} {
		resp, body := get(t, c, id, "/read?path="+p)
		if resp.StatusCode == 200 {
			t.Errorf("fiber read %s outside its root: %q", p, body)
		}
	}
	if resp, body := get(t, c, id, "/write?path=/app/x"); resp.StatusCode == 200 || !strings.Contains(string(body), "read-only") {
		t.Errorf("write to the root: %d %s, want a read-only file system error", resp.StatusCode, body)
	}
	if resp, body := get(t, c, id, "/write?path=/tmp/x"); resp.StatusCode != 200 {
		t.Errorf("write to /tmp: %d %s, want a private writable /tmp", resp.StatusCode, body)
	}
}

func TestIsolationProcesses(t *testing.T) {
	inst, a := leaseReuse(t, fiberdtest.Options{})
	b, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b.ID} {
		resp, body := get(t, inst.Client, id, "/ps")
		if resp.StatusCode != 200 {
			t.Fatalf("ps: %d %s", resp.StatusCode, body)
		}
		var procs map[string]string
		json.Unmarshal(body, &procs)
		// Its own helper (PID 1) and handler, nothing else: not the other
		// fiber, not fiberd, not the host.
		if len(procs) != 2 || !strings.Contains(procs["1"], "lampyr-helper") {
			t.Fatalf("fiber %s sees processes %v; want only its helper (PID 1) and handler", id, procs)
		}
		handlers := 0
		for _, cmd := range procs {
			if cmd == "/app/handler" {
				handlers++
			}
		}
		if handlers != 1 {
			t.Fatalf("fiber %s sees %d handler processes: %v", id, handlers, procs)
		}
	}
}

func TestIsolationNetwork(t *testing.T) {
	inst, id := leaseReuse(t, fiberdtest.Options{})
	host := fiberdtest.HostListener(t)
	if resp, body := get(t, inst.Client, id, "/dial?addr=127.0.0.1:8080"); resp.StatusCode != 200 {
		t.Fatalf("control: the fiber cannot reach its own port: %d %s", resp.StatusCode, body)
	}
	for _, addr := range []string{host, inst.Endpoint, inst.Registry} {
		resp, body := get(t, inst.Client, id, "/dial?addr="+addr)
		if resp.StatusCode == 200 {
			t.Errorf("fiber reached host loopback %s: %s", addr, body)
		}
	}
}

func TestIsolationMemoryLimit(t *testing.T) {
	inst, id := leaseReuse(t, fiberdtest.Options{MemoryPerFiber: 96 << 20})
	c := inst.Client
	if resp, body := get(t, c, id, "/alloc?mb=16"); resp.StatusCode != 200 {
		t.Fatalf("control: 16 MiB under a 96 MiB limit failed: %d %s", resp.StatusCode, body)
	}
	resp, body := get(t, c, id, "/alloc?mb=256")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("256 MiB under a 96 MiB limit: %d %s, want 502 (fiber OOM-killed)", resp.StatusCode, body)
	}
	waitFor(t, "the OOM-killed fiber to be removed", 5_000_000_000, func() bool {
		l, err := c.List(context.Background())
		return err == nil && !hasFiber(l, id)
	})
}

func TestIsolationPidsLimit(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 pids controller on this host; the pids limit is best effort")
	}
	inst, id := leaseReuse(t, fiberdtest.Options{PidsMax: 48})
	resp, body := get(t, inst.Client, id, "/spawn?n=200")
	if resp.StatusCode != 200 {
		t.Fatalf("spawn: %d %s", resp.StatusCode, body)
	}
	var r struct {
		Started int    `json:"started"`
		Error   string `json:"error"`
	}
	json.Unmarshal(body, &r)
	if r.Started == 0 || r.Started >= 48 || !strings.Contains(r.Error, "resource temporarily unavailable") {
		t.Fatalf("a fiber limited to 48 tasks started %d processes (error %q); want fewer than 48 and EAGAIN", r.Started, r.Error)
	}
}
