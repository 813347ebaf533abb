package kindcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cluster/nodes"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"
	kindlog "sigs.k8s.io/kind/pkg/log"

	"lampyr.dev/serving/impl/progress"
)

// Info is what a suite needs to use a cluster; it is written next to the
// kubeconfig as <name>.json.
type Info struct {
	Name       string `json:"name"`
	Kubeconfig string `json:"kubeconfig"`
	// Ports maps each requested node port to its 127.0.0.1 host port.
	Ports     []PortMapping `json:"ports"`
	SpecHash  string        `json:"specHash"`
	NodeImage string        `json:"nodeImage"`
	Registry  string        `json:"registry,omitempty"`
	// NodesStartedAt records when Docker last started each node container
	// (by container name), as of the creation. A node started since then was
	// restarted (a Docker or host restart); with Spec.EtcdOnTmpfs that means
	// the cluster's etcd came back empty.
	NodesStartedAt map[string]string `json:"nodesStartedAt,omitempty"`
	// Created is true when this Up created the cluster (rather than reusing
	// it): whoever created it deletes it at the end.
	Created bool `json:"-"`
}

// Gateway is the first published port: the gateway's public NodePort.
func (i Info) Gateway() PortMapping {
	if len(i.Ports) == 0 {
		return PortMapping{}
	}
	return i.Ports[0]
}

// GatewayURL is http://127.0.0.1:<host port of the gateway>.
func (i Info) GatewayURL() string { return fmt.Sprintf("http://127.0.0.1:%d", i.Gateway().HostPort) }

// HostPort returns the 127.0.0.1 port mapped to nodePort, or 0.
func (i Info) HostPort(nodePort int) int {
	for _, p := range i.Ports {
		if p.NodePort == nodePort {
			return p.HostPort
		}
	}
	return 0
}

// Manager owns the clusters of one state directory.
type Manager struct {
	// StateDir holds <name>.kubeconfig and <name>.json.
	StateDir string
	Log      *progress.Log
	// Registry, when set, is connected to every cluster created.
	Registry *Registry
	// Setup, when set, runs on every cluster Up creates or reuses, once its
	// node is Ready and wired to the registry: what each cluster must run
	// before it is handed out (the NetworkPolicy enforcer). It must be
	// idempotent. Its error fails that cluster as a failed creation does
	// (a cluster this Up created is deleted unless Keep).
	Setup    func(ctx context.Context, info Info) error
	provider *cluster.Provider
}

// NewManager uses Docker through the kind library.
func NewManager(stateDir string, log *progress.Log) *Manager {
	return &Manager{
		StateDir: stateDir,
		Log:      log,
		provider: cluster.NewProvider(cluster.ProviderWithDocker(), cluster.ProviderWithLogger(kindlog.NoopLogger{})),
	}
}

// KubeconfigPath is where a cluster's kubeconfig is exported. kind would
// otherwise write ~/.kube/config.
func (m *Manager) KubeconfigPath(name string) string {
	return filepath.Join(m.StateDir, name+".kubeconfig")
}

func (m *Manager) infoPath(name string) string { return filepath.Join(m.StateDir, name+".json") }

// ReadInfo loads the Info of a cluster this manager created.
func (m *Manager) ReadInfo(name string) (Info, error) {
	var info Info
	b, err := os.ReadFile(m.infoPath(name))
	if err != nil {
		return info, fmt.Errorf("cluster %s has no state in %s (create it with `just cluster-up %s`): %w", name, m.StateDir, name, err)
	}
	return info, json.Unmarshal(b, &info)
}

// List names every Kind cluster on this Docker engine, whoever created it.
func (m *Manager) List() ([]string, error) {
	names, err := m.provider.List()
	if err != nil {
		return nil, fmt.Errorf("list kind clusters: %w", err)
	}
	return names, nil
}

// Exists reports whether kind knows a cluster named name.
func (m *Manager) Exists(name string) (bool, error) {
	names, err := m.provider.List()
	if err != nil {
		return false, fmt.Errorf("list kind clusters: %w", err)
	}
	return slices.Contains(names, name), nil
}

