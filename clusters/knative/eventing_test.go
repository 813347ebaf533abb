package knative

import (
	"context"
	"strings"
	"testing"
)

func renderEventing(t *testing.T) []Object {
	t.Helper()
	src, err := EventingSources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestEventingPinsServingPkg(t *testing.T) {
	if err := EventingPinsServingPkg(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEventingSourcesHoldCoreBrokerAndChannel(t *testing.T) {
	objs := renderEventing(t)
	have := map[string]bool{}
	for _, o := range objs {
		have[objectKey(o.Unstructured)] = true
		if ns := o.GetNamespace(); ns != "" && ns != EventingNamespace {
			t.Errorf("%s (%s) is in namespace %s, want %s", objectKey(o.Unstructured), o.Source, ns, EventingNamespace)
		}
	}
	for _, want := range []string{
		"Namespace//" + EventingNamespace,
		"CustomResourceDefinition//brokers.eventing.knative.dev",
		"CustomResourceDefinition//triggers.eventing.knative.dev",
		"CustomResourceDefinition//pingsources.sources.knative.dev",
		"CustomResourceDefinition//inmemorychannels.messaging.knative.dev",
		"Deployment/knative-eventing/eventing-controller",
		"Deployment/knative-eventing/eventing-webhook",
		"Deployment/knative-eventing/mt-broker-ingress",
		"Deployment/knative-eventing/mt-broker-filter",
		"Deployment/knative-eventing/mt-broker-controller",
		"Deployment/knative-eventing/imc-controller",
		"ConfigMap/knative-eventing/config-br-defaults",
		"ConfigMap/knative-eventing/config-br-default-channel",
	} {
		if !have[want] {
			t.Errorf("rendered eventing lacks %s", want)
		}
	}
}

func TestEveryEventingKoReferenceResolved(t *testing.T) {
	objs := renderEventing(t)
	refs := KoReferences(objs)
	if got, want := strings.Join(refs, ","), strings.Join(EventingPackages(), ","); got != want {
		t.Fatalf("ko references of %v\n = %v\nwant EventingCommands %v", EventingTrees, refs, EventingPackages())
	}
	images := map[string]string{}
	for _, r := range refs {
		images[r] = "kind.local/" + r[strings.LastIndex(r, "/")+1:] + ":test"
	}
	if err := ResolveImages(objs, images); err != nil {
		t.Fatal(err)
	}
	if left := KoReferences(objs); len(left) != 0 {
		t.Fatalf("unresolved after ResolveImages: %v", left)
	}
	delete(images, EventingModule+"/cmd/broker/filter")
	objs = renderEventing(t)
	if err := ResolveImages(objs, images); err == nil || !strings.Contains(err.Error(), "ko://knative.dev/eventing/cmd/broker/filter") {
		t.Fatalf("want an error naming the missing broker filter image, got %v", err)
	}
}
