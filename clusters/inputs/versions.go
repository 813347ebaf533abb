// Package inputs knows every external input a Lampyr or stock Knative Kind
// cluster needs, pinned by version, and builds each of them offline from Go
// modules and Debian packages into a cache keyed by those versions.
package inputs

// Pinned versions. Changing one changes the cache keys of everything built
// from it, so a warm cache never serves a stale input. The networking
// providers' versions are the installer's (impl/install/networking,
// versions.go).
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
