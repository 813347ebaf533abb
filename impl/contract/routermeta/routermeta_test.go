package routermeta

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"lampyr.dev/serving/impl/contract"
)

func TestRoundTrip(t *testing.T) {
	want := Metadata{
		Revision: "hello-00001", Namespace: "demo", Ready: true,
		HomeEndpoint: "10.244.0.7:9090", Home: "hello-00001-0123456789", HomeKeySHA256: strings.Repeat("0f", 32), MaxFibers: 3,
		TimeoutSeconds: 300, Mode: "reuse", IdleTimeoutSeconds: 30,
		Protocol: ProtocolH2C, Generation: 1,
	}
	cm := MakeConfigMap("lampyr-system", want)
	if cm.Name != "route.demo.hello-00001" || cm.Namespace != "lampyr-system" || cm.Labels[contract.RouterMetadataLabel] != "true" || cm.Labels[contract.RevisionNamespaceLabel] != "demo" {
		t.Fatalf("unexpected object meta: %+v", cm.ObjectMeta)
	}
	got, err := FromConfigMap(cm)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
}

func TestFromConfigMapRefuses(t *testing.T) {
	good := func() Metadata {
		return Metadata{Revision: "r", Namespace: "n", Mode: "fresh", Protocol: ProtocolHTTP1, Ready: true, HomeEndpoint: "10.0.0.1:9090", Home: "r-1"}
	}
	for want, mut := range map[string]func(m *Metadata, d map[string]string, name *string, labels map[string]string){
		"data.maxFibers": func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) { d["maxFibers"] = "many" },
		"data.mode":      func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) { d["mode"] = "park" },
		"not named":      func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) { d["namespace"] = "victim" },
		"labelled": func(_ *Metadata, _ map[string]string, _ *string, l map[string]string) {
			l[contract.RevisionNamespaceLabel] = "victim"
		},
		"route.n.r": func(_ *Metadata, _ map[string]string, n *string, _ map[string]string) { *n = "route.n.other" },
		"more than": func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) {
			d["padding"] = strings.Repeat("x", MaxBytes)
		},
		"data.home is empty": func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) { d["home"] = "" },
		"data.homeKeySHA256": func(_ *Metadata, d map[string]string, _ *string, _ map[string]string) { d["homeKeySHA256"] = "ABC" },
	} {
		cm := MakeConfigMap("lampyr-system", good())
		mut(nil, cm.Data, &cm.Name, cm.Labels)
		if _, err := FromConfigMap(cm); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error saying %q, got %v", want, err)
		}
	}
}

// Metadata an earlier controller wrote has no homeKeySHA256 at all: it
// decodes, with no key (fiber-router then decides whether to dial it).
func TestMetadataWithoutHomeKey(t *testing.T) {
	cm := MakeConfigMap("lampyr-system", Metadata{Revision: "r", Namespace: "n", Mode: "fresh", Protocol: ProtocolHTTP1, Ready: true, HomeEndpoint: "10.0.0.1:9090", Home: "r-1"})
	delete(cm.Data, "homeKeySHA256")
	m, err := FromConfigMap(cm)
	if err != nil || m.HomeKeySHA256 != "" {
		t.Fatalf("metadata of an earlier version: %+v %v", m, err)
	}
}

func TestCheckHomeEndpoint(t *testing.T) {
	for ep, ok := range map[string]bool{
		"10.244.0.7:9090":                            true,
		"[fd00::7]:9090":                             true,
		"h-1.lampyr-homes.svc:9090":                  true,
		"h-1.lampyr-homes.svc.cluster.local:9090":    true,
		"h-1.tenant.svc:9090":                        false,
		"kubernetes.default.svc:443":                 false,
		"127.0.0.1:9090":                             false,
		"169.254.169.254:80":                         false,
		"evil.example.com:9090":                      false,
		"h-1.lampyr-homes.svc.evil.example.com:9090": false,
		"10.244.0.7":                                 false,
	} {
		if err := CheckHomeEndpoint(ep, "lampyr-homes"); (err == nil) != ok {
			t.Errorf("%s: err %v, want ok=%v", ep, err, ok)
		}
	}
}
