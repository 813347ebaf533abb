package networking

import (
	"fmt"
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
	if got := strings.Join(Names(), ","); got != "gateway-api,kourier,traefik-knative" {
		t.Fatalf("providers = %s", got)
	}
	if _, err := Get("contour"); err == nil || !strings.Contains(err.Error(), "kourier") {
		t.Fatalf("unknown provider error must list the known ones: %v", err)
	}
	if p, err := Get("traefik"); err != nil || p.Name() != TraefikKnativeName {
		t.Fatalf("the old name traefik must still select the Knative provider: %v %v", p, err)
	}
	if p, err := Get(Default); err != nil || p.Name() != GatewayAPIName {
		t.Fatalf("default = %v %v", p, err)
	}
	seen := map[string]string{}
	for _, n := range Names() {
		p, _ := Get(n)
		if other, dup := seen[p.IngressClass()]; dup {
			t.Errorf("%s and %s share ingress class %s", n, other, p.IngressClass())
		}
		seen[p.IngressClass()] = n
		if got, ok := ForIngressClass(p.IngressClass()); !ok || got.Name() != n {
			t.Errorf("ForIngressClass(%s) = %v", p.IngressClass(), got)
		}
		if p.Describe() == "" {
			t.Errorf("%s has no description", n)
		}
	}
}

