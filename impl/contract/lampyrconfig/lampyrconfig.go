// Package lampyrconfig is the one parser of config-lampyr, the ConfigMap in
// the Lampyr system namespace that the grant controller, the Revision
// controller and ly share: its keys, their defaults, their validation and
// errors that name the key and the fix.
//
// Each component parses only the keys it reads (GrantKeys, RevisionKeys),
// so a mistake in one component's key does not stop another; the rules for
// a key are the same wherever it is read.
package lampyrconfig

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// Keys the grant controller reads.
const (
	KeyFiberMemoryCapacity = "fiber-memory-capacity"
	KeyMaxMemoryPerFiber   = "max-memory-per-fiber"
	KeyMaxFibersPerGrant   = "max-fibers-per-grant"
	KeyDefaultMaxFibers    = "default-max-fibers"
	KeyGrantTTL            = "grant-ttl"
	KeyGrantRenewInterval  = "grant-renew-interval"
	KeyHomeImage           = "home-image"
	KeyHelperImage         = "helper-image"
	KeyHomeWarmFibers      = "home-warm-fibers"
	// KeyHomeSpares is how many spare Homes (fiberd running, no grant
	// yet) the grant controller keeps for new Revisions to claim.
	KeyHomeSpares = "home-spares"
	// KeyHomeIdleAfter: a Home whose fiberd reports no fiber leased for
	// this long gives back its scheduler reservation (its fiberd
	// container's requests are resized in place to KeyHomeIdleMemory and
	// KeyHomeIdleCPU; its limits stay) and takes it back when traffic
	// returns. "0" turns the give-back off.
	KeyHomeIdleAfter = "home-idle-after"
	// KeyHomeIdleMemory is an idle Home's memory request.
	KeyHomeIdleMemory = "home-idle-memory"
	// KeyHomeIdleCPU is an idle Home's CPU request.
	KeyHomeIdleCPU = "home-idle-cpu"
	// KeyHomeWarmIdle is fiberd's --warm-idle (given only when not 0).
	KeyHomeWarmIdle = "home-warm-idle"
	// KeyHomeRegistryMirrors: comma-separated from=to registry host pairs
	// for fiberd (e.g. localhost:5002=kind-registry:5000), since the
	// references `ly` writes name the registry as the developer reaches it.
	// The Revision controller uses them too unless KeyRegistryMirrors is set.
	KeyHomeRegistryMirrors = "home-registry-mirrors"
	// KeyHomeCPULimit bounds each Home's CPU (its fibers and fiberd), so
	// one busy Revision cannot take every core of a node.
	KeyHomeCPULimit = "home-cpu-limit"
	// KeyFiberCPULimit bounds each fiber's CPU within its Home.
	KeyFiberCPULimit = "fiber-cpu-limit"
	// KeyHomeStorageLimit is the sizeLimit of a Home's state volume
	// (unpacked snapshot, fibers' mount points); fiberd's unpack limit is
	// set to half of it.
	KeyHomeStorageLimit = "home-storage-limit"
	// KeyNamespaceFiberMemoryShare is how much of fiber-memory-capacity one
	// namespace's grants may reserve: a quantity ("4Gi") or a percentage
	// of the capacity ("50%"). An administrator gives a namespace another
	// share with the Namespace annotation contract.FiberMemoryShareAnnotation.
	KeyNamespaceFiberMemoryShare = "namespace-fiber-memory-share"
	// KeyFiberEgress turns fibers' service bindings on ("cluster", the
	// default: through the namespace's egress Pod; "direct": from the
	// Home) or off ("off": loopback only). docs/networking.md, "Service
	// bindings".
	KeyFiberEgress = "fiber-egress"
	// KeyFiberEgressDomains: DNS suffixes fibers may resolve.
	KeyFiberEgressDomains = "fiber-egress-domains"
	// KeyFiberEgressDenyNames: names (or ".suffix") fibers may not
	// resolve even inside the domains.
	KeyFiberEgressDenyNames = "fiber-egress-deny-names"
	// KeyFiberEgressAllowCIDRs: address ranges fibers may connect to;
	// default the cluster's Service CIDRs (ServiceCIDR objects).
	KeyFiberEgressAllowCIDRs = "fiber-egress-allow-cidrs"
	// KeyFiberEgressDenyCIDRs: ranges refused inside those (the
	// Kubernetes API's ClusterIPs are always added).
	KeyFiberEgressDenyCIDRs = "fiber-egress-deny-cidrs"
	// KeyFiberBackend selects what runs fibers in every Home: "process"
	// (a Linux process sandbox) or "gvisor" (a runsc sandbox per fiber,
	// gVisor's user-space kernel between the handler and the host's;
	// Homes started after the change use it).
	KeyFiberBackend = "fiber-backend"
	// KeyFiberGVisorPreinit: with the gvisor backend, restore every fiber
	// from a checkpoint of the handler taken once it listens ("true", the
	// default) or start each one cold ("false").
	KeyFiberGVisorPreinit = "fiber-gvisor-preinit"
)

