// Package config is the grant controller's configuration: the installation's
// fiber capacity and the Home images, from the `config-lampyr` ConfigMap in
// the system namespace (keys below) with the seed's environment overrides
// for images.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/egress"
)

// ConfigMap name and keys.
const (
	ConfigMapName = contract.ConfigMapName

	KeyFiberMemoryCapacity = "fiber-memory-capacity"
	KeyMaxMemoryPerFiber   = "max-memory-per-fiber"
	KeyMaxFibersPerGrant   = "max-fibers-per-grant"
	KeyDefaultMaxFibers    = "default-max-fibers"
	KeyGrantTTL            = "grant-ttl"
	KeyHomeImage           = "home-image"
	KeyHelperImage         = "helper-image"
	KeyHomeWarmFibers      = "home-warm-fibers"
	// KeyHomeRegistryMirrors: comma-separated from=to registry host pairs
	// for fiberd (e.g. localhost:5002=kind-registry:5000), since the
	// references `ly` writes name the registry as the developer reaches it.
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
	// KeyFiberEgress turns fibers' service bindings on ("cluster", the
	// default) or off ("off": loopback only). docs/networking.md,
	// "Service bindings".
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
)

// Fiber egress modes.
const (
	EgressCluster = "cluster"
	EgressOff     = "off"
)

// DefaultEgressDenyNames keep fibers' resolver away from the platform's
// own Services and the Kubernetes API by name (the address ranges are the
// real bound; these are a second one).
var DefaultEgressDenyNames = []string{
	"kubernetes.default.svc.cluster.local",
	".kube-system.svc.cluster.local",
	".knative-serving.svc.cluster.local",
	".lampyr-system.svc.cluster.local",
	".lampyr-homes.svc.cluster.local",
}

// Environment overrides for the images (names from the seed).
const (
	EnvGrantImage  = "LAMPYR_GRANT_IMAGE"
	EnvHelperImage = "LAMPYR_HELPER_IMAGE"
)

// Config is the grant controller's configuration.
type Config struct {
	// FiberMemoryCapacity is the memory all admitted grants may reserve
	// together (memoryPerFiber × maxFibers summed).
	FiberMemoryCapacity resource.Quantity
	// MaxMemoryPerFiber caps one fiber's memory.
	MaxMemoryPerFiber resource.Quantity
	// MaxFibersPerGrant caps one grant's maxFibers.
	MaxFibersPerGrant int32
	// DefaultMaxFibers applies when a grant's maxFibers is 0.
	DefaultMaxFibers int32
	// GrantTTL is the life of a signed grant; it is renewed at half-life.
	GrantTTL time.Duration
	// HomeImage runs fiberd (and holds /lampyr-helper unless HelperImage is set).
	HomeImage string
	// HelperImage, if set, supplies lampyr-helper through an init container.
	HelperImage string
	// HomeWarmFibers is each Home's warm pool size.
	HomeWarmFibers int
	// HomeRegistryMirrors are fiberd's --registry-mirror values.
	HomeRegistryMirrors []string
	// HomeCPULimit is each Home Pod's CPU limit.
	HomeCPULimit resource.Quantity
	// FiberCPULimit is each fiber's CPU bound (fiberd --fiber-cpu); at most
	// HomeCPULimit.
	FiberCPULimit resource.Quantity
	// HomeStorageLimit is the sizeLimit of the Home's state emptyDir.
	HomeStorageLimit resource.Quantity
	// Egress is EgressCluster or EgressOff.
	Egress string
	// EgressDomains, EgressDenyNames, EgressAllow and EgressDeny are the
	// fibers' egress policy (impl/fiberd/egress.Policy). An empty
	// EgressAllow means the cluster's Service CIDRs, which the grant
	// controller discovers.
	EgressDomains   []string
	EgressDenyNames []string
	EgressAllow     []netip.Prefix
	EgressDeny      []netip.Prefix
}

// Defaults returns the configuration of an empty ConfigMap.
func Defaults() *Config {
	return &Config{
		FiberMemoryCapacity: resource.MustParse("8Gi"),
		MaxMemoryPerFiber:   resource.MustParse("2Gi"),
		MaxFibersPerGrant:   100,
		DefaultMaxFibers:    10,
		GrantTTL:            10 * time.Minute,
		HomeImage:           os.Getenv(EnvGrantImage),
		HelperImage:         os.Getenv(EnvHelperImage),
		HomeWarmFibers:      2,
		HomeCPULimit:        resource.MustParse("1"),
		FiberCPULimit:       resource.MustParse("1"),
		HomeStorageLimit:    resource.MustParse("2Gi"),
		Egress:              EgressCluster,
		EgressDomains:       []string{"svc.cluster.local"},
		EgressDenyNames:     append([]string(nil), DefaultEgressDenyNames...),
	}
}

