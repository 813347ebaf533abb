//go:build linux

// Package process is fiberd's Linux process-sandbox backend. Each fiber is a
// fresh lampyr-helper process (the fiber's PID 1) in a new user namespace
// mapped onto a host id range of its own (ids.go) and new mount, PID,
// network, IPC and UTS namespaces owned by it, inside its own cgroup v1
// memory, pids and cpu cgroups, with the snapshot as its read-only root.
// See lampyr.dev/serving/impl/fiberd/helper for what happens inside.
package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"lampyr.dev/serving/impl/fiberd/backend"
	"lampyr.dev/serving/impl/fiberd/egress"
	"lampyr.dev/serving/impl/fiberd/egress/netstack"
	"lampyr.dev/serving/impl/fiberd/helper"
	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// Config configures the backend.
type Config struct {
	// HelperPath is the lampyr-helper binary.
	HelperPath string
	// SpawnerPath is the binary run as the helper spawner (its argument
	// "spawner"); default HelperPath.
	SpawnerPath string
	// StateDir holds one directory per fiber (its root mount point).
	StateDir string
	// CgroupParent is the cgroup v1 memory directory under which each fiber
	// gets its own cgroup, e.g. /sys/fs/cgroup/memory/lampyr-fiberd.
	CgroupParent string
	// PidsParent is a cgroup v1 pids directory under which each fiber gets
	// a cgroup capped at PidsMax tasks, so a fork bomb in one fiber cannot
	// exhaust the Home's PIDs. Required: without it New refuses.
	PidsParent string
	// PidsMax is each fiber's task limit (threads count); default 1024.
	PidsMax int
	// HomePidsMax bounds the tasks of all fibers of the Home together:
	// pids.max of PidsParent, the one cgroup every fiber's pids cgroup is
	// under. 0 sizes it from the grant (BoundHomeTasks): maxFibers ×
	// PidsMax, at most DefaultHomePidsCap; below 0, no Home-wide bound
	// (each fiber's own still holds).
	HomePidsMax int
	// CPUParent is a cgroup v1 cpu directory under which each fiber gets a
	// cgroup of equal cpu.shares (so busy fibers of a Home split its CPU
	// evenly) capped at CPUMillis. Required: without it New refuses.
	CPUParent string
	// CPUMillis is each fiber's CPU bound in thousandths of a CPU (CFS
	// quota); default 1000. Where the Home's own limit is lower, the
	// fiber is bounded by the Home's instead.
	CPUMillis int
	// UID/GID the handler runs as inside its user namespace when the
	// snapshot names no user; default 65534 (nobody).
	UID, GID uint32
	// IDBase, IDRanges and IDLockDir define the node's pool of host id
	// ranges (ids.go); defaults DefaultIDBase, DefaultIDRanges,
	// DefaultIDLockDir. Every Home on a node must use the same values and
	// the same lock directory.
	IDBase    uint32
	IDRanges  int
	IDLockDir string
	// Limits are the handler's rlimits; zero fields get defaults (4096
	// open files, 512 tasks, TmpBytes per file).
	Limits helper.Limits
	// TmpBytes caps each fiber's /tmp; default 64 MiB (also charged to the
	// memory cgroup, since tmpfs pages are memory).
	TmpBytes int64
	// ResolvConf is the content of every fiber's /etc/resolv.conf (read
	// only); default Egress.Policy.ResolvConf() with egress, else
	// NoResolverConf.
	ResolvConf string
	// Egress, if set, gives every fiber its service bindings
	// (impl/fiberd/egress); nil leaves fibers with loopback only.
	Egress *Egress
	// Log receives the helpers' and handlers' stdout/stderr; default stderr.
	Log io.Writer
	// OnStart, if set, is called after each fiber that started, with the
	// steps of its start as fiberd's side saw them (BenchmarkStartSteps).
	OnStart func(id string, steps []StartStep)
	// Shells is how many sandbox shells the backend keeps ready once it
	// knows the fibers' memory limit and snapshot (Prepare, or the first
	// Start): a helper cloned into its namespaces on its own host id
	// range, moved into its cgroups, its root built (helper.Setup),
	// waiting for its spec (the egress link is made when a start takes
	// it, so a waiting shell holds no network stack). No
	// handler runs in a shell and none has run in it; a start takes one
	// and only sends the spec, so the clone and the cgroup moves are off
	// its path (with cgroup v1 the first move after a quiet spell waits
	// for an RCU grace period: about 10 ms of a 17 ms start on the
	// development machine, BenchmarkStartSteps). 0: none.
	Shells int
}

// StartStep is one step of a fiber's start and how long it took.
type StartStep struct {
	Name string
	D    time.Duration
}

