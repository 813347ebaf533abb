//go:build linux

package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Host id ranges. Every fiber gets a user namespace of its own, mapped onto
// a range of IDRangeSize host uids and gids that no other live fiber on the
// node holds: inside it the helper is 0 and the handler its snapshot's user
// (65534 by default); on the host they are base+0 and base+uid. The range's
// first id also owns the namespace (fiberd creates it from a thread whose
// effective uid is that id), so what the kernel counts per user (keys and
// their quota, inotify instances and watches, user namespaces, message
// queue bytes, RLIMIT_NPROC tasks) is counted per fiber, at every level of
// the user namespace hierarchy, instead of for one uid every fiber of the
// node shared (65534 before; root, had fiberd owned the namespaces).
//
// Ranges are unique across Homes on a node by coordination, not
// derivation: each range n (host ids IDBase+n*IDRangeSize ...) is claimed
// by an exclusive, non-blocking flock on the file <IDLockDir>/<n>, a
// directory every Home on the node mounts from the same host path
// (/run/lampyr/idmap, a hostPath in the Home Pod). fiberd holds the lock
// from before the fiber's clone until the fiber's cgroups could be removed,
// which the kernel allows only once every process of the fiber is gone, so
// a range is recycled only after its last process. The kernel drops the
// lock with fiberd's descriptor if fiberd dies; its fibers die with it
// (Pdeathsig, and the Home container's PID namespace), the only window
// being the microseconds between the two in the exiting fiberd, in which
// the fibers are already being killed. Nothing on the node derived from a
// Pod's identity could give every Home a disjoint share of the 32-bit id
// space at 65536 ids per fiber; the lock directory needs no such share.
const IDRangeSize = 65536

// Defaults of the id pool: 8192 ranges from 2^31, host ids 2147483648 to
// 2684354559, above any id a distribution or Kubernetes' own user
// namespace support hands out by default below 2^31.
const (
	DefaultIDBase    uint32 = 1 << 31
	DefaultIDRanges         = 8192
	DefaultIDLockDir        = "/run/lampyr/idmap"
)

// idPool hands out id ranges.
type idPool struct {
	base   uint32
	ranges int
	dir    string

	mu   sync.Mutex
	next int
	held map[int]*os.File
}

func newIDPool(base uint32, ranges int, dir string) (*idPool, error) {
	if ranges <= 0 {
		return nil, fmt.Errorf("process backend: id pool of %d ranges", ranges)
	}
	if base < IDRangeSize {
		return nil, fmt.Errorf("process backend: id base %d overlaps the ids of the Home itself (want >= %d)", base, IDRangeSize)
	}
	if uint64(base)+uint64(ranges)*IDRangeSize > 1<<32-1 {
		return nil, fmt.Errorf("process backend: id pool %d + %d x %d passes the last host id", base, ranges, IDRangeSize)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("process backend: id lock directory %s: %w", dir, err)
	}
	// Start where this process's pid points, so Homes starting together
	// do not all probe the same ranges first.
	return &idPool{base: base, ranges: ranges, dir: dir, next: os.Getpid() % ranges, held: map[int]*os.File{}}, nil
}

// errNoIDs: every range is held.
var errNoIDs = errors.New("every host id range of the pool is held by a live fiber on this node")

// acquire claims a free range and returns its index and first host id.
func (p *idPool) acquire() (int, uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < p.ranges; i++ {
		n := (p.next + i) % p.ranges
		if _, mine := p.held[n]; mine {
			continue
		}
		f, err := os.OpenFile(filepath.Join(p.dir, strconv.Itoa(n)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, 0, fmt.Errorf("id range %d: %w", n, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // another Home's fiber holds it
			}
			return 0, 0, fmt.Errorf("locking id range %d: %w", n, err)
		}
		p.held[n] = f
		p.next = n + 1
		return n, p.base + uint32(n)*IDRangeSize, nil
	}
	return 0, 0, fmt.Errorf("%w (%d ranges from %d in %s)", errNoIDs, p.ranges, p.base, p.dir)
}

// release gives range n back; call it only once the fiber's processes are
// gone.
func (p *idPool) release(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.held[n]; ok {
		f.Close() // drops the flock
		delete(p.held, n)
	}
}

// IDPool is the node's pool of host id ranges for another backend (the
// gvisor backend maps each sandbox's user namespace onto one): the same
// lock files as the process backend's, so a range is held by one live
// fiber of either backend on the node.
type IDPool struct{ p *idPool }

// NewIDPool opens the pool of ranges host ids base, base+IDRangeSize ...
// (ranges of them), locked in dir; zero values take the defaults.
func NewIDPool(base uint32, ranges int, dir string) (*IDPool, error) {
	if base == 0 {
		base = DefaultIDBase
	}
	if ranges == 0 {
		ranges = DefaultIDRanges
	}
	if dir == "" {
		dir = DefaultIDLockDir
	}
	p, err := newIDPool(base, ranges, dir)
	if err != nil {
		return nil, err
	}
	return &IDPool{p}, nil
}

// Acquire claims a free range: its index (for Release) and first host id.
func (p *IDPool) Acquire() (int, uint32, error) { return p.p.acquire() }

// Release gives range n back once the processes that used it are gone.
func (p *IDPool) Release(n int) { p.p.release(n) }