// UpOptions tune Up.
type UpOptions struct {
	// Keep leaves a cluster whose creation failed or was interrupted.
	Keep bool
	// WaitReady bounds the wait for the control plane.
	WaitReady time.Duration
}

// Up creates the clusters in parallel, or reuses each one that already
// exists with the same spec. When ctx is cancelled (SIGINT) or a creation
// fails, clusters this call started are deleted unless opts.Keep.
func (m *Manager) Up(ctx context.Context, specs []Spec, opts UpOptions) ([]Info, error) {
	if err := os.MkdirAll(m.StateDir, 0o755); err != nil {
		return nil, err
	}
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	if opts.WaitReady == 0 {
		opts.WaitReady = 3 * time.Minute
	}
	if m.Registry != nil {
		if err := m.Registry.Ensure(ctx, m.Log); err != nil {
			return nil, err
		}
	}
	// kind creates its "kind" network on first use and never removes it; a
	// failed first run must not leave it behind.
	_, netErr := docker(ctx, "network", "inspect", "kind")
	networkExisted := netErr == nil
	infos := make([]Info, len(specs))
	created := make([]bool, len(specs))
	g, gctx := errgroup.WithContext(ctx)
	for i, s := range specs {
		g.Go(func() error {
			info, made, err := m.up(gctx, s, opts)
			infos[i], created[i] = info, made
			return err
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil && !opts.Keep {
		for i, s := range specs {
			if created[i] {
				m.Log.Printf(" • deleting cluster %s after failure (keep it with LAMPYR_KEEP=1)", s.Name)
				if derr := m.Delete(s.Name); derr != nil {
					m.Log.Printf(" ✗ %v", derr)
				}
			}
		}
		if m.Registry != nil {
			m.Registry.CleanupIfCreated(m.Log)
		}
		if !networkExisted {
			_, _ = docker(context.Background(), "network", "rm", "kind")
		}
	}
	return infos, err
}

func (m *Manager) up(ctx context.Context, s Spec, opts UpOptions) (Info, bool, error) {
	hash := s.Hash()
	exists, err := m.Exists(s.Name)
	if err != nil {
		return Info{}, false, err
	}
	if exists {
		info, err := m.ReadInfo(s.Name)
		if err != nil || info.SpecHash != hash {
			return Info{}, false, fmt.Errorf("cluster %s exists but was not created from this spec (recorded %q, want %q): delete it with `just cluster-down %s`", s.Name, info.SpecHash, hash, s.Name)
		}
		lost, why, err := m.stateLost(ctx, s, info)
		if err != nil {
			return Info{}, false, err
		}
		if !lost {
			m.Log.Printf(" ✓ Reusing cluster %s (same spec %s)", s.Name, hash)
			if err := m.connect(ctx, info); err != nil {
				return info, false, err
			}
			return info, false, m.setup(ctx, info)
		}
		// Nothing of it is left to lose: its etcd is empty. Recreating it
		// is what the user would do by hand.
		m.Log.Printf(" ✗ Cluster %s cannot be reused: %s; recreating it", s.Name, why)
		if err := m.Delete(s.Name); err != nil {
			return Info{}, false, err
		}
	}
	_ = os.Remove(m.infoPath(s.Name))
	resolved := s
	resolved.Ports = append([]PortMapping(nil), s.Ports...)
	for i := range resolved.Ports {
		if resolved.Ports[i].HostPort == 0 {
			p, err := freePort()
			if err != nil {
				return Info{}, false, err
			}
			resolved.Ports[i].HostPort = p
		}
	}
	raw, err := resolved.KindConfig()
	if err != nil {
		return Info{}, false, err
	}
	info := Info{Name: s.Name, Kubeconfig: m.KubeconfigPath(s.Name), Ports: resolved.Ports, SpecHash: hash, NodeImage: s.NodeImage}
	done := make(chan error, 1)
	err = m.Log.Step("Creating cluster "+s.Name, func() error {
		go func() {
			done <- m.provider.Create(s.Name,
				cluster.CreateWithNodeImage(s.NodeImage),
				cluster.CreateWithRawConfig(raw),
				cluster.CreateWithKubeconfigPath(info.Kubeconfig),
				cluster.CreateWithWaitForReady(opts.WaitReady),
				// We delete on failure ourselves, so an interrupt can too.
				cluster.CreateWithRetain(true),
				cluster.CreateWithDisplayUsage(false),
				cluster.CreateWithDisplaySalutation(false),
			)
		}()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("kind create %s: %w", s.Name, err)
			}
			return nil
		case <-ctx.Done():
			// kind's Create cannot be cancelled: deleting the node makes it
			// return; wait for that so nothing is recreated behind us.
			if !opts.Keep {
				_ = m.provider.Delete(s.Name, info.Kubeconfig)
				select {
				case <-done:
				case <-time.After(2 * time.Minute):
				}
			}
			return ctx.Err()
		}
	})
	if err != nil {
		return info, true, err
	}
	if s.Workers > 0 {
		if err := m.Log.Step(fmt.Sprintf("Laying the pod network across %s's %d nodes", s.Name, s.Workers+1), func() error {
			if s.PodSubnet == "" {
				return fmt.Errorf("cluster %s: workers need the pod subnet (podSubnet) to lay the pod network", s.Name)
			}
			return m.podNetwork(ctx, s.Name, s.PodSubnet)
		}); err != nil {
			return info, true, err
		}
	}
	if err := m.connect(ctx, info); err != nil {
		return info, true, err
	}
	if m.Registry != nil {
		info.Registry = m.Registry.HostAddress()
	}
	if err := m.setup(ctx, info); err != nil {
		return info, true, err
	}
	if info.NodesStartedAt, err = m.nodesStartedAt(ctx, s.Name); err != nil {
		return info, true, err
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	info.Created = true
	return info, true, os.WriteFile(m.infoPath(s.Name), b, 0o644)
}

func (m *Manager) setup(ctx context.Context, info Info) error {
	if m.Setup == nil {
		return nil
	}
	if err := m.Setup(ctx, info); err != nil {
		return fmt.Errorf("cluster %s: %w", info.Name, err)
	}
	return nil
}

// nodesStartedAt reads when Docker last started each of a cluster's nodes.
func (m *Manager) nodesStartedAt(ctx context.Context, name string) (map[string]string, error) {
	ns, err := m.provider.ListNodes(name)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: list nodes: %w", name, err)
	}
	at := make(map[string]string, len(ns))
	for _, n := range ns {
		out, err := docker(ctx, "inspect", "--format", "{{.State.Running}} {{.State.StartedAt}}", n.String())
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", name, err)
		}
		running, started, _ := strings.Cut(out, " ")
		if running != "true" {
			started = "not running"
		}
		at[n.String()] = started
	}
	return at, nil
}

