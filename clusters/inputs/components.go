package inputs

import (
	"lampyr.dev/serving/clusters/build/gobuild"
)

// EtcdSpec builds the etcd server kubeadm runs as a static pod.
func EtcdSpec() gobuild.Spec {
	return gobuild.Spec{Name: "etcd", Module: "go.etcd.io/etcd/server/v3", Version: EtcdModuleVersion,
		Packages: []string{"go.etcd.io/etcd/server/v3"}, LDFlags: "-s -w"}
}

// CoreDNSSpec builds CoreDNS with its default plugin set.
func CoreDNSSpec() gobuild.Spec {
	return gobuild.Spec{Name: "coredns", Module: "github.com/coredns/coredns", Version: CoreDNSVersion,
		Packages: []string{"github.com/coredns/coredns"}, LDFlags: "-s -w"}
}

// CrictlSpec builds crictl, which kind uses to inspect node images.
func CrictlSpec() gobuild.Spec {
	return gobuild.Spec{Name: "crictl", Module: "sigs.k8s.io/cri-tools", Version: CRIToolsVersion,
		Packages: []string{"sigs.k8s.io/cri-tools/cmd/crictl"}, LDFlags: "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=" + CRIToolsVersion}
}

// RegistrySpec builds the CNCF Distribution registry.
func RegistrySpec() gobuild.Spec {
	return gobuild.Spec{Name: "distribution", Module: "github.com/distribution/distribution/v3", Version: DistributionVersion,
		Packages: []string{"github.com/distribution/distribution/v3/cmd/registry"}, LDFlags: "-s -w"}
}
