package filelock

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestAnotherProcessWaits: a lock held by another process (flock is per
// open file, so a child holding it is a real second holder) makes Acquire
// wait, names the holder, and is free once the holder exits.
func TestAnotherProcessWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	// The child takes the lock with flock(1)-like behaviour through a
	// shell: hold it 1 s, then exit.
	child := exec.Command("bash", "-c", `exec 9>"$1"; flock 9; echo $$ >&9; sleep 1`, "bash", path)
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed (util-linux)")
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if len(b) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var holder string
	t0 := time.Now()
	l, err := Acquire(context.Background(), path, func(h string) { holder = h })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if waited := time.Since(t0); waited < 500*time.Millisecond {
		t.Errorf("acquired after %s while another process held it", waited)
	}
	if holder != strconv.Itoa(child.Process.Pid) {
		t.Errorf("holder %q, want the child's pid %d", holder, child.Process.Pid)
	}
	_ = child.Wait()
	// A cancelled wait gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	other := exec.Command("bash", "-c", `exec 9>"$1"; flock 9; sleep 2`, "bash", path)
	l.Unlock()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	time.Sleep(300 * time.Millisecond)
	if _, err := Acquire(ctx, path, nil); err == nil {
		t.Error("acquired a lock another process holds")
	}
}
