// Package clusters is the framework's entry point for Kind clusters: it
// builds the offline inputs (clusters/inputs), runs the local registry and
// creates, reuses and deletes named clusters (clusters/kindcluster). It
// installs the stock and lampyr profiles on them with the product's
// installer (impl/install.Installer), which `ly cluster install` uses too.
package clusters

import (
	"context"
	"fmt"
	"os"

	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/clusters/netpol"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/progress"
)

// Gateway NodePorts. The paired clusters publish their gateway on
// 127.0.0.1 at the same port number as the NodePort, because Knative's
// ingress conformance (-ingressendpoint) dials ENDPOINT:NODEPORT. Other
// clusters get NodePort 30080 on a free host port.
const (
	StockGatewayPort  = 31080
	LampyrGatewayPort = 32080
	DefaultNodePort   = install.DefaultNodePort
)

// TLSPortFor is the gateway's HTTPS mapping for a cluster name: its NodePort
// next to the HTTP one (networking.TLSNodePortOffset), published on the same
// port of 127.0.0.1 for the paired clusters (Knative's ingress conformance
// dials ENDPOINT:NODEPORT for its tls test too).
func TLSPortFor(name string) kindcluster.PortMapping {
	gw := GatewayPortFor(name)
	m := kindcluster.PortMapping{NodePort: gw.NodePort + networking.TLSNodePortOffset}
	if gw.HostPort != 0 {
		m.HostPort = m.NodePort
	}
	return m
}

// pairedGatewayPorts are the fixed gateway ports of the two paired
// clusters (by cluster name: a port, not a profile).
var pairedGatewayPorts = map[string]int{"stock": StockGatewayPort, "lampyr": LampyrGatewayPort}

// GatewayPortFor returns the gateway mapping for a cluster name: the paired
// clusters' fixed port, else NodePort 30080 on a free host port.
func GatewayPortFor(name string) kindcluster.PortMapping {
	if p, ok := pairedGatewayPorts[name]; ok {
		return kindcluster.PortMapping{NodePort: p, HostPort: p}
	}
	return kindcluster.PortMapping{NodePort: DefaultNodePort}
}

// Paired is the stock/lampyr pair every paired suite and `just cluster-up`
// use, each cluster with its install profile stated (never inferred from
// its name).
var Paired = []Cluster{{Name: "stock", Profile: ProfileStock}, {Name: "lampyr", Profile: ProfileLampyr}}

// Install profiles (the installer's).
const (
	ProfileStock  = install.ProfileStock
	ProfileLampyr = install.ProfileLampyr
)

// Cluster is a named cluster and the install profile it gets (empty: a
// bare cluster).
type Cluster struct {
	Name    string
	Profile string
}

// PairedProfile is the profile of a paired cluster's name ("stock",
// "lampyr"); false for any other name, which needs its profile stated.
func PairedProfile(name string) (string, bool) {
	for _, c := range Paired {
		if c.Name == name {
			return c.Profile, true
		}
	}
	return "", false
}

// Domain is config-domain's domain on both profiles (install.Domain).
const Domain = install.Domain

// RegistryContainer is the local registry's container name (the one the
// installer's default mirror names).
const RegistryContainer = install.LocalRegistryContainer

// Settings are the cluster framework's settings, read at the edge
// (clusters/environ) and handed down.
type Settings struct {
	// Cache holds everything built from pinned versions.
	Cache string
	// StateDir holds the clusters' kubeconfigs and records.
	StateDir string
	// EtcdOnDisk keeps a test cluster's etcd on disk (default: tmpfs,
	// kindcluster.Spec.EtcdOnTmpfs says what that costs).
	EtcdOnDisk bool
	// DebianMirror overrides inputs.DebianMirror.
	DebianMirror string
	// Online says upstream registries are reachable, so networking
	// providers that pull images (kourier) may be installed
	// (install.Options.Online).
	Online bool
	// LampyrSources say where the lampyr profile's components come from
	// (zero: built from this checkout).
	LampyrSources install.LampyrSources
	// Workers gives every cluster this run creates that many worker nodes
	// beside its control plane (0: one node, the default).
	Workers int
}

// Env ties the cache, the state directory and the registry together.
type Env struct {
	Settings
	Log    *progress.Log
	inputs *inputs.Result
}

// NewEnv is an Env on s.
func NewEnv(log *progress.Log, s Settings) *Env {
	return &Env{Settings: s, Log: log}
}

// Inputs builds or finds every offline input.
func (e *Env) Inputs(ctx context.Context) (*inputs.Result, error) {
	if e.inputs != nil {
		return e.inputs, nil
	}
	var res *inputs.Result
	err := e.Log.Step("Cluster inputs (cache "+e.Cache+")", func() (err error) {
		b := inputs.NewBuilder(e.Cache, e.Log)
		b.DebianMirror = e.DebianMirror
		res, err = b.Build(ctx)
		return err
	})
	e.inputs = res
	return res, err
}

// Manager returns a cluster manager on the state directory, without the
// registry (enough for delete, logs, info).
func (e *Env) Manager() *kindcluster.Manager {
	return kindcluster.NewManager(e.StateDir, e.Log)
}

