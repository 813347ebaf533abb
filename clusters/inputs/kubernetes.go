package inputs

import (
	"context"
	"fmt"
	"os"
	"strings"

	"lampyr.dev/serving/impl/build/gobuild"
)

// KubernetesCommands are the k8s.io/kubernetes commands a node needs: the
// node binaries and the control-plane components kubeadm runs as static pods.
var KubernetesCommands = []string{"kubelet", "kubeadm", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"}

// stagingVersion maps a Kubernetes version to its published staging modules'
// version: v1.35.4 -> v0.35.4.
func stagingVersion(k8s string) string { return "v0" + strings.TrimPrefix(k8s, "v1") }

// KubernetesLDFlags stamps the version the way Kubernetes' own build does;
// without it kubeadm reports v0.0.0-master and its version checks fail.
func KubernetesLDFlags(version string) string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	var flags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			fmt.Sprintf("-X %s.gitVersion=%s", pkg, version),
			fmt.Sprintf("-X %s.gitMajor=%s", pkg, major),
			fmt.Sprintf("-X %s.gitMinor=%s", pkg, minor),
			fmt.Sprintf("-X %s.gitTreeState=clean", pkg),
			fmt.Sprintf("-X %s.buildDate=1970-01-01T00:00:00Z", pkg),
		)
	}
	return "-s -w " + strings.Join(flags, " ")
}

// KubernetesSpec is the one build of every Kubernetes command, with each
// staging module replaced by its published version (derived from the
// module's own go.mod so the list never drifts).
func KubernetesSpec(ctx context.Context) (gobuild.Spec, error) {
	dl, err := gobuild.Download(ctx, "k8s.io/kubernetes", KubernetesVersion)
	if err != nil {
		return gobuild.Spec{}, err
	}
	gomod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return gobuild.Spec{}, err
	}
	replaces, err := gobuild.StagingReplaces(gomod, stagingVersion(KubernetesVersion))
	if err != nil {
		return gobuild.Spec{}, fmt.Errorf("k8s.io/kubernetes %s go.mod: %w", KubernetesVersion, err)
	}
	pkgs := make([]string, len(KubernetesCommands))
	for i, c := range KubernetesCommands {
		pkgs[i] = "k8s.io/kubernetes/cmd/" + c
	}
	return gobuild.Spec{
		Name:     "kubernetes",
		Module:   "k8s.io/kubernetes",
		Version:  KubernetesVersion,
		Packages: pkgs,
		Replace:  replaces,
		LDFlags:  KubernetesLDFlags(KubernetesVersion),
	}, nil
}
