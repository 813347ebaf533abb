package ly

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestParseProject(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		wantErr    []string // substrings, each naming a field
	}{
		{name: "minimal", yaml: "name: hello\n"},
		{name: "full", yaml: "name: hello\nruntime: go\nmain: ./cmd/server\nport: 9090\nprotocol: h2c\nreadinessPath: /healthz\nstartupTimeout: 5s\nmemory: 64Mi\nmaxScale: 3\ntimeoutSeconds: 60\nexecution:\n  mode: reuse\n  idleTimeout: 30s\n  idleAction: release\n"},
		{name: "missing name", yaml: "port: 8080\n", wantErr: []string{"name: required"}},
		{name: "bad name", yaml: "name: Hello_World\n", wantErr: []string{"name: \"Hello_World\""}},
		{name: "unknown field", yaml: "name: a\nimage: x\n", wantErr: []string{`unknown field "image"`}},
		{name: "runtime", yaml: "name: a\nruntime: node\n", wantErr: []string{"runtime: \"node\""}},
		{name: "port", yaml: "name: a\nport: 70000\n", wantErr: []string{"port: 70000"}},
		{name: "protocol", yaml: "name: a\nprotocol: grpc\n", wantErr: []string{"protocol: \"grpc\": want http1 or h2c"}},
		{name: "readiness", yaml: "name: a\nreadinessPath: healthz\n", wantErr: []string{"readinessPath"}},
		{name: "memory", yaml: "name: a\nmemory: lots\n", wantErr: []string{"memory: \"lots\""}},
		{name: "maxScale", yaml: "name: a\nmaxScale: -1\n", wantErr: []string{"maxScale: -1"}},
		{name: "timeout", yaml: "name: a\ntimeoutSeconds: 0\n", wantErr: []string{"timeoutSeconds: 0"}},
		{name: "park", yaml: "name: a\nexecution:\n  mode: reuse\n  idleTimeout: 30s\n  idleAction: park\n", wantErr: []string{"execution.idleAction: \"park\": park/resume is not supported"}},
		{name: "resume", yaml: "name: a\nexecution:\n  mode: reuse\n  idleTimeout: 30s\n  idleAction: resume\n", wantErr: []string{"park/resume is not supported"}},
		{name: "reuse without idle timeout", yaml: "name: a\nexecution:\n  mode: reuse\n", wantErr: []string{"execution.idleTimeout: required"}},
		{name: "idle timeout too long", yaml: "name: a\nexecution:\n  mode: reuse\n  idleTimeout: 25h\n", wantErr: []string{"execution.idleTimeout: \"25h\""}},
		{name: "fresh with idle", yaml: "name: a\nexecution:\n  mode: fresh\n  idleTimeout: 30s\n", wantErr: []string{"apply only to mode: reuse"}},
		{name: "mode", yaml: "name: a\nexecution:\n  mode: park\n", wantErr: []string{"execution.mode: \"park\""}},
		{name: "several at once", yaml: "name: a\nport: 0\nprotocol: x\n", wantErr: []string{"protocol: \"x\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseProject([]byte(tc.yaml))
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if p.Runtime != "go" || p.Port == 0 || p.Protocol == "" || p.Execution.Mode == "" {
					t.Errorf("defaults not applied: %+v", p)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %q, want an error containing %q", tc.yaml, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestPolicyRoundsIdleTimeoutUp(t *testing.T) {
	p, err := ParseProject([]byte("name: a\nexecution:\n  mode: reuse\n  idleTimeout: 1500ms\n  idleAction: release\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := p.Policy()
	if got.Mode != "reuse" || got.IdleTimeoutSeconds != 2 || got.IdleAction != "release" {
		t.Errorf("Policy() = %+v, want reuse/2s/release", got)
	}
	fresh, _ := ParseProject([]byte("name: a\n"))
	if got := fresh.Policy(); got.Mode != "fresh" || got.IdleTimeoutSeconds != 0 {
		t.Errorf("fresh Policy() = %+v", got)
	}
}

func TestVisibility(t *testing.T) {
	root := t.TempDir()
	svc := filepath.Join(root, "services", "api")
	if err := os.MkdirAll(svc, 0o755); err != nil {
		t.Fatal(err)
	}
	// No workspace anywhere above: cluster-local.
	ws, path, err := FindWorkspace(svc)
	if err != nil || path != "" {
		// A workspace file above the temp dir would break the test's premise.
		if path != "" && !strings.HasPrefix(path, root) {
			t.Skipf("a %s exists above the temp dir (%s)", WorkspaceFile, path)
		}
		t.Fatalf("FindWorkspace: %v %q", err, path)
	}
	if ws.Public("api") {
		t.Error("outside a workspace a service must be cluster-local")
	}
	if err := os.WriteFile(filepath.Join(root, WorkspaceFile), []byte("ingress:\n  services: [api, web]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws, path, err = FindWorkspace(svc)
	if err != nil || path != filepath.Join(root, WorkspaceFile) {
		t.Fatalf("FindWorkspace = %q, %v", path, err)
	}
	for name, want := range map[string]bool{"api": true, "web": true, "worker": false} {
		if got := ws.Public(name); got != want {
			t.Errorf("Public(%q) = %v, want %v", name, got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(root, WorkspaceFile), []byte("ingress:\n  hosts: [a]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := FindWorkspace(svc); err == nil || !strings.Contains(err.Error(), "hosts") {
		t.Errorf("unknown workspace field accepted: %v", err)
	}
}

func TestParseTraffic(t *testing.T) {
	got, err := ParseTraffic("hello-00001=90,@latest=10")
	if err != nil {
		t.Fatal(err)
	}
	want := []TrafficTarget{{Revision: "hello-00001", Percent: 90}, {Latest: true, Percent: 10}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ParseTraffic (-want +got):\n%s", d)
	}
	if got, err := ParseTraffic(""); err != nil || got != nil {
		t.Errorf("empty --traffic = %v, %v; want nil, nil", got, err)
	}
	for in, msg := range map[string]string{
		"a=50":            "add up to 50",
		"a":               "want REVISION=PERCENT",
		"a=x,b=100":       "whole number",
		"a=50,a=50":       "names a twice",
		"a=101":           "0-100",
		"=100":            "want REVISION=PERCENT",
		"a=60,@latest=60": "add up to 120",
	} {
		if _, err := ParseTraffic(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseTraffic(%q) = %v, want an error containing %q", in, err, msg)
		}
	}
}

func TestParseImageTag(t *testing.T) {
	if _, err := ParseImageTag("localhost:5002/demo-app:v1"); err != nil {
		t.Errorf("valid --image refused: %v", err)
	}
	for _, bad := range []string{"", "localhost:5002/demo-app", "localhost:5002/demo-app@sha256:" + strings.Repeat("a", 64), "Not Valid"} {
		if _, err := ParseImageTag(bad); err == nil || !strings.Contains(err.Error(), "--image") {
			t.Errorf("ParseImageTag(%q) = %v, want an error naming --image", bad, err)
		}
	}
}

// TestServiceManifest pins the Service ly deploy applies (golden file).
func TestServiceManifest(t *testing.T) {
	p, err := ParseProject([]byte("name: hello\nprotocol: h2c\nmemory: 64Mi\nmaxScale: 3\ntimeoutSeconds: 60\nexecution:\n  mode: reuse\n  idleTimeout: 30s\n  idleAction: release\n"))
	if err != nil {
		t.Fatal(err)
	}
	snap := "localhost:5002/hello@sha256:" + strings.Repeat("a", 64)
	tmpl := "localhost:5002/lampyr/templates@sha256:" + strings.Repeat("b", 64)
	tr, _ := ParseTraffic("hello-00001=50,@latest=50")
	for _, tc := range []struct {
		golden string
		in     ServiceInputs
	}{
		{"service-cluster-local.yaml", ServiceInputs{Namespace: "demo", Image: snap, Snapshot: snap, Template: tmpl}},
		{"service-public-traffic.yaml", ServiceInputs{Namespace: "demo", Image: snap, Snapshot: snap, Template: tmpl, Public: true, Traffic: tr}},
	} {
		got, err := yaml.Marshal(ServiceManifest(p, tc.in).Object)
		if err != nil {
			t.Fatal(err)
		}
		golden(t, tc.golden, got)
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./impl/ly -update to create it)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s (-want +got):\n%s", name, d)
	}
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { c.t = c.t.Add(1500 * time.Millisecond); return c.t }

// TestProgressGolden pins the non-terminal (plain) and JSON renderings.
func TestProgressGolden(t *testing.T) {
	for _, mode := range []string{OutputPlain, OutputTerminal, OutputJSON} {
		var buf bytes.Buffer
		clk := &fakeClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
		pr := NewProgress(&buf, mode, clk.now)
		_ = pr.Phase("Artifact verification", func(ph *Phase) error {
			ph.Detail("local artifact %s", "sha256:abc")
			return nil
		})
		pr.Warn("adapter file .lampyr-adapter/README.md was modified")
		_ = pr.Phase("Template sealing", func(ph *Phase) error { return errors.New("template repository missing") })
		pr.Result("Service demo/hello is ready: http://hello.demo.example.com", map[string]string{"url": "http://hello.demo.example.com"})
		golden(t, "progress-"+mode+".txt", buf.Bytes())
	}
}

func TestScaffoldAndAdapterCheck(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hello")
	files, err := Scaffold(dir, "hello", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Errorf("scaffold wrote %v", files)
	}
	if _, err := LoadProject(dir); err != nil {
		t.Fatalf("scaffolded lampyr.yaml invalid: %v", err)
	}
	if w := CheckAdapter(dir); len(w) != 0 {
		t.Errorf("fresh adapter warnings: %v", w)
	}
	if _, err := Scaffold(dir, "hello", false); err == nil {
		t.Error("scaffold over an existing service must refuse without --upgrade")
	}
	readme := filepath.Join(dir, AdapterDir, "README.md")
	if err := os.WriteFile(readme, []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if w := CheckAdapter(dir); len(w) != 1 || !strings.Contains(w[0], "README.md was modified") {
		t.Errorf("modified adapter warnings: %v", w)
	}
	if _, err := Scaffold(dir, "hello", true); err != nil {
		t.Fatal(err)
	}
	if w := CheckAdapter(dir); len(w) != 0 {
		t.Errorf("after --upgrade: %v", w)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "main.go")); !bytes.Contains(b, []byte("K_SERVICE")) {
		t.Error("--upgrade must leave user-owned files alone")
	}
	meta := filepath.Join(dir, AdapterDir, AdapterMetaFile)
	raw, _ := os.ReadFile(meta)
	if err := os.WriteFile(meta, bytes.Replace(raw, []byte(AdapterVersion), []byte("go/v0"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if w := CheckAdapter(dir); len(w) != 1 || !strings.Contains(w[0], "go/v0 is not this ly's") {
		t.Errorf("outdated adapter warnings: %v", w)
	}
}

// TestBuildAndPush builds a scaffolded service twice (same digest), pushes
// it to an in-process registry (pushed once, then found), and checks the
// tag resolution.
func TestBuildAndPush(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	dir := filepath.Join(t.TempDir(), "hello")
	if _, err := Scaffold(dir, "hello", false); err != nil {
		t.Fatal(err)
	}
	p, err := LoadProject(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b1, err := Build(ctx, dir, p, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Build(ctx, dir, p, BuildOptions{ArtifactDir: filepath.Join(t.TempDir(), "again")})
	if err != nil {
		t.Fatal(err)
	}
	if b1.Digest != b2.Digest {
		t.Errorf("same sources, different digests: %s vs %s", b1.Digest, b2.Digest)
	}
	if b1.Config.AdapterVersion != AdapterVersion || b1.Config.Port != 8080 || b1.Config.Entrypoint[0] != "/handler" {
		t.Errorf("recorded helper facts: %+v", b1.Config)
	}
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	tag, err := ParseImageTag(host + "/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := Push(ctx, b1, tag)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Push(ctx, b1, tag)
	if err != nil {
		t.Fatal(err)
	}
	if !r1.Pushed || r2.Pushed {
		t.Errorf("pushed = %v then %v, want true then false", r1.Pushed, r2.Pushed)
	}
	if r1.Ref.DigestStr() != b1.Digest.String() {
		t.Errorf("ref %s, want digest %s", r1.Ref, b1.Digest)
	}
	if _, err := Push(ctx, b1, mustTag(t, "127.0.0.1:1/hello:v1")); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("unreachable registry: %v", err)
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := ParseImageTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}
