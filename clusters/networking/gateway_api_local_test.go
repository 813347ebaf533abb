package networking

import (
	"strings"
	"testing"
)

// TestLocalGatewayByAddress: once the install knows the internal Service's
// ClusterIP, Traefik reports it as the Gateways' address and the local
// Gateway names no Service, so Serving makes Routes' placeholder Services
// headless (DomainMapping); without it the rendering is as before.
func TestLocalGatewayByAddress(t *testing.T) {
	var _ LocalAddressed = GatewayAPI{}
	args := TraefikGatewayArgs("10.96.0.42")
	if !containsArg(args, "--providers.kubernetesgateway.statusaddress.ip=10.96.0.42") {
		t.Errorf("args %v lack the status address", args)
	}
	if containsArg(TraefikGatewayArgs(""), "--providers.kubernetesgateway.statusaddress.ip=") {
		t.Error("a status address without a known IP")
	}
	byAddr, bySvc := GatewayConfig(true), GatewayConfig(false)
	if strings.Contains(byAddr["local-gateways"], "service:") || !strings.Contains(byAddr["external-gateways"], "service: traefik/traefik") {
		t.Errorf("by address: %q", byAddr)
	}
	if !strings.Contains(bySvc["local-gateways"], "service: traefik/traefik-internal") {
		t.Errorf("by service: %q", bySvc)
	}
}

func containsArg(args []any, prefix string) bool {
	for _, a := range args {
		if s, ok := a.(string); ok && strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}
