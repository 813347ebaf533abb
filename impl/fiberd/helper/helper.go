//go:build linux

// Package helper is lampyr-helper, the PID 1 of every fiber of the process
// backend (docs/contracts.md §5). fiberd starts it in a new user namespace
// (owned by, and mapped onto, a host id range of this fiber alone) and new
// mount, PID, network, IPC and UTS namespaces, already inside the fiber's
// memory, pids and cpu cgroups, with two inherited descriptors:
//
//	fd 3  the Setup, then the Spec, as JSON, both sent once the cgroups
//	      are set up; fiberd closes it after the Spec
//	fd 4  the status pipe: the helper writes "ready\n" or "error: ...\n"
//
// Both are made close-on-exec before anything else, so the handler never
// holds them. The helper, root of its user namespace only, turns the
// unpacked snapshot into the fiber's read-only root (pivot_root, private
// /tmp, minimal /dev, its own /proc), brings up the loopback interface and
// assembles the seccomp program as soon as the Setup comes (a sandbox
// shell waits so), then, given the Spec, enters a new cgroup namespace,
// joins a fresh session keyring and starts the handler as an unprivileged user of its namespace with the
// Knative runtime contract environment, rlimits, no_new_privs and the
// seccomp filter of seccomp.go, all set on the thread that forks it. It
// checks the handler's /proc status shows both, waits for it to listen on
// 127.0.0.1:$PORT, then reports ready; fiberd dials that port from inside
// the fiber's network namespace, so requests never pass through the helper.
// It reaps orphans like any PID 1 and exits when the handler exits, which
// ends the fiber: the kernel kills whatever is left in its PID namespace.
package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/backend"
)

// Setup is the first of the two messages fiberd sends on fd 3, once the
// helper is in the fiber's cgroups: the fiber's root. The helper builds it
// (and its loopback, and the seccomp program) at once, before the Spec
// names a handler, so a sandbox shell waits with its root ready and a
// start only sends the Spec.
type Setup struct {
	// Root is the host path of an empty directory that becomes the fiber's
	// mount point for the root (per fiber, so fibers never share mounts).
	Root string `json:"root"`
	// RootFS is the host path of the unpacked snapshot, bound read-only.
	RootFS string `json:"rootfs"`
	// TmpBytes caps the private /tmp (tmpfs, charged to the fiber's cgroup).
	TmpBytes int64 `json:"tmpBytes"`
	// Cgroups maps a cgroup v1 controller ("cpu", "memory", "pids") to the
	// host path of the fiber's own cgroup of that controller, bound
	// read-only at /sys/fs/cgroup/<controller> (the runtime contract's
	// read-only cgroup view).
	Cgroups map[string]string `json:"cgroups,omitempty"`
	// ResolvConf is the host path of the file bound read-only over the
	// snapshot's /etc/resolv.conf (which fiberd's unpack leaves a regular
	// file).
	ResolvConf string `json:"resolvConf,omitempty"`
}

// Spec is the second message on fd 3: the handler to start in the root of
// Setup. fiberd closes fd 3 after it.
type Spec struct {
	// Entrypoint is the handler's command, resolved inside the new root.
	Entrypoint []string `json:"entrypoint"`
	// Env is the handler's complete environment (PORT, K_* ...).
	Env  []string `json:"env"`
	Port int32    `json:"port"`
	// Hostname is the fiber's UTS name.
	Hostname string `json:"hostname"`
	// UID and GID the handler runs as inside the fiber's user namespace
	// (never 0; the helper stays root of that namespace only).
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Limits are the handler's rlimits.
	Limits Limits `json:"limits"`
	// StartupTimeoutMillis bounds how long the handler may take to listen.
	StartupTimeoutMillis int64 `json:"startupTimeoutMillis"`
	// ReadinessPath, if set, must answer GET with 2xx before "ready".
	ReadinessPath string `json:"readinessPath,omitempty"`
}

// Limits are rlimits set (soft = hard) on the handler. Zero leaves one as
// inherited.
type Limits struct {
	// OpenFiles is RLIMIT_NOFILE.
	OpenFiles uint64 `json:"openFiles,omitempty"`
	// Processes is RLIMIT_NPROC: tasks of the handler's uid, which no
	// other fiber shares.
	Processes uint64 `json:"processes,omitempty"`
	// FileBytes is RLIMIT_FSIZE, the largest file the handler may write.
	FileBytes uint64 `json:"fileBytes,omitempty"`
}

