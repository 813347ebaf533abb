package routermeta

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRoundTrip(t *testing.T) {
	want := Metadata{
		Revision: "hello-00001", Namespace: "demo", Ready: true,
		HomeEndpoint: "hello-00001-home.demo.svc:9090", MaxFibers: 3,
		TimeoutSeconds: 300, Mode: "reuse", IdleTimeoutSeconds: 30,
		Protocol: ProtocolH2C, Generation: 1,
	}
	cm := MakeConfigMap(want)
	if cm.Name != "hello-00001-lampyr-route" || cm.Labels[LabelKey] != "true" {
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

func TestFromConfigMapNamesBadKey(t *testing.T) {
	cm := MakeConfigMap(Metadata{Revision: "r", Namespace: "n", Mode: "fresh", Protocol: ProtocolHTTP1})
	cm.Data["maxFibers"] = "many"
	if _, err := FromConfigMap(cm); err == nil || !strings.Contains(err.Error(), "data.maxFibers") {
		t.Fatalf("want an error naming data.maxFibers, got %v", err)
	}
	cm = MakeConfigMap(Metadata{Revision: "r", Namespace: "n", Mode: "park", Protocol: ProtocolHTTP1})
	if _, err := FromConfigMap(cm); err == nil || !strings.Contains(err.Error(), "data.mode") {
		t.Fatalf("want an error naming data.mode, got %v", err)
	}
}
