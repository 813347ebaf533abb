// Package config holds the configuration the Lampyr Revision reconciler reads:
// Lampyr's own ConfigMap (config-lampyr in the Lampyr namespace) and Knative's
// config-defaults / config-features / config-autoscaler, which the reconciler
// needs to tell webhook-defaulted fields from user-written ones.
package config

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"knative.dev/pkg/configmap"
	apisconfig "knative.dev/serving/pkg/apis/config"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/contract"
)

const (
	// LampyrConfigName is the ConfigMap in the Lampyr namespace.
	LampyrConfigName = contract.ConfigMapName

	// BackendStrategyKey selects how a Revision's backend Service reaches
	// fiber-router (docs/contracts.md §3).
	BackendStrategyKey = "backend-strategy"
	// DefaultMemoryPerFiberKey is the memory each fiber gets when the
	// Revision has no memory request (a plain Service without resources).
	DefaultMemoryPerFiberKey = "default-memory-per-fiber"
	// VerifyArtifactsKey turns on a registry HEAD of the snapshot artifact
	// before a Revision can become Ready. Off by default: the controller Pod
	// often cannot reach the registry the Homes pull from (Kind's
	// localhost:5002 is not localhost inside a Pod).
	VerifyArtifactsKey = "verify-artifacts"
	// ImageSnapshotsKey maps runnable images, by repository@digest, to the
	// snapshot artifacts built from the same source (docs/contracts.md,
	// "Image snapshots"): a Revision without Lampyr annotations whose image
	// is mapped runs from that snapshot, and the controller seals its
	// template.
	ImageSnapshotsKey = "image-snapshots"
	// TemplateRepositoryKey is where sealed fiberd templates are pushed (by
	// `ly deploy`, and by the controller for image-mapped Revisions).
	TemplateRepositoryKey = "template-repository"
	// RegistryMirrorsKey: comma-separated from=to registry host pairs the
	// controller applies to its own registry traffic; unset, it uses
	// HomeRegistryMirrorsKey (the controller Pod sees the registry as Home
	// Pods do).
	RegistryMirrorsKey     = "registry-mirrors"
	HomeRegistryMirrorsKey = "home-registry-mirrors"
	// DefaultTemplateRepository is template-repository's default.
	DefaultTemplateRepository = "localhost:5002/lampyr/templates"

	// NamespaceEnvKey overrides the Lampyr namespace.
	NamespaceEnvKey = contract.SystemNamespaceEnv
	// DefaultNamespace is where config-lampyr and fiber-router live.
	DefaultNamespace = contract.SystemNamespace
	// RouterServiceName is fiber-router's Service in the Lampyr namespace.
	RouterServiceName = contract.RouterServiceName
)

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

// Namespace is the Lampyr system namespace (config-lampyr, fiber-router).
func Namespace() string {
	if ns := os.Getenv(NamespaceEnvKey); ns != "" {
		return ns
	}
	return DefaultNamespace
}

// Lampyr is the parsed config-lampyr.
type Lampyr struct {
	BackendStrategy       BackendStrategy
	DefaultMemoryPerFiber resource.Quantity
	VerifyArtifacts       bool
	// ImageSnapshots maps an image (ImageKey: repository@sha256:...) to a
	// digest-pinned snapshot artifact reference.
	ImageSnapshots map[string]string
	// TemplateRepository receives the templates the controller seals.
	TemplateRepository string
	// RegistryMirrors are from=to host pairs for the controller's registry
	// traffic (artifact checks, template pushes).
	RegistryMirrors []string
	// RouterNamespace and RouterService name fiber-router; the ExternalName
	// target and the EndpointSlice mirror source are derived from them.
	RouterNamespace string
	RouterService   string
}

// RouterHost is fiber-router's cluster DNS name, the ExternalName target.
func (l *Lampyr) RouterHost() string {
	return l.RouterService + "." + l.RouterNamespace + ".svc.cluster.local"
}

// DefaultLampyr is used while config-lampyr does not exist.
func DefaultLampyr() *Lampyr {
	return &Lampyr{
		BackendStrategy:       BackendExternalName,
		DefaultMemoryPerFiber: resource.MustParse("256Mi"),
		TemplateRepository:    DefaultTemplateRepository,
		RouterNamespace:       Namespace(),
		RouterService:         RouterServiceName,
	}
}