func TestTraefikKnativeManifests(t *testing.T) {
	p := TraefikKnative{}
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

func TestGatewayAPIManifests(t *testing.T) {
	p := GatewayAPI{}
	gw := p.Gateway(30080)
	images := map[string]string{
		"traefik":               "localhost:5002/traefik/traefik@sha256:abc",
		netGatewayAPIController: "localhost:5002/net-gateway-api/controller@sha256:def",
		netGatewayAPIWebhook:    "localhost:5002/net-gateway-api/webhook@sha256:012",
	}
	objs, err := p.Manifests(images, gw)
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range []string{"gateways", "gatewayclasses", "httproutes", "referencegrants", "grpcroutes", "backendtlspolicies", "tlsroutes"} {
		if find(objs, "CustomResourceDefinition", crd+".gateway.networking.k8s.io") == nil {
			t.Errorf("no %s CRD", crd)
		}
	}
	dep := find(objs, "Deployment", "traefik")
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	c := cs[0].(map[string]any)
	if c["image"] != images["traefik"] {
		t.Errorf("traefik image = %v", c["image"])
	}
	joined := fmt.Sprint(c["args"])
	for _, want := range []string{"--providers.kubernetesgateway=true", "--entryPoints.web.address=:8080", "--entryPoints.internal.address=:8081", "--entryPoints.websecure.address=:443"} {
		if !strings.Contains(joined, want) {
			t.Errorf("args lack %s: %s", want, joined)
		}
	}
	if strings.Contains(joined, "knative") {
		t.Errorf("the Gateway API Traefik must not run the Knative provider: %s", joined)
	}
	sysctls, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "securityContext", "sysctls")
	if len(sysctls) != 1 || sysctls[0].(map[string]any)["name"] != "net.ipv4.ip_unprivileged_port_start" {
		t.Errorf("the non-root Traefik must be allowed to bind 443: %v", sysctls)
	}
	svc := find(objs, "Service", "traefik")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 2 || ports[0].(map[string]any)["name"] != "http" || ports[0].(map[string]any)["nodePort"] != int64(30080) ||
		ports[1].(map[string]any)["port"] != int64(443) || ports[1].(map[string]any)["targetPort"] != int64(443) || ports[1].(map[string]any)["nodePort"] != int64(30443) {
		t.Errorf("public Service ports = %v (net-gateway-api probes the port named http)", ports)
	}
	gc := find(objs, "GatewayClass", GatewayClassName)
	if ctrl, _, _ := unstructured.NestedString(gc.Object, "spec", "controllerName"); ctrl != "traefik.io/gateway-controller" {
		t.Errorf("GatewayClass controller = %s", ctrl)
	}
	for name, port := range map[string]int64{ExternalGateway: 8080, LocalGateway: 8081} {
		g := find(objs, "Gateway", name)
		if g == nil || g.GetNamespace() != "traefik" {
			t.Fatalf("no Gateway traefik/%s", name)
		}
		ls, _, _ := unstructured.NestedSlice(g.Object, "spec", "listeners")
		l := ls[0].(map[string]any)
		if l["port"] != port || l["protocol"] != "HTTP" {
			t.Errorf("Gateway %s listener = %v: its port must be an entry point's", name, l)
		}
	}
	crb := find(objs, "ClusterRoleBinding", "traefik-gwapi-gateway-controller")
	if crb == nil {
		t.Fatal("no Traefik Gateway API RBAC from the module's reference file")
	}
	if ref, _, _ := unstructured.NestedString(crb.Object, "roleRef", "name"); ref != "traefik-gwapi-gateway-role" || find(objs, "ClusterRole", ref) == nil {
		t.Errorf("binding roleRef = %s", ref)
	}
	// net-gateway-api from its module's config/.
	for _, d := range []string{"net-gateway-api-controller", "net-gateway-api-webhook"} {
		o := find(objs, "Deployment", d)
		if o == nil || o.GetNamespace() != "knative-serving" {
			t.Fatalf("no Deployment knative-serving/%s", d)
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		if img := cs[0].(map[string]any)["image"].(string); !strings.HasPrefix(img, "localhost:5002/net-gateway-api/") {
			t.Errorf("%s image = %s", d, img)
		}
	}
	cfg := find(objs, "ConfigMap", "config-gateway")
	ext, _, _ := unstructured.NestedString(cfg.Object, "data", "external-gateways")
	local, _, _ := unstructured.NestedString(cfg.Object, "data", "local-gateways")
	for _, want := range []string{"gateway: traefik/knative-gateway", "service: traefik/traefik", "class: traefik"} {
		if !strings.Contains(ext, want) {
			t.Errorf("external-gateways lacks %q:\n%s", want, ext)
		}
	}
	if !strings.Contains(local, "gateway: traefik/knative-local-gateway") || !strings.Contains(local, "service: traefik/traefik-internal") {
		t.Errorf("local-gateways = %s", local)
	}
	if strings.Contains(ext+local, "supported-features") {
		t.Errorf("no supported features may be claimed (Traefik has no per-route timeouts): %s", ext)
	}
	// config-gateway before the webhook that validates it.
	idx := map[string]int{}
	for i, o := range objs {
		idx[o.GetKind()+"/"+o.GetName()] = i
	}
	if idx["ConfigMap/config-gateway"] > idx["ValidatingWebhookConfiguration/config.webhook.gateway-api.networking.internal.knative.dev"] {
		t.Error("config-gateway must be applied before net-gateway-api's validating webhook")
	}
	delete(images, netGatewayAPIWebhook)
	if _, err := p.Manifests(images, gw); err == nil || !strings.Contains(err.Error(), "webhook") {
		t.Errorf("a missing image must be an error naming it, got %v", err)
	}
}

// TestTraefikProvidersCoexistOnSwitch: both Traefik providers run Traefik
// as traefik/traefik, but their cluster-scoped RBAC must not share names
// (a ClusterRoleBinding's roleRef cannot change in place).
func TestTraefikProvidersCoexistOnSwitch(t *testing.T) {
	k, err := TraefikKnative{}.Manifests(map[string]string{"traefik": "x@sha256:1"}, Gateway{NodePort: 30080})
	if err != nil {
		t.Fatal(err)
	}
	g, err := GatewayAPI{}.Manifests(map[string]string{"traefik": "x@sha256:1", netGatewayAPIController: "c@sha256:2", netGatewayAPIWebhook: "w@sha256:3"}, Gateway{NodePort: 30080})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range k {
		if a.GetKind() != "ClusterRoleBinding" && a.GetKind() != "ClusterRole" {
			continue
		}
		if find(g, a.GetKind(), a.GetName()) != nil {
			t.Errorf("%s %s is rendered by both providers", a.GetKind(), a.GetName())
		}
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

func TestLeftovers(t *testing.T) {
	gw := Gateway{NodePort: 30080}
	left, err := Leftovers(TraefikKnative{}, GatewayAPI{}, gw)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, o := range left {
		names[o.GetKind()+"/"+o.GetName()] = true
	}
	if !names["ClusterRoleBinding/traefik-gateway-controller"] || !names["ClusterRole/traefik-knative-networking-role"] {
		t.Errorf("switching to gateway-api must delete the Knative provider's RBAC: %v", names)
	}
	if names["Deployment/traefik"] || names["Namespace/traefik"] || names["Service/traefik"] {
		t.Errorf("objects both render are replaced, not deleted: %v", names)
	}
	back, err := Leftovers(GatewayAPI{}, TraefikKnative{}, gw)
	if err != nil {
		t.Fatal(err)
	}
	names = map[string]bool{}
	for _, o := range back {
		names[o.GetKind()+"/"+o.GetName()] = true
		if o.GetKind() == "CustomResourceDefinition" {
			t.Errorf("CRDs stay: %s", o.GetName())
		}
	}
	for _, want := range []string{"Deployment/net-gateway-api-controller", "Deployment/net-gateway-api-webhook", "ValidatingWebhookConfiguration/config.webhook.gateway-api.networking.internal.knative.dev", "Gateway/knative-gateway", "GatewayClass/traefik"} {
		if !names[want] {
			t.Errorf("switching back must delete %s: %v", want, names)
		}
	}
}

func TestIngressFinalizer(t *testing.T) {
	for p, want := range map[Provider]string{
		GatewayAPI{}:     "ingresses.networking.internal.knative.dev",
		Kourier{}:        "ingresses.networking.internal.knative.dev",
		TraefikKnative{}: "",
	} {
		if got := IngressFinalizer(p); got != want {
			t.Errorf("IngressFinalizer(%s) = %q, want %q", p.Name(), got, want)
		}
	}
}
