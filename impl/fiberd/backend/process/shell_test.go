package process_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/process"
)

// stepsRecorder keeps each started fiber's steps (Config.OnStart).
type stepsRecorder struct {
	mu    sync.Mutex
	steps map[string][]process.StartStep
}

func (r *stepsRecorder) record(id string, s []process.StartStep) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.steps == nil {
		r.steps = map[string][]process.StartStep{}
	}
	r.steps[id] = s
}

// first is the first step of fiber id's start.
func (r *stepsRecorder) first(t *testing.T, id string) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.steps[id]
	if len(s) == 0 {
		t.Fatalf("no start steps recorded for %s", id)
	}
	return s[0].Name
}

func waitShells(t *testing.T, be *process.Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for be.ReadyShells() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d sandbox shells ready after 10s, want %d", be.ReadyShells(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hello asks the fiber's handler for / and returns what it says of itself.
func hello(t *testing.T, f backend.Fiber) map[string]any {
	t.Helper()
	c, err := f.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: fiber\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A start takes a ready sandbox shell and skips the steps the shell did;
// the fiber is still the one its spec asks for (its own id as hostname,
// its env), and a new shell is made for the next start.
func TestStartTakesAShell(t *testing.T) {
	var rec stepsRecorder
	be, spec := newBackend(t, func(c *process.Config) { c.Shells = 1; c.OnStart = rec.record })
	spec.Env["FROM_SPEC"] = "yes"
	be.Prepare(spec)
	waitShells(t, be, 1)
	for _, id := range []string{"sh1", "sh2"} {
		f, err := be.Start(context.Background(), id, spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := rec.first(t, id); got != process.StepShell {
			t.Errorf("%s started from %q, want a ready shell", id, got)
		}
		m := hello(t, f)
		if m["hostname"] != "fiber-"+id || !strings.Contains(strings.Join(toStrings(m["env"]), " "), "FROM_SPEC=yes") {
			t.Errorf("%s: the handler says hostname %v, env %v: not the spec's", id, m["hostname"], m["env"])
		}
		f.Destroy()
		waitShells(t, be, 1)
	}
}

// A shell made for another memory limit (a new grant's) is not taken.
func TestShellOfAnotherMemoryLimitIsNotTaken(t *testing.T) {
	var rec stepsRecorder
	be, spec := newBackend(t, func(c *process.Config) { c.Shells = 1; c.OnStart = rec.record })
	be.Prepare(spec)
	waitShells(t, be, 1)
	bigger := *spec
	bigger.MemoryBytes = 2 * spec.MemoryBytes
	f, err := be.Start(context.Background(), "mem1", &bigger)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Destroy()
	if got := rec.first(t, "mem1"); got == process.StepShell {
		t.Fatalf("a fiber of %d bytes started from a shell made for %d", bigger.MemoryBytes, spec.MemoryBytes)
	}
	hello(t, f)
}

// A shell whose helper died while it waited is not taken: the start makes
// its own and succeeds.
func TestDeadShellIsNotTaken(t *testing.T) {
	var rec stepsRecorder
	be, spec, cfg := newBackendConfig(t, func(c *process.Config) { c.Shells = 1; c.OnStart = rec.record })
	be.Prepare(spec)
	waitShells(t, be, 1)
	procs, err := os.ReadFile(filepath.Join(cfg.CgroupParent, "shell-1", "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(procs))[0])
	if err != nil {
		t.Fatalf("shell-1's tasks %q: %v", procs, err)
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	f, err := be.Start(context.Background(), "dead1", spec)
	if err != nil {
		t.Fatalf("start after the shell's helper died: %v", err)
	}
	defer f.Destroy()
	if got := rec.first(t, "dead1"); got == process.StepShell {
		t.Fatal("a start took the shell whose helper was killed")
	}
	hello(t, f)
}

func toStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// A waiting shell has already built its root (the helper's Setup): its
// helper's root is the snapshot, not the Home's, before any start sends a
// spec; a start from it reports no root step of its own.
func TestShellBuildsItsRootBeforeItsSpec(t *testing.T) {
	var rec stepsRecorder
	be, spec, cfg := newBackendConfig(t, func(c *process.Config) { c.Shells = 1; c.OnStart = rec.record })
	be.Prepare(spec)
	waitShells(t, be, 1)
	procs, err := os.ReadFile(filepath.Join(cfg.CgroupParent, "shell-1", "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.Fields(string(procs))[0]
	// mountinfo: field 4 is the mount's root within its filesystem, field
	// 5 where it is mounted. The Home's "/" is its filesystem's root; the
	// fiber's "/" is the snapshot's directory.
	rootOf := func(mountinfo string) string {
		for _, line := range strings.Split(mountinfo, "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[4] == "/" {
				return f[3]
			}
		}
		return ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mi, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		r := rootOf(string(mi))
		if strings.HasSuffix(r, filepath.Base(spec.RootFS)) && r != "/" {
			if !strings.Contains(string(mi), " /proc ") || !strings.Contains(string(mi), " /tmp ") {
				t.Fatalf("the shell's root has no /proc or /tmp yet:\n%s", mi)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting shell's helper %s has root %q, want the snapshot %s:\n%s", pid, r, spec.RootFS, mi)
		}
		time.Sleep(10 * time.Millisecond)
	}
	f, err := be.Start(context.Background(), "root1", spec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Destroy()
	hello(t, f)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var names []string
	for _, s := range rec.steps["root1"] {
		names = append(names, s.Name)
	}
	if len(names) == 0 || names[0] != process.StepShell || !slices.Contains(names, process.StepHelperPrefix+"exec") {
		t.Errorf("steps of a start from a shell: %q", names)
	}
}

// A snapshot the helper cannot bind fails the start with the helper's own
// words (its Setup failed before the spec was sent), with or without a
// shell.
func TestSetupFailureIsReported(t *testing.T) {
	for _, shells := range []int{0, 1} {
		be, spec := newBackend(t, func(c *process.Config) { c.Shells = shells })
		bad := *spec
		bad.RootFS = filepath.Join(t.TempDir(), "missing")
		be.Prepare(&bad)
		_, err := be.Start(context.Background(), "bad"+strconv.Itoa(shells), &bad)
		if err == nil || !strings.Contains(err.Error(), "binding snapshot") {
			t.Errorf("shells=%d: start with a missing snapshot: %v, want the helper's \"binding snapshot\" error", shells, err)
		}
		// The backend still starts fibers of a good snapshot.
		f, err := be.Start(context.Background(), "good"+strconv.Itoa(shells), spec)
		if err != nil {
			t.Fatalf("shells=%d: %v", shells, err)
		}
		hello(t, f)
		f.Destroy()
	}
}