// Names of the start steps, in order (StartStep.Name).
const (
	StepShell     = "a ready sandbox shell taken (the steps up to the spec were done before)"
	StepPrepare   = "prepare: state dir, host id range, pipes"
	StepSpawn     = "spawn: clone into new namespaces, exec the helper"
	StepHandles   = "handles: pidfd, network namespace"
	StepCgroups   = "cgroups: memory, pids, cpu"
	StepSetup     = "setup sent (the helper builds the root meanwhile)"
	StepEgress    = "egress link (none without egress)"
	StepSpec      = "spec sent to the helper"
	StepHelperRun = "helper: root, mounts, loopback, exec the handler, until it listens"
	// StepHelperPrefix starts the names of the helper's own steps, which
	// follow StepHelperRun and divide it (helper.StepRoot ...): "  helper
	// root" and so on.
	StepHelperPrefix = "  helper "
)

// stepClock records consecutive steps.
type stepClock struct {
	last  time.Time
	steps []StartStep
}

func (c *stepClock) mark(name string) {
	now := time.Now()
	c.steps = append(c.steps, StartStep{name, now.Sub(c.last)})
	c.last = now
}

// Backend is the process backend.
type Backend struct {
	cfg Config
	// hostNS is fiberd's own network namespace, restored on the thread
	// that dialled into a fiber's.
	hostNS netns.NsHandle
	// cleanups tracks background removal of destroyed fibers' cgroups and
	// directories, so Close can wait for them.
	cleanups sync.WaitGroup
	ids      *idPool
	// cpuGroups and pidsGroups are the fibers' cpu and pids cgroups,
	// reused (cgpool.go).
	cpuGroups, pidsGroups *cgPool
	// spawner clones helpers (spawn.go); restarted if it dies.
	spawnMu sync.Mutex
	spawner *spawner
	// resolvConf is the host file bound over each fiber's /etc/resolv.conf.
	resolvConf string
	// cpuQuotaOnce: the Home's own CPU limit is below CPUMillis; fibers
	// inherit it instead (logged once).
	cpuQuotaOnce sync.Once
	// homePids is the Home-wide task bound last written (homePidsMu).
	homePidsMu sync.Mutex
	homePids   int
	// shells are ready sandbox shells for fibers of memory limit
	// shellMem; shellsMaking counts those being made (shellMu).
	shellMu      sync.Mutex
	shells       []*fiber
	shellFor     shellKey
	shellsMaking int
	shellSeq     int
	closed       bool
	shellWG      sync.WaitGroup
}

// Egress configures fibers' service bindings.
type Egress struct {
	Policy *egresspolicy.Policy
	// Lookup asks the Home's nameserver; default the nameservers of the
	// Home's /etc/resolv.conf (egress.ResolverFromConf).
	Lookup egress.Lookup
	// Dial opens forwarded connections: through the tenant namespace's
	// egress proxy (proxy.Dialer) or, by default, from the Home
	// (egress.DirectDial).
	Dial egress.Dialer
}

// NoResolverConf is a fiber's /etc/resolv.conf when it has no resolver:
// no nameserver line, so lookups of anything but /etc/hosts fail at once.
const NoResolverConf = "# This fiber has no DNS resolver (fiber egress is off); only /etc/hosts resolves.\noptions attempts:1 timeout:1\n"

// DefaultCgroupParent is where fibers' memory cgroups go by default.
const DefaultCgroupParent = "/sys/fs/cgroup/memory/lampyr-fiberd"

// DefaultPidsRoot is the cgroup v1 pids hierarchy.
const DefaultPidsRoot = "/sys/fs/cgroup/pids"

// DefaultHomePidsCap caps the sized Home-wide task bound (Config.HomePidsMax
// 0): 4096 tasks, an eighth of the 32768 a node's pid_max often is, so a
// few hostile Homes on a node cannot take its PIDs while a Home's fibers
// keep a few hundred threads each on average (a fiber alone stays under
// PidsMax, 1024). Raise it with fiberd --home-pids-max for Revisions whose
// fibers run many threads.
const DefaultHomePidsCap = 4096

// DefaultCPURoot is the cgroup v1 cpu hierarchy.
const DefaultCPURoot = "/sys/fs/cgroup/cpu"

