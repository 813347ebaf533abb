package contract

// The fibers' egress path through their namespace's egress Pod
// (docs/networking.md "Service bindings"; DESIGN issue 31 §2): names the
// grant controller (which makes the Pod and serves EgressAPIPath), fiberd
// (which asks it and dials through the Pod) and `fiberd egress-proxy`
// (which the Pod runs) must agree on.
const (
	// EgressName names the egress Pod, its Service and its NetworkPolicy
	// in a tenant namespace.
	EgressName = "lampyr-egress"
	// EgressComponent is the app.kubernetes.io/component label of those
	// objects.
	EgressComponent = "lampyr-egress"
	// EgressProxyPort is the proxy's port (HTTP/1.1 CONNECT).
	EgressProxyPort = 3128
	// EgressAPIPort is the grant controller's egress API port; only
	// lampyr-homes reaches it (impl/config/networkpolicy).
	EgressAPIPort = 8092
	// EgressAPIPath is the egress API: POST with the Home's signed grant
	// as bearer, answered {"endpoint": "ip:port"} of the grant
	// namespace's egress Pod once it is Ready.
	EgressAPIPath = "/v1/egress"
	// EgressGrantKeyEnv carries the grant controller's public key (PEM)
	// into the egress Pod; EgressNamespaceEnv its own namespace (downward
	// API). The proxy serves only grants of that namespace.
	EgressGrantKeyEnv  = "LAMPYR_GRANT_KEY"
	EgressNamespaceEnv = "POD_NAMESPACE"
)