// Keys the Revision controller reads (and ly: template-repository,
// image-snapshots).
const (
	// KeyBackendStrategy selects how a Revision's backend Service reaches
	// fiber-router (docs/contracts.md §3).
	KeyBackendStrategy = "backend-strategy"
	// KeyBackendClusterIPProbe: in the endpointslice strategy, a Revision
	// is routable only once its backend Service's cluster IP leads to
	// fiber-router ("true", the default: a gateway that dials cluster IPs,
	// as Traefik's Knative provider does, needs kube-proxy to have
	// programmed it). "false" where the gateway dials the EndpointSlice's
	// addresses and probes the route itself before a KIngress is Ready
	// (net-gateway-api over Traefik's Gateway API provider): the wait for
	// kube-proxy is then up to 1.8 s on no one's path (issue 32).
	KeyBackendClusterIPProbe = "backend-cluster-ip-probe"
	// KeyDefaultMemoryPerFiber is the memory each fiber gets when the
	// Revision has no memory request (a plain Service without resources).
	KeyDefaultMemoryPerFiber = "default-memory-per-fiber"
	// KeyVerifyArtifacts turns on a registry HEAD of the snapshot artifact
	// before a Revision can become Ready. Off by default: the controller Pod
	// often cannot reach the registry the Homes pull from (Kind's
	// localhost:5002 is not localhost inside a Pod).
	KeyVerifyArtifacts = "verify-artifacts"
	// KeyImageSnapshots maps runnable images, by repository@digest, to the
	// snapshot artifacts built from the same source (docs/contracts.md,
	// "Image snapshots"): a Revision without Lampyr annotations whose image
	// is mapped runs from that snapshot, and the controller seals its
	// template.
	KeyImageSnapshots = "image-snapshots"
	// KeyTemplateRepository is where sealed fiberd templates are pushed (by
	// `ly deploy`, and by the controller for image-mapped Revisions).
	KeyTemplateRepository = "template-repository"
	// KeyRegistryMirrors: comma-separated from=to registry host pairs the
	// controller applies to its own registry traffic; unset, it uses
	// KeyHomeRegistryMirrors (the controller Pod sees the registry as Home
	// Pods do).
	KeyRegistryMirrors = "registry-mirrors"
)

// Fiber backends (KeyFiberBackend).
const (
	BackendProcess = "process"
	BackendGVisor  = "gvisor"
)

// GrantKeys are the keys the grant controller parses.
var GrantKeys = []string{
	KeyFiberMemoryCapacity, KeyMaxMemoryPerFiber, KeyMaxFibersPerGrant, KeyDefaultMaxFibers,
	KeyGrantTTL, KeyGrantRenewInterval, KeyHomeImage, KeyHelperImage, KeyHomeWarmFibers, KeyHomeSpares, KeyHomeRegistryMirrors,
	KeyHomeIdleAfter, KeyHomeIdleMemory, KeyHomeIdleCPU, KeyHomeWarmIdle,
	KeyFiberBackend, KeyFiberGVisorPreinit,
	KeyHomeCPULimit, KeyFiberCPULimit, KeyHomeStorageLimit, KeyNamespaceFiberMemoryShare,
	KeyFiberEgress, KeyFiberEgressDomains, KeyFiberEgressDenyNames, KeyFiberEgressAllowCIDRs, KeyFiberEgressDenyCIDRs,
}