// New checks that the host can sandbox (root, memory cgroup, helper present)
// and returns the backend. The error says what is missing.
func New(cfg Config) (*Backend, error) {
	if cfg.UID == 0 && cfg.GID == 0 {
		cfg.UID, cfg.GID = 65534, 65534
	}
	if cfg.TmpBytes == 0 {
		cfg.TmpBytes = 64 << 20
	}
	if cfg.Log == nil {
		cfg.Log = os.Stderr
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.PidsMax == 0 {
		cfg.PidsMax = 1024
	}
	if cfg.CPUMillis == 0 {
		cfg.CPUMillis = 1000
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = DefaultIDBase
	}
	if cfg.IDRanges == 0 {
		cfg.IDRanges = DefaultIDRanges
	}
	if cfg.IDLockDir == "" {
		cfg.IDLockDir = DefaultIDLockDir
	}
	if cfg.Limits.OpenFiles == 0 {
		cfg.Limits.OpenFiles = 4096
	}
	if cfg.Limits.Processes == 0 {
		cfg.Limits.Processes = 512
	}
	if cfg.Limits.FileBytes == 0 {
		cfg.Limits.FileBytes = uint64(cfg.TmpBytes)
	}
	if cfg.UID == 0 || cfg.GID == 0 || cfg.UID >= IDRangeSize || cfg.GID >= IDRangeSize {
		return nil, fmt.Errorf("process backend: handler uid/gid %d/%d: want 1-%d (a non-root id of the fiber's user namespace)", cfg.UID, cfg.GID, IDRangeSize-1)
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	// A fiber without a task bound can fork-bomb its Home, one without a
	// CPU cgroup can starve its siblings: refuse to run any.
	if cfg.PidsParent == "" {
		return nil, errors.New("process backend: no pids cgroup for fibers (PidsParent): refusing to start fibers without a bound on their tasks; mount the cgroup v1 pids controller at /sys/fs/cgroup/pids")
	}
	if cfg.CPUParent == "" {
		return nil, errors.New("process backend: no cpu cgroup for fibers (CPUParent): refusing to start fibers without a CPU share and bound; mount the cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
	}
	if fi, err := os.Stat(cfg.HelperPath); err != nil || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("process backend: helper %q is not an executable file; build lampyr.dev/serving/impl/cmd/lampyr-helper and pass its path (--helper)", cfg.HelperPath)
	}
	// The helper runs as the fiber's own host uid, not root: it must be
	// able to search its way to its mount point and to the helper binary.
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("process backend: state dir: %w", err)
	}
	if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("process backend: state dir: %w", err)
	}
	for _, p := range []string{cfg.StateDir, filepath.Dir(cfg.HelperPath)} {
		if err := searchable(p); err != nil {
			return nil, fmt.Errorf("process backend: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.CgroupParent, 0o755); err != nil {
		return nil, fmt.Errorf("process backend: creating memory cgroup %s: %w (is the cgroup v1 memory controller mounted at /sys/fs/cgroup/memory and writable?)", cfg.CgroupParent, err)
	}
	if err := os.MkdirAll(cfg.PidsParent, 0o755); err != nil {
		return nil, fmt.Errorf("process backend: creating pids cgroup %s: %w (is the cgroup v1 pids controller mounted and writable?)", cfg.PidsParent, err)
	}
	if err := os.MkdirAll(cfg.CPUParent, 0o755); err != nil {
		return nil, fmt.Errorf("process backend: creating cpu cgroup %s: %w (is the cgroup v1 cpu controller mounted and writable?)", cfg.CPUParent, err)
	}
	ids, err := newIDPool(cfg.IDBase, cfg.IDRanges, cfg.IDLockDir)
	if err != nil {
		return nil, err
	}
	host, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("process backend: opening fiberd's own network namespace: %w", err)
	}
	removeLeftovers(cfg)
	if cfg.SpawnerPath == "" {
		cfg.SpawnerPath = cfg.HelperPath
	}
	if e := cfg.Egress; e != nil {
		if e.Policy == nil {
			return nil, errors.New("process backend: egress without a policy")
		}
		if e.Lookup == nil {
			// Real queries to the Home's nameserver: the Guard checks every
			// name of the answer's CNAME chain (net.Resolver hides it).
			e.Lookup = egress.ResolverFromConf("/etc/resolv.conf").Lookup
		}
		if cfg.ResolvConf == "" {
			cfg.ResolvConf = e.Policy.ResolvConf()
		}
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = NoResolverConf
	}
	b := &Backend{cfg: cfg, hostNS: host, ids: ids, resolvConf: filepath.Join(cfg.StateDir, "resolv.conf")}
	if err := os.WriteFile(b.resolvConf, []byte(cfg.ResolvConf), 0o644); err != nil {
		host.Close()
		return nil, fmt.Errorf("process backend: writing the fibers' resolv.conf: %w", err)
	}
	// Until a grant sizes it, the Home-wide bound is the cap (or the
	// configured bound): fibers are never without it.
	if _, err := b.BoundHomeTasks(0); err != nil {
		host.Close()
		return nil, err
	}
	b.pidsGroups = &cgPool{parent: cfg.PidsParent, setup: func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(cfg.PidsMax)), 0)
	}}
	b.cpuGroups = &cgPool{parent: cfg.CPUParent, setup: b.setupCPU}
	if b.spawner, err = startSpawner(cfg.SpawnerPath, cfg.Log); err != nil {
		host.Close()
		return nil, fmt.Errorf("process backend: %w", err)
	}
	return b, nil
}

// currentSpawner returns a live spawner, starting a new one if the last
// died (its fibers died with it).
func (b *Backend) currentSpawner() (*spawner, error) {
	b.spawnMu.Lock()
	defer b.spawnMu.Unlock()
	b.spawner.mu.Lock()
	dead := b.spawner.dead
	b.spawner.mu.Unlock()
	if dead != nil {
		fmt.Fprintf(b.cfg.Log, "process backend: %v; starting a new one\n", dead)
		s, err := startSpawner(b.cfg.SpawnerPath, b.cfg.Log)
		if err != nil {
			return nil, err
		}
		b.spawner = s
	}
	return b.spawner, nil
}

// searchable checks that every directory from / to dir lets others search
// it (o+x): fibers' helpers run as unprivileged host ids.
func searchable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is mode %s: fibers run as unprivileged host ids and cannot search it to reach %s (chmod o+x)", p, fi.Mode().Perm(), abs)
		}
		if p == "/" {
			return nil
		}
	}
}

