package networking

// The providers' pinned versions. Changing one changes the cache keys of
// everything built from it, so a warm cache never serves a stale build.
const (
	// TraefikKnativeVersion is the Traefik of the traefik-knative
	// networking provider (its experimental Knative provider), the version
	// its limits were measured on (docs/networking.md).
	TraefikKnativeVersion = "v3.6.12"
	// TraefikGatewayVersion is the Traefik of the gateway-api provider (its
	// Gateway API provider). v3.7 is the first to apply HTTPRoute
	// backendRef filters (v3.6.12 ignores them silently, and
	// net-gateway-api puts each split's Knative-Serving-Revision/-Namespace
	// there); v3.7.6 fixed an advisory on filters shared between routes
	// with the same backend. v3.7's go.mod needs a stand-in for its nested
	// module github.com/traefik/traefik/dynamic/ext (impl/build/stubs).
	TraefikGatewayVersion = "v3.7.9"
	// NetGatewayAPIVersion is knative.dev/net-gateway-api, Knative's
	// KIngress over Gateway API. The proxy refuses v0.50.x; v0.49.1 builds
	// with the knative.dev/networking and knative.dev/pkg versions Knative
	// Serving (knative.ServingVersion, impl/install/knative) pins (v0.49.1 ->
	// v0.50.0 only adds proxy-protocol support).
	NetGatewayAPIVersion = "v0.49.1"
	// GatewayAPIVersion is sigs.k8s.io/gateway-api, whose standard-channel
	// CRDs (config/crd/standard) the gateway-api provider installs: Traefik
	// v3.7 watches TLSRoute v1, which net-gateway-api's own bundle (v1.4)
	// lacks.
	GatewayAPIVersion = "v1.5.1"
	// NetKourierVersion is knative.dev/net-kourier (online only: its
	// gateway is Envoy).
	NetKourierVersion = "v0.48.0"
)
