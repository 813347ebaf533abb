//go:build linux

// Package helper is lampyr-helper, the PID 1 of every fiber of the process
// backend (docs/contracts.md §5). fiberd starts it in fresh mount, PID,
// network, IPC and UTS namespaces, already inside the fiber's memory cgroup,
// with two inherited descriptors:
//
//	fd 3  the Spec as JSON, closed by fiberd once the cgroup is set up
//	fd 4  the status pipe: the helper writes "ready\n" or "error: ...\n"
//
// The helper turns the unpacked snapshot into the fiber's read-only root
// (pivot_root, private /tmp, minimal /dev, its own /proc), brings up the
// loopback interface, starts the handler as an unprivileged user with the
// Knative runtime contract environment, waits for it to listen on
// 127.0.0.1:$PORT, then reports ready; fiberd dials that port from inside
// the fiber's network namespace, so requests never pass through the helper. It
// reaps orphans like any PID 1 and exits when the handler exits, which ends
// the fiber: the kernel kills whatever is left in its PID namespace.
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
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Spec is what fiberd tells the helper on fd 3.
type Spec struct {
	// Root is the host path of an empty directory that becomes the fiber's
	// mount point for the root (per fiber, so fibers never share mounts).
	Root string `json:"root"`
	// RootFS is the host path of the unpacked snapshot, bound read-only.
	RootFS string `json:"rootfs"`
	// Entrypoint is the handler's command, resolved inside the new root.
	Entrypoint []string `json:"entrypoint"`
	// Env is the handler's complete environment (PORT, K_* ...).
	Env  []string `json:"env"`
	Port int32    `json:"port"`
	// Hostname is the fiber's UTS name.
	Hostname string `json:"hostname"`
	// UID and GID the handler runs as (the helper stays root in its namespaces).
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// TmpBytes caps the private /tmp (tmpfs, charged to the fiber's cgroup).
	TmpBytes int64 `json:"tmpBytes"`
	// StartupTimeoutMillis bounds how long the handler may take to listen.
	StartupTimeoutMillis int64 `json:"startupTimeoutMillis"`
	// ReadinessPath, if set, must answer GET with 2xx before "ready".
	ReadinessPath string `json:"readinessPath,omitempty"`
}

// Descriptor numbers of the helper protocol. fiberd reaches the handler
// itself, dialling 127.0.0.1:Port from inside the fiber's network namespace
// (see the process backend's Dial): no bytes of a request pass through the
// helper.
const (
	SpecFD   = 3
	StatusFD = 4
)

// ReadyLine is the status line of a ready fiber.
const ReadyLine = "ready\n"

// MountPoints are the directories the read-only root must already contain;
// fiberd creates them when it unpacks a snapshot.
var MountPoints = []string{"proc", "tmp", "dev"}

// Main runs the helper and returns its exit code.
func Main() int {
	status := os.NewFile(StatusFD, "status")
	fail := func(err error) int {
		fmt.Fprintf(status, "error: %v\n", err)
		fmt.Fprintf(os.Stderr, "lampyr-helper: %v\n", err)
		return 1
	}
	if os.Getpid() != 1 {
		return fail(errors.New("must run as PID 1 of a new PID namespace (started by fiberd's process backend)"))
	}
	var spec Spec
	specFile := os.NewFile(SpecFD, "spec")
	if err := json.NewDecoder(specFile).Decode(&spec); err != nil {
		return fail(fmt.Errorf("reading spec on fd %d: %w", SpecFD, err))
	}
	specFile.Close()
	if err := setupRoot(&spec); err != nil {
		return fail(err)
	}
	if err := loopbackUp(); err != nil {
		return fail(fmt.Errorf("bringing up lo: %w", err))
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fail(fmt.Errorf("sethostname: %w", err))
	}
	// No process in the fiber may gain privileges through execve (setuid
	// binaries in a snapshot, file capabilities).
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("no_new_privs: %w", err))
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
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("starting handler %q: %w", spec.Entrypoint[0], err))
	}
	handler := cmd.Process.Pid

	exited := make(chan int, 1)
	go reap(sigs, handler, exited)

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(spec.Port)))
	deadline := time.Now().Add(time.Duration(spec.StartupTimeoutMillis) * time.Millisecond)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case code := <-exited:
			fail(fmt.Errorf("handler exited with status %d before listening on %s", code, addr))
			return 1
		default:
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("handler did not listen on %s within %s (start-up contract: listen on $PORT)", addr, time.Duration(spec.StartupTimeoutMillis)*time.Millisecond))
		}
		time.Sleep(500 * time.Microsecond)
	}

	if spec.ReadinessPath != "" {
		if err := waitHTTPReady(addr, spec.ReadinessPath, deadline, exited); err != nil {
			return fail(err)
		}
	}

	io.WriteString(status, ReadyLine)
	status.Close()
	return <-exited
}

// waitHTTPReady polls GET path until it answers 2xx, the handler exits or
// the deadline passes.
func waitHTTPReady(addr, path string, deadline time.Time, exited chan int) error {
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
			last = err.Error()
		}
		select {
		case code := <-exited:
			return fmt.Errorf("handler exited with status %d before GET %s answered 2xx", code, path)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s did not answer 2xx before the start-up deadline (last: %s)", path, last)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reap collects every child (orphans reparent to PID 1), forwards
// termination signals to the handler and reports the handler's exit.
func reap(sigs chan os.Signal, handler int, exited chan<- int) {
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
				code := ws.ExitStatus()
				if ws.Signaled() {
					fmt.Fprintf(os.Stderr, "lampyr-helper: handler killed by %s\n", ws.Signal())
					code = 128 + int(ws.Signal())
				}
				exited <- code
			}
		}
	}
}

func setupRoot(spec *Spec) error {
	// Nothing done here may propagate back to the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	root := spec.Root
	if err := unix.Mount(spec.RootFS, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding snapshot %s: %w", spec.RootFS, err)
	}
	if err := unix.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making root read-only: %w", err)
	}
	tmpOpts := "mode=1777"
	if spec.TmpBytes > 0 {
		tmpOpts += ",size=" + strconv.FormatInt(spec.TmpBytes, 10)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("mounting /tmp: %w", err)
	}
	dev := filepath.Join(root, "dev")
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "random", "urandom"} {
		p := filepath.Join(dev, d)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	if err := unix.Mount("", dev, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("making /dev read-only: %w", err)
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
