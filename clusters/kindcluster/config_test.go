package kindcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	kindv1alpha4 "sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

func TestKindConfig(t *testing.T) {
	s := Spec{Name: "stock", NodeImage: "img", Ports: []PortMapping{{NodePort: 30080, HostPort: 18080}}, CgroupV1: true, DisableDefaultCNI: true, PodSubnet: "10.244.0.0/16", ServiceSubnet: "10.96.0.0/16"}
	b, err := s.KindConfig()
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"apiVersion: kind.x-k8s.io/v1alpha4",
		"apiServerAddress: 127.0.0.1",
		"disableDefaultCNI: true",
		"containerPort: 30080",
		"hostPort: 18080",
		"listenAddress: 127.0.0.1",
		"failCgroupV1: false",
		"serviceSubnet: 10.96.0.0/16",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("kind config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "dataDir") {
		t.Error("etcd's data dir must stay kubeadm's default unless EtcdOnTmpfs")
	}
	s.CgroupV1 = false
	s.EtcdOnTmpfs = true
	b, _ = s.KindConfig()
	if strings.Contains(string(b), "failCgroupV1") {
		t.Error("failCgroupV1 must only be set on cgroup v1 hosts")
	}
	if !strings.Contains(string(b), "dataDir: /tmp/lampyr-etcd") {
		t.Errorf("EtcdOnTmpfs must move etcd's data dir into the node's tmpfs:\n%s", b)
	}
	if strings.Contains(string(b), "maxPods") || strings.Contains(string(b), "KubeletConfiguration") {
		t.Errorf("no kubelet patch without a kubelet setting:\n%s", b)
	}
	s.CgroupV1, s.MaxPods = true, 250
	b, _ = s.KindConfig()
	if got := string(b); strings.Count(got, "kind: KubeletConfiguration") != 1 || !strings.Contains(got, "maxPods: 250") || !strings.Contains(got, "failCgroupV1: false") {
		t.Errorf("MaxPods and CgroupV1 must be one KubeletConfiguration patch with both settings:\n%s", got)
	}
	s.Ports[0].HostPort = 0
	if _, err := s.KindConfig(); err == nil {
		t.Error("an unresolved host port must be an error")
	}
}

func TestValidate(t *testing.T) {
	ok := Spec{Name: "lampyr", NodeImage: "img", Ports: []PortMapping{{NodePort: 30080}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]Spec{
		"cluster name":    {Name: "Bad_Name", NodeImage: "img"},
		"nodeImage":       {Name: "x"},
		"ports.nodePort":  {Name: "x", NodeImage: "i", Ports: []PortMapping{{NodePort: 80}}},
		"ports.hostPort ": {Name: "x", NodeImage: "i", Ports: []PortMapping{{NodePort: 30080, HostPort: 9}, {NodePort: 30081, HostPort: 9}}},
	}
	for field, s := range cases {
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("spec %+v: want an error naming %q, got %v", s, field, err)
		}
	}
}

func TestHashIgnoresNothingThatMatters(t *testing.T) {
	a := Spec{Name: "x", NodeImage: "img:1"}
	b := a
	b.NodeImage = "img:2"
	if a.Hash() == b.Hash() {
		t.Error("a new node image must change the spec hash (the cluster must not be reused)")
	}
	if a.Hash() != (Spec{Name: "x", NodeImage: "img:1"}).Hash() {
		t.Error("equal specs must hash equally")
	}
}

func TestRegistryHostsTOML(t *testing.T) {
	r := Registry{Container: "lampyr-registry", HostPort: 5002}
	if r.HostAddress() != "localhost:5002" {
		t.Errorf("HostAddress = %s", r.HostAddress())
	}
	if !strings.Contains(r.HostsTOML(), `[host."http://lampyr-registry:5000"]`) {
		t.Errorf("hosts.toml = %s", r.HostsTOML())
	}
}

// Every cluster's kube-apiserver refuses Services with spec.externalIPs
// (DenyServiceExternalIPs, CVE-2020-8554) and keeps kubeadm's
// NodeRestriction, whichever kubeadm config version kind renders: the
// patches are applied here to the shapes kind v0.33 renders for v1beta3
// (Kubernetes up to 1.35: extraArgs a map) and v1beta4 (a list).
func TestKindConfigDeniesServiceExternalIPs(t *testing.T) {
	b, err := Spec{Name: "x", NodeImage: "img"}.KindConfig()
	if err != nil {
		t.Fatal(err)
	}
	var cluster kindv1alpha4.Cluster
	if err := yaml.UnmarshalStrict(b, &cluster); err != nil {
		t.Fatalf("kind config does not decode as kind's own type: %v\n%s", err, b)
	}
	kubeadm := map[string]string{
		"v1beta3": `{"apiVersion":"kubeadm.k8s.io/v1beta3","kind":"ClusterConfiguration","apiServer":{"certSANs":["localhost"],"extraArgs":{"runtime-config":""}}}`,
		"v1beta4": `{"apiVersion":"kubeadm.k8s.io/v1beta4","kind":"ClusterConfiguration","apiServer":{"certSANs":["localhost"],"extraArgs":[{"name":"runtime-config","value":""}]}}`,
	}
	applied := map[string]bool{}
	for _, p := range cluster.KubeadmConfigPatchesJSON6902 {
		doc, ok := kubeadm[p.Version]
		if p.Group != "kubeadm.k8s.io" || p.Kind != "ClusterConfiguration" || !ok {
			t.Fatalf("patch for %s/%s %s: not a kubeadm ClusterConfiguration kind renders", p.Group, p.Version, p.Kind)
		}
		ops, err := yaml.YAMLToJSON([]byte(p.Patch))
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatal(err)
		}
		out, err := patch.Apply([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", p.Version, err)
		}
		var cfg struct {
			APIServer struct {
				ExtraArgs any `json:"extraArgs"`
			} `json:"apiServer"`
		}
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		args := fmt.Sprint(cfg.APIServer.ExtraArgs)
		if !strings.Contains(args, "runtime-config") || !strings.Contains(args, "enable-admission-plugins") ||
			!strings.Contains(args, "NodeRestriction,DenyServiceExternalIPs") {
			t.Fatalf("%s extraArgs after the patch: %s", p.Version, args)
		}
		applied[p.Version] = true
	}
	if !applied["v1beta3"] || !applied["v1beta4"] {
		t.Fatalf("patched versions %v, want v1beta3 and v1beta4", applied)
	}
	// A cluster made before the plugin is not reused as if it had it.
	old, _ := yaml.Marshal(Spec{Name: "x", NodeImage: "img"})
	if h := sha256.Sum256(old); hex.EncodeToString(h[:])[:16] == (Spec{Name: "x", NodeImage: "img"}).Hash() {
		t.Fatal("the spec hash does not cover the admission plugins")
	}
}