// Spec is the offline spec for a named cluster: one node, or a control
// plane and Settings.Workers workers.
func (e *Env) Spec(name, nodeImage string) kindcluster.Spec {
	return kindcluster.Spec{
		Name:      name,
		NodeImage: nodeImage,
		// HTTP first: Info.Gateway() is the first mapping.
		Ports:             []kindcluster.PortMapping{GatewayPortFor(name), TLSPortFor(name)},
		CgroupV1:          !cgroupV2(),
		DisableDefaultCNI: true,
		PodSubnet:         inputs.PodSubnet,
		ServiceSubnet:     inputs.ServiceSubnet,
		// Test clusters: etcd on the node's tmpfs unless asked otherwise
		// (kindcluster.Spec.EtcdOnTmpfs says what that costs).
		EtcdOnTmpfs: !e.EtcdOnDisk,
		Workers:     e.Workers,
		// Both sides alike: the bench's scale row holds 200 idle
		// Services on one node, each a Home Pod on Lampyr.
		MaxPods: NodeMaxPods,
	}
}

// NodeMaxPods is every test node's kubelet maxPods: room for the bench's
// 200 idle Revisions (a Home Pod each on Lampyr) beside the platform's own
// Pods. The single-node pod range (inputs.PodSubnet, a /16) has the
// addresses.
const NodeMaxPods = 250

// Up builds the inputs and creates or reuses the named clusters in parallel,
// each connected to the local registry and enforcing NetworkPolicies.
func (e *Env) Up(ctx context.Context, names []string, keep bool) ([]kindcluster.Info, error) {
	res, err := e.Inputs(ctx)
	if err != nil {
		return nil, err
	}
	m := e.Manager()
	m.Registry = &kindcluster.Registry{Container: RegistryContainer, Image: res.RegistryImage, HostPort: kindcluster.DefaultRegistryPort}
	m.Setup = func(ctx context.Context, info kindcluster.Info) error {
		return e.installEnforcer(ctx, info, res.NetworkPolicyImage)
	}
	specs := make([]kindcluster.Spec, len(names))
	for i, n := range names {
		specs[i] = e.Spec(n, res.NodeImage)
	}
	return m.Up(ctx, specs, kindcluster.UpOptions{Keep: keep})
}

// NetworkPolicyEnforcer describes the enforcer every cluster runs.
func NetworkPolicyEnforcer(image string) netpol.Options {
	return netpol.Options{Image: image, Version: inputs.KubeRouterVersion, ServiceSubnet: inputs.ServiceSubnet}
}

// installEnforcer puts the NetworkPolicy enforcer on a cluster and waits for
// it to enforce: the offline CNI (ptp) enforces no policy, and Lampyr's
// trust model relies on NetworkPolicies being enforced.
func (e *Env) installEnforcer(ctx context.Context, info kindcluster.Info, image string) error {
	o := NetworkPolicyEnforcer(image)
	return e.Log.Step(fmt.Sprintf("Installing the %s on %s, waiting until it enforces", o.Describe(), info.Name), func() error {
		c, err := install.NewClients(info.Kubeconfig)
		if err != nil {
			return err
		}
		return netpol.Install(ctx, c.Config, e.Log, o, netpol.DefaultTimeout)
	})
}

func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// Installer is the product's installer (impl/install) on this Env: the
// cache's Go builds, the local registry and its in-cluster mirror, this
// checkout and the Settings' sources.
func (e *Env) Installer() *install.Installer {
	return &install.Installer{
		Cache:          e.Cache,
		Registry:       fmt.Sprintf("localhost:%d", kindcluster.DefaultRegistryPort),
		RegistryMirror: fmt.Sprintf("localhost:%d=%s:5000", kindcluster.DefaultRegistryPort, RegistryContainer),
		Root:           RepoRoot(),
		Online:         e.Online,
		Sources:        e.LampyrSources,
		Log:            e.Log,
	}
}

// installTarget is what the installer needs of a Kind cluster: its
// kubeconfig and its gateway's NodePort.
func installTarget(info kindcluster.Info) install.Cluster {
	return install.Cluster{Name: info.Name, Kubeconfig: info.Kubeconfig, NodePort: info.Gateway().NodePort}
}

// Publisher builds images and pushes them to the local registry.
func (e *Env) Publisher() *publish.Publisher { return e.Installer().Publisher() }

// Prebuild starts the Go builds the installs of these profiles will ask
// for in the background (install.Installer.Prebuild).
func (e *Env) Prebuild(ctx context.Context, profiles []string, provider string) {
	e.Installer().Prebuild(ctx, profiles, provider)
}

// Install puts a profile on a cluster with a networking provider
// (install.Installer.Install).
func (e *Env) Install(ctx context.Context, info kindcluster.Info, profile, provider string) error {
	return e.Installer().Install(ctx, installTarget(info), profile, provider)
}

// InstallEventing adds Knative Eventing to a cluster that has a profile
// installed (install.Installer.InstallEventing).
func (e *Env) InstallEventing(ctx context.Context, info kindcluster.Info) error {
	return e.Installer().InstallEventing(ctx, installTarget(info))
}