// Descriptor numbers of the helper protocol. fiberd reaches the handler
// itself, dialling 127.0.0.1:Port from inside the fiber's network namespace
// (see the process backend's Dial): no bytes of a request pass through the
// helper.
const (
	SpecFD   = 3
	StatusFD = 4
)

// ReadyLine is the status line of a ready fiber. The helper may put its
// own steps between "ready" and the newline (ReadySteps): " name=µs" each,
// how long each of its steps after the spec took, for fiberd's start steps
// (process.Config.OnStart). Only the helper writes the line: fd 4 is
// close-on-exec before the handler starts.
const ReadyLine = "ready\n"

// The helper's steps after its spec, in order (ReadySteps).
// The first three are done on the Setup, before the Spec: in a sandbox
// shell, before the start that takes it (StepWait is then the shell's wait).
const (
	StepRoot     = "root"     // user namespace checked, mounts, pivot_root, the host root detached
	StepLoopback = "lo"       // loopback up
	StepSeccomp  = "seccomp"  // the seccomp program assembled
	StepWait     = "wait"     // until the Spec came
	StepExec     = "exec"     // hostname, the confined thread, fork and exec of the handler
	StepConfined = "confined" // the handler's /proc status checked
	StepListen   = "listen"   // until the handler listens (and answers ReadinessPath)
)

// ReadySteps parses a status line of a ready fiber: ok reports whether it
// is one, steps are the helper's own (name, duration), in order.
func ReadySteps(line string) (steps []ReadyStep, ok bool) {
	rest, found := strings.CutPrefix(line, "ready")
	if !found || !strings.HasSuffix(rest, "\n") || (rest != "\n" && rest[0] != ' ') {
		return nil, false
	}
	for _, f := range strings.Fields(rest) {
		name, v, ok := strings.Cut(f, "=")
		us, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || us < 0 {
			continue
		}
		steps = append(steps, ReadyStep{name, time.Duration(us) * time.Microsecond})
	}
	return steps, true
}

// ReadyStep is one of the helper's steps in its ready line.
type ReadyStep struct {
	Name string
	D    time.Duration
}

// stepTimer builds the ready line's steps.
type stepTimer struct {
	last time.Time
	b    strings.Builder
}

func (t *stepTimer) mark(name string) {
	now := time.Now()
	fmt.Fprintf(&t.b, " %s=%d", name, now.Sub(t.last).Microseconds())
	t.last = now
}

// FailedPrefix starts the status line of a start that failed because of the
// handler itself: the rest of the line is a backend.StartFailure as JSON.
// Failures of the sandbox are "error: ..." lines; fiberd tells the two
// apart by the prefix, never by the wording of a message.
const FailedPrefix = "failed: "

// exitStatus is how the handler ended.
type exitStatus struct {
	code   int32
	signal string
}

func (e exitStatus) String() string {
	if e.signal != "" {
		return fmt.Sprintf("was killed by signal %s (exit code %d)", e.signal, e.code)
	}
	return fmt.Sprintf("exited with code %d", e.code)
}

func exitedFailure(e exitStatus, before string) backend.StartFailure {
	return backend.StartFailure{Reason: contract.ReasonHandlerExited, ExitCode: e.code, Signal: e.signal, Message: "the handler " + e.String() + " before " + before}
}

// MountPoints are the directories the read-only root must already contain;
// fiberd creates them when it unpacks a snapshot.
var MountPoints = []string{"proc", "tmp", "dev", "sys"}

// ResolvConfPath is the file, relative to the root, that Spec.ResolvConf
// is bound over; fiberd's unpack makes it a regular file.
const ResolvConfPath = "etc/resolv.conf"

