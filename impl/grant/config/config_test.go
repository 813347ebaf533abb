package config

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

func TestFromConfigMap(t *testing.T) {
	c, err := FromConfigMap(nil)
	if err != nil || c.FiberMemoryCapacity.String() != "8Gi" || c.GrantTTL != time.Hour || c.RenewBefore() != 55*time.Minute {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyFiberMemoryCapacity: "2Gi", lampyrconfig.KeyGrantTTL: "2m", lampyrconfig.KeyHomeImage: "img", lampyrconfig.KeyHomeWarmFibers: "0"}})
	if err != nil || c.FiberMemoryCapacity.String() != "2Gi" || c.GrantTTL != 2*time.Minute || c.HomeImage != "img" || c.HomeWarmFibers != 0 {
		t.Fatalf("parsed: %+v %v", c, err)
	}
	// A grant-ttl of 2m with the default interval (5m) renews at half-life.
	if c.RenewBefore() != time.Minute {
		t.Fatalf("grant-ttl 2m: renewed %s before expiry, want 1m (half-life)", c.RenewBefore())
	}
	c, err = FromConfigMap(&corev1.ConfigMap{Data: map[string]string{lampyrconfig.KeyGrantTTL: "2h", lampyrconfig.KeyGrantRenewInterval: "10m"}})
	if err != nil || c.RenewBefore() != 110*time.Minute {
		t.Fatalf("grant-ttl 2h, grant-renew-interval 10m: renewed %s before expiry (%v), want 1h50m", c.RenewBefore(), err)
	}
	for key, val := range map[string]string{
		lampyrconfig.KeyFiberMemoryCapacity: "lots",
		lampyrconfig.KeyMaxMemoryPerFiber:   "-1Gi",
		lampyrconfig.KeyMaxFibersPerGrant:   "0",
		lampyrconfig.KeyGrantTTL:            "5s",
		lampyrconfig.KeyGrantRenewInterval:  "1s",
		lampyrconfig.KeyDefaultMaxFibers:    "1000",
	} {
		_, err := FromConfigMap(&corev1.ConfigMap{Data: map[string]string{key: val}})
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%q: error %v should name the key", key, val, err)
		}
	}
}