// removeLeftovers clears what fibers of a previous fiberd in the same Home
// left behind (they died with it through Pdeathsig): their directories and
// their now empty cgroups. A cgroup still holding tasks is left alone.
func removeLeftovers(cfg Config) {
	if ents, err := os.ReadDir(cfg.StateDir); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(cfg.StateDir, e.Name()))
		}
	}
	for _, parent := range []string{cfg.CgroupParent, cfg.PidsParent, cfg.CPUParent} {
		if parent == "" {
			continue
		}
		if ents, err := os.ReadDir(parent); err == nil {
			for _, e := range ents {
				if e.IsDir() {
					os.Remove(filepath.Join(parent, e.Name()))
				}
			}
		}
	}
}

// Supported says whether this process may create sandboxes: it must be root
// (CAP_SYS_ADMIN for namespaces and mounts) and find the cgroup v1 memory
// controller. Tests call it to skip with a clear reason.
func Supported() error {
	if os.Geteuid() != 0 {
		return errors.New("process backend needs root (CAP_SYS_ADMIN) to create namespaces and mounts; run fiberd as root in a privileged Home")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err != nil {
		return errors.New("process backend needs the cgroup v1 memory controller at /sys/fs/cgroup/memory (this host looks cgroup v2-only)")
	}
	for _, c := range []string{DefaultPidsRoot, DefaultCPURoot} {
		if _, err := os.Stat(filepath.Join(c, "cgroup.procs")); err != nil {
			return fmt.Errorf("process backend needs the cgroup v1 %s controller at %s: fibers are refused without a task bound and a CPU share", filepath.Base(c), c)
		}
	}
	return nil
}

// Close waits for destroyed fibers' cleanup and removes the backend's own
// cgroup directories if they are empty. Destroy every fiber first.
func (b *Backend) Close() error {
	b.shellMu.Lock()
	b.closed = true
	shells := b.shells
	b.shells = nil
	b.shellMu.Unlock()
	b.shellWG.Wait()
	for _, f := range shells {
		f.Destroy()
	}
	b.cleanups.Wait()
	b.spawnMu.Lock()
	b.spawner.close()
	b.spawnMu.Unlock()
	b.cpuGroups.close()
	b.pidsGroups.close()
	b.hostNS.Close()
	for _, d := range []string{b.cfg.CgroupParent, b.cfg.PidsParent, b.cfg.CPUParent} {
		if d != "" {
			os.Remove(d)
		}
	}
	return nil
}

// BoundHomeTasks implements backend.HomeTasks: pids.max of PidsParent,
// above every fiber's pids cgroup, so the fibers of this Home hold at most
// that many tasks together whatever each one's own bound. maxFibers 0
// (not known yet) gives the cap.
func (b *Backend) BoundHomeTasks(maxFibers int) (int, error) {
	n := b.cfg.HomePidsMax
	if n == 0 {
		n = DefaultHomePidsCap
		if maxFibers > 0 {
			n = min(maxFibers*b.cfg.PidsMax, DefaultHomePidsCap)
		}
	}
	b.homePidsMu.Lock()
	defer b.homePidsMu.Unlock()
	if n == b.homePids {
		return max(n, 0), nil
	}
	v := strconv.Itoa(n)
	if n < 0 {
		v = "max"
	}
	if err := os.WriteFile(filepath.Join(b.cfg.PidsParent, "pids.max"), []byte(v), 0); err != nil {
		return 0, fmt.Errorf("process backend: bounding the Home's fibers to %s tasks (%s/pids.max): %w", v, b.cfg.PidsParent, err)
	}
	fmt.Fprintf(b.cfg.Log, "process backend: the fibers of this Home may hold %s tasks together (each at most %d)\n", v, b.cfg.PidsMax)
	b.homePids = n
	return max(n, 0), nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "process" }

type fiber struct {
	b   *Backend
	id  string
	dir string
	// ns is the fiber's network namespace, addr its handler's address in
	// it. nsMu is held for reading while a dial uses ns, and for writing to
	// close it: a closed descriptor's number may be reused by another
	// fiber's handle, and a dial must never enter that.
	nsMu sync.RWMutex
	ns   netns.NsHandle
	addr string
	// egress is the fiber's service-binding link (nil when egress is off).
	egress *netstack.Link
	cgroup string
	pids   string
	cpu    string
	// idRange is the fiber's host id range (index in the pool, -1 none),
	// hostID its first id.
	idRange int
	hostID  uint32
	// pid is the helper's, pidfd a handle to signal exactly it.
	pid   int
	pidfd int
	done  chan struct{}

	mu      sync.Mutex
	err     error
	destroy sync.Once

	// Between the shell and its run: the ends fiberd keeps of the
	// helper's spec and status pipes, the fiber's output (prefixed with
	// its id once it has one) and the end of that output.
	specW, statusR *os.File
	out            *prefixWriter
	tail           *tailBuffer
	logDone        chan struct{}
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, id string, spec *backend.Spec) (backend.Fiber, error) {
	// One bound for every wait of the start, however far it gets.
	timeout := spec.StartupTimeout + 5*time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	clock := &stepClock{last: time.Now()}
	key := shellKey{spec.MemoryBytes, spec.RootFS}
	f := b.takeShell(key)
	if f != nil {
		clock.mark(StepShell)
	} else {
		f = b.newFiber(id)
		if err := f.shell(ctx, key, clock); err != nil {
			f.cleanup()
			return nil, fmt.Errorf("starting fiber %s: %w", id, err)
		}
	}
	f.id = id
	f.out.setPrefix("fiber " + id + ": ")
	err := f.run(ctx, spec, timeout, clock)
	// The next start's shell is made after this fiber's first request
	// rather than beside its start or that request (on two cores the
	// clone took a millisecond from the first response).
	time.AfterFunc(shellRefillDelay, func() { b.refillShells(key) })
	if err != nil {
		f.cleanup()
		return nil, fmt.Errorf("starting fiber %s: %w", id, err)
	}
	if b.cfg.OnStart != nil {
		b.cfg.OnStart(id, clock.steps)
	}
	return f, nil
}

// newFiber is a fiber with nothing made yet; name names its directory
// and memory cgroup (the fiber's id, or a shell's own name).
func (b *Backend) newFiber(name string) *fiber {
	f := &fiber{
		b:       b,
		id:      name,
		dir:     filepath.Join(b.cfg.StateDir, name),
		cgroup:  filepath.Join(b.cfg.CgroupParent, name),
		idRange: -1,
		pidfd:   -1,
		done:    make(chan struct{}),
	}
	f.ns = netns.None()
	return f
}

// Prepare implements backend.Preparer: it makes the sandbox shells
// (Config.Shells) for fibers of spec before the first start needs one.
func (b *Backend) Prepare(spec *backend.Spec) {
	b.refillShells(shellKey{spec.MemoryBytes, spec.RootFS})
}

// ReadyShells is how many sandbox shells are ready now.
func (b *Backend) ReadyShells() int {
	b.shellMu.Lock()
	defer b.shellMu.Unlock()
	return len(b.shells)
}

// shellKey is what a sandbox shell was made for: the fibers' memory limit
// and the snapshot its root binds (a shell's root is built before its
// spec comes).
type shellKey struct {
	mem    int64
	rootfs string
}

// takeShell returns a ready shell made for key, or nil. A shell whose
// helper died while it waited is destroyed, not returned.
func (b *Backend) takeShell(key shellKey) *fiber {
	b.shellMu.Lock()
	defer b.shellMu.Unlock()
	for len(b.shells) > 0 {
		f := b.shells[0]
		b.shells = b.shells[1:]
		select {
		case <-f.done:
			go f.Destroy()
			continue
		default:
		}
		if b.shellFor != key {
			go f.Destroy()
			continue
		}
		return f
	}
	return nil
}

// shellRefillDelay is how long after a start its replacement shell is
// begun: a fresh fiber's first request is usually answered by then.
const shellRefillDelay = 20 * time.Millisecond

// shellTimeout bounds the making of one shell.
const shellTimeout = 30 * time.Second

// refillShells makes shells until Config.Shells are ready or being made,
// for fibers of key; shells made for another key are dropped. A shell that
// fails is not retried until the next start.
func (b *Backend) refillShells(key shellKey) {
	b.shellMu.Lock()
	defer b.shellMu.Unlock()
	if b.closed || b.cfg.Shells <= 0 {
		return
	}
	if b.shellFor != key {
		for _, f := range b.shells {
			go f.Destroy()
		}
		b.shells, b.shellFor = nil, key
	}
	for len(b.shells)+b.shellsMaking < b.cfg.Shells {
		b.shellsMaking++
		b.shellSeq++
		f := b.newFiber("shell-" + strconv.Itoa(b.shellSeq))
		b.shellWG.Add(1)
		go func() {
			defer b.shellWG.Done()
			ctx, cancel := context.WithTimeout(context.Background(), shellTimeout)
			err := f.shell(ctx, key, &stepClock{last: time.Now()})
			cancel()
			b.shellMu.Lock()
			b.shellsMaking--
			keep := err == nil && !b.closed && b.shellFor == key
			if keep {
				b.shells = append(b.shells, f)
			}
			b.shellMu.Unlock()
			if err != nil {
				fmt.Fprintf(b.cfg.Log, "process backend: making a sandbox shell: %v\n", err)
				f.cleanup()
			} else if !keep {
				f.Destroy()
			}
		}()
	}
}

// shell makes everything of the fiber that does not depend on its spec
// beyond its memory limit and snapshot: its directory, host id range and
// pipes, the helper cloned into new namespaces, the cgroups, and sends the
// helper its Setup (it builds the root while it waits for its spec, run).
func (f *fiber) shell(ctx context.Context, key shellKey, clock *stepClock) error {
	cfg := &f.b.cfg
	if err := os.MkdirAll(filepath.Join(f.dir, "root"), 0o711); err != nil {
		return err
	}
	n, hostID, err := f.b.ids.acquire()
	if err != nil {
		return err
	}
	f.idRange, f.hostID = n, hostID
	specR, specW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer specR.Close()
	f.specW = specW // closed by run, or by cleanup
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	f.statusR = statusR
	defer statusW.Close()

	logR, logW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer logW.Close()
	f.out = &prefixWriter{w: cfg.Log, prefix: "fiber " + f.id + ": "}
	// The end of the fiber's output is kept for a failed start's report.
	// It costs a bounded copy per write and never slows the reader, so the
	// handler cannot block on it or make fiberd hold more than tailSize.
	f.tail = &tailBuffer{}
	f.logDone = make(chan struct{})
	go func(out *prefixWriter, tail *tailBuffer, logDone chan struct{}) {
		defer close(logDone)
		io.Copy(io.MultiWriter(out, tail), logR)
		logR.Close()
	}(f.out, f.tail, f.logDone)
	sp, err := f.b.currentSpawner()
	if err != nil {
		return err
	}
	clock.mark(StepPrepare)
	pid, exit, err := sp.spawn(helper.SpawnRequest{
		Path:   cfg.HelperPath,
		HostID: hostID,
		IDs:    IDRangeSize,
		// With the user namespace (added by the spawner, which owns it by
		// the range's first id): mount, PID, network, IPC and UTS.
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
	}, specR, statusW, logW)
	if err != nil {
		return fmt.Errorf("starting %s in new namespaces: %w", cfg.HelperPath, err)
	}
	// The helper holds its own copy now: the output ends (logDone) once
	// the fiber's last process is gone.
	logW.Close()
	f.pid = pid
	clock.mark(StepSpawn)
	// A handle on exactly this process: signalling it by pid after it was
	// reaped could hit another.
	if f.pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		return fmt.Errorf("pidfd of helper %d: %w", pid, err)
	}
	go func() {
		why := <-exit
		f.mu.Lock()
		if f.err == nil {
			f.err = fmt.Errorf("fiber exited: %s", why)
		}
		f.mu.Unlock()
		close(f.done)
	}()
	// The handle keeps only the namespace object (no process) until the
	// fiber's cleanup closes it.
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("opening the fiber's network namespace: %w", err)
	}
	f.nsMu.Lock()
	f.ns = ns
	f.nsMu.Unlock()
	clock.mark(StepHandles)
	// The helper waits for its spec before starting the handler, so joining
	// the cgroups here, before sending the spec, puts every process of the
	// fiber under the limits.
	if err := f.joinCgroup(pid, key.mem); err != nil {
		return err
	}
	if err := f.joinPooled(f.b.pidsGroups, &f.pids, pid, "pids"); err != nil {
		return err
	}
	if err := f.joinPooled(f.b.cpuGroups, &f.cpu, pid, "cpu"); err != nil {
		return err
	}
	clock.mark(StepCgroups)
	// The root, only now: the helper's mounts (/tmp, /dev) are charged to
	// the fiber's memory cgroup.
	setup := helper.Setup{
		Root:       filepath.Join(f.dir, "root"),
		RootFS:     key.rootfs,
		TmpBytes:   cfg.TmpBytes,
		Cgroups:    map[string]string{"memory": f.cgroup, "cpu": f.cpu, "pids": f.pids},
		ResolvConf: f.b.resolvConf,
	}
	if err := json.NewEncoder(f.specW).Encode(setup); err != nil {
		return fmt.Errorf("sending the setup to helper: %w", err)
	}
	clock.mark(StepSetup)
	return ctx.Err()
}

