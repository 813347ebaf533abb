//go:build linux

package process

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cgPool keeps a Home's fiber cgroups of one controller for reuse.
// Creating and removing a cgroup v1 cpu group cost about 1 ms of CPU per
// fiber here (a quarter of what the sandbox adds to a start); an empty
// cgroup holds nothing of its last fiber, and the settings (pids.max, cpu
// shares and quota) are the same for every fiber of a Home. Memory cgroups
// are not pooled: charges that outlive a fiber's tasks would count against
// the next one.
type cgPool struct {
	parent string
	setup  func(dir string) error

	mu   sync.Mutex
	free []string
	n    int
}

// get returns an empty cgroup, creating and setting up a new one if none
// is free.
func (p *cgPool) get() (string, error) {
	p.mu.Lock()
	if k := len(p.free); k > 0 {
		dir := p.free[k-1]
		p.free = p.free[:k-1]
		p.mu.Unlock()
		return dir, nil
	}
	p.n++
	dir := filepath.Join(p.parent, "s"+strconv.Itoa(p.n))
	p.mu.Unlock()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := p.setup(dir); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// put takes dir back once its last task has gone (the fiber was killed, so
// that is a matter of milliseconds); a cgroup still busy after a second is
// left out of the pool.
func (p *cgPool) put(dir string) error {
	for i := 0; ; i++ {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err == nil && strings.TrimSpace(string(b)) == "" {
			break
		}
		if i == 200 {
			return fmt.Errorf("cgroup %s still has tasks %q: not reused", dir, strings.Fields(string(b)))
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.mu.Lock()
	p.free = append(p.free, dir)
	p.mu.Unlock()
	return nil
}

// close removes the free cgroups.
func (p *cgPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.free {
		os.Remove(d)
	}
	p.free = nil
}