// RevisionKeys are the keys the Revision controller parses.
var RevisionKeys = []string{
	KeyBackendStrategy, KeyBackendClusterIPProbe, KeyDefaultMemoryPerFiber, KeyVerifyArtifacts, KeyImageSnapshots,
	KeyTemplateRepository, KeyRegistryMirrors, KeyHomeRegistryMirrors,
}

// DefaultTemplateRepository is template-repository's default.
const DefaultTemplateRepository = "localhost:5002/lampyr/templates"

// BackendStrategy is the value of backend-strategy.
type BackendStrategy string

const (
	// BackendExternalName makes the Revision Service an ExternalName alias of
	// fiber-router (works with Kourier, which resolves it as a DNS upstream).
	BackendExternalName BackendStrategy = "externalname"
	// BackendEndpointSlice makes it a selectorless ClusterIP Service whose
	// EndpointSlice mirrors fiber-router's ready endpoints (works with
	// providers that dial ClusterIPs or read EndpointSlices, e.g. Traefik).
	BackendEndpointSlice BackendStrategy = "endpointslice"
)

// Fiber egress modes.
const (
	// EgressCluster: fibers reach the cluster's Services through their
	// namespace's egress Pod, so NetworkPolicies treat them as Pods of
	// that namespace.
	EgressCluster = "cluster"
	// EgressDirect: the same resolver and policy, but connections leave
	// from the Home in lampyr-homes (no egress Pod; the tenant's
	// NetworkPolicies do not apply). For clusters that cannot run the
	// egress Pod, and for comparison.
	EgressDirect = "direct"
	EgressOff    = "off"
)

// DefaultEgressDenyNames keep fibers' resolver away from the platform's
// own Services and the Kubernetes API by name (the address ranges are the
// real bound; these are a second one).
var DefaultEgressDenyNames = []string{
	"kubernetes.default.svc.cluster.local",
	".kube-system.svc.cluster.local",
	".knative-serving.svc.cluster.local",
	"." + contract.SystemNamespace + ".svc.cluster.local",
	"." + contract.HomesNamespace + ".svc.cluster.local",
}

// Config is config-lampyr parsed. A component reads the fields of the keys
// it parsed; the others keep their defaults.
type Config struct {
	// Grant controller.

	// NamespaceShare is how much of FiberMemoryCapacity one namespace may
	// reserve unless its Namespace says otherwise.
	NamespaceShare Share
	// FiberMemoryCapacity is the memory all admitted grants may reserve
	// together (memoryPerFiber × maxFibers summed).
	FiberMemoryCapacity resource.Quantity
	// MaxMemoryPerFiber caps one fiber's memory.
	MaxMemoryPerFiber resource.Quantity
	// MaxFibersPerGrant caps one grant's maxFibers.
	MaxFibersPerGrant int32
	// DefaultMaxFibers applies when a grant's maxFibers is 0.
	DefaultMaxFibers int32
	// GrantTTL is the life of a signed grant: how long its Home serves
	// without the grant controller (an outage, an upgrade). Revoking a
	// grant does not wait for it: the grant controller deletes the Home of
	// a grant that lost its admission.
	GrantTTL time.Duration
	// GrantRenewInterval is how often a grant is renewed (re-signed), so
	// new keys and terms reach Homes within it; at most half of GrantTTL.
	GrantRenewInterval time.Duration
	// HomeImage runs fiberd (and holds /lampyr-helper unless HelperImage is set).
	HomeImage string
	// HelperImage, if set, supplies lampyr-helper through an init container.
	HelperImage string
	// HomeWarmFibers is each Home's warm pool size.
	HomeWarmFibers int
	// HomeSpares is how many unclaimed spare Homes are kept.
	HomeSpares int
	// HomeIdleAfter is how long a Home's fiberd must have had no fiber
	// leased before the Home gives back its reservation (0: never).
	HomeIdleAfter time.Duration
	// HomeIdleMemory and HomeIdleCPU are an idle Home's requests.
	HomeIdleMemory resource.Quantity
	HomeIdleCPU    resource.Quantity
	// HomeWarmIdle is fiberd's --warm-idle (0: the flag is not given).
	HomeWarmIdle time.Duration
	// FiberBackend is fiberd's --backend: BackendProcess or BackendGVisor.
	FiberBackend string
	// FiberGVisorPreinit is fiberd's --gvisor-preinit.
	FiberGVisorPreinit bool
	// HomeRegistryMirrors are fiberd's --registry-mirror values.
	HomeRegistryMirrors []string
	// HomeCPULimit is each Home Pod's CPU limit.
	HomeCPULimit resource.Quantity
	// FiberCPULimit is each fiber's CPU bound (fiberd --fiber-cpu); at most
	// HomeCPULimit.
	FiberCPULimit resource.Quantity
	// HomeStorageLimit is the sizeLimit of the Home's state emptyDir.
	HomeStorageLimit resource.Quantity
	// Egress is EgressCluster, EgressDirect or EgressOff.
	Egress string
	// EgressAPI is the grant controller's egress API base URL, given to
	// Homes (fiberd --egress-api). Not a key: the grant controller sets
	// it from where it runs.
	EgressAPI string
	// EgressDomains, EgressDenyNames, EgressAllow and EgressDeny are the
	// fibers' egress policy (impl/trust/egresspolicy.Policy). An empty
	// EgressAllow means the cluster's Service CIDRs, which the grant
	// controller discovers.
	EgressDomains   []string
	EgressDenyNames []string
	EgressAllow     []netip.Prefix
	EgressDeny      []netip.Prefix

	// Revision controller.

	BackendStrategy BackendStrategy
	// BackendClusterIPProbe is backend-cluster-ip-probe.
	BackendClusterIPProbe bool
	DefaultMemoryPerFiber resource.Quantity
	VerifyArtifacts       bool
	// ImageSnapshots maps an image (ImageKey: repository@sha256:...) to a
	// digest-pinned snapshot artifact reference.
	ImageSnapshots map[string]string
	// TemplateRepository receives the templates the controller seals.
	TemplateRepository string
	// RegistryMirrors are from=to host pairs for the controller's registry
	// traffic (artifact checks, template pushes): registry-mirrors, or
	// home-registry-mirrors when that is unset.
	RegistryMirrors []string
	// RouterNamespace and RouterService name fiber-router; the ExternalName
	// target and the EndpointSlice mirror source are derived from them.
	// They are not keys: the controller sets them from where it runs.
	RouterNamespace string
	RouterService   string
}