// run sends the helper of a shell its spec and waits until the handler
// listens (and answers ReadinessPath).
func (f *fiber) run(ctx context.Context, spec *backend.Spec, timeout time.Duration, clock *stepClock) error {
	cfg := &f.b.cfg
	specW, statusR := f.specW, f.statusR
	defer specW.Close()
	defer statusR.Close()
	f.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(spec.Port)))
	if e := cfg.Egress; e != nil {
		// Before the handler starts, so its first call finds the way out;
		// not in the shell, so a shell that waits holds no network stack.
		f.nsMu.RLock()
		ns := f.ns
		f.nsMu.RUnlock()
		var err error
		if f.egress, err = netstack.Attach(ns, f.b.hostNS, egress.NewGuard(e.Policy, e.Lookup), e.Dial); err != nil {
			return fmt.Errorf("fiber egress: %w", err)
		}
	}
	clock.mark(StepEgress)
	uid, gid := cfg.UID, cfg.GID
	if spec.UID != 0 {
		uid, gid = spec.UID, spec.GID
	}
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	hs := helper.Spec{
		Entrypoint:           spec.Entrypoint,
		Env:                  env,
		Port:                 spec.Port,
		Hostname:             "fiber-" + f.id,
		UID:                  uid,
		GID:                  gid,
		Limits:               cfg.Limits,
		StartupTimeoutMillis: spec.StartupTimeout.Milliseconds(),
		ReadinessPath:        spec.ReadinessPath,
	}
	// A helper whose setup failed has said why on the status pipe and
	// exited: the send then fails, and the status line below is the error.
	sendErr := json.NewEncoder(specW).Encode(hs)
	specW.Close()
	clock.mark(StepSpec)

	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Only the helper holds the write end (close-on-exec keeps it from
		// the handler); a status line is short.
		line, err := bufio.NewReader(io.LimitReader(statusR, 4096)).ReadString('\n')
		ch <- result{line, err}
	}()
	expired := func() error {
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("helper did not report ready within %s", timeout)
		}
		return ctx.Err()
	}
	select {
	case r := <-ch:
		if hs, ok := helper.ReadySteps(r.line); ok {
			clock.mark(StepHelperRun)
			for _, h := range hs {
				clock.steps = append(clock.steps, StartStep{StepHelperPrefix + h.Name, h.D})
			}
			return nil
		}
		switch {
		case strings.HasPrefix(r.line, "error: ") && strings.HasSuffix(r.line, "\n"):
			return errors.New("helper: " + strings.TrimSpace(strings.TrimPrefix(r.line, "error: ")))
		case strings.HasPrefix(r.line, helper.FailedPrefix) && strings.HasSuffix(r.line, "\n"):
			var sf backend.StartFailure
			if json.Unmarshal([]byte(strings.TrimPrefix(r.line, helper.FailedPrefix)), &sf) == nil && sf.Reason != "" {
				// The helper exits right after its report, and the
				// fiber's processes with it: wait briefly for their last
				// output, then report what arrived.
				select {
				case <-f.logDone:
				case <-time.After(failureOutputWait):
				}
				sf.Output = f.tail.String()
				return &sf
			}
		}
		if sendErr != nil {
			return fmt.Errorf("sending spec to helper: %w (%v)", sendErr, f.Err())
		}
		select {
		case <-f.done:
			return fmt.Errorf("helper died before reporting ready (status %q): %v", r.line, f.Err())
		case <-ctx.Done():
			return fmt.Errorf("helper sent an unexpected status %q: %w", r.line, expired())
		}
	case <-ctx.Done():
		return expired()
	}
}

