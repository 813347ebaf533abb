package install

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/install/manifest"
	"lampyr.dev/serving/impl/install/networking"
)

func implObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	objs, err := manifest.ReadDir(filepath.Join(filepath.Dir(file), "..", "..", ImplConfigDir))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestLampyrManifestsNameEveryComponent(t *testing.T) {
	objs := implObjects(t)
	refs := strings.Join(koRefs(objs), ",")
	for _, want := range []string{"impl/cmd/controller", "impl/cmd/fiber-router", "impl/cmd/grant-controller"} {
		if !strings.Contains(refs, ModulePath+"/"+want) {
			t.Errorf("impl/config has no ko:// reference to %s (has %s)", want, refs)
		}
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()+"/"+o.GetName()] = true
	}
	for _, want := range []string{"CustomResourceDefinition/capacitygrants.fiberd.io", "ConfigMap/config-lampyr", "Namespace/lampyr-system", "Namespace/lampyr-homes",
		"NetworkPolicy/fiber-router-from-gateway", "NetworkPolicy/fiberd-api", "Role/lampyr-public-config"} {
		if !kinds[want] {
			t.Errorf("impl/config lacks %s", want)
		}
	}
}

func TestHomeImagesAndBackendStrategy(t *testing.T) {
	pinned := "localhost:5002/lampyr/home@sha256:" + strings.Repeat("1", 64)
	in := &LampyrInputs{Objects: implObjects(t), GrantImage: pinned, HelperImage: pinned}
	if err := setHomeImages(in); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, o := range in.Objects {
		if o.GetName() != "lampyr-grant-controller" || o.GetKind() != "Deployment" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, e := range cs[0].(map[string]any)["env"].([]any) {
			em := e.(map[string]any)
			if (em["name"] == EnvGrantImage || em["name"] == EnvHelperImage) && em["value"] == in.GrantImage {
				found++
			}
		}
	}
	if found != 2 {
		t.Errorf("grant controller env carries the Home image %d times, want 2", found)
	}
	if err := SetBackendStrategy(in.Objects, "endpointslice"); err != nil {
		t.Fatal(err)
	}
	if err := setHomeImages(&LampyrInputs{}); err == nil {
		t.Error("manifests without the grant controller must be an error")
	}
	// A Home image anyone who can move a tag could replace is refused.
	if err := setHomeImages(&LampyrInputs{Objects: implObjects(t), GrantImage: "localhost:5002/lampyr/home:dev"}); err == nil || !strings.Contains(err.Error(), EnvGrantImage) {
		t.Errorf("a Home image by tag: %v, want an error naming %s", err, EnvGrantImage)
	}
}

// TestLeastPrivilege: no Lampyr component may write Secrets or ConfigMaps
// cluster-wide, nor exec into Pods; only the grant controller may touch Pods
// in every namespace (the tenant namespaces' egress Pods, issue 31: Pods it
// builds itself within Pod Security restricted); fiber-router has no
// cluster-wide role at all, and only lampyr-homes admits privileged Pods
// (docs/security.md §6). A ClusterRole that grew such a rule would hand
// every tenant namespace to the component.
func TestLeastPrivilege(t *testing.T) {
	forbidden := map[string]bool{"secrets": true, "pods": true, "configmaps": true, "*": true, "pods/exec": true, "pods/attach": true, "pods/ephemeralcontainers": true}
	for _, o := range implObjects(t) {
		switch o.GetKind() {
		case "ClusterRole":
			if o.GetName() == "lampyr-fiber-router" {
				t.Errorf("fiber-router has a ClusterRole; it needs only a Role in lampyr-system")
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				rm := r.(map[string]any)
				groups, _, _ := unstructured.NestedStringSlice(rm, "apiGroups")
				res, _, _ := unstructured.NestedStringSlice(rm, "resources")
				for _, g := range groups {
					if g != "" {
						continue
					}
					for _, x := range res {
						if x == "pods" && strings.HasPrefix(o.GetName(), "lampyr-grant-controller") {
							continue
						}
						if forbidden[x] {
							t.Errorf("ClusterRole %s grants %q cluster-wide", o.GetName(), x)
						}
					}
				}
			}
		case "Namespace":
			level := o.GetLabels()["pod-security.kubernetes.io/enforce"]
			if want := map[string]string{"lampyr-system": "restricted", "lampyr-homes": "privileged"}[o.GetName()]; level != want {
				t.Errorf("Namespace %s enforces Pod Security %q, want %q", o.GetName(), level, want)
			}
		}
	}
}

// TestSourcesAreOptionsNotEnvironment: the installer takes its inputs from
// LampyrSources and Options (the callers read LAMPYR_*), so setting the
// variables in the process changes nothing here.
func TestSourcesAreOptionsNotEnvironment(t *testing.T) {
	t.Setenv(EnvClusterInputs, t.TempDir()) // empty: would fail if read
	dir := t.TempDir()
	mf := filepath.Join(dir, "lampyr.yaml")
	var b strings.Builder
	for _, o := range implObjects(t) {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	if err := os.WriteFile(mf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	pinned := "localhost:5002/lampyr/home@sha256:" + strings.Repeat("2", 64)
	in, err := LampyrComponents(context.Background(), "", nil, LampyrSources{ControllerManifest: mf, GrantImage: pinned})
	if err != nil {
		t.Fatalf("a controller manifest and a pinned Home image: %v", err)
	}
	if in.GrantImage != pinned || len(in.Objects) == 0 {
		t.Errorf("got Home image %q and %d objects, want %q and the manifest's objects", in.GrantImage, len(in.Objects), pinned)
	}
	if _, err := LampyrComponents(context.Background(), "", nil, LampyrSources{ControllerManifest: mf}); err == nil || !strings.Contains(err.Error(), EnvGrantImage) {
		t.Errorf("a controller manifest without a Home image: %v, want an error naming %s", err, EnvGrantImage)
	}
	if err := Install(context.Background(), nil, nil, nil, Options{Provider: networking.Kourier{}}); err == nil || !strings.Contains(err.Error(), EnvOnline) {
		t.Errorf("kourier offline: %v, want a refusal naming %s", err, EnvOnline)
	}
}
