// Package config holds the configuration the Lampyr Revision reconciler reads:
// Lampyr's own ConfigMap (config-lampyr in the Lampyr namespace) and Knative's
// config-defaults / config-features / config-autoscaler, which the reconciler
// needs to tell webhook-defaulted fields from user-written ones.
package config

import (
	"context"
	"os"

	corev1 "k8s.io/api/core/v1"
	"knative.dev/pkg/configmap"
	apisconfig "knative.dev/serving/pkg/apis/config"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// Namespace is the Lampyr system namespace (config-lampyr, fiber-router).
func Namespace() string {
	if ns := os.Getenv(contract.SystemNamespaceEnv); ns != "" {
		return ns
	}
	return contract.SystemNamespace
}

// DefaultLampyr is used while config-lampyr does not exist.
func DefaultLampyr() *lampyrconfig.Config {
	l := lampyrconfig.Defaults()
	l.RouterNamespace = Namespace()
	return l
}

// NewLampyrFromMap parses config-lampyr's data. Keys of other components
// (ly, the grant controller) are not read here.
func NewLampyrFromMap(data map[string]string) (*lampyrconfig.Config, error) {
	l, err := lampyrconfig.Parse(data, lampyrconfig.RevisionKeys)
	if err != nil {
		return nil, err
	}
	l.RouterNamespace = Namespace()
	return l, nil
}

// NewLampyrFromConfigMap is the configmap.Constructor for config-lampyr.
func NewLampyrFromConfigMap(cm *corev1.ConfigMap) (*lampyrconfig.Config, error) {
	return NewLampyrFromMap(cm.Data)
}

// Config is everything a reconcile reads, frozen for its duration.
type Config struct {
	Lampyr *lampyrconfig.Config
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
			configmap.Constructors{contract.ConfigMapName: NewLampyrFromConfigMap}, onAfterStore...),
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
	empty.Name = contract.ConfigMapName
	empty.Namespace = Namespace()
	lampyrWatcher.WatchWithDefault(empty, s.lampyr.OnConfigChanged)
}

// Load returns the current Config.
func (s *Store) Load() *Config {
	c := &Config{Serving: s.serving.Load(), Lampyr: DefaultLampyr()}
	if l, ok := s.lampyr.UntypedLoad(contract.ConfigMapName).(*lampyrconfig.Config); ok && l != nil {
		c.Lampyr = l
	}
	return c
}

// ToContext attaches the current Config to ctx (controller.ConfigStore).
func (s *Store) ToContext(ctx context.Context) context.Context {
	return ToContext(ctx, s.Load())
}
