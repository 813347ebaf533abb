package inputs

import (
	"context"
	"os"
	"path/filepath"
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

func TestMissingRefs(t *testing.T) {
	got := missingRefs([]string{"a:1", "b:2", "c:3"}, []string{"b:2", "sha256:x", "a:1"})
	if len(got) != 1 || got[0] != "c:3" {
		t.Errorf("missingRefs = %v, want [c:3]", got)
	}
}

// The node memo must change when any input file changes (its size, since
// paths hold cache keys) or the set of kubeadm images does, and only then.
func TestNodeMemoKey(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubelet")
	if err := os.WriteFile(bin, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	key := func(required map[string]string) string {
		m, err := newNodeMemo(dir, "root", required, map[string]string{"etcd": bin}, map[string]string{"/usr/bin/kubelet": bin})
		if err != nil {
			t.Fatal(err)
		}
		return m.file
	}
	req := map[string]string{"etcd": "registry.k8s.io/etcd:3.6.6-0", "pause": "registry.k8s.io/pause:3.10.1"}
	a := key(req)
	if b := key(map[string]string{"pause": "registry.k8s.io/pause:3.10.1", "etcd": "registry.k8s.io/etcd:3.6.6-0"}); a != b {
		t.Errorf("map order changed the key: %s vs %s", a, b)
	}
	if b := key(map[string]string{"etcd": "registry.k8s.io/etcd:3.6.7-0", "pause": "registry.k8s.io/pause:3.10.1"}); a == b {
		t.Error("a different etcd image kept the key")
	}
	if err := os.WriteFile(bin, []byte("longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if b := key(req); a == b {
		t.Error("a different binary kept the key")
	}
	if _, ok := (&nodeMemo{file: filepath.Join(dir, "absent.json")}).load(context.Background()); ok {
		t.Error("an absent memo loaded")
	}
}
