package inputs

import (
	"strings"
	"testing"
)

const kubeadmList = `registry.k8s.io/kube-apiserver:v1.35.4
registry.k8s.io/kube-controller-manager:v1.35.4
registry.k8s.io/kube-scheduler:v1.35.4
registry.k8s.io/kube-proxy:v1.35.4
registry.k8s.io/coredns/coredns:v1.13.1
registry.k8s.io/pause:3.10.1
registry.k8s.io/etcd:3.6.6-0
`

func TestParseImageListAndPins(t *testing.T) {
	m, err := ParseImageList(kubeadmList)
	if err != nil {
		t.Fatal(err)
	}
	if m["coredns"] != "registry.k8s.io/coredns/coredns:v1.13.1" || m["pause"] != "registry.k8s.io/pause:3.10.1" {
		t.Fatalf("parsed %v", m)
	}
	if err := CheckPins(m); err != nil {
		t.Fatalf("pins must match kubeadm %s: %v", KubernetesVersion, err)
	}
	m["etcd"] = "registry.k8s.io/etcd:3.7.0-0"
	if err := CheckPins(m); err == nil || !strings.Contains(err.Error(), "EtcdModuleVersion") {
		t.Fatalf("want an error naming EtcdModuleVersion, got %v", err)
	}
	if _, err := ParseImageList("registry.k8s.io/pause:3.10.1\n"); err == nil {
		t.Fatal("a list missing components must be an error")
	}
}

func TestKubernetesLDFlags(t *testing.T) {
	f := KubernetesLDFlags("v1.35.4")
	for _, want := range []string{
		"k8s.io/component-base/version.gitVersion=v1.35.4",
		"k8s.io/component-base/version.gitMajor=1",
		"k8s.io/component-base/version.gitMinor=35",
		"k8s.io/client-go/pkg/version.gitVersion=v1.35.4",
	} {
		if !strings.Contains(f, want) {
			t.Errorf("ldflags lack %s: %s", want, f)
		}
	}
	if stagingVersion("v1.35.4") != "v0.35.4" {
		t.Errorf("stagingVersion = %s", stagingVersion("v1.35.4"))
	}
}

func TestImageFileName(t *testing.T) {
	if got := imageFileName("registry.k8s.io/coredns/coredns:v1.13.1"); got != "registry.k8s.io_coredns_coredns_v1.13.1.tar" {
		t.Errorf("imageFileName = %s", got)
	}
}