// NewLampyrFromMap parses config-lampyr's data. Unknown keys are ignored
// because other components (ly, the grant controller) share the ConfigMap.
func NewLampyrFromMap(data map[string]string) (*Lampyr, error) {
	l := DefaultLampyr()
	if v, ok := data[BackendStrategyKey]; ok {
		switch s := BackendStrategy(strings.ToLower(strings.TrimSpace(v))); s {
		case BackendExternalName, BackendEndpointSlice:
			l.BackendStrategy = s
		default:
			return nil, fmt.Errorf("%s: %q is neither %q nor %q", BackendStrategyKey, v, BackendExternalName, BackendEndpointSlice)
		}
	}
	if v, ok := data[DefaultMemoryPerFiberKey]; ok {
		q, err := resource.ParseQuantity(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", DefaultMemoryPerFiberKey, err)
		}
		if q.Sign() <= 0 {
			return nil, fmt.Errorf("%s: %q must be positive", DefaultMemoryPerFiberKey, v)
		}
		l.DefaultMemoryPerFiber = q
	}
	if v, ok := data[VerifyArtifactsKey]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", VerifyArtifactsKey, err)
		}
		l.VerifyArtifacts = b
	}
	if v, ok := data[ImageSnapshotsKey]; ok {
		m, err := ParseImageSnapshots(v)
		if err != nil {
			return nil, err
		}
		l.ImageSnapshots = m
	}
	if v := strings.TrimSpace(data[TemplateRepositoryKey]); v != "" {
		if _, err := name.NewRepository(v); err != nil {
			return nil, fmt.Errorf("%s: %q is not a repository (e.g. %s): %w", TemplateRepositoryKey, v, DefaultTemplateRepository, err)
		}
		l.TemplateRepository = v
	}
	key := RegistryMirrorsKey
	mirrors, ok := data[key]
	if !ok {
		key, mirrors = HomeRegistryMirrorsKey, data[HomeRegistryMirrorsKey]
	}
	for _, m := range strings.Split(mirrors, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if from, to, ok := strings.Cut(m, "="); !ok || from == "" || to == "" {
			return nil, fmt.Errorf("%s entry %q: want from=to, e.g. localhost:5002=kind-registry:5000", key, m)
		}
		l.RegistryMirrors = append(l.RegistryMirrors, m)
	}
	return l, nil
}

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
		return nil, fmt.Errorf("%s: want a YAML map of image (repository@sha256:...) to snapshot artifact (repository@sha256:...): %w", ImageSnapshotsKey, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]string, len(m))
	for _, k := range keys {
		if _, err := v1.NewHash(k); err == nil {
			return nil, fmt.Errorf("%s: key %q is a bare digest: map the whole image, repository@%s (a bare digest would map the same bytes under any repository); `ly image-snapshot --register` writes such keys", ImageSnapshotsKey, k, k)
		}
		ik, ok := ImageKey(k)
		if !ok {
			return nil, fmt.Errorf("%s: key %q: want a digest-pinned image reference such as localhost:5002/app@sha256:<64 hex>", ImageSnapshotsKey, k)
		}
		if _, err := name.NewDigest(m[k]); err != nil {
			return nil, fmt.Errorf("%s[%s]: %q: want a digest-pinned snapshot artifact reference (repository@sha256:...): %v", ImageSnapshotsKey, k, m[k], err)
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

// NewLampyrFromConfigMap is the configmap.Constructor for config-lampyr.
func NewLampyrFromConfigMap(cm *corev1.ConfigMap) (*Lampyr, error) {
	return NewLampyrFromMap(cm.Data)
}

// Config is everything a reconcile reads, frozen for its duration.
type Config struct {
	Lampyr *Lampyr
	// Serving is Knative's config-defaults/-features/-autoscaler.
	Serving *apisconfig.Config
}

type cfgKey struct{}

// ToContext attaches c to ctx. Serving's config is attached too so that the
// generated reconciler's SetDefaults (PreProcessReconcile) uses the
// installation's config-defaults, exactly as the webhook did.
func ToContext(ctx context.Context, c *Config) context.Context {
	ctx = context.WithValue(ctx, cfgKey{}, c)
	if c.Serving != nil {
		ctx = apisconfig.ToContext(ctx, c.Serving)
	}
	return ctx
}

// FromContext returns the Config attached by ToContext, or defaults.
func FromContext(ctx context.Context) *Config {
	if c, ok := ctx.Value(cfgKey{}).(*Config); ok {
		return c
	}
	return &Config{Lampyr: DefaultLampyr(), Serving: apisconfig.FromContextOrDefaults(ctx)}
}

// Store watches both namespaces' ConfigMaps.
type Store struct {
	serving *apisconfig.Store
	lampyr  *configmap.UntypedStore
}

// NewStore makes a Store; onAfterStore runs after any watched ConfigMap changes.
func NewStore(logger configmap.Logger, onAfterStore ...func(name string, value interface{})) *Store {
	return &Store{
		serving: apisconfig.NewStore(logger, onAfterStore...),
		lampyr: configmap.NewUntypedStore("lampyr", logger,
			configmap.Constructors{LampyrConfigName: NewLampyrFromConfigMap}, onAfterStore...),
	}
}

// DefaultingWatcher is a configmap.Watcher that can fall back to a default
// ConfigMap while the real one does not exist (configmap/informer.InformedWatcher).
type DefaultingWatcher interface {
	WatchWithDefault(cm corev1.ConfigMap, o ...configmap.Observer)
}

// WatchConfigs registers the Knative ConfigMaps on servingWatcher (the
// Knative system namespace) and config-lampyr on lampyrWatcher, where it may
// be absent: then the defaults apply.
func (s *Store) WatchConfigs(servingWatcher configmap.Watcher, lampyrWatcher DefaultingWatcher) {
	s.serving.WatchConfigs(servingWatcher)
	empty := corev1.ConfigMap{}
	empty.Name = LampyrConfigName
	empty.Namespace = Namespace()
	lampyrWatcher.WatchWithDefault(empty, s.lampyr.OnConfigChanged)
}

// Load returns the current Config.
func (s *Store) Load() *Config {
	c := &Config{Serving: s.serving.Load(), Lampyr: DefaultLampyr()}
	if l, ok := s.lampyr.UntypedLoad(LampyrConfigName).(*Lampyr); ok && l != nil {
		c.Lampyr = l
	}
	return c
}

// ToContext attaches the current Config to ctx (controller.ConfigStore).
func (s *Store) ToContext(ctx context.Context) context.Context {
	return ToContext(ctx, s.Load())
}
