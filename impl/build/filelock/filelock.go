// Package filelock serialises work on a cache entry across processes: a
// background build of the cluster inputs (started by the justfile while a
// suite compiles) and the suite's own harness, or two terminals, must not
// build into one directory at once. The lock is flock(2) on a file beside
// the entry, released by the kernel when its holder exits, however it
// exits.
package filelock

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Lock holds path locked until Unlock.
type Lock struct{ f *os.File }

// Acquire locks path (created if missing), waiting while another process
// holds it; waiting, if not nil, is called once when it must wait, with
// the holder's pid as it wrote it.
func Acquire(ctx context.Context, path string, waiting func(holder string)) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !told && waiting != nil {
			told = true
			b, _ := os.ReadFile(path)
			waiting(strings.TrimSpace(string(b)))
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	// Say who holds it, for whoever waits next.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() {
	if l == nil || l.f == nil {
		return
	}
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
