package knative

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func renderEventing(t *testing.T) []Object { return renderFrom(t, EventingSources) }

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

// Every ConfigMap a Deployment or StatefulSet of Eventing reads must be in
// the rendered objects: a file upstream keeps as a symlink is missing from
// the module zip, and the Pod would never start (CreateContainerConfigError).
func TestEventingWorkloadsFindTheirConfigMaps(t *testing.T) {
	objs := renderEventing(t)
	have := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			have[o.GetName()] = true
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		walkMaps(o.Object, func(m map[string]any) {
			ref, ok := m["configMapKeyRef"].(map[string]any)
			if !ok {
				return
			}
			if opt, _ := ref["optional"].(bool); opt {
				return
			}
			if name, _ := ref["name"].(string); !have[name] {
				t.Errorf("%s %s (%s) reads ConfigMap %s, which is not rendered", o.GetKind(), o.GetName(), o.Source, name)
			}
		})
	}
}

func walkMaps(v any, fn func(map[string]any)) {
	switch t := v.(type) {
	case map[string]any:
		fn(t)
		for _, x := range t {
			walkMaps(x, fn)
		}
	case []any:
		for _, x := range t {
			walkMaps(x, fn)
		}
	}
}

func TestCapCPURequests(t *testing.T) {
	objs := renderEventing(t)
	n, err := CapCPURequests(objs, EventingCPURequest)
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 {
		t.Errorf("lowered %d CPU requests, want at least the 7 upstream sets above %s", n, EventingCPURequest)
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			req, _, _ := unstructured.NestedString(c.(map[string]any), "resources", "requests", "cpu")
			if req != "" && req != EventingCPURequest {
				t.Errorf("%s %s: cpu request %s", o.GetKind(), o.GetName(), req)
			}
		}
	}
}
