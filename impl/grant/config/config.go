// Package config is the grant controller's configuration: the installation's
// fiber capacity and the Home images, from the `config-lampyr` ConfigMap in
// the system namespace, parsed by impl/contract/lampyrconfig (the keys in
// lampyrconfig.GrantKeys), with the seed's environment overrides for images.
package config

import (
	"context"
	"os"

	corev1 "k8s.io/api/core/v1"
	"knative.dev/pkg/configmap"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// Environment overrides for the images (names from the seed).
const (
	EnvGrantImage  = "LAMPYR_GRANT_IMAGE"
	EnvHelperImage = "LAMPYR_HELPER_IMAGE"
)

// Defaults returns the configuration of an empty ConfigMap.
func Defaults() *lampyrconfig.Config {
	c := lampyrconfig.Defaults()
	withImageEnv(c)
	return c
}

// FromConfigMap parses config-lampyr's grant keys; a nil ConfigMap gives
// the defaults. Every error names the key and what is accepted.
func FromConfigMap(cm *corev1.ConfigMap) (*lampyrconfig.Config, error) {
	var data map[string]string
	if cm != nil {
		data = cm.Data
	}
	c, err := lampyrconfig.Parse(data, lampyrconfig.GrantKeys)
	if err != nil {
		return nil, err
	}
	withImageEnv(c)
	return c, nil
}

// withImageEnv takes the images the ConfigMap does not set from the
// grant controller's environment.
func withImageEnv(c *lampyrconfig.Config) {
	if c.HomeImage == "" {
		c.HomeImage = os.Getenv(EnvGrantImage)
	}
	if c.HelperImage == "" {
		c.HelperImage = os.Getenv(EnvHelperImage)
	}
}

type cfgKey struct{}

// ToContext attaches c to ctx, frozen for one reconcile.
func ToContext(ctx context.Context, c *lampyrconfig.Config) context.Context {
	return context.WithValue(ctx, cfgKey{}, c)
}

// FromContext is the configuration attached by the Store (or ToContext);
// the defaults when none is.
func FromContext(ctx context.Context) *lampyrconfig.Config {
	if c, ok := ctx.Value(cfgKey{}).(*lampyrconfig.Config); ok && c != nil {
		return c
	}
	return Defaults()
}

// Store is the grant controller's view of config-lampyr, parsed once per
// change by Knative's config store (not per reconcile) and attached to each
// reconcile's context (controller.Options.ConfigStore).
type Store struct {
	untyped *configmap.UntypedStore
}

// NewStore makes a Store; onAfterStore runs after config-lampyr changes.
func NewStore(logger configmap.Logger, onAfterStore ...func(name string, value interface{})) *Store {
	return &Store{untyped: configmap.NewUntypedStore("grant-controller", logger,
		configmap.Constructors{contract.ConfigMapName: FromConfigMap}, onAfterStore...)}
}

// DefaultingWatcher is a configmap.Watcher that can stand in a default
// ConfigMap while the real one does not exist (sharedmain's InformedWatcher).
type DefaultingWatcher interface {
	WatchWithDefault(cm corev1.ConfigMap, o ...configmap.Observer)
}

// WatchConfigs watches config-lampyr in namespace, where it may be absent
// (then the defaults apply).
func (s *Store) WatchConfigs(w DefaultingWatcher, namespace string) {
	empty := corev1.ConfigMap{}
	empty.Name, empty.Namespace = contract.ConfigMapName, namespace
	w.WatchWithDefault(empty, s.untyped.OnConfigChanged)
}

// Load is the current configuration; the defaults until one was stored.
func (s *Store) Load() *lampyrconfig.Config {
	if c, ok := s.untyped.UntypedLoad(contract.ConfigMapName).(*lampyrconfig.Config); ok && c != nil {
		return c
	}
	return Defaults()
}

// ToContext implements controller.ConfigStore.
func (s *Store) ToContext(ctx context.Context) context.Context { return ToContext(ctx, s.Load()) }