// RouterHost is fiber-router's cluster DNS name, the ExternalName target.
func (c *Config) RouterHost() string {
	return c.RouterService + "." + c.RouterNamespace + ".svc.cluster.local"
}

// EgressAPIURL is the grant controller's egress API base URL when it runs
// in systemNamespace (its Service, contract.GrantControllerName).
func EgressAPIURL(systemNamespace string) string {
	return fmt.Sprintf("http://%s.%s.svc:%d", contract.GrantControllerName, systemNamespace, contract.EgressAPIPort)
}

// RenewBefore is how long before expiry a grant is renewed: once it is
// GrantRenewInterval old, or at half-life when that comes first, so a Home
// survives a missed renewal plus the kubelet's Secret sync delay, and a
// grant controller away for up to GrantTTL minus that age.
func (c *Config) RenewBefore() time.Duration {
	every := c.GrantRenewInterval
	if every <= 0 || every > c.GrantTTL/2 {
		every = c.GrantTTL / 2
	}
	return c.GrantTTL - every
}

// Defaults is the configuration of an empty ConfigMap.
func Defaults() *Config {
	return &Config{
		FiberMemoryCapacity: resource.MustParse("8Gi"),
		MaxMemoryPerFiber:   resource.MustParse("2Gi"),
		MaxFibersPerGrant:   100,
		DefaultMaxFibers:    10,
		GrantTTL:            time.Hour,
		GrantRenewInterval:  5 * time.Minute,
		HomeWarmFibers:      2,
		HomeSpares:          1,
		HomeIdleAfter:       60 * time.Second,
		// As stock Knative lets an idle Revision's last Pod go (its
		// stable window, 60 s, and scale-to-zero grace, 30 s): a Home
		// idle that long ends its warm fibers, and its next request
		// starts one.
		HomeWarmIdle:       90 * time.Second,
		HomeIdleMemory:     resource.MustParse("64Mi"),
		HomeIdleCPU:        resource.MustParse("1m"),
		FiberBackend:       BackendProcess,
		FiberGVisorPreinit: true,
		HomeCPULimit:       resource.MustParse("1"),
		FiberCPULimit:      resource.MustParse("1"),
		HomeStorageLimit:   resource.MustParse("2Gi"),
		NamespaceShare:     Share{Percent: 50},
		Egress:             EgressCluster,
		EgressDomains:      []string{"svc.cluster.local"},
		EgressDenyNames:    append([]string(nil), DefaultEgressDenyNames...),
		EgressAPI:          EgressAPIURL(contract.SystemNamespace),

		BackendStrategy:       BackendExternalName,
		BackendClusterIPProbe: true,
		DefaultMemoryPerFiber: resource.MustParse("256Mi"),
		TemplateRepository:    DefaultTemplateRepository,
		RouterNamespace:       contract.SystemNamespace,
		RouterService:         contract.RouterServiceName,
	}
}