// stateLost tells whether an existing cluster with the right spec has lost
// its state: with etcd on the node's tmpfs, a node container that Docker
// restarted since the creation (or that is not running) holds an empty etcd,
// and the API server answers without kubeadm's RBAC ("kubernetes-admin
// cannot patch namespaces"). Info files written before NodesStartedAt was
// recorded cannot tell, and are trusted.
func (m *Manager) stateLost(ctx context.Context, s Spec, info Info) (bool, string, error) {
	if !s.EtcdOnTmpfs || len(info.NodesStartedAt) == 0 {
		return false, "", nil
	}
	now, err := m.nodesStartedAt(ctx, s.Name)
	if err != nil {
		return false, "", err
	}
	lost, why := restartedNodes(info.NodesStartedAt, now)
	return lost, why, nil
}

// restartedNodes compares the recorded start times with the current ones.
func restartedNodes(recorded, now map[string]string) (bool, string) {
	names := make([]string, 0, len(recorded))
	for n := range recorded {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		cur, ok := now[n]
		switch {
		case !ok:
			return true, fmt.Sprintf("its node %s is gone", n)
		case cur == "not running":
			return true, fmt.Sprintf("its node %s is not running, and its etcd kept its data in the node's tmpfs", n)
		case cur != recorded[n]:
			return true, fmt.Sprintf("its node %s was restarted (at %s, created at %s), and its etcd kept its data in the node's tmpfs, so the cluster came back empty", n, cur, recorded[n])
		}
	}
	return false, ""
}

