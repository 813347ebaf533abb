//go:build linux

package process_test

// Issue 22, item 5: would a well-kept OCI runtime start fibers as cheaply
// as the hand-written helper? This file starts the same handler, from the
// same read-only root, through an OCI runtime binary (Debian's crun, and
// runc, which is libcontainer behind its CLI) with the helper's isolation
// as far as the OCI runtime spec can say it, and measures both against the
// process backend in one alternating run. The result is in
// docs/security.md, "Why not an OCI runtime".
//
//	hack/bench-oci.sh -benchtime 200x   # installs crun (hack/install-crun.sh), runs the
//	                                    # test binary where crun accepts the cgroups
//
// On a host without cgroup2 controllers beside v1, plain go test does:
//
//	go test ./impl/fiberd/backend/process -run '^$' -bench OCIvsHelper -benchtime 200x

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/helper"
)

// ociIDBase is the first host id of the OCI sides' ranges: just above the
// process backend's default pool, so no range is shared with its fibers.
const ociIDBase = process.DefaultIDBase + process.DefaultIDRanges*process.IDRangeSize

// ociRuntime is a runtime binary and the fibers it has started.
type ociRuntime struct {
	name, bin string
	// state is the runtime's --root; bundles holds one bundle per fiber.
	state, bundles string
	// rootfs is the snapshot (the process backend's spec.RootFS).
	rootfs string
	// cgroup is the cgroupsPath prefix, under every v1 hierarchy.
	cgroup string
	// slot0 is this runtime's first id range above ociIDBase.
	slot0 int
	log   *os.File
	// runs and deletes are the time spent in `run --detach` and `delete`.
	runs, deletes time.Duration
}

// lookOCIRuntime finds name on PATH or skips, saying how to install it.
func lookOCIRuntime(tb testing.TB, name, rootfs string, slot0 int) *ociRuntime {
	bin, err := exec.LookPath(name)
	if err != nil {
		install := "apt-get install -y " + name + " (hack/install-crun.sh)"
		if name == "runc" {
			install = "apt-get install -y runc (Debian's docker.io depends on it)"
		}
		tb.Skipf("skipping: the OCI runtime %s is not installed: %s", name, install)
	}
	if name == "crun" {
		if err := crunCgroupsUsable(); err != nil {
			tb.Skipf("skipping crun: %v", err)
		}
	}
	// runc mounts a tmpfs with the mode of the directory it covers, not
	// the mode= option: the snapshot's /tmp must be 1777 for the handler
	// to write /tmp (the helper mounts /tmp mode=1777 over any mode).
	os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777)
	dir, _ := os.MkdirTemp("/tmp", "oci-"+name)
	os.Chmod(dir, 0o711)
	r := &ociRuntime{name: name, bin: bin, state: filepath.Join(dir, "state"), bundles: filepath.Join(dir, "b"),
		rootfs: rootfs, cgroup: "/lampyr-oci-bench-" + name, slot0: slot0}
	os.MkdirAll(r.state, 0o700)
	os.MkdirAll(r.bundles, 0o711)
	r.log, _ = os.Create(filepath.Join(dir, "log"))
	tb.Cleanup(func() {
		r.log.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(r.log.Name())
			tb.Logf("%s log:\n%s", name, b)
		}
		os.RemoveAll(dir)
		removeCgroupEverywhere(r.cgroup)
	})
	return r
}

// crunCgroupsUsable says why crun cannot create cgroups here, if it cannot:
// on a hybrid host (cgroup v1 controllers, and cgroup2 mounted at
// /sys/fs/cgroup/unified) crun refuses to run anything while the cgroup2
// hierarchy has any controller ("cgroups in hybrid mode not supported,
// drop all controllers from cgroupv2"). Without /sys/fs/cgroup/unified it
// sees a plain cgroup v1 host and uses the v1 controllers.
func crunCgroupsUsable() error {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup/unified", &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	b, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	return fmt.Errorf("crun refuses hybrid cgroups while cgroup2 at /sys/fs/cgroup/unified has controllers (%s); run the test in a mount namespace without it: hack/bench-oci.sh", strings.TrimSpace(string(b)))
}