// Main runs the helper and returns its exit code.
func Main() int {
	// The handler must never inherit the protocol descriptors (fd 4 would
	// let it forge or stall the helper's report with an unterminated line)
	// nor anything else fiberd's own parent left open: every descriptor
	// from 3 up is made close-on-exec, so the handler gets 0, 1 and 2 only.
	if err := unix.CloseRange(SpecFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		for fd := SpecFD; fd < 1024; fd++ {
			unix.CloseOnExec(fd)
		}
	}
	status := os.NewFile(StatusFD, "status")
	fail := func(err error) int {
		fmt.Fprintf(status, "error: %v\n", err)
		fmt.Fprintf(os.Stderr, "lampyr-helper: %v\n", err)
		return 1
	}
	// failed reports the handler's own failure. Nothing goes to stderr:
	// fiberd logs it, and the fiber's output is the handler's alone, which
	// fiberd shows the Revision's owner.
	failed := func(f backend.StartFailure) int {
		b, _ := json.Marshal(f)
		fmt.Fprintf(status, "%s%s\n", FailedPrefix, b)
		return 1
	}
	if os.Getpid() != 1 {
		return fail(errors.New("must run as PID 1 of a new PID namespace (started by fiberd's process backend)"))
	}
	specFile := os.NewFile(SpecFD, "spec")
	dec := json.NewDecoder(specFile)
	var setup Setup
	if err := dec.Decode(&setup); err != nil {
		return fail(fmt.Errorf("reading the setup on fd %d: %w", SpecFD, err))
	}
	// Everything up to the handler's own start that the Spec does not
	// change is done here, while a sandbox shell waits (the time each took
	// is reported with ready: the steps of a start without a shell).
	steps := stepTimer{last: time.Now()}
	if err := checkOwnUserNamespace(); err != nil {
		return fail(err)
	}
	if err := setupRoot(&setup); err != nil {
		return fail(err)
	}
	steps.mark(StepRoot)
	if err := loopbackUp(); err != nil {
		return fail(fmt.Errorf("bringing up lo: %w", err))
	}
	steps.mark(StepLoopback)
	prog, err := seccompProgram()
	if err != nil {
		return fail(err)
	}
	steps.mark(StepSeccomp)

	var spec Spec
	if err := dec.Decode(&spec); err != nil {
		return fail(fmt.Errorf("reading spec on fd %d: %w", SpecFD, err))
	}
	specFile.Close()
	steps.mark(StepWait)
	if len(spec.Entrypoint) == 0 {
		return fail(errors.New("spec has no entrypoint"))
	}
	if spec.UID == 0 || spec.GID == 0 {
		return fail(fmt.Errorf("refusing to run the handler as uid %d gid %d: root of the fiber's user namespace holds its namespaces", spec.UID, spec.GID))
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fail(fmt.Errorf("sethostname: %w", err))
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT)

	cmd := exec.Command(spec.Entrypoint[0], spec.Entrypoint[1:]...)
	cmd.Env = spec.Env
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: []uint32{}},
		Setsid:     true,
	}
	if err := startConfined(cmd, spec.Limits, prog); err != nil {
		return fail(fmt.Errorf("starting handler %q: %w", spec.Entrypoint[0], err))
	}
	handler := cmd.Process.Pid
	steps.mark(StepExec)

	exited := make(chan exitStatus, 1)
	go reap(sigs, handler, exited)

	if err := CheckConfined(handler); err != nil {
		unix.Kill(handler, unix.SIGKILL)
		return fail(fmt.Errorf("%w; refusing to run it", err))
	}
	steps.mark(StepConfined)

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(spec.Port)))
	deadline := time.Now().Add(time.Duration(spec.StartupTimeoutMillis) * time.Millisecond)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case e := <-exited:
			return failed(exitedFailure(e, fmt.Sprintf("it listened on $PORT (%d)", spec.Port)))
		default:
		}
		if time.Now().After(deadline) {
			return failed(backend.StartFailure{Reason: contract.ReasonHandlerNotListening, Message: fmt.Sprintf("the handler did not listen on $PORT (%d) within the start-up timeout of %s", spec.Port, time.Duration(spec.StartupTimeoutMillis)*time.Millisecond)})
		}
		time.Sleep(500 * time.Microsecond)
	}

	if spec.ReadinessPath != "" {
		if f := waitHTTPReady(addr, spec.ReadinessPath, deadline, exited); f != nil {
			return failed(*f)
		}
	}

	steps.mark(StepListen)
	io.WriteString(status, "ready"+steps.b.String()+"\n")
	status.Close()
	return int((<-exited).code)
}

