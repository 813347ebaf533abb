package install

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/progress"
	"lampyr.dev/serving/impl/trust/seal"
)

// Install profiles.
const (
	ProfileStock  = "stock"
	ProfileLampyr = "lampyr"
)

// Domain is config-domain's domain on both profiles (identical, so the
// defaulted Services compare equal). Knative 1.23 without a configured
// domain makes every Route cluster-local (svc.cluster.local).
const Domain = "example.com"

// DefaultNodePort is the gateway's NodePort on a cluster that states none.
const DefaultNodePort = 30080

// The local registry, run as Kind's local-registry documentation does (the
// framework's clusters/kindcluster.Registry): images are pushed to and
// named by LocalRegistry, which the host and every node reach; inside the
// cluster fiberd reaches the registry container on the kind network
// (LocalRegistryMirror, config-lampyr's home-registry-mirrors).
const (
	LocalRegistry          = "localhost:5002"
	LocalRegistryContainer = "lampyr-registry"
	LocalRegistryMirror    = LocalRegistry + "=" + LocalRegistryContainer + ":5000"
)

// Installer is the install policy `ly cluster install` and the suites
// share: which images it builds and where it pushes them, which Revision
// backend strategy Lampyr gets behind each networking provider, and which
// sealer identity a fresh installation trusts. It reads no environment
// variable; the commands fill it at their edge (impl/install/installenv,
// clusters/environ).
type Installer struct {
	// Cache holds everything built from pinned versions; the Go builds of
	// the images go to Cache/go.
	Cache string
	// Registry is where images are pushed and pulled from, as the host and
	// the cluster's nodes name it (empty: LocalRegistry).
	Registry string
	// RegistryMirror is config-lampyr's home-registry-mirrors: how fiberd,
	// inside the cluster, reaches Registry (empty: LocalRegistryMirror).
	RegistryMirror string
	// Root is the checkout Lampyr is built from (empty: RepoRoot()).
	Root string
	// Online says upstream registries are reachable (Options.Online).
	Online bool
	// Sources say where the lampyr profile's components come from (zero:
	// built from Root).
	Sources LampyrSources
	// StockServingVersion installs the stock profile at another version of
	// knative.dev/serving than the pinned one (empty: the pinned
	// knative.ServingVersion); the lampyr profile always runs the pinned
	// one. The operations suite's stock upgrade reference sets it.
	StockServingVersion string
	Log                 *progress.Log
}

func (i *Installer) stockServingVersion() string {
	if i.StockServingVersion != "" {
		return i.StockServingVersion
	}
	return knative.ServingVersion
}

// Cluster is the cluster an install goes to.
type Cluster struct {
	// Name names the cluster in progress lines and errors.
	Name string
	// Kubeconfig is a kubeconfig file; its current context is used.
	Kubeconfig string
	// NodePort is the gateway's public NodePort.
	NodePort int
}

func (i *Installer) registry() string {
	if i.Registry != "" {
		return i.Registry
	}
	return LocalRegistry
}

func (i *Installer) registryMirror() string {
	if i.RegistryMirror != "" {
		return i.RegistryMirror
	}
	return LocalRegistryMirror
}

func (i *Installer) root() string {
	if i.Root != "" {
		return i.Root
	}
	return RepoRoot()
}