func (f *fiber) joinCgroup(pid int, limit int64) error {
	if err := os.Mkdir(f.cgroup, 0o755); err != nil {
		return fmt.Errorf("creating memory cgroup %s: %w", f.cgroup, err)
	}
	// Swap would let a fiber exceed its limit instead of being OOM-killed.
	write := func(file, val string) error {
		return os.WriteFile(filepath.Join(f.cgroup, file), []byte(val), 0)
	}
	if err := write("memory.swappiness", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("memory cgroup swappiness: %w", err)
	}
	if err := write("memory.limit_in_bytes", strconv.FormatInt(limit, 10)); err != nil {
		return fmt.Errorf("setting memory limit %d on %s: %w", limit, f.cgroup, err)
	}
	if err := write("memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("setting memory+swap limit on %s: %w", f.cgroup, err)
	}
	if err := write("cgroup.procs", strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("moving helper %d into %s: %w", pid, f.cgroup, err)
	}
	return nil
}

// joinPooled puts the fiber's helper in a cgroup of its own from pool (its
// pids.max, or cpu shares and quota, were set when the pool made it: see
// setupCPU and the pids pool's setup) and records it in *dir for cleanup.
func (f *fiber) joinPooled(pool *cgPool, dir *string, pid int, controller string) error {
	d, err := pool.get()
	if err != nil {
		return fmt.Errorf("%s cgroup: %w", controller, err)
	}
	*dir = d
	if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("moving helper %d into %s: %w", pid, d, err)
	}
	return nil
}