// removeCgroupEverywhere removes path (empty by now) from every v1
// hierarchy. With /sys/fs/cgroup/unified unmounted (hack/bench-oci.sh),
// crun still follows /proc/self/cgroup's "0::/" line and writes
// unified/<path>/<id>/cgroup.procs into the plain tmpfs below: removed too.
func removeCgroupEverywhere(path string) {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		os.Remove(filepath.Join("/sys/fs/cgroup", e.Name(), path))
	}
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.TMPFS_MAGIC && strings.HasPrefix(path, "/lampyr-oci-") {
		os.RemoveAll(filepath.Join("/sys/fs/cgroup/unified", path))
	}
}

// ociFiber is one container: its init is the handler itself.
type ociFiber struct {
	r      *ociRuntime
	id     string
	pid    int
	pidfd  int
	ns     netns.NsHandle
	bundle string
}

// start runs the fiber (config.json written, `<runtime> run --detach`),
// waits until the handler accepts on 127.0.0.1:PORT in its network
// namespace (the helper's readiness criterion, without ReadinessPath) and
// checks its /proc status as the helper does before "ready".
func (r *ociRuntime) start(id string, spec *backend.Spec, slot int) (*ociFiber, error) {
	f := &ociFiber{r: r, id: id, pidfd: -1, ns: netns.None(), bundle: filepath.Join(r.bundles, id)}
	if err := os.Mkdir(f.bundle, 0o711); err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(ociConfig(r, id, spec, ociIDBase+uint32(r.slot0+slot)*process.IDRangeSize))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(f.bundle, "config.json"), cfg, 0o644); err != nil {
		return nil, err
	}
	pidFile := filepath.Join(f.bundle, "pid")
	cmd := exec.Command(r.bin, "--root", r.state, "run", "--detach", "--bundle", f.bundle, "--pid-file", pidFile, id)
	cmd.Stdout, cmd.Stderr = r.log, r.log // files: Wait must not wait for the detached handler's output
	t0 := time.Now()
	err = cmd.Run()
	r.runs += time.Since(t0)
	if err != nil {
		return f, fmt.Errorf("%s run: %w", r.name, err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return f, err
	}
	if f.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return f, fmt.Errorf("%s pid file %q: %w", r.name, b, err)
	}
	if f.pidfd, err = unix.PidfdOpen(f.pid, 0); err != nil {
		return f, fmt.Errorf("pidfd of %d: %w", f.pid, err)
	}
	if f.ns, err = netns.GetFromPid(f.pid); err != nil {
		return f, fmt.Errorf("network namespace of %d: %w", f.pid, err)
	}
	deadline := time.Now().Add(spec.StartupTimeout)
	for {
		c, err := f.dial(100 * time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("handler did not listen within %s: %v", spec.StartupTimeout, err)
		}
		time.Sleep(500 * time.Microsecond)
	}
	return f, helper.CheckConfined(f.pid)
}

// dial connects to the handler from a thread inside its network namespace
// (as the process backend's Dial does).
func (f *ociFiber) dial(timeout time.Duration) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(f.ns); err != nil {
			ch <- result{err: err}
			return
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:8080", timeout)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// destroy kills the handler (PID 1 of the container), reaps it (this
// process is a subreaper: the detached container was reparented to it),
// and has the runtime delete the container (its cgroups and state).
func (f *ociFiber) destroy() error {
	var errs []error
	if f.pidfd >= 0 {
		unix.PidfdSendSignal(f.pidfd, unix.SIGKILL, nil, 0)
		var ws unix.WaitStatus
		if _, err := unix.Wait4(f.pid, &ws, 0, nil); err != nil {
			// Not our child after all: wait for the exit on the pidfd.
			unix.Poll([]unix.PollFd{{Fd: int32(f.pidfd), Events: unix.POLLIN}}, 5000)
		}
		unix.Close(f.pidfd)
	}
	if f.ns.IsOpen() {
		f.ns.Close()
	}
	if f.pid != 0 {
		cmd := exec.Command(f.r.bin, "--root", f.r.state, "delete", "--force", f.id)
		cmd.Stdout, cmd.Stderr = f.r.log, f.r.log
		t0 := time.Now()
		err := cmd.Run()
		f.r.deletes += time.Since(t0)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s delete: %w", f.r.name, err))
		}
	}
	errs = append(errs, os.RemoveAll(f.bundle))
	return errors.Join(errs...)
}

