//go:build linux

package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The spawner starts fibers' helpers for fiberd. A helper is cloned into a
// new user namespace, and Go cannot vfork a process into one (the child
// must wait for its id map, which the suspended parent could not write):
// it copies the parent's page tables instead, and fiberd's copy, with the
// write faults it costs fiberd afterwards, was the larger part of what the
// sandbox added to a fiber's start. fiberd therefore keeps one small
// process, this one (lampyr-helper spawner), forked once, and asks it to
// clone each helper; copying its few MiB is cheap.
//
// Protocol, on a SOCK_SEQPACKET socket at fd 3 (one message each):
//
//	fiberd -> spawner  SpawnRequest (JSON) + 3 descriptors (SCM_RIGHTS):
//	                   the helper's fd 3 (spec), fd 4 (status), fds 1 and 2 (log)
//	spawner -> fiberd  SpawnReply {id, pid} or {id, error} once started,
//	                   then {pid, exited} when that helper has exited
//
// The spawner exits, and with it (Pdeathsig) every helper it started, when
// fiberd closes the socket or dies.

// SpawnerArg is the helper binary's argument that makes it the spawner.
const SpawnerArg = "spawner"

// SpawnFD is the spawner's socket.
const SpawnFD = 3

// SpawnRequest asks for one fiber's helper.
type SpawnRequest struct {
	ID uint64 `json:"id"`
	// Path is the helper binary to start.
	Path string `json:"path"`
	// HostID is the first host id of the fiber's range: inside the new
	// user namespace 0..IDs-1 map to HostID..; HostID also owns it.
	HostID uint32 `json:"hostID"`
	IDs    uint32 `json:"ids"`
	// Cloneflags are the namespaces besides the user namespace.
	Cloneflags uintptr `json:"cloneflags"`
}

// SpawnReply answers a request, or reports a helper's exit.
type SpawnReply struct {
	ID     uint64 `json:"id,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	Error  string `json:"error,omitempty"`
	Exited string `json:"exited,omitempty"`
}

// SpawnerMain runs the spawner; it returns when fiberd closes the socket.
func SpawnerMain() int {
	sock := os.NewFile(SpawnFD, "spawner")
	unix.CloseOnExec(SpawnFD)
	send := func(r SpawnReply) {
		b, _ := json.Marshal(r)
		unix.Sendmsg(SpawnFD, b, nil, nil, 0)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(SpawnFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil || n == 0 {
			// fiberd is gone: so are we, and our helpers with us.
			sock.Close()
			return 0
		}
		var req SpawnRequest
		jerr := json.Unmarshal(buf[:n], &req)
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		if jerr != nil || len(fds) != 3 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			send(SpawnReply{ID: req.ID, Error: fmt.Sprintf("bad spawn request (%v, %d descriptors)", jerr, len(fds))})
			continue
		}
		spec, status, log := os.NewFile(uintptr(fds[0]), "spec"), os.NewFile(uintptr(fds[1]), "status"), os.NewFile(uintptr(fds[2]), "log")
		cmd := exec.Command(req.Path)
		cmd.Env = []string{"GOMAXPROCS=1"}
		cmd.Stdout, cmd.Stderr = log, log
		cmd.ExtraFiles = []*os.File{spec, status} // fds 3, 4
		idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(req.HostID), Size: int(req.IDs)}}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			// The user namespace comes first and owns the others: the
			// helper is root over the fiber's mounts, network and
			// processes and nothing else.
			Cloneflags: unix.CLONE_NEWUSER | req.Cloneflags,
			// Written by this process (root in the parent namespace, so
			// any range may be mapped) before the helper runs.
			UidMappings:                idMap,
			GidMappings:                idMap,
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
			// If the spawner (and so fiberd) dies, the fibers die too.
			Pdeathsig: unix.SIGKILL,
			Setsid:    true,
		}
		err = startOwnedBy(cmd, req.HostID)
		spec.Close()
		status.Close()
		log.Close()
		if err != nil {
			send(SpawnReply{ID: req.ID, Error: err.Error()})
			continue
		}
		pid := cmd.Process.Pid
		send(SpawnReply{ID: req.ID, Pid: pid})
		go func() {
			err := cmd.Wait()
			send(SpawnReply{Pid: pid, Exited: fmt.Sprint(err)})
		}()
	}
}

// startOwnedBy starts cmd, which creates a user namespace, from an OS
// thread whose effective uid and gid are hostID (with its capabilities
// kept): the kernel makes the creator's effective ids the namespace's
// owner, and charges what the namespace's users hold, at the parent level,
// to that owner. Owned by root, every fiber of the node would share root's
// per-user counts (one fiber holding every inotify instance denied them to
// the node's own root processes, measured here); owned by the fiber's
// first id, each fiber has its own. Only this thread changes ids, and only
// for the clone; it is restored before it goes back to the scheduler. Were
// that to fail, the thread stays locked and ends with this goroutine (its
// children get Pdeathsig, so the fiber dies; the caller reports the error).
func startOwnedBy(cmd *exec.Cmd, hostID uint32) error {
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(hostID), ^uintptr(0)); e != 0 {
		restored = true
		return fmt.Errorf("setting the creating thread's gid to %d: %w", hostID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(hostID), ^uintptr(0)); e != 0 {
		restored = restoreIDs() == nil
		return fmt.Errorf("setting the creating thread's uid to %d: %w", hostID, e)
	}
	// Leaving euid 0 cleared the effective capabilities; they are still
	// permitted, and the clone and the id map need them.
	startErr := raiseEffectiveCaps()
	if startErr == nil {
		startErr = cmd.Start()
	}
	if err := restoreIDs(); err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
		return fmt.Errorf("restoring the spawner's thread ids: %w", err)
	}
	restored = true
	return startErr
}

func raiseEffectiveCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := unix.RawSyscall(unix.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capget: %w", e)
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// restoreIDs gives the calling thread back effective uid and gid 0 (its
// real and saved ids never changed; going back to euid 0 restores the
// effective capabilities).
func restoreIDs() error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
		return e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
		return e
	}
	if os.Geteuid() != 0 {
		return errors.New("effective uid still not 0")
	}
	return nil
}