// setupCPU gives a new fiber cpu cgroup the same cpu.shares as every
// sibling (the kernel default, 1024), so busy fibers of a Home split its
// CPU evenly, and a CFS quota of CPUMillis/1000 CPUs.
func (b *Backend) setupCPU(dir string) error {
	write := func(file, val string) error {
		return os.WriteFile(filepath.Join(dir, file), []byte(val), 0)
	}
	if err := write("cpu.shares", "1024"); err != nil {
		return fmt.Errorf("setting cpu.shares on %s: %w", dir, err)
	}
	const period = 100000
	if err := write("cpu.cfs_period_us", strconv.Itoa(period)); err != nil {
		return fmt.Errorf("setting cpu.cfs_period_us on %s: %w", dir, err)
	}
	// cgroup v1 refuses a quota above the parent's: the Home's own limit
	// then bounds the fiber.
	if err := write("cpu.cfs_quota_us", strconv.Itoa(b.cfg.CPUMillis*period/1000)); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("setting cpu.cfs_quota_us on %s: %w", dir, err)
		}
		b.cpuQuotaOnce.Do(func() {
			fmt.Fprintf(b.cfg.Log, "process backend: the Home's CPU limit is below %dm per fiber; fibers are bounded by the Home's limit\n", b.cfg.CPUMillis)
		})
	}
	return nil
}

func (f *fiber) ID() string            { return f.id }
func (f *fiber) Done() <-chan struct{} { return f.done }