// ociConfig is the OCI runtime spec (config.json) closest to what the
// process backend and the helper set up. What it cannot say is listed in
// docs/security.md, "Why not an OCI runtime".
func ociConfig(r *ociRuntime, id string, spec *backend.Spec, hostID uint32) map[string]any {
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	idMap := []map[string]any{{"containerID": 0, "hostID": hostID, "size": process.IDRangeSize}}
	tmp := int64(64 << 20) // the process backend's default TmpBytes and RLIMIT_FSIZE
	rl := func(t string, v int64) map[string]any { return map[string]any{"type": t, "soft": v, "hard": v} }
	ns := []map[string]any{}
	for _, t := range []string{"user", "pid", "mount", "network", "ipc", "uts", "cgroup"} {
		ns = append(ns, map[string]any{"type": t})
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"root":       map[string]any{"path": r.rootfs, "readonly": true},
		"hostname":   "fiber-" + id,
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 65534, "gid": 65534},
			"args":     spec.Entrypoint,
			"env":      env,
			"cwd":      "/",
			// No capability in any set, as the helper's handler.
			"capabilities":    map[string]any{"bounding": []string{}, "effective": []string{}, "inheritable": []string{}, "permitted": []string{}, "ambient": []string{}},
			"rlimits":         []map[string]any{rl("RLIMIT_NOFILE", 4096), rl("RLIMIT_NPROC", 512), rl("RLIMIT_FSIZE", tmp), rl("RLIMIT_CORE", 0)},
			"noNewPrivileges": true,
		},
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc", "options": []string{"nosuid", "noexec", "nodev"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(tmp, 10)}},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "noexec", "mode=755", "size=65536"}},
		},
		"linux": map[string]any{
			"namespaces":  ns,
			"uidMappings": idMap,
			"gidMappings": idMap,
			"cgroupsPath": r.cgroup + "/" + id,
			"resources": map[string]any{
				"memory": map[string]any{"limit": spec.MemoryBytes, "swap": spec.MemoryBytes, "swappiness": 0},
				"pids":   map[string]any{"limit": 1024},
				"cpu":    map[string]any{"shares": 1024, "quota": 100000, "period": 100000},
			},
			"seccomp": ociSeccomp(),
		},
	}
}

var (
	ociSeccompOnce    sync.Once
	ociSeccompProfile map[string]any
)

