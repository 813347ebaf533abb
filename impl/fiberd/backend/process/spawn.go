//go:build linux

package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/fiberd/helper"
)

// spawner is fiberd's end of the helper spawner (helper.SpawnerMain): a
// small child process that clones each fiber's helper into its user
// namespace, so fiberd itself is never copied by a fork.
type spawner struct {
	sock *os.File
	cmd  *exec.Cmd

	sendMu  sync.Mutex
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan helper.SpawnReply
	exits   map[int]chan string
	// early holds exits reported before their fiber registered.
	early map[int]string
	dead  error
}

func startSpawner(helperPath string, log io.Writer) (*spawner, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "spawner"), os.NewFile(uintptr(fds[1]), "spawner")
	defer theirs.Close()
	cmd := exec.Command(helperPath, helper.SpawnerArg)
	cmd.Env = []string{"GOMAXPROCS=1"}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL, Setsid: true}
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting the helper spawner (%s %s): %w", helperPath, helper.SpawnerArg, err)
	}
	s := &spawner{sock: ours, cmd: cmd, waiting: map[uint64]chan helper.SpawnReply{}, exits: map[int]chan string{}, early: map[int]string{}}
	go s.read()
	return s, nil
}

// read dispatches the spawner's replies until it dies.
func (s *spawner) read() {
	buf := make([]byte, 4096)
	rc, err := s.sock.SyscallConn()
	if err != nil {
		s.fail(fmt.Errorf("helper spawner socket: %v", err))
		return
	}
	for {
		// Through the RawConn the descriptor stays referenced while
		// recvmsg runs: close cannot release (and let the kernel reuse)
		// its number under this read.
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
			return true
		}); err != nil {
			rerr = err
		}
		err := rerr
		if err != nil || n == 0 {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.fail(fmt.Errorf("helper spawner gone: %v", err))
			return
		}
		var r helper.SpawnReply
		if json.Unmarshal(buf[:n], &r) != nil {
			continue
		}
		s.mu.Lock()
		switch {
		case r.ID != 0:
			if ch, ok := s.waiting[r.ID]; ok {
				delete(s.waiting, r.ID)
				ch <- r
			}
		case r.Exited != "":
			if ch, ok := s.exits[r.Pid]; ok {
				delete(s.exits, r.Pid)
				ch <- r.Exited
			} else {
				s.early[r.Pid] = r.Exited
			}
		}
		s.mu.Unlock()
	}
}

func (s *spawner) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead == nil {
		s.dead = err
	}
	for id, ch := range s.waiting {
		ch <- helper.SpawnReply{ID: id, Error: err.Error()}
		delete(s.waiting, id)
	}
	for pid, ch := range s.exits {
		ch <- err.Error()
		delete(s.exits, pid)
	}
}

// spawn asks for a helper with fds (spec, status, log) and returns its pid
// and a channel that receives its exit.
func (s *spawner) spawn(req helper.SpawnRequest, spec, status, log *os.File) (int, <-chan string, error) {
	ch := make(chan helper.SpawnReply, 1)
	s.mu.Lock()
	if s.dead != nil {
		s.mu.Unlock()
		return 0, nil, s.dead
	}
	s.next++
	req.ID = s.next
	s.waiting[req.ID] = ch
	s.mu.Unlock()
	b, _ := json.Marshal(req)
	rights := unix.UnixRights(int(spec.Fd()), int(status.Fd()), int(log.Fd()))
	s.sendMu.Lock()
	var err error
	if rc, rcErr := s.sock.SyscallConn(); rcErr != nil {
		err = rcErr
	} else if werr := rc.Write(func(fd uintptr) bool {
		err = unix.Sendmsg(int(fd), b, rights, nil, 0)
		return true
	}); werr != nil {
		err = werr
	}
	s.sendMu.Unlock()
	if err != nil {
		s.mu.Lock()
		delete(s.waiting, req.ID)
		s.mu.Unlock()
		return 0, nil, fmt.Errorf("asking the helper spawner: %w", err)
	}
	r := <-ch
	if r.Error != "" {
		return 0, nil, errors.New(r.Error)
	}
	exit := make(chan string, 1)
	s.mu.Lock()
	if e, ok := s.early[r.Pid]; ok {
		delete(s.early, r.Pid)
		exit <- e
	} else if s.dead != nil {
		exit <- s.dead.Error()
	} else {
		s.exits[r.Pid] = exit
	}
	s.mu.Unlock()
	return r.Pid, exit, nil
}

// close ends the spawner (and so any helper still running).
func (s *spawner) close() {
	s.sock.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}