// connect wires a cluster's node to the local registry.
func (m *Manager) connect(ctx context.Context, info Info) error {
	if m.Registry == nil {
		return nil
	}
	ns, err := m.provider.ListNodes(info.Name)
	if err != nil {
		return err
	}
	for _, n := range ns {
		if err := m.Registry.ConfigureNode(ctx, n); err != nil {
			return fmt.Errorf("cluster %s: connect node %s to the local registry: %w", info.Name, n.String(), err)
		}
	}
	return nil
}

// Delete removes a cluster, its kubeconfig and its state.
//
// On cgroup v1 a node interrupted mid-creation can hold a pod container
// whose freezer cgroup the node's own runc left FROZEN (it was killed while
// applying cgroup settings); its tasks cannot die, so `docker rm -f` fails
// with "did not receive an exit event". Delete then thaws the node's frozen
// cgroups and tries again.
func (m *Manager) Delete(name string) error {
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = m.provider.Delete(name, m.KubeconfigPath(name)); err == nil {
			break
		}
		if n := m.thawNodes(name); n > 0 && m.Log != nil {
			m.Log.Printf("   thawed %d frozen cgroup(s) in cluster %s's nodes; deleting again", n, name)
		}
		time.Sleep(time.Duration(attempt+1) * time.Second)
	}
	if err != nil {
		return fmt.Errorf("delete cluster %s: %w", name, err)
	}
	_ = os.Remove(m.KubeconfigPath(name))
	_ = os.Remove(m.infoPath(name))
	return nil
}

// Nodes lists a cluster's nodes.
func (m *Manager) Nodes(name string) ([]nodes.Node, error) { return m.provider.ListNodes(name) }

// LoadImageArchives imports docker-archive tarballs into every node of a
// cluster (kind load image-archive). Images loaded this way are addressable
// by tag only; anything used by digest must come from the registry.
func (m *Manager) LoadImageArchives(name string, files ...string) error {
	ns, err := m.provider.ListNodes(name)
	if err != nil {
		return err
	}
	for _, n := range ns {
		for _, f := range files {
			r, err := os.Open(f)
			if err != nil {
				return err
			}
			err = nodeutils.LoadImageArchive(n, r)
			r.Close()
			if err != nil {
				return fmt.Errorf("load %s into %s: %w", f, n.String(), err)
			}
		}
	}
	return nil
}

// ExportLogs writes what `kind export logs` writes into dir/<name>.
func (m *Manager) ExportLogs(name, dir string) error {
	out := filepath.Join(dir, name)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return m.provider.CollectLogs(name, out)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// thawNodes thaws every FROZEN freezer cgroup under the cluster's node
// containers (cgroup v1 only) and returns how many it thawed.
func (m *Manager) thawNodes(name string) int {
	const root = "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(root); err != nil {
		return 0
	}
	out, err := docker(context.Background(), "ps", "-aq", "--no-trunc", "--filter", "label=io.x-k8s.kind.cluster="+name)
	if err != nil {
		return 0
	}
	ids := strings.Fields(out)
	n := 0
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "freezer.state" {
			return nil
		}
		mine := false
		for _, id := range ids {
			if strings.Contains(path, id) {
				mine = true
				break
			}
		}
		if !mine {
			return nil
		}
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "FROZEN" {
			if os.WriteFile(path, []byte("THAWED"), 0) == nil {
				n++
			}
		}
		return nil
	})
	return n
}