// Parse reads keys (GrantKeys, RevisionKeys) from config-lampyr's data onto
// the defaults; other keys are left alone, since other components share
// the ConfigMap. The error lists every key that does not parse, each with
// what is accepted, then the rules between keys.
func Parse(data map[string]string, keys []string) (*Config, error) {
	c := Defaults()
	var errs []string
	for _, key := range keys {
		v, ok := data[key]
		if !ok {
			continue
		}
		p := parsers[key]
		if p == nil {
			return nil, fmt.Errorf("lampyrconfig: no parser for key %q", key)
		}
		if err := p(c, v, data); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ConfigMap %s: %s", contract.ConfigMapName, strings.Join(errs, "; "))
	}
	return c, c.check(keys)
}

// parsers parse one key's value into c; data is there for keys whose
// meaning depends on another (registry-mirrors).
var parsers = map[string]func(c *Config, v string, data map[string]string) error{
	KeyFiberMemoryCapacity: quantity(KeyFiberMemoryCapacity, func(c *Config) *resource.Quantity { return &c.FiberMemoryCapacity }),
	KeyMaxMemoryPerFiber:   quantity(KeyMaxMemoryPerFiber, func(c *Config) *resource.Quantity { return &c.MaxMemoryPerFiber }),
	KeyHomeCPULimit:        quantity(KeyHomeCPULimit, func(c *Config) *resource.Quantity { return &c.HomeCPULimit }),
	KeyFiberCPULimit:       quantity(KeyFiberCPULimit, func(c *Config) *resource.Quantity { return &c.FiberCPULimit }),
	KeyHomeStorageLimit:    quantity(KeyHomeStorageLimit, func(c *Config) *resource.Quantity { return &c.HomeStorageLimit }),
	KeyNamespaceFiberMemoryShare: func(c *Config, v string, _ map[string]string) error {
		sh, err := ParseShare(KeyNamespaceFiberMemoryShare, v)
		c.NamespaceShare = sh
		return err
	},
	KeyDefaultMemoryPerFiber: quantity(KeyDefaultMemoryPerFiber, func(c *Config) *resource.Quantity {
		return &c.DefaultMemoryPerFiber
	}),
	KeyMaxFibersPerGrant: integer(KeyMaxFibersPerGrant, 1, func(c *Config, n int32) { c.MaxFibersPerGrant = n }),
	KeyDefaultMaxFibers:  integer(KeyDefaultMaxFibers, 1, func(c *Config, n int32) { c.DefaultMaxFibers = n }),
	KeyHomeWarmFibers:    integer(KeyHomeWarmFibers, 0, func(c *Config, n int32) { c.HomeWarmFibers = int(n) }),
	KeyHomeSpares:        integer(KeyHomeSpares, 0, func(c *Config, n int32) { c.HomeSpares = int(n) }),
	KeyHomeIdleMemory:    quantity(KeyHomeIdleMemory, func(c *Config) *resource.Quantity { return &c.HomeIdleMemory }),
	KeyHomeIdleCPU:       quantity(KeyHomeIdleCPU, func(c *Config) *resource.Quantity { return &c.HomeIdleCPU }),
	KeyHomeIdleAfter: func(c *Config, v string, _ map[string]string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 || (d > 0 && d < MinHomeIdleAfter) {
			return fmt.Errorf("%s %q: want 0 (off) or a duration of at least %s, e.g. 60s (Homes are asked whether they are idle every 15s)", KeyHomeIdleAfter, v, MinHomeIdleAfter)
		}
		c.HomeIdleAfter = d
		return nil
	},
	KeyHomeWarmIdle: func(c *Config, v string, _ map[string]string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 {
			return fmt.Errorf("%s %q: want 0 (off) or a positive duration, e.g. 5m", KeyHomeWarmIdle, v)
		}
		c.HomeWarmIdle = d
		return nil
	},
	KeyGrantTTL: func(c *Config, v string, _ map[string]string) error {
		ttl, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || ttl < 30*time.Second {
			return fmt.Errorf("%s %q: want a duration of at least 30s, e.g. 1h", KeyGrantTTL, v)
		}
		c.GrantTTL = ttl
		return nil
	},
	KeyGrantRenewInterval: func(c *Config, v string, _ map[string]string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 10*time.Second {
			return fmt.Errorf("%s %q: want a duration of at least 10s, e.g. 5m (grants are renewed that often, at most at half of grant-ttl)", KeyGrantRenewInterval, v)
		}
		c.GrantRenewInterval = d
		return nil
	},
	KeyHomeImage: func(c *Config, v string, _ map[string]string) error {
		c.HomeImage = v
		return nil
	},
	KeyHelperImage: func(c *Config, v string, _ map[string]string) error {
		c.HelperImage = v
		return nil
	},
	KeyHomeRegistryMirrors: func(c *Config, v string, data map[string]string) error {
		m, err := mirrors(KeyHomeRegistryMirrors, v)
		if err != nil {
			return err
		}
		c.HomeRegistryMirrors = m
		if _, own := data[KeyRegistryMirrors]; !own {
			c.RegistryMirrors = m
		}
		return nil
	},
	KeyRegistryMirrors: func(c *Config, v string, _ map[string]string) error {
		m, err := mirrors(KeyRegistryMirrors, v)
		c.RegistryMirrors = m
		return err
	},
	KeyFiberBackend: func(c *Config, v string, _ map[string]string) error {
		switch v = strings.TrimSpace(v); v {
		case BackendProcess, BackendGVisor:
			c.FiberBackend = v
			return nil
		}
		return fmt.Errorf("%s %q: want %q or %q", KeyFiberBackend, v, BackendProcess, BackendGVisor)
	},
	KeyFiberGVisorPreinit: func(c *Config, v string, _ map[string]string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s %q: want true or false", KeyFiberGVisorPreinit, v)
		}
		c.FiberGVisorPreinit = b
		return nil
	},
	KeyFiberEgress: func(c *Config, v string, _ map[string]string) error {
		switch v = strings.TrimSpace(v); v {
		case EgressCluster, EgressDirect, EgressOff:
			c.Egress = v
			return nil
		}
		return fmt.Errorf("%s %q: want %q, %q or %q", KeyFiberEgress, v, EgressCluster, EgressDirect, EgressOff)
	},
	KeyFiberEgressDomains:    list(func(c *Config) *[]string { return &c.EgressDomains }),
	KeyFiberEgressDenyNames:  list(func(c *Config) *[]string { return &c.EgressDenyNames }),
	KeyFiberEgressAllowCIDRs: cidrs(KeyFiberEgressAllowCIDRs, func(c *Config) *[]netip.Prefix { return &c.EgressAllow }),
	KeyFiberEgressDenyCIDRs:  cidrs(KeyFiberEgressDenyCIDRs, func(c *Config) *[]netip.Prefix { return &c.EgressDeny }),
	KeyBackendStrategy: func(c *Config, v string, _ map[string]string) error {
		switch s := BackendStrategy(strings.ToLower(strings.TrimSpace(v))); s {
		case BackendExternalName, BackendEndpointSlice:
			c.BackendStrategy = s
			return nil
		}
		return fmt.Errorf("%s %q: want %q or %q", KeyBackendStrategy, v, BackendExternalName, BackendEndpointSlice)
	},
	KeyBackendClusterIPProbe: func(c *Config, v string, _ map[string]string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s %q: want true or false", KeyBackendClusterIPProbe, v)
		}
		c.BackendClusterIPProbe = b
		return nil
	},
	KeyVerifyArtifacts: func(c *Config, v string, _ map[string]string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s %q: want true or false", KeyVerifyArtifacts, v)
		}
		c.VerifyArtifacts = b
		return nil
	},
	KeyImageSnapshots: func(c *Config, v string, _ map[string]string) error {
		m, err := ParseImageSnapshots(v)
		if err != nil {
			return err
		}
		c.ImageSnapshots = m
		return nil
	},
	KeyTemplateRepository: func(c *Config, v string, _ map[string]string) error {
		if v = strings.TrimSpace(v); v == "" {
			return nil
		}
		if _, err := name.NewRepository(v); err != nil {
			return fmt.Errorf("%s %q: want a repository such as %s: %v", KeyTemplateRepository, v, DefaultTemplateRepository, err)
		}
		c.TemplateRepository = v
		return nil
	},
}

