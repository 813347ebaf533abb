package clusters

import (
	"testing"

	"lampyr.dev/serving/impl/install/networking"
)

func TestGatewayPortsAndPairedProfiles(t *testing.T) {
	if got := GatewayPortFor("lampyr"); got.NodePort != LampyrGatewayPort || got.HostPort != LampyrGatewayPort {
		t.Errorf("GatewayPortFor(lampyr) = %+v", got)
	}
	// A name that starts like a paired cluster's is not one of them.
	if got := GatewayPortFor("lampyr-x"); got.NodePort != DefaultNodePort || got.HostPort != 0 {
		t.Errorf("GatewayPortFor(lampyr-x) = %+v, want NodePort %d on a free host port", got, DefaultNodePort)
	}
	if p, ok := PairedProfile("stock"); !ok || p != ProfileStock {
		t.Errorf("PairedProfile(stock) = %q, %v", p, ok)
	}
	if p, ok := PairedProfile("stock-x"); ok {
		t.Errorf("PairedProfile(stock-x) = %q: a profile must be stated for any other name", p)
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