// ociSeccomp translates the helper's profile (helper.SeccompGroups) into
// the OCI form, rule for rule: the same allowlist, the same argument
// conditions, clone3 ENOSYS, everything else EPERM, x86_64 only.
func ociSeccomp() map[string]any {
	ociSeccompOnce.Do(func() {
		info, err := arch.GetInfo("")
		if err != nil {
			panic(err)
		}
		var rules []map[string]any
		for _, g := range helper.SeccompGroups {
			action, errno := "SCMP_ACT_ALLOW", 0
			if g.Action != 0 && g.Action != seccomp.ActionAllow {
				action, errno = "SCMP_ACT_ERRNO", int(uint32(g.Action)&unix.SECCOMP_RET_DATA)
			}
			rule := func(names []string, args []map[string]any) {
				m := map[string]any{"names": names, "action": action}
				if errno != 0 {
					m["errnoRet"] = errno
				}
				if args != nil {
					m["args"] = args
				}
				rules = append(rules, m)
			}
			var names []string
			for _, n := range g.Names {
				if _, ok := info.SyscallNames[n]; ok {
					names = append(names, n)
				}
			}
			if len(names) > 0 {
				rule(names, nil)
			}
			for _, a := range g.Args {
				args := []map[string]any{}
				for _, c := range a.Conditions {
					switch c.Operation {
					case seccomp.Equal:
						args = append(args, map[string]any{"index": c.Argument, "value": c.Value, "op": "SCMP_CMP_EQ"})
					case seccomp.BitsNotSet:
						args = append(args, map[string]any{"index": c.Argument, "value": c.Value, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"})
					default:
						panic("no OCI form for " + string(c.Operation))
					}
				}
				rule([]string{a.Name}, args)
			}
		}
		ociSeccompProfile = map[string]any{
			"defaultAction":   "SCMP_ACT_ERRNO",
			"defaultErrnoRet": int(unix.EPERM),
			"architectures":   []string{"SCMP_ARCH_X86_64"},
			"syscalls":        rules,
		}
	})
	return ociSeccompProfile
}

// becomeSubreaper makes detached containers this process's children once
// their runtime exits, so they can be reaped and their CPU time counted
// (RUSAGE_CHILDREN).
func becomeSubreaper(tb testing.TB) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		tb.Fatal(err)
	}
}

func childrenCPU() time.Duration {
	var kids unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	return time.Duration(kids.Utime.Nano() + kids.Stime.Nano())
}

func selfCPU() time.Duration {
	var self unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano())
}

// spawnerCPU is the CPU time of the process backend's spawner and every
// helper (with its handler) it has reaped: the helper side's children,
// which this process only reaps when the backend closes. It is counted in
// clock ticks (10 ms): meaningful over many cycles, not over a few.
func spawnerCPU(tb testing.TB) time.Duration {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		kids, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		for _, k := range strings.Fields(string(kids)) {
			cmdline, _ := os.ReadFile("/proc/" + k + "/cmdline")
			if !strings.HasSuffix(string(cmdline), "\x00"+helper.SpawnerArg+"\x00") {
				continue
			}
			stat, _ := os.ReadFile("/proc/" + k + "/stat")
			// Fields after the command: state is 3; utime, stime, cutime,
			// cstime are 14-17.
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			var ticks int64
			for _, i := range []int{14, 15, 16, 17} {
				v, _ := strconv.ParseInt(f[i-3], 10, 64)
				ticks += v
			}
			return time.Duration(ticks) * time.Second / 100 // USER_HZ
		}
	}
	tb.Fatal("no helper spawner among this process's children")
	return 0
}