// startConfined starts cmd from an OS thread that has entered a new
// cgroup namespace, joined a new session keyring and set the handler's
// rlimits, no_new_privs and the seccomp filter. Each of those belongs to a
// thread, not to the process: a new process inherits them from the thread
// that forks it (setting no_new_privs on another thread of the helper is
// how most handlers ran without it before). The thread keeps the filter,
// so it is never given back to the Go scheduler: the goroutine ends locked
// and the runtime ends the thread.
func startConfined(cmd *exec.Cmd, l Limits, prog *unix.SockFprog) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// fiberd moved the helper into the fiber's cgroups before sending
		// the spec: a cgroup namespace rooted there hides the Home's cgroup
		// paths (Pod UID, container ID) from /proc/self/cgroup.
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			done <- fmt.Errorf("new cgroup namespace: %w", err)
			return
		}
		// A fresh, anonymous session keyring: nothing fiberd's session held
		// (or an earlier fiber added to it) is reachable from the handler.
		if _, _, e := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); e != 0 {
			done <- fmt.Errorf("joining a new session keyring: %w", e)
			return
		}
		// rlimits belong to the process, so they are set here, just before
		// the fork, and the helper (which starts nothing else) keeps them.
		for _, r := range []struct {
			res int
			v   uint64
		}{{unix.RLIMIT_NOFILE, l.OpenFiles}, {unix.RLIMIT_NPROC, l.Processes}, {unix.RLIMIT_FSIZE, l.FileBytes}, {unix.RLIMIT_CORE, 0}} {
			if r.v == 0 && r.res != unix.RLIMIT_CORE {
				continue
			}
			// syscall.Setrlimit, not unix: os/exec then passes the limit on
			// instead of restoring the soft open-files limit it started with.
			if err := syscall.Setrlimit(r.res, &syscall.Rlimit{Cur: r.v, Max: r.v}); err != nil {
				done <- fmt.Errorf("setrlimit %d: %w", r.res, err)
				return
			}
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- fmt.Errorf("no_new_privs: %w", err)
			return
		}
		if err := loadSeccomp(prog); err != nil {
			done <- err
			return
		}
		done <- cmd.Start()
	}()
	return <-done
}

// CheckConfined reads a handler's /proc status: a handler that is not
// running under no_new_privs and a seccomp filter, or that holds a
// capability, is never reported ready. (The OCI runtime benchmark applies
// the same check to what crun and runc start.)
func CheckConfined(pid int) error {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return fmt.Errorf("checking the handler's confinement: %w", err)
	}
	want := map[string]string{"NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0000000000000000", "CapPrm": "0000000000000000"}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if w, check := want[k]; ok && check {
			if strings.TrimSpace(v) != w {
				return fmt.Errorf("handler %d has %s %s, want %s", pid, k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("handler %d: /proc status lacks %v", pid, want)
	}
	return nil
}

// checkOwnUserNamespace refuses to start a handler outside a user namespace
// of its own: the helper must be root of a namespace mapped onto the
// fiber's private host id range, never the host's root.
func checkOwnUserNamespace() error {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return fmt.Errorf("reading uid_map: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 || f[0] != "0" || f[1] == "0" {
		return fmt.Errorf("not in a user namespace of its own (uid_map %q): fiberd must map the fiber onto its own host id range", strings.TrimSpace(string(b)))
	}
	return nil
}

// waitHTTPReady polls GET path until it answers 2xx, the handler exits or
// the deadline passes.
func waitHTTPReady(addr, path string, deadline time.Time, exited chan exitStatus) *backend.StartFailure {
	c := &http.Client{Timeout: time.Second}
	last := ""
	for {
		resp, err := c.Get("http://" + addr + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
			last = resp.Status
		} else {
			// Not err itself: it names the loopback address, which the
			// owner did not choose and need not see.
			last = "no HTTP answer"
		}
		select {
		case e := <-exited:
			f := exitedFailure(e, fmt.Sprintf("GET %s answered 2xx", path))
			return &f
		default:
		}
		if time.Now().After(deadline) {
			return &backend.StartFailure{Reason: contract.ReasonHandlerNotReady, Message: fmt.Sprintf("GET %s did not answer 2xx within the start-up timeout (last: %s)", path, last)}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reap collects every child (orphans reparent to PID 1), forwards
// termination signals to the handler and reports the handler's exit.
func reap(sigs chan os.Signal, handler int, exited chan<- exitStatus) {
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			unix.Kill(handler, sig.(syscall.Signal))
			continue
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == handler {
				e := exitStatus{code: int32(ws.ExitStatus())}
				if ws.Signaled() {
					fmt.Fprintf(os.Stderr, "lampyr-helper: handler killed by %s\n", ws.Signal())
					e = exitStatus{code: 128 + int32(ws.Signal()), signal: unix.SignalName(ws.Signal())}
				}
				exited <- e
			}
		}
	}
}

func setupRoot(spec *Setup) error {
	// Nothing done here may propagate back to the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	root := spec.Root
	if err := unix.Mount(spec.RootFS, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding snapshot %s: %w", spec.RootFS, err)
	}
	// In a user namespace the flags the bind inherited from the host's
	// mount (noexec, relatime ...) are locked: a remount must repeat them.
	if err := unix.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|lockedFlags(root), ""); err != nil {
		return fmt.Errorf("making root read-only: %w", err)
	}
	tmpOpts := "mode=1777"
	if spec.TmpBytes > 0 {
		tmpOpts += ",size=" + strconv.FormatInt(spec.TmpBytes, 10)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("mounting /tmp: %w", err)
	}
	if err := setupDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	if err := setupSys(filepath.Join(root, "sys"), spec.Cgroups); err != nil {
		return err
	}
	if spec.ResolvConf != "" {
		if err := bindFileRO(spec.ResolvConf, root, ResolvConfPath); err != nil {
			return err
		}
	}
	// We are PID 1 of the new PID namespace, so this /proc shows only the
	// fiber's processes.
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one without a
	// put_old directory (the new root is read-only); detaching it leaves
	// nothing of the host reachable.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host root: %w", err)
	}
	return unix.Chdir("/")
}

