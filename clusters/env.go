// Package clusters is the framework's entry point for Kind clusters: it
// builds the offline inputs (clusters/inputs), runs the local registry and
// creates, reuses and deletes named clusters (clusters/kindcluster).
package clusters

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"lampyr.dev/serving/clusters/netpol"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/trust/seal"

	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/impl/progress"
)

// Gateway NodePorts. The paired clusters publish their gateway on
// 127.0.0.1 at the same port number as the NodePort, because Knative's
// ingress conformance (-ingressendpoint) dials ENDPOINT:NODEPORT. Other
// clusters get NodePort 30080 on a free host port.
const (
	StockGatewayPort  = 31080
	LampyrGatewayPort = 32080
	DefaultNodePort   = 30080
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

// Install profiles.
const (
	ProfileStock  = "stock"
	ProfileLampyr = "lampyr"
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

// Domain is config-domain's domain on both profiles (identical, so the
// defaulted Services compare equal). Knative 1.23 without a configured
// domain makes every Route cluster-local (svc.cluster.local).
const Domain = "example.com"

// RegistryContainer is the local registry's container name.
const RegistryContainer = "lampyr-registry"

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
	}
}

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

// Publisher builds images and pushes them to the local registry.
func (e *Env) Publisher() *publish.Publisher {
	return &publish.Publisher{
		Go:       &gobuild.Builder{WorkDir: filepath.Join(e.Cache, "go"), Log: e.Log},
		Registry: fmt.Sprintf("localhost:%d", kindcluster.DefaultRegistryPort),
		Log:      e.Log,
	}
}

// Prebuild starts, in the background and at background build priority
// (gobuild.Background), the Go builds the installs of these profiles will
// ask for (Knative Serving, the networking provider, Lampyr from this
// checkout), so that they run beside the cluster inputs instead of after
// the clusters are up. It runs the install code itself with a build-only
// Publisher, so it asks for exactly the builds (the same specs and cache
// keys) the installs will. A build that fails here is logged and left to
// the install, which runs it again and reports it.
func (e *Env) Prebuild(ctx context.Context, profiles []string, provider string) {
	prov, err := networking.Get(provider)
	if err != nil {
		return // the install reports it
	}
	want := map[string]bool{}
	for _, p := range profiles {
		want[p] = true
	}
	if !want[ProfileStock] && !want[ProfileLampyr] {
		return
	}
	bp := e.Publisher()
	bp.BuildOnly, bp.Registry = true, "prebuild.invalid"
	ctx = gobuild.Background(ctx)
	what := []string{"Knative Serving " + knative.ServingVersion, prov.Name() + " (" + prov.Describe() + ")"}
	if want[ProfileLampyr] {
		what = append(what, "Lampyr from this checkout")
	}
	e.Log.Printf("   prebuilding in the background, beside the cluster inputs: %s", strings.Join(what, "; "))
	run := func(name string, fn func() error) {
		go func() {
			if err := fn(); err != nil && ctx.Err() == nil {
				e.Log.Printf("   prebuild of %s failed (its install builds it again and reports it): %v", name, err)
			}
		}()
	}
	run("Knative Serving", func() error { _, err := install.ServingImages(ctx, bp); return err })
	run(prov.Name(), func() error { _, err := prov.Publish(ctx, bp); return err })
	if want[ProfileLampyr] {
		run("Lampyr", func() error { _, err := install.LampyrComponents(ctx, RepoRoot(), bp, e.LampyrSources); return err })
	}
}