// TestOCIRuntimeIsolation starts one fiber through each OCI runtime and
// checks, from inside, what the benchmark below claims it has in common
// with a helper fiber: user namespace on its own host range, read-only
// root, private /tmp, own PID, network, UTS and cgroup namespaces, and the
// limits in its cgroups.
func TestOCIRuntimeIsolation(t *testing.T) {
	_, spec := newBackend(t)
	becomeSubreaper(t)
	for i, name := range []string{"crun", "runc"} {
		t.Run(name, func(t *testing.T) {
			r := lookOCIRuntime(t, name, spec.RootFS, 16*i)
			f, err := r.start("iso1", spec, 0)
			if f != nil {
				defer func() {
					if err := f.destroy(); err != nil {
						t.Error(err)
					}
				}()
			}
			if err != nil {
				t.Fatal(err)
			}
			get := func(path string) (int, string) {
				c := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return f.dial(time.Second) }}}
				resp, err := c.Get("http://fiber" + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			_, root := get("/")
			if !strings.Contains(root, `"uid":65534`) || !strings.Contains(root, `"hostname":"fiber-iso1"`) || !strings.Contains(root, `"pid":1,`) {
				t.Errorf("GET /: %s", root)
			}
			_, uidMap := get("/read?path=/proc/self/uid_map")
			if f := strings.Fields(uidMap); len(f) != 3 || f[0] != "0" || f[1] != strconv.Itoa(int(ociIDBase)+16*i*process.IDRangeSize) || f[2] != "65536" {
				t.Errorf("uid_map %q", uidMap)
			}
			if code, _ := get("/write?path=/app/x"); code == 200 {
				t.Error("wrote the read-only root")
			}
			if code, body := get("/write?path=/tmp/x"); code != 200 {
				_, mi := get("/read?path=/proc/self/mountinfo")
				t.Errorf("/tmp not writable: %s\n%s", body, mi)
			}
			if _, cg := get("/read?path=/proc/self/cgroup"); strings.Contains(cg, "lampyr") {
				t.Errorf("cgroup paths visible (no cgroup namespace): %s", cg)
			}
			if _, dev := get("/read?path=/proc/net/dev"); strings.Count(dev, ":") != 1 || !strings.Contains(dev, "lo:") {
				t.Errorf("interfaces other than lo: %s", dev)
			}
			if _, ps := get("/ps"); strings.Count(ps, ":") != 1 {
				t.Errorf("processes visible: %s", ps)
			}
			_, status := get("/read?path=/proc/self/status")
			for _, l := range strings.Split(status, "\n") {
				if strings.HasPrefix(l, "Seccomp") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Cap") {
					t.Log(l)
				}
			}
			for file, want := range map[string]string{
				"memory/" + r.cgroup + "/iso1/memory.limit_in_bytes": strconv.FormatInt(spec.MemoryBytes, 10),
				"pids/" + r.cgroup + "/iso1/pids.max":                "1024",
				"cpu/" + r.cgroup + "/iso1/cpu.cfs_quota_us":         "100000",
			} {
				b, err := os.ReadFile("/sys/fs/cgroup/" + file)
				if got := strings.TrimSpace(string(b)); err != nil || got != want {
					t.Errorf("%s: %q %v, want %s", file, got, err, want)
				}
			}
			ents, _ := os.ReadDir("/sys/fs/cgroup")
			var in []string
			for _, e := range ents {
				var st unix.Statfs_t
				if unix.Statfs(filepath.Join("/sys/fs/cgroup", e.Name()), &st) != nil || st.Type == unix.TMPFS_MAGIC {
					continue // not a cgroup hierarchy
				}
				if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", e.Name(), r.cgroup, "iso1")); err == nil {
					in = append(in, e.Name())
				}
			}
			t.Logf("%s put the fiber in cgroup hierarchies %v", name, in)
		})
	}
}

