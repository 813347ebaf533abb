package inputs

import (
	"context"
	_ "embed"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"lampyr.dev/serving/clusters/build/nodeimage"
	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
)

// KubeRouterModule holds the NetworkPolicy enforcer's controller.
const KubeRouterModule = "github.com/cloudnativelabs/kube-router/v2"

// NetworkPolicyImageRepo is the repository of the enforcer's image, which is
// preloaded into the node image and never pulled.
const NetworkPolicyImageRepo = "lampyr.dev/kube-router-netpol"

// KubeRouterRaised are kube-router's dependencies raised above the versions
// its v2.1.0 go.mod pins (Kubernetes v0.29.2, golang.org/x/net v0.21.0,
// google.golang.org/protobuf v1.32.0, golang.org/x/oauth2 v0.17.0: releases
// with published advisories, such as x/net's HTTP/2 CONTINUATION flood and
// protobuf's protojson loop), to the versions this repository's own go.mod
// uses. client-go then matches the cluster's Kubernetes minor. The build
// proves kube-router's netpol packages still compile against them.
var KubeRouterRaised = map[string]string{
	"k8s.io/api":                 "v0.35.7",
	"k8s.io/apimachinery":        "v0.35.7",
	"k8s.io/client-go":           "v0.35.7",
	"golang.org/x/net":           "v0.59.0",
	"golang.org/x/oauth2":        "v0.37.0",
	"google.golang.org/protobuf": "v1.36.12",
}

// netpolMain is the enforcer's main package: kube-router's NetworkPolicy
// controller alone, as k3s runs it (pkg/agent/netpol), with readiness that
// waits for the first full sync to reach the kernel.
//
//go:embed netpol_main.go.txt
var netpolMain string

// NetworkPolicySpec builds the enforcer from kube-router's netpol packages
// with a main of our own. Upstream's cmd/kube-router would link its BGP
// router (gobgp, gRPC), IPVS service proxy and the Docker and AWS SDKs just
// to leave them off with --run-router=false --run-service-proxy=false; the
// netpol packages need only client-go, go-iptables, netlink and
// Prometheus' client.
func NetworkPolicySpec() gobuild.Spec {
	s := gobuild.Spec{
		Name: "kube-router-netpol", Module: KubeRouterModule, Version: KubeRouterVersion,
		Require:    KubeRouterRaised,
		MainSource: netpolMain,
		LDFlags: "-s -w -X main.kubeRouterVersion=" + KubeRouterVersion +
			" -X " + KubeRouterModule + "/pkg/version.Version=" + KubeRouterVersion,
	}
	s.Packages = []string{s.ScratchPath()}
	return s
}

// NetworkPolicyTools are the Debian packages whose commands the enforcer
// runs: kube-router calls iptables, iptables-save/-restore and ipset.
var NetworkPolicyTools = []string{"iptables", "ipset"}

// networkPolicyImage assembles the enforcer's image: the static binary, run
// as root (the DaemonSet grants only NET_ADMIN and NET_RAW), on the
// iptables and ipset commands and their libraries from the node rootfs's own
// packages, as kube-proxy's image is. Both therefore use the rootfs's
// iptables alternative (nf_tables), so their rules land in the same tables.
func networkPolicyImage(ctx context.Context, rootDir, binary string) (v1.Image, error) {
	files, _, err := nodeimage.ClosureFiles(ctx, rootDir, NetworkPolicyTools)
	if err != nil {
		return nil, err
	}
	tools, err := image.Layer(files)
	if err != nil {
		return nil, err
	}
	return image.FromBinary(binary, "kube-router-netpol", image.Options{
		Root: true, BinaryPath: "/usr/local/bin/kube-router-netpol", ExtraLayers: []v1.Layer{tools},
		Labels: map[string]string{"dev.lampyr.kube-router-version": KubeRouterVersion},
	})
}

// NetworkPolicyImageRef names the enforcer's image by version and digest.
func NetworkPolicyImageRef(digestHex string) string {
	return NetworkPolicyImageRepo + ":" + strings.TrimPrefix(KubeRouterVersion, "v") + "-" + digestHex[:12]
}