// Install puts a profile on a cluster with a networking provider (a name
// networking.Get knows). A cluster that carries another provider is
// switched: what only the other one installed is deleted first.
func (e *Env) Install(ctx context.Context, info kindcluster.Info, profile, provider string) error {
	prov, err := networking.Get(provider)
	if err != nil {
		return err
	}
	provider = prov.Name()
	c, err := install.NewClients(info.Kubeconfig)
	if err != nil {
		return err
	}
	switch profile {
	case ProfileStock:
		return e.Log.Step(fmt.Sprintf("Installing stock Knative Serving %s with %s on %s", knative.ServingVersion, provider, info.Name), func() error {
			return install.Install(ctx, c, e.Publisher(), e.Log, install.Options{Profile: knative.Stock, Provider: prov, NodePort: info.Gateway().NodePort, Domain: Domain, Online: e.Online})
		})
	case ProfileLampyr:
		return e.Log.Step(fmt.Sprintf("Installing Lampyr (upstream Serving %s API, lampyr profile) with %s on %s", knative.ServingVersion, provider, info.Name), func() error {
			comps, err := install.LampyrComponents(ctx, RepoRoot(), e.Publisher(), e.LampyrSources)
			if err != nil {
				return err
			}
			if err := install.SetBackendStrategy(comps.Objects, BackendStrategyFor(provider)); err != nil {
				return err
			}
			// References name the registry as the host reaches it
			// (localhost:5002); inside the cluster fiberd reaches the
			// registry container on the kind network.
			mirror := fmt.Sprintf("localhost:%d=%s:5000", kindcluster.DefaultRegistryPort, RegistryContainer)
			if err := install.SetConfig(comps.Objects, "home-registry-mirrors", mirror); err != nil {
				return err
			}
			if err := install.Install(ctx, c, e.Publisher(), e.Log, install.Options{Profile: knative.Lampyr, Provider: prov, NodePort: info.Gateway().NodePort, Domain: Domain, Extra: comps.Objects, Online: e.Online}); err != nil {
				return err
			}
			return e.authorizeLocalSealer(ctx, info)
		})
	}
	return fmt.Errorf("unknown profile %q: want stock or lampyr", profile)
}

// backendStrategies is the feasibility gate's selection per networking
// provider (`just test-feasibility`: the first strategy, in the seed's
// order, that passes every proof; the gate fails if this table disagrees
// with what it measured). The matrix and its evidence: docs/networking.md.
var backendStrategies = map[string]string{
	// Traefik's Knative provider dials a backend's ClusterIP: an
	// ExternalName backend answers 404 while the KIngress says Ready.
	networking.TraefikKnativeName: "endpointslice",
	// Traefik's Gateway API provider refuses ExternalName backends ("type
	// ExternalName is not supported for Kubernetes Service reference") and
	// answers 500, which net-gateway-api's best-effort probe takes for
	// Ready; it dials the EndpointSlices' ready addresses (2026-12-01:
	// externalname 500 on every request, endpointslice every proof).
	networking.GatewayAPIName: "endpointslice",
	// Kourier (Envoy) resolves an ExternalName as DNS, as seed 000 proved;
	// not measured here (its gateway must be pulled from a registry).
	"kourier": "externalname",
}

// BackendStrategyFor is the Revision backend strategy Lampyr uses behind a
// networking provider (the gate's result; endpointslice for a provider the
// gate never measured, since it works behind any gateway that follows a
// Service's endpoints).
func BackendStrategyFor(provider string) string {
	if p, err := networking.Get(provider); err == nil {
		provider = p.Name()
	}
	if s, ok := backendStrategies[provider]; ok {
		return s
	}
	return "endpointslice"
}

// authorizeLocalSealer authorizes this machine's `ly` sealer identity for
// every namespace, as `ly cluster install` does for its installer: the
// suites and the portability proof deploy with it (docs/security.md "Keys
// and their rotation").
func (e *Env) authorizeLocalSealer(ctx context.Context, info kindcluster.Info) error {
	path, err := ly.SealerKeyPath("")
	if err != nil {
		return err
	}
	s, err := ly.LoadSealer(path, true)
	if err != nil {
		return err
	}
	lc, err := ly.Connect(info.Kubeconfig, "")
	if err != nil {
		return err
	}
	ch, err := ly.AuthorizeSealer(ctx, lc, ly.SealerAuthorization{Name: ly.DefaultSealerName(), Key: s.Key.Public(), Namespaces: []string{seal.AllNamespaces}})
	if err != nil {
		return fmt.Errorf("authorizing this machine's ly sealer identity %s (key %s) on %s: %w", s.Path, s.KeyID(), info.Name, err)
	}
	e.Log.Printf("   sealer identity %s (key %s, %s) %s for every namespace", ch.Name, s.KeyID()[:16], s.Path, ch.Action)
	return nil
}

// InstallEventing adds Knative Eventing (core, MT channel-based Broker,
// InMemoryChannel) to a cluster that has a profile installed: the same
// objects on stock and on Lampyr. Optional; Serving-only installs never
// call it.
func (e *Env) InstallEventing(ctx context.Context, info kindcluster.Info) error {
	c, err := install.NewClients(info.Kubeconfig)
	if err != nil {
		return err
	}
	return e.Log.Step(fmt.Sprintf("Installing Knative Eventing %s on %s", knative.EventingVersion, info.Name), func() error {
		return install.InstallEventing(ctx, c, e.Publisher(), e.Log, 0)
	})
}
