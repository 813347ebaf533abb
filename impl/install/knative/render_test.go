package knative

import (
	"context"
	"strings"
	"testing"
)

func render(t *testing.T) []Object { return renderFrom(t, Sources) }

// renderFrom parses what sources lists (Serving's or Eventing's trees).
func renderFrom(t *testing.T, sources func(context.Context) ([]Source, error)) []Object {
	t.Helper()
	src, err := sources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestSourcesIncludeUpstreamSymlinks(t *testing.T) {
	objs := render(t)
	crds := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds[o.GetName()] = true
		}
	}
	for _, want := range []string{
		"services.serving.knative.dev", "configurations.serving.knative.dev", "revisions.serving.knative.dev",
		"routes.serving.knative.dev", "domainmappings.serving.knative.dev",
		"ingresses.networking.internal.knative.dev", "certificates.networking.internal.knative.dev",
		"serverlessservices.networking.internal.knative.dev", "clusterdomainclaims.networking.internal.knative.dev",
		"images.caching.internal.knative.dev",
	} {
		if !crds[want] {
			t.Errorf("rendered manifests lack CRD %s", want)
		}
	}
}

func TestEveryKoReferenceResolved(t *testing.T) {
	objs := render(t)
	refs := KoReferences(objs)
	want := []string{"knative.dev/serving/cmd/activator", "knative.dev/serving/cmd/autoscaler", "knative.dev/serving/cmd/controller", "knative.dev/serving/cmd/queue", "knative.dev/serving/cmd/webhook"}
	if strings.Join(refs, ",") != strings.Join(want, ",") {
		t.Fatalf("ko references = %v, want %v", refs, want)
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
	delete(images, "knative.dev/serving/cmd/queue")
	objs = render(t)
	err := ResolveImages(objs, images)
	if err == nil || !strings.Contains(err.Error(), "ko://knative.dev/serving/cmd/queue") {
		t.Fatalf("want an error naming the missing queue image, got %v", err)
	}
}

func TestLampyrProfileDropsOnlyPodMachinery(t *testing.T) {
	objs := render(t)
	stock, _, err := Filter(objs, Stock)
	if err != nil {
		t.Fatal(err)
	}
	lampyr, excluded, err := Filter(objs, Lampyr)
	if err != nil {
		t.Fatal(err)
	}
	if len(stock) != len(objs) || len(lampyr)+len(excluded) != len(objs) {
		t.Fatalf("stock %d, lampyr %d + excluded %d, all %d", len(stock), len(lampyr), len(excluded), len(objs))
	}
	kept := map[string]bool{}
	for _, o := range lampyr {
		kept[objectKey(o.Unstructured)] = true
		if o.GetKind() == "Deployment" && o.GetName() != "webhook" {
			t.Errorf("lampyr profile keeps Deployment %s", o.GetName())
		}
	}
	// Every CRD, webhook configuration, ConfigMap and the webhook of the
	// stock profile must be in the lampyr profile.
	for _, o := range stock {
		switch o.GetKind() {
		case "CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ConfigMap", "Secret", "Namespace":
			if !kept[objectKey(o.Unstructured)] {
				t.Errorf("lampyr profile dropped %s", objectKey(o.Unstructured))
			}
		}
	}
	for _, must := range []string{"Deployment/knative-serving/webhook", "Service/knative-serving/webhook", "ServiceAccount/knative-serving/controller"} {
		if !kept[must] {
			t.Errorf("lampyr profile dropped %s", must)
		}
	}
	if _, _, err := Filter(objs, "other"); err == nil {
		t.Error("an unknown profile must be an error")
	}
}

func TestApplySettings(t *testing.T) {
	objs := render(t)
	if err := ApplySettings(objs, Settings{IngressClass: "traefik.ingress.networking.knative.dev", Domain: "127.0.0.1.sslip.io"}); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		data, _, _ := unstructuredData(o)
		switch o.GetName() {
		case "config-network":
			if data["ingress-class"] != "traefik.ingress.networking.knative.dev" {
				t.Errorf("ingress-class = %q", data["ingress-class"])
			}
		case "config-domain":
			if _, ok := data["127.0.0.1.sslip.io"]; !ok || len(data) != 1 {
				t.Errorf("config-domain data = %v", data)
			}
		}
	}
	if err := ApplySettings(nil, Settings{}); err == nil {
		t.Error("missing ConfigMaps must be an error")
	}
	for p, want := range map[Profile]string{Stock: "", Lampyr: "1"} {
		objs := render(t)
		if err := ApplySettings(objs, ProfileSettings(p, Settings{})); err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "ConfigMap" && o.GetName() == "config-defaults" {
				data, _, _ := unstructuredData(o)
				if got, ok := data["container-concurrency"]; got != want || ok != (want != "") {
					t.Errorf("%s profile: config-defaults container-concurrency %q (set %v), want %q", p, got, ok, want)
				}
			}
		}
	}
}

func unstructuredData(o Object) (map[string]string, bool, error) {
	m := map[string]string{}
	raw, ok := o.Object["data"].(map[string]any)
	for k, v := range raw {
		s, _ := v.(string)
		m[k] = s
	}
	return m, ok, nil
}

// The stock upgrade reference installs the previous minor version with the
// same code: its tree must parse, name the same five commands, take the
// stock settings and pass the stock filter.
func TestPreviousVersionRendersAsStock(t *testing.T) {
	objs := renderFrom(t, func(ctx context.Context) ([]Source, error) { return SourcesAt(ctx, PreviousServingVersion) })
	refs := KoReferences(objs)
	want := []string{"knative.dev/serving/cmd/activator", "knative.dev/serving/cmd/autoscaler", "knative.dev/serving/cmd/controller", "knative.dev/serving/cmd/queue", "knative.dev/serving/cmd/webhook"}
	if strings.Join(refs, ",") != strings.Join(want, ",") {
		t.Fatalf("%s: ko references = %v, want %v", PreviousServingVersion, refs, want)
	}
	images := map[string]string{}
	for _, r := range refs {
		images[r] = "kind.local/" + r[strings.LastIndex(r, "/")+1:] + ":test"
	}
	if err := ResolveImages(objs, images); err != nil {
		t.Fatal(err)
	}
	if err := ApplySettings(objs, ProfileSettings(Stock, Settings{IngressClass: "gateway-api.ingress.networking.knative.dev", Domain: "example.com"})); err != nil {
		t.Fatal(err)
	}
	kept, _, err := Filter(objs, Stock)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != len(objs) {
		t.Errorf("%s: the stock filter kept %d of %d objects", PreviousServingVersion, len(kept), len(objs))
	}
}