func (f *fiber) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// Dial connects to the handler's port from inside the fiber's network
// namespace: the socket is created on an OS thread switched into that
// namespace and belongs to it for its life, so fiberd talks to the handler
// directly (no bridge process) while the fiber still has no route out. The
// thread is switched back before it runs anything else; if that fails it
// is left locked, and the runtime ends it with the goroutine.
func (f *fiber) Dial(ctx context.Context) (net.Conn, error) {
	if err := f.Err(); err != nil {
		return nil, err
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		f.nsMu.RLock()
		defer f.nsMu.RUnlock()
		if !f.ns.IsOpen() {
			ch <- result{err: fmt.Errorf("fiber %s has ended", f.id)}
			return
		}
		runtime.LockOSThread()
		if err := netns.Set(f.ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering fiber %s's network namespace: %w", f.id, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", f.addr)
		if rerr := netns.Set(f.b.hostNS); rerr != nil {
			if c != nil {
				c.Close()
			}
			ch <- result{err: fmt.Errorf("leaving fiber %s's network namespace: %w", f.id, rerr)}
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// Destroy implements backend.Fiber.
func (f *fiber) Destroy() error {
	var err error
	f.destroy.Do(func() {
		f.mu.Lock()
		if f.err == nil {
			f.err = errors.New("fiber destroyed")
		}
		f.mu.Unlock()
		if f.pidfd >= 0 {
			// Killing PID 1 of the namespace kills every process in it.
			unix.PidfdSendSignal(f.pidfd, unix.SIGKILL, nil, 0)
			<-f.done
		}
		// The processes are gone; removing the emptied cgroup and the
		// fiber's directory need not hold up the caller (release latency).
		f.b.cleanups.Add(1)
		go func() {
			defer f.b.cleanups.Done()
			if err := f.cleanup(); err != nil {
				fmt.Fprintf(os.Stderr, "fiber %s cleanup: %v\n", f.id, err)
			}
		}()
	})
	return err
}

func (f *fiber) cleanup() error {
	var errs []error
	for _, p := range []*os.File{f.specW, f.statusR} {
		if p != nil {
			p.Close()
		}
	}
	if f.pidfd >= 0 {
		select {
		case <-f.done:
		default:
			unix.PidfdSendSignal(f.pidfd, unix.SIGKILL, nil, 0)
			<-f.done
		}
		unix.Close(f.pidfd)
		f.pidfd = -1
	}
	if f.egress != nil {
		f.egress.Close()
	}
	// A cgroup can only be removed once its last task has been reaped,
	// which may trail the helper's exit by a moment.
	for i := 0; ; i++ {
		err := os.Remove(f.cgroup)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		if i == 200 {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", f.cgroup, err))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The pooled cgroups go back once empty; one that stays busy is not
	// reused.
	for _, g := range []struct {
		pool *cgPool
		dir  *string
	}{{f.b.pidsGroups, &f.pids}, {f.b.cpuGroups, &f.cpu}} {
		if *g.dir == "" {
			continue
		}
		if err := g.pool.put(*g.dir); err != nil {
			errs = append(errs, err)
		}
		*g.dir = ""
	}
	// The kernel removes a cgroup only once its last task is gone, and the
	// pooled ones were seen empty: nothing runs as this fiber's ids any
	// more and the range may go to another fiber. Otherwise it stays held
	// (and logged).
	if f.idRange >= 0 {
		if len(errs) == 0 {
			f.b.ids.release(f.idRange)
		} else {
			errs = append(errs, fmt.Errorf("keeping host id range %d (ids %d-%d) out of use", f.idRange, f.hostID, f.hostID+IDRangeSize-1))
		}
		f.idRange = -1
	}
	f.nsMu.Lock()
	if f.ns.IsOpen() {
		f.ns.Close()
		f.ns = netns.None()
	}
	f.nsMu.Unlock()
	if err := os.RemoveAll(f.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// failureOutputWait bounds how long a failed start waits for the end of
// the fiber's output.
const failureOutputWait = time.Second

// tailSize is how much of a fiber's output tailBuffer keeps: twice what a
// report shows, so the lines around the cut are whole.
const tailSize = 2 * backend.MaxFailureOutput

// tailBuffer keeps the last tailSize bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	n := len(b)
	if len(b) > tailSize {
		b = b[len(b)-tailSize:]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if drop := len(t.buf) + len(b) - tailSize; drop > 0 {
		t.buf = append(t.buf[:0], t.buf[drop:]...)
	}
	t.buf = append(t.buf, b...)
	return n, nil
}

// String is the kept output as StartFailure.Output wants it.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return backend.LastOutput(t.buf)
}

// prefixWriter prefixes each line with the fiber id so handler logs from
// many fibers stay attributable in fiberd's log. Partial lines are held back
// (up to 4 KiB) so every write downstream is one whole line.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

// setPrefix names the fiber in the lines that follow (a shell gets its
// fiber's id when a start takes it).
func (p *prefixWriter) setPrefix(prefix string) {
	p.mu.Lock()
	p.prefix = prefix
	p.mu.Unlock()
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.w.Write(append([]byte(p.prefix), p.buf[:i+1]...))
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) > 4096 {
		p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
		p.buf = nil
	}
	return len(b), nil
}
