package main

import (
	"bytes"
	"context"
	"encoding/base64"
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
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
)

func TestFiberctlAgainstRealFiberd(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "ctl-00001"})
	ctx := context.Background()
	dir := t.TempDir()
	keyPEM, err := routercred.MarshalPrivateKey(inst.RouterKey)
	if err != nil {
		t.Fatal(err)
	}
	routerKey := filepath.Join(dir, "router.pem")
	if err := os.WriteFile(routerKey, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	api := []string{"-endpoint", inst.Endpoint, "-router-key-file", routerKey, "-home", inst.Home}

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

	// A credential minted for another Home, or by another router key, is
	// refused; missing flags are named.
	_, otherKey, _ := routercred.GenerateKey()
	otherPEM, _ := routercred.MarshalPrivateKey(otherKey)
	other := filepath.Join(dir, "other.pem")
	os.WriteFile(other, otherPEM, 0o600)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"another home", []string{"-endpoint", inst.Endpoint, "-router-key-file", routerKey, "-home", inst.Home + "-x"}, "401"},
		{"another router key", []string{"-endpoint", inst.Endpoint, "-router-key-file", other, "-home", inst.Home}, "401"},
		{"no home", []string{"-endpoint", inst.Endpoint, "-router-key-file", routerKey}, "-home is required"},
		{"no key", []string{"-endpoint", inst.Endpoint, "-home", inst.Home}, "-router-key-file is required"},
		{"bad key file", []string{"-endpoint", inst.Endpoint, "-router-key-file", filepath.Join(dir, "missing.pem"), "-home", inst.Home}, "-router-key-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("FIBERD_HOME", "")
			t.Setenv("FIBERD_ROUTER_KEY_FILE", "")
			err := run(ctx, append([]string{"fibers"}, tc.args...), &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("fibers %v: %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestTemplate seals a template as ly deploy does (a fresh fleet key and
// sealer identity), pushes it to an in-memory registry and reads it back
// with fiberctl template: header only, opened with the sealer's key or an
// installation's sealers, and refused with the wrong keys or trust.
func TestTemplate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fleetKey := func(name string) (*seal.PrivateKey, string) {
		t.Helper()
		k, err := seal.GenerateFleetKey()
		if err != nil {
			t.Fatal(err)
		}
		b, err := k.MarshalPEM()
		if err != nil {
			t.Fatal(err)
		}
		return k, write(name, b)
	}
	fleet, fleetFile := fleetKey("fleet.pem")
	_, retiredFile := fleetKey("retired.pem")
	_, otherFleetFile := fleetKey("other-fleet.pem")
	sealer, err := seal.GenerateSealerKey()
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := seal.GenerateSealerKey()
	b64 := func(k *seal.SealerKey) string { return base64.StdEncoding.EncodeToString(k.Public()) }
	sealerPEM := write("sealer.pub", seal.MarshalSealerPublicKey(sealer.Public()))

	digest := "sha256:" + strings.Repeat("ab", 32)
	tmpl := seal.NewTemplate("team-a", "hello-00001", digest, seal.ExecutionPolicy{Mode: "fresh"}, artifact.Config{Port: 8080, Protocol: "http1", Runtime: artifact.Runtime{Name: "go"}})
	sealed, err := seal.Seal(fleet.Public(), sealer, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	reg := fiberdtest.StartRegistry(t)
	ref, err := artifact.PushTemplate(ctx, sealed, reg+"/lampyr/templates", "team-a", "hello-00001", fleet.Public().KeyID())
	if err != nil {
		t.Fatal(err)
	}
	blob := write("sealed.bin", sealed)

	entry := func(k *seal.SealerKey, ns ...string) string {
		v, err := seal.FormatSealer(seal.TrustedSealer{Key: k.Public(), Namespaces: ns})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	indent := func(s string) string { return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ") }
	cmFile := write("sealers-cm.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: lampyr-template-sealers\n  namespace: lampyr-system\ndata:\n  alice: |\n"+indent(entry(sealer, "team-a", "team-b"))+"\n  ci: |\n"+indent(entry(stranger, "*"))+"\n"))
	otherNSFile := write("sealers-other-ns.yaml", []byte("alice: |\n"+indent(entry(sealer, "team-b"))+"\n"))
	strangerFile := write("sealers-stranger.yaml", []byte("ci: |\n"+indent(entry(stranger, "*"))+"\n"))

	header := []string{"fleet key id:  " + fleet.Public().KeyID(), "sealer key id: " + sealer.KeyID()}
	opened := append([]string{`"namespace": "team-a"`, `"revision": "hello-00001"`, `"snapshotDigest": "` + digest + `"`}, header...)
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{name: "header only", args: []string{"-ref", ref.String()}, want: header},
		{name: "header from a file", args: []string{"-file", blob}, want: header},
		{name: "sealer public key", args: []string{"-ref", ref.String(), "-fleet-key-file", fleetFile, "-sealer-public-key", b64(sealer)},
			want: append(opened, "signature verified with -sealer-public-key; namespace authorization not checked")},
		{name: "sealer public key PEM file, current and retired fleet keys", args: []string{"-file", blob, "-fleet-key-file", retiredFile, "-fleet-key-file", fleetFile, "-sealer-public-key", "@" + sealerPEM}, want: opened},
		{name: "installation's sealers", args: []string{"-ref", ref.String(), "-fleet-key-file", fleetFile, "-sealers-file", cmFile},
			want: append(opened, "sealer:        alice (namespaces team-a,team-b)", "sealer authorized by -sealers-file")},
		{name: "sealer not authorized for the namespace", args: []string{"-file", blob, "-fleet-key-file", fleetFile, "-sealers-file", otherNSFile}, wantErr: "not authorized"},
		{name: "sealer not trusted", args: []string{"-file", blob, "-fleet-key-file", fleetFile, "-sealers-file", strangerFile}, wantErr: "does not trust"},
		{name: "another sealer key", args: []string{"-file", blob, "-fleet-key-file", fleetFile, "-sealer-public-key", b64(stranger)}, wantErr: "template was signed by " + sealer.KeyID()},
		{name: "another fleet key", args: []string{"-file", blob, "-fleet-key-file", otherFleetFile, "-sealer-public-key", b64(sealer)}, wantErr: "another fleet key"},
		{name: "no trust", args: []string{"-file", blob, "-fleet-key-file", fleetFile}, wantErr: "pass -sealers-file"},
		{name: "trust without fleet key", args: []string{"-file", blob, "-sealer-public-key", b64(sealer)}, wantErr: "needs -fleet-key-file"},
		{name: "both trusts", args: []string{"-file", blob, "-fleet-key-file", fleetFile, "-sealer-public-key", b64(sealer), "-sealers-file", cmFile}, wantErr: "not both"},
		{name: "not a template", args: []string{"-file", fleetFile}, wantErr: "not a sealed fiberd template"},
		{name: "nothing to read", args: nil, wantErr: "pass -ref"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(ctx, append([]string{"template"}, tc.args...), &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("template %v: %v, want an error containing %q\n%s", tc.args, err, tc.wantErr, out.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("template %v: %v\n%s", tc.args, err, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestPrintGrants(t *testing.T) {
	g := &v1alpha1.CapacityGrant{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "CapacityGrant"},
		ObjectMeta: metav1.ObjectMeta{Name: "hello-00001", Namespace: "demo"},
	}
	g.Status.InitializeConditions()
	g.Status.MarkNotAdmitted(contract.ReasonInsufficientMemory, "needs 1Gi")
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{contract.CapacityGrants: "CapacityGrantList"}, &unstructured.Unstructured{Object: m})
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