// Publisher builds images and pushes them to the registry.
func (i *Installer) Publisher() *publish.Publisher {
	return &publish.Publisher{
		Go:       &gobuild.Builder{WorkDir: filepath.Join(i.Cache, "go"), Log: i.Log},
		Registry: i.registry(),
		Log:      i.Log,
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
func (i *Installer) Prebuild(ctx context.Context, profiles []string, provider string) {
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
	bp := i.Publisher()
	bp.BuildOnly, bp.Registry = true, "prebuild.invalid"
	ctx = gobuild.Background(ctx)
	what := []string{"Knative Serving " + knative.ServingVersion, prov.Name() + " (" + prov.Describe() + ")"}
	if want[ProfileLampyr] {
		what = append(what, "Lampyr from this checkout")
	}
	i.Log.Printf("   prebuilding in the background, beside the cluster inputs: %s", strings.Join(what, "; "))
	run := func(name string, fn func() error) {
		go func() {
			if err := fn(); err != nil && ctx.Err() == nil {
				i.Log.Printf("   prebuild of %s failed (its install builds it again and reports it): %v", name, err)
			}
		}()
	}
	run("Knative Serving", func() error { _, err := ServingImages(ctx, bp); return err })
	run(prov.Name(), func() error { _, err := prov.Publish(ctx, bp); return err })
	if want[ProfileLampyr] {
		run("Lampyr", func() error { _, err := LampyrComponents(ctx, i.root(), bp, i.Sources); return err })
	}
}

// Install puts a profile on a cluster with a networking provider (a name
// networking.Get knows). A cluster that carries another provider is
// switched: what only the other one installed is deleted first.
func (i *Installer) Install(ctx context.Context, cl Cluster, profile, provider string) error {
	prov, err := networking.Get(provider)
	if err != nil {
		return err
	}
	provider = prov.Name()
	c, err := NewClients(cl.Kubeconfig)
	if err != nil {
		return err
	}
	switch profile {
	case ProfileStock:
		v := i.stockServingVersion()
		return i.Log.Step(fmt.Sprintf("Installing stock Knative Serving %s with %s on %s", v, provider, cl.Name), func() error {
			return Install(ctx, c, i.Publisher(), i.Log, Options{Profile: knative.Stock, Provider: prov, NodePort: cl.NodePort, Domain: Domain, Online: i.Online, ServingVersion: v})
		})
	case ProfileLampyr:
		return i.Log.Step(fmt.Sprintf("Installing Lampyr (upstream Serving %s API, lampyr profile) with %s on %s", knative.ServingVersion, provider, cl.Name), func() error {
			comps, err := LampyrComponents(ctx, i.root(), i.Publisher(), i.Sources)
			if err != nil {
				return err
			}
			if err := SetBackendStrategy(comps.Objects, BackendStrategyFor(provider)); err != nil {
				return err
			}
			if err := SetConfig(comps.Objects, lampyrconfig.KeyBackendClusterIPProbe, strconv.FormatBool(ClusterIPProbeFor(provider))); err != nil {
				return err
			}
			// References name the registry as the host reaches it;
			// inside the cluster fiberd reaches it through the mirror.
			if err := SetConfig(comps.Objects, "home-registry-mirrors", i.registryMirror()); err != nil {
				return err
			}
			if b := i.Sources.FiberBackend; b != "" {
				if b != lampyrconfig.BackendProcess && b != lampyrconfig.BackendGVisor {
					return fmt.Errorf("%s=%q: want %q or %q", EnvFiberBackend, b, lampyrconfig.BackendProcess, lampyrconfig.BackendGVisor)
				}
				if err := SetConfig(comps.Objects, lampyrconfig.KeyFiberBackend, b); err != nil {
					return err
				}
			}
			if err := Install(ctx, c, i.Publisher(), i.Log, Options{Profile: knative.Lampyr, Provider: prov, NodePort: cl.NodePort, Domain: Domain, Extra: comps.Objects, Online: i.Online}); err != nil {
				return err
			}
			return i.authorizeLocalSealer(ctx, cl)
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

// ClusterIPProbeFor says whether a Revision must wait, behind provider's
// gateway, until its backend Service's cluster IP leads to fiber-router
// (config-lampyr backend-cluster-ip-probe): only where the gateway dials
// cluster IPs (Traefik's Knative provider). Traefik's Gateway API provider
// dials the EndpointSlice's ready addresses, and net-gateway-api probes
// the route before the KIngress is Ready, so there the wait for kube-proxy
// (up to 1.8 s after the Service is made, measured 2026-12-05) delayed
// every new Revision and guarded nothing. A provider not named here is
// probed.
func ClusterIPProbeFor(provider string) bool {
	if p, err := networking.Get(provider); err == nil {
		provider = p.Name()
	}
	return provider != networking.GatewayAPIName
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
func (i *Installer) authorizeLocalSealer(ctx context.Context, cl Cluster) error {
	path, err := ly.SealerKeyPath("")
	if err != nil {
		return err
	}
	s, err := ly.LoadSealer(path, true)
	if err != nil {
		return err
	}
	lc, err := ly.Connect(cl.Kubeconfig, "")
	if err != nil {
		return err
	}
	ch, err := ly.AuthorizeSealer(ctx, lc, ly.SealerAuthorization{Name: ly.DefaultSealerName(), Key: s.Key.Public(), Namespaces: []string{seal.AllNamespaces}})
	if err != nil {
		return fmt.Errorf("authorizing this machine's ly sealer identity %s (key %s) on %s: %w", s.Path, s.KeyID(), cl.Name, err)
	}
	i.Log.Printf("   sealer identity %s (key %s, %s) %s for every namespace", ch.Name, s.KeyID()[:16], s.Path, ch.Action)
	return nil
}

// InstallEventing adds Knative Eventing (core, MT channel-based Broker,
// InMemoryChannel) to a cluster that has a profile installed: the same
// objects on stock and on Lampyr. Optional; Serving-only installs never
// call it.
func (i *Installer) InstallEventing(ctx context.Context, cl Cluster) error {
	c, err := NewClients(cl.Kubeconfig)
	if err != nil {
		return err
	}
	return i.Log.Step(fmt.Sprintf("Installing Knative Eventing %s on %s", knative.EventingVersion, cl.Name), func() error {
		return InstallEventing(ctx, c, i.Publisher(), i.Log, 0)
	})
}
