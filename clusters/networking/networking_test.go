package networking

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func TestProviders(t *testing.T) {
	if got := strings.Join(Names(), ","); got != "kourier,traefik" {
		t.Fatalf("providers = %s", got)
	}
	if _, err := Get("contour"); err == nil || !strings.Contains(err.Error(), "kourier") {
		t.Fatalf("unknown provider error must list the known ones: %v", err)
	}
}

func TestTraefikManifests(t *testing.T) {
	p := Traefik{}
	gw := p.Gateway(30080)
	objs, err := p.Manifests(map[string]string{"traefik": "localhost:5002/traefik/traefik@sha256:abc"}, gw)
	if err != nil {
		t.Fatal(err)
	}
	dep := find(objs, "Deployment", "traefik")
	if dep == nil {
		t.Fatal("no traefik Deployment")
	}
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	c := cs[0].(map[string]any)
	if c["image"] != "localhost:5002/traefik/traefik@sha256:abc" {
		t.Errorf("image = %v", c["image"])
	}
	args := c["args"].([]any)
	joined := ""
	for _, a := range args {
		joined += a.(string) + " "
	}
	for _, want := range []string{"--experimental.knative=true", "--providers.knative.publicService.name=traefik", "--providers.knative.privateService.name=traefik-internal"} {
		if !strings.Contains(joined, want) {
			t.Errorf("args lack %s", want)
		}
	}
	svc := find(objs, "Service", "traefik")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if typ, _, _ := unstructured.NestedString(svc.Object, "spec", "type"); typ != "NodePort" || ports[0].(map[string]any)["nodePort"] != int64(30080) {
		t.Errorf("public service = %v", svc.Object["spec"])
	}
	crb := find(objs, "ClusterRoleBinding", "traefik-gateway-controller")
	if crb == nil {
		t.Fatal("RBAC from the module's reference file is missing")
	}
	subj, _, _ := unstructured.NestedSlice(crb.Object, "subjects")
	if subj[0].(map[string]any)["namespace"] != "traefik" {
		t.Errorf("binding subject = %v", subj)
	}
	if _, err := p.Manifests(nil, gw); err == nil {
		t.Error("missing image must be an error")
	}
}

func TestKourierManifests(t *testing.T) {
	p := Kourier{}
	if p.NeedsRegistry() == "" || !strings.Contains(p.NeedsRegistry(), "Envoy") {
		t.Fatal("kourier must say it needs a registry for Envoy")
	}
	objs, err := p.Manifests(map[string]string{kourierPackage: "localhost:5002/net-kourier/kourier@sha256:abc"}, p.Gateway(30080))
	if err != nil {
		t.Fatal(err)
	}
	ctrl := find(objs, "Deployment", "net-kourier-controller")
	if ctrl == nil {
		t.Fatal("no net-kourier-controller Deployment")
	}
	cs, _, _ := unstructured.NestedSlice(ctrl.Object, "spec", "template", "spec", "containers")
	if cs[0].(map[string]any)["image"] != "localhost:5002/net-kourier/kourier@sha256:abc" {
		t.Errorf("controller image = %v", cs[0].(map[string]any)["image"])
	}
	gw := find(objs, "Deployment", "3scale-kourier-gateway")
	gcs, _, _ := unstructured.NestedSlice(gw.Object, "spec", "template", "spec", "containers")
	if gcs[0].(map[string]any)["image"] != KourierEnvoyImage {
		t.Errorf("gateway image = %v", gcs[0].(map[string]any)["image"])
	}
	svc := find(objs, "Service", "kourier")
	if typ, _, _ := unstructured.NestedString(svc.Object, "spec", "type"); typ != "NodePort" {
		t.Errorf("kourier service type = %s, want NodePort", typ)
	}
	if _, err := p.Manifests(nil, p.Gateway(30080)); err == nil || !strings.Contains(err.Error(), "ko://") {
		t.Errorf("an unresolved ko:// image must be an error naming it, got %v", err)
	}
}
