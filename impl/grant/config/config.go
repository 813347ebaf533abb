// Package config is the grant controller's configuration: the installation's
// fiber capacity and the Home images, from the `config-lampyr` ConfigMap in
// the system namespace, parsed by impl/contract/lampyrconfig (the keys in
// lampyrconfig.GrantKeys), with the seed's environment overrides for images.
package config

import (
	"os"

	corev1 "k8s.io/api/core/v1"

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
