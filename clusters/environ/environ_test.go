package environ

import (
	"path/filepath"
	"testing"

	"lampyr.dev/serving/impl/install/networking"
)

func TestProviderDefaultAndOverride(t *testing.T) {
	t.Setenv(Networking, "")
	if got := Provider(); got != networking.Default || networking.Default != "gateway-api" {
		t.Fatalf("Provider() = %s, want the default gateway-api", got)
	}
	t.Setenv(Networking, "traefik-knative")
	if got := Provider(); got != "traefik-knative" {
		t.Fatalf("Provider() = %s with %s set", got, Networking)
	}
}

func TestClustersSettings(t *testing.T) {
	t.Setenv(CacheDir, "/tmp/c")
	t.Setenv(StateDir, "")
	t.Setenv(EtcdOnDisk, "1")
	s := Clusters()
	if s.Cache != "/tmp/c" || s.StateDir != filepath.Join("/tmp/c", "clusters") || !s.EtcdOnDisk {
		t.Fatalf("Clusters() = %+v", s)
	}
	t.Setenv(StateDir, "/tmp/s")
	if s := Clusters(); s.StateDir != "/tmp/s" {
		t.Fatalf("StateDir = %s with %s=/tmp/s", s.StateDir, StateDir)
	}
}