// BenchmarkOCIvsHelper starts and destroys fibers of the same handler,
// from the same read-only root, alternately through the process backend
// (helper), crun and runc: each iteration starts one fiber of each, in an
// order that rotates, so load on a shared machine falls on all sides
// alike. It reports, per side, the mean and median start (requested ->
// handler accepting on its port in its network namespace), the teardown
// (until its cgroups are removed) and the CPU time of a whole cycle in
// every process involved: this one, the runtime or the helper spawner, the
// helper, the handler (not the kernel's deferred namespace teardown). Run
// it with hack/bench-oci.sh (see the top of this file).
func BenchmarkOCIvsHelper(b *testing.B) {
	be, spec := newBackend(b)
	becomeSubreaper(b)
	fiberDirs := filepath.Join(filepath.Dir(spec.RootFS), "f")
	type side struct {
		name          string
		run           func(i int) (start, teardown time.Duration, err error)
		starts, tears []time.Duration
		cpu           time.Duration
		outsideCPU    func() time.Duration // CPU not seen by getrusage
		outside0      time.Duration
		r             *ociRuntime
	}
	sides := []*side{{name: "helper", outsideCPU: func() time.Duration { return spawnerCPU(b) },
		run: func(i int) (time.Duration, time.Duration, error) {
			id := fmt.Sprintf("h%d", i)
			t0 := time.Now()
			f, err := be.Start(context.Background(), id, spec)
			if err != nil {
				return 0, 0, err
			}
			t1 := time.Now()
			f.Destroy()
			// Destroy returns once the fiber's processes are gone; its
			// cgroup and directory go in the background: wait for them.
			for {
				if _, err := os.Stat(filepath.Join(fiberDirs, id)); errors.Is(err, os.ErrNotExist) {
					break
				}
				time.Sleep(200 * time.Microsecond)
			}
			return t1.Sub(t0), time.Since(t1), nil
		}}}
	for slot0, name := range map[int]string{0: "crun", 16: "runc"} {
		if _, err := exec.LookPath(name); err != nil {
			b.Logf("%s not installed, not measured (hack/install-crun.sh)", name)
			continue
		}
		r := lookOCIRuntime(b, name, spec.RootFS, slot0)
		sides = append(sides, &side{name: name, r: r, run: func(i int) (time.Duration, time.Duration, error) {
			t0 := time.Now()
			f, err := r.start(fmt.Sprintf("%s%d", name[:1], i), spec, i%16)
			if err != nil {
				if f != nil {
					f.destroy()
				}
				return 0, 0, err
			}
			t1 := time.Now()
			err = f.destroy()
			return t1.Sub(t0), time.Since(t1), err
		}})
	}
	sort.Slice(sides[1:], func(i, j int) bool { return sides[1+i].name < sides[1+j].name })
	// One untimed cycle each: binaries and the root in the page cache.
	for _, s := range sides {
		if _, _, err := s.run(-1 - len(s.name)); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
	}
	for _, s := range sides {
		if s.outsideCPU != nil {
			s.outside0 = s.outsideCPU()
		}
		if s.r != nil {
			s.r.runs, s.r.deletes = 0, 0
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range sides {
			s := sides[(i+k)%len(sides)]
			self0, kids0 := selfCPU(), childrenCPU()
			start, tear, err := s.run(i)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			s.cpu += selfCPU() - self0 + childrenCPU() - kids0
			s.starts = append(s.starts, start)
			s.tears = append(s.tears, tear)
		}
	}
	b.StopTimer()
	for _, s := range sides {
		if s.outsideCPU != nil {
			s.cpu += s.outsideCPU() - s.outside0
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mean := func(d []time.Duration) time.Duration {
		var t time.Duration
		for _, x := range d {
			t += x
		}
		return t / time.Duration(len(d))
	}
	median := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	h := sides[0]
	for _, s := range sides {
		n := float64(b.N)
		b.ReportMetric(ms(mean(s.starts)), s.name+"-start-ms")
		b.ReportMetric(ms(median(s.starts)), s.name+"-start-p50-ms")
		b.ReportMetric(ms(mean(s.tears)), s.name+"-teardown-ms")
		b.ReportMetric(ms(s.cpu)/n, s.name+"-cpu-ms")
		line := fmt.Sprintf("%-6s start mean %6.2f ms p50 %6.2f ms, teardown %6.2f ms, cpu %6.2f ms/cycle",
			s.name, ms(mean(s.starts)), ms(median(s.starts)), ms(mean(s.tears)), ms(s.cpu)/n)
		if s.r != nil {
			line += fmt.Sprintf(" (in `%s run` %.2f ms, `%s delete` %.2f ms)", s.name, ms(s.r.runs)/n, s.name, ms(s.r.deletes)/n)
		}
		if s != h {
			line += fmt.Sprintf("; vs helper: start x%.2f (p50 x%.2f), cpu x%.2f",
				float64(mean(s.starts))/float64(mean(h.starts)), float64(median(s.starts))/float64(median(h.starts)), float64(s.cpu)/float64(h.cpu))
		}
		fmt.Println(line)
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average at the end: %s", la)
	}
}
