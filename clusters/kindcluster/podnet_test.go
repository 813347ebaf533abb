package kindcluster

import (
	"strings"
	"testing"
)

func TestParseNodeNets(t *testing.T) {
	out := "lampyr-control-plane 10.244.0.0/24 172.18.0.3|\nlampyr-worker 10.244.1.0/24 172.18.0.4|\nlampyr-worker2  |\n"
	nets, err := parseNodeNets(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != 2 || nets[1].name != "lampyr-worker" || nets[1].podCIDR.String() != "10.244.1.0/24" || nets[1].ip.String() != "172.18.0.4" {
		t.Fatalf("%+v: want two nodes (the one without a range yet skipped)", nets)
	}
	if _, err := parseNodeNets("x 10.244.0.0/33 172.18.0.3|\n"); err == nil || !strings.Contains(err.Error(), "podCIDR") {
		t.Fatalf("a bad range: %v, want an error naming podCIDR", err)
	}
}

func TestKindConfigWorkers(t *testing.T) {
	s := Spec{Name: "multi", NodeImage: "img", DisableDefaultCNI: true, Workers: 2, Ports: []PortMapping{{NodePort: 30080, HostPort: 30080}}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	raw, err := s.KindConfig()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "role: worker"); n != 2 {
		t.Fatalf("%d workers in\n%s", n, raw)
	}
	single := s
	single.Workers = 0
	if single.Hash() == s.Hash() {
		t.Fatal("workers do not change the spec hash: a single-node cluster would be reused for a multi-node spec")
	}
	s.DisableDefaultCNI = false
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "workers") {
		t.Fatalf("workers without the offline CNI: %v", err)
	}
}