// devFiles are the device nodes of the fiber's /dev, bound from the Home's
// own /dev (a user namespace cannot create device nodes). /dev/console is
// deliberately absent (the runtime contract says it should not exist).
var devFiles = []string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are the runtime contract's /dev symlinks.
var devLinks = map[string]string{
	"fd":     "/proc/self/fd",
	"stdin":  "/proc/self/fd/0",
	"stdout": "/proc/self/fd/1",
	"stderr": "/proc/self/fd/2",
	"ptmx":   "pts/ptmx",
}

// setupDev builds the fiber's /dev on a small tmpfs, read-only once built:
// the device nodes of devFiles, the contract's symlinks and a
// private devpts instance (its own ptys, none of the Home's) behind
// /dev/ptmx.
func setupDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, d := range devFiles {
		p := filepath.Join(dev, d)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	for name, target := range devLinks {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	// A new devpts instance belongs to this fiber's user namespace: its
	// ptys are the fiber's alone, and ptmx is usable by the handler.
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mounting /dev/pts: %w", err)
	}
	if err := unix.Mount("", dev, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("making /dev read-only: %w", err)
	}
	return nil
}

// setupSys gives the fiber a /sys holding only fs/cgroup/<controller>: its
// own cgroups, read-only (how a container runtime shows cgroup v1 to a
// container). Nothing else of the host's sysfs is there.
func setupSys(sys string, cgroups map[string]string) error {
	if err := unix.Mount("tmpfs", sys, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=16k"); err != nil {
		return fmt.Errorf("mounting /sys: %w", err)
	}
	cg := filepath.Join(sys, "fs", "cgroup")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", cg, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=16k"); err != nil {
		return fmt.Errorf("mounting /sys/fs/cgroup: %w", err)
	}
	names := make([]string, 0, len(cgroups))
	for c := range cgroups {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		if c == "" || strings.ContainsAny(c, "/.") {
			return fmt.Errorf("cgroup controller name %q", c)
		}
		p := filepath.Join(cg, c)
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(cgroups[c], p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the fiber's %s cgroup: %w", c, err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|lockedFlags(p), ""); err != nil {
			return fmt.Errorf("making the %s cgroup view read-only: %w", c, err)
		}
	}
	for _, p := range []string{cg, sys} {
		if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=16k"); err != nil {
			return fmt.Errorf("making %s read-only: %w", p, err)
		}
	}
	return nil
}

// bindFileRO binds the host file src read-only over rel inside root. The
// target must be a regular file of the root itself: a symlink there would
// be followed on the host's side of pivot_root.
func bindFileRO(src, root, rel string) error {
	dst := filepath.Join(root, rel)
	fi, err := os.Lstat(dst)
	if err != nil {
		return fmt.Errorf("/%s: %w", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("/%s is not a regular file in the snapshot", rel)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding /%s: %w", rel, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|lockedFlags(dst), ""); err != nil {
		return fmt.Errorf("making /%s read-only: %w", rel, err)
	}
	return nil
}

// lockedFlags are the mount flags of the mount at p that a remount inside
// a user namespace may not clear.
func lockedFlags(p string) uintptr {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0
	}
	f := uintptr(st.Flags) & (unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME)
	if st.Flags&unix.ST_RELATIME != 0 {
		f |= unix.MS_RELATIME
	}
	return f
}

// loopbackUp sets IFF_UP on lo in the fiber's fresh network namespace, its
// only interface: the handler can listen on 127.0.0.1 and reach nothing else.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