func quantity(key string, field func(*Config) *resource.Quantity) func(*Config, string, map[string]string) error {
	return func(c *Config, v string, _ map[string]string) error {
		q, err := resource.ParseQuantity(strings.TrimSpace(v))
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%s %q: want a positive quantity such as 8Gi", key, v)
		}
		*field(c) = q
		return nil
	}
}

func integer(key string, minimum int32, set func(*Config, int32)) func(*Config, string, map[string]string) error {
	return func(c *Config, v string, _ map[string]string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || int32(n) < minimum {
			return fmt.Errorf("%s %q: want an integer >= %d", key, v, minimum)
		}
		set(c, int32(n))
		return nil
	}
}

func list(field func(*Config) *[]string) func(*Config, string, map[string]string) error {
	return func(c *Config, v string, _ map[string]string) error {
		var out []string
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		*field(c) = out
		return nil
	}
}

func cidrs(key string, field func(*Config) *[]netip.Prefix) func(*Config, string, map[string]string) error {
	return func(c *Config, v string, _ map[string]string) error {
		p, err := egresspolicy.ParsePrefixes(key, v)
		if err != nil {
			return err
		}
		*field(c) = p
		return nil
	}
}

// mirrors parses comma-separated from=to registry host pairs; empty entries
// are skipped.
func mirrors(key, v string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(v, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if from, to, ok := strings.Cut(m, "="); !ok || from == "" || to == "" {
			return nil, fmt.Errorf("%s entry %q: want from=to, e.g. localhost:5002=kind-registry:5000", key, m)
		}
		out = append(out, m)
	}
	return out, nil
}

