package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/grant"
)

func TestFiberctlAgainstRealFiberd(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "ctl-00001"})
	ctx := context.Background()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte(inst.Token+"\n"), 0o600)
	api := []string{"-endpoint", inst.Endpoint, "-token-file", tok}

	var out bytes.Buffer
	if err := run(ctx, append([]string{"acquire"}, api...), &out); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out.String())
	out.Reset()
	if err := run(ctx, append([]string{"fibers"}, api...), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), id) || !strings.Contains(out.String(), "acquired") || !strings.Contains(out.String(), "revision ctl-00001") {
		t.Fatalf("fibers output lacks the acquired fiber %s:\n%s", id, out.String())
	}
	if err := run(ctx, append(append([]string{"release"}, api...), id), &out); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, append([]string{"grant"}, api...), &out); err != nil || !strings.Contains(out.String(), `"grantID": "grant-test-1"`) {
		t.Fatalf("grant: %v\n%s", err, out.String())
	}

	// Open the Revision's template with the fleet key, from the registry.
	keyPEM, _ := inst.FleetKey.MarshalPEM()
	key := filepath.Join(dir, "fleet.pem")
	os.WriteFile(key, keyPEM, 0o600)
	out.Reset()
	if err := run(ctx, []string{"template", "-fleet-key-file", key, "-ref", inst.TemplateRef}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"revision": "ctl-00001"`) {
		t.Fatalf("template output:\n%s", out.String())
	}
	// With another fleet key it refuses, naming the key.
	if err := run(ctx, []string{"fleet-key", "-out", dir}, &out); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, []string{"template", "-fleet-key-file", filepath.Join(dir, "private.pem"), "-ref", inst.TemplateRef}, &out)
	if err == nil || !strings.Contains(err.Error(), "another fleet key") {
		t.Fatalf("template with another fleet key: %v", err)
	}
}

func TestPrintGrants(t *testing.T) {
	g := &v1alpha1.CapacityGrant{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "CapacityGrant"},
		ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "demo"},
	}
	g.Status.InitializeConditions()
	g.Status.MarkNotAdmitted(v1alpha1.ReasonInsufficientMemory, "needs 1Gi")
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{grant.GrantGVR: "CapacityGrantList"}, &unstructured.Unstructured{Object: m})
	var out bytes.Buffer
	if err := printGrants(context.Background(), &out, dyn, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"demo", "hello-00001", "False", "InsufficientMemory: needs 1Gi"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
