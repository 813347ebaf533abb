// Package inputs knows every external input a Lampyr or stock Knative Kind
// cluster needs, pinned by version, and builds each of them offline from Go
// modules and Debian packages into a cache keyed by those versions.
package inputs

// Pinned versions. Changing one changes the cache keys of everything built
// from it, so a warm cache never serves a stale input.
const (
	// KubernetesVersion is the node's Kubernetes (kubelet, kubeadm and the
	// control-plane images), built from k8s.io/kubernetes.
	KubernetesVersion = "v1.35.4"
	// EtcdModuleVersion is the etcd kubeadm 1.35 expects (image tag 3.6.6-0).
	EtcdModuleVersion = "v3.6.6"
	// CoreDNSVersion is kubeadm 1.35's CoreDNS.
	CoreDNSVersion = "v1.13.1"
	// CRIToolsVersion is crictl; v1.35.0 is not served by the module proxy.
	CRIToolsVersion = "v1.34.0"
	// KindVersion supplies the node's entrypoint, systemd units and
	// containerd config (images/base/files in the module).
	KindVersion = "v0.33.0"
	// DebianSuite is the node rootfs's Debian release.
	DebianSuite = "bookworm"
	// DistributionVersion is the CNCF Distribution registry.
	DistributionVersion = "v3.1.2"
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
	// module github.com/traefik/traefik/dynamic/ext (clusters/build/stubs).
	TraefikGatewayVersion = "v3.7.9"
	// NetGatewayAPIVersion is knative.dev/net-gateway-api, Knative's
	// KIngress over Gateway API. The proxy refuses v0.50.x; v0.49.1 builds
	// with the knative.dev/networking and knative.dev/pkg versions Knative
	// Serving (knative.ServingVersion, clusters/knative) pins (v0.49.1 ->
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
	// KubeRouterVersion is the NetworkPolicy enforcer: kube-router's
	// netpol controller (iptables + ipset), run alone (NetworkPolicySpec).
	// v2.1.0 is the only version of github.com/cloudnativelabs/kube-router/v2
	// the module proxy serves; security reports are filed against it, so
	// only its netpol packages are linked (not the BGP router, IPVS proxy
	// or their SDKs) and the dependencies with advisories are raised
	// (KubeRouterRaised). sigs.k8s.io/kube-network-policies (v0.7.0,
	// v0.8.0) cannot enforce here: it sends packets to user space with an
	// nftables queue rule, and these kernels lack CONFIG_NFT_QUEUE.
	KubeRouterVersion = "v2.1.0"
)

// NodePackages are the Debian packages of the Kind node rootfs: kind's own
// base image list (images/base/Dockerfile) plus containerd, runc and CNI
// plugins, which kind builds from source and Debian ships.
var NodePackages = []string{
	"systemd", "containerd", "runc", "containernetworking-plugins",
	"conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux",
	"mount", "kmod", "libseccomp2", "pigz", "e2fsprogs", "bash",
	"ca-certificates", "curl", "jq", "procps", "socat", "ebtables", "ipset",
}