// FromConfigMap parses config-lampyr; a nil ConfigMap gives the defaults.
// Every error names the key and what is accepted.
func FromConfigMap(cm *corev1.ConfigMap) (*Config, error) {
	c := Defaults()
	if cm == nil {
		return c, c.check()
	}
	d := cm.Data
	var errs []string
	qty := func(key string, into *resource.Quantity) {
		if v, ok := d[key]; ok {
			q, err := resource.ParseQuantity(strings.TrimSpace(v))
			if err != nil || q.Sign() <= 0 {
				errs = append(errs, fmt.Sprintf("%s %q: want a positive quantity such as 8Gi", key, v))
				return
			}
			*into = q
		}
	}
	integer := func(key string, into *int32, minimum int32) {
		if v, ok := d[key]; ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil || int32(n) < minimum {
				errs = append(errs, fmt.Sprintf("%s %q: want an integer >= %d", key, v, minimum))
				return
			}
			*into = int32(n)
		}
	}
	qty(KeyFiberMemoryCapacity, &c.FiberMemoryCapacity)
	qty(KeyMaxMemoryPerFiber, &c.MaxMemoryPerFiber)
	qty(KeyHomeCPULimit, &c.HomeCPULimit)
	qty(KeyFiberCPULimit, &c.FiberCPULimit)
	qty(KeyHomeStorageLimit, &c.HomeStorageLimit)
	integer(KeyMaxFibersPerGrant, &c.MaxFibersPerGrant, 1)
	integer(KeyDefaultMaxFibers, &c.DefaultMaxFibers, 1)
	var warm int32 = int32(c.HomeWarmFibers)
	integer(KeyHomeWarmFibers, &warm, 0)
	c.HomeWarmFibers = int(warm)
	if v, ok := d[KeyGrantTTL]; ok {
		ttl, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || ttl < 30*time.Second {
			errs = append(errs, fmt.Sprintf("%s %q: want a duration of at least 30s, e.g. 10m", KeyGrantTTL, v))
		} else {
			c.GrantTTL = ttl
		}
	}
	if v := d[KeyHomeImage]; v != "" {
		c.HomeImage = v
	}
	if v := d[KeyHelperImage]; v != "" {
		c.HelperImage = v
	}
	if v := strings.TrimSpace(d[KeyHomeRegistryMirrors]); v != "" {
		for _, m := range strings.Split(v, ",") {
			m = strings.TrimSpace(m)
			if from, to, ok := strings.Cut(m, "="); !ok || from == "" || to == "" {
				errs = append(errs, fmt.Sprintf("%s entry %q: want from=to, e.g. localhost:5002=kind-registry:5000", KeyHomeRegistryMirrors, m))
				continue
			}
			c.HomeRegistryMirrors = append(c.HomeRegistryMirrors, m)
		}
	}
	if v, ok := d[KeyFiberEgress]; ok {
		switch v = strings.TrimSpace(v); v {
		case EgressCluster, EgressOff:
			c.Egress = v
		default:
			errs = append(errs, fmt.Sprintf("%s %q: want %q or %q", KeyFiberEgress, v, EgressCluster, EgressOff))
		}
	}
	list := func(key string, into *[]string) {
		if v, ok := d[key]; ok {
			*into = nil
			for _, f := range strings.Split(v, ",") {
				if f = strings.TrimSpace(f); f != "" {
					*into = append(*into, f)
				}
			}
		}
	}
	list(KeyFiberEgressDomains, &c.EgressDomains)
	list(KeyFiberEgressDenyNames, &c.EgressDenyNames)
	cidrs := func(key string, into *[]netip.Prefix) {
		if v, ok := d[key]; ok {
			p, err := egress.ParsePrefixes(key, v)
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			*into = p
		}
	}
	cidrs(KeyFiberEgressAllowCIDRs, &c.EgressAllow)
	cidrs(KeyFiberEgressDenyCIDRs, &c.EgressDeny)
	if len(errs) > 0 {
		return nil, fmt.Errorf("ConfigMap %s: %s", ConfigMapName, strings.Join(errs, "; "))
	}
	return c, c.check()
}

func (c *Config) check() error {
	if c.DefaultMaxFibers > c.MaxFibersPerGrant {
		return fmt.Errorf("ConfigMap %s: %s %d exceeds %s %d", ConfigMapName, KeyDefaultMaxFibers, c.DefaultMaxFibers, KeyMaxFibersPerGrant, c.MaxFibersPerGrant)
	}
	if c.FiberCPULimit.Cmp(c.HomeCPULimit) > 0 {
		return fmt.Errorf("ConfigMap %s: %s %s exceeds %s %s", ConfigMapName, KeyFiberCPULimit, c.FiberCPULimit.String(), KeyHomeCPULimit, c.HomeCPULimit.String())
	}
	if c.HomeStorageLimit.Cmp(resource.MustParse("256Mi")) < 0 {
		return fmt.Errorf("ConfigMap %s: %s %s: want at least 256Mi (the unpacked snapshot gets half)", ConfigMapName, KeyHomeStorageLimit, c.HomeStorageLimit.String())
	}
	return nil
}

// RenewBefore is how long before expiry a grant is renewed: at half-life, so
// a Home survives one missed renewal plus the kubelet's Secret sync delay.
func (c *Config) RenewBefore() time.Duration { return c.GrantTTL / 2 }