// check applies the rules between keys the caller parsed.
func (c *Config) check(keys []string) error {
	has := func(k string) bool {
		for _, x := range keys {
			if x == k {
				return true
			}
		}
		return false
	}
	var errs []error
	if has(KeyDefaultMaxFibers) && c.DefaultMaxFibers > c.MaxFibersPerGrant {
		errs = append(errs, fmt.Errorf("ConfigMap %s: %s %d exceeds %s %d", contract.ConfigMapName, KeyDefaultMaxFibers, c.DefaultMaxFibers, KeyMaxFibersPerGrant, c.MaxFibersPerGrant))
	}
	if has(KeyFiberCPULimit) && c.FiberCPULimit.Cmp(c.HomeCPULimit) > 0 {
		errs = append(errs, fmt.Errorf("ConfigMap %s: %s %s exceeds %s %s", contract.ConfigMapName, KeyFiberCPULimit, c.FiberCPULimit.String(), KeyHomeCPULimit, c.HomeCPULimit.String()))
	}
	if has(KeyHomeStorageLimit) && c.HomeStorageLimit.Cmp(resource.MustParse("256Mi")) < 0 {
		errs = append(errs, fmt.Errorf("ConfigMap %s: %s %s: want at least 256Mi (the unpacked snapshot gets half)", contract.ConfigMapName, KeyHomeStorageLimit, c.HomeStorageLimit.String()))
	}
	if has(KeyHomeIdleMemory) && c.HomeIdleMemory.Cmp(MaxHomeIdleMemory) > 0 {
		errs = append(errs, fmt.Errorf("ConfigMap %s: %s %s: want at most %s (fiberd's own memory, the smallest Home's limit: a request may not exceed its limit)", contract.ConfigMapName, KeyHomeIdleMemory, c.HomeIdleMemory.String(), MaxHomeIdleMemory.String()))
	}
	if has(KeyHomeIdleCPU) && c.HomeIdleCPU.Cmp(MaxHomeIdleCPU) > 0 {
		errs = append(errs, fmt.Errorf("ConfigMap %s: %s %s: want at most %s (a Home's full CPU request)", contract.ConfigMapName, KeyHomeIdleCPU, c.HomeIdleCPU.String(), MaxHomeIdleCPU.String()))
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// MinHomeIdleAfter is the shortest home-idle-after but 0.
const MinHomeIdleAfter = 15 * time.Second

// MaxHomeIdleMemory and MaxHomeIdleCPU bound an idle Home's requests: a
// Home's memory overhead and CPU request (resources.HomeOverhead,
// resources.HomeCPURequest; a test there keeps them equal), so that an idle
// request is never above the full one nor above any Home's limit.
var (
	MaxHomeIdleMemory = resource.MustParse("256Mi")
	MaxHomeIdleCPU    = resource.MustParse("25m")
)

// ParseImageSnapshots parses image-snapshots: a YAML map from a
// digest-pinned image reference to the digest-pinned snapshot artifact built
// from the same image,
//
//	localhost:5002/app@sha256:<64 hex>: localhost:5002/lampyr/snapshots/app@sha256:<64 hex>
//
// Keys are the whole repository@digest, never a bare digest: the same bytes
// pushed under another repository are another image and are not mapped
// (docs/security.md §2). Keys are returned normalized (ImageKey). Errors
// name the entry and the fix.
func ParseImageSnapshots(v string) (map[string]string, error) {
	m := map[string]string{}
	if err := yaml.UnmarshalStrict([]byte(v), &m); err != nil {
		return nil, fmt.Errorf("%s: want a YAML map of image (repository@sha256:...) to snapshot artifact (repository@sha256:...): %w", KeyImageSnapshots, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]string, len(m))
	for _, k := range keys {
		if _, err := v1.NewHash(k); err == nil {
			return nil, fmt.Errorf("%s: key %q is a bare digest: map the whole image, repository@%s (a bare digest would map the same bytes under any repository); `ly image-snapshot --register` writes such keys", KeyImageSnapshots, k, k)
		}
		ik, ok := ImageKey(k)
		if !ok {
			return nil, fmt.Errorf("%s: key %q: want a digest-pinned image reference such as localhost:5002/app@sha256:<64 hex>", KeyImageSnapshots, k)
		}
		if _, err := name.NewDigest(m[k]); err != nil {
			return nil, fmt.Errorf("%s[%s]: %q: want a digest-pinned snapshot artifact reference (repository@sha256:...): %v", KeyImageSnapshots, k, m[k], err)
		}
		out[ik] = m[k]
	}
	return out, nil
}

// ImageKey is the normalized repository@digest of a digest-pinned image
// reference (docker.io's defaults spelled out), the form image-snapshots is
// keyed by; ok is false if image is not pinned by digest.
func ImageKey(image string) (string, bool) {
	d, err := name.NewDigest(image)
	if err != nil {
		return "", false
	}
	return d.Context().Name() + "@" + d.DigestStr(), true
}

// Share is a part of the installation's fiber memory: a percentage of it,
// or an amount.
type Share struct {
	Percent int
	Bytes   int64
}

// Of is the share in bytes of capacity.
func (s Share) Of(capacity int64) int64 {
	if s.Percent > 0 {
		return capacity * int64(s.Percent) / 100
	}
	return s.Bytes
}

// String is the share as written.
func (s Share) String() string {
	if s.Percent > 0 {
		return strconv.Itoa(s.Percent) + "%"
	}
	return resource.NewQuantity(s.Bytes, resource.BinarySI).String()
}

// ParseShare reads "50%" (1-100) or a quantity ("4Gi"); what names the
// field in the error.
func ParseShare(what, v string) (Share, error) {
	v = strings.TrimSpace(v)
	if p, ok := strings.CutSuffix(v, "%"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > 100 {
			return Share{}, fmt.Errorf("%s %q: want a percentage of fiber-memory-capacity from 1%% to 100%%, or an amount such as 4Gi", what, v)
		}
		return Share{Percent: n}, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return Share{}, fmt.Errorf("%s %q: want an amount of memory such as 4Gi, or a percentage of fiber-memory-capacity such as 50%%", what, v)
	}
	return Share{Bytes: q.Value()}, nil
}
