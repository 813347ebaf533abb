package clusters

import (
	"testing"

	"lampyr.dev/serving/clusters/networking"
)

func TestNetworkingDefaultAndOverride(t *testing.T) {
	t.Setenv(EnvNetworking, "")
	if got := Networking(); got != networking.Default || networking.Default != "gateway-api" {
		t.Fatalf("Networking() = %s, want the default gateway-api", got)
	}
	t.Setenv(EnvNetworking, "traefik-knative")
	if got := Networking(); got != "traefik-knative" {
		t.Fatalf("Networking() = %s with %s set", got, EnvNetworking)
	}
}

func TestBackendStrategyFor(t *testing.T) {
	for prov, want := range map[string]string{
		"gateway-api":     "endpointslice",
		"traefik-knative": "endpointslice",
		"traefik":         "endpointslice", // the old name of traefik-knative
		"kourier":         "externalname",
	} {
		if got := BackendStrategyFor(prov); got != want {
			t.Errorf("BackendStrategyFor(%s) = %s, want %s", prov, got, want)
		}
	}
	for _, n := range networking.Names() {
		if _, ok := backendStrategies[n]; !ok {
			t.Errorf("provider %s has no backend strategy from the feasibility gate", n)
		}
	}
}
