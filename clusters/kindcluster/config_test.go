package kindcluster

import (
	"strings"
	"testing"
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
