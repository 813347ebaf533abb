package install

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters/manifest"
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
	for _, want := range []string{"CustomResourceDefinition/capacitygrants.fiberd.io", "ConfigMap/config-lampyr", "Namespace/lampyr-system"} {
		if !kinds[want] {
			t.Errorf("impl/config lacks %s", want)
		}
	}
}

func TestHomeImagesAndBackendStrategy(t *testing.T) {
	in := &LampyrInputs{Objects: implObjects(t), GrantImage: "localhost:5002/lampyr/home@sha256:1", HelperImage: "localhost:5002/lampyr/home@sha256:1"}
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
}
