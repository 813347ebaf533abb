package portability

// Plain tests of the N-way proof's own logic (targets file, alignment,
// report): they run with `go test` whether or not LAMPYR_E2E is set.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/conformance/upstream"
)

func writeTargets(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "targets.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTargetsFileBecomesClusters(t *testing.T) {
	home, _ := os.UserHomeDir()
	p := writeTargets(t, `reference: stock
targets:
- name: stock
  profile: stock
  kubeconfig: ~/.kube/stock
  context: kind-stock
  gateway: http://127.0.0.1:31080
  registry: localhost:5002
- name: lampyr
  profile: lampyr
  kubeconfig: lampyr.kubeconfig
  gateway: http://127.0.0.1:32080
- name: stock-tk
  profile: stock
  provider: traefik-knative
- name: other
  profile: stock
  kubeconfig: /k
  gateway: http://gw:80
  registry: {pull: registry.internal:5000, push: localhost:5002}
`)
	ts, err := LoadTargets(p)
	if err != nil {
		t.Fatal(err)
	}
	if ts.Namespace != DefaultNamespace || ts.Reference != "stock" {
		t.Errorf("defaults: %+v", ts)
	}
	cs := ts.Clusters()
	if len(cs) != 4 {
		t.Fatalf("clusters: %+v", cs)
	}
	want := []harness.Cluster{
		{Name: "stock", Profile: "stock", External: &harness.External{Kubeconfig: filepath.Join(home, ".kube/stock"), Context: "kind-stock", Gateway: "http://127.0.0.1:31080", Registry: "localhost:5002"}},
		{Name: "lampyr", Profile: "lampyr", External: &harness.External{Kubeconfig: filepath.Join(filepath.Dir(p), "lampyr.kubeconfig"), Gateway: "http://127.0.0.1:32080"}},
		{Name: "stock-tk", Profile: "stock", Provider: "traefik-knative"},
		{Name: "other", Profile: "stock", External: &harness.External{Kubeconfig: "/k", Gateway: "http://gw:80", Registry: "registry.internal:5000", Push: "localhost:5002"}},
	}
	for i := range want {
		g, _ := json.Marshal(cs[i])
		w, _ := json.Marshal(want[i])
		if string(g) != string(w) {
			t.Errorf("cluster %d:\n got %s\nwant %s", i, g, w)
		}
	}
	// The default is exactly the managed pair.
	pc, _ := json.Marshal(PairedTargets().Clusters())
	hp, _ := json.Marshal(harness.Paired())
	if string(pc) != string(hp) {
		t.Errorf("the default targets %s are not the harness's pair %s", pc, hp)
	}
}

func TestTargetsFileNamesEachMistake(t *testing.T) {
	two := "- name: b\n  profile: stock\n"
	for body, want := range map[string]string{
		"reference: a\ntargets:\n- name: a\n  profile: stock\n":                                                                                                "at least two targets",
		"reference: x\ntargets:\n- name: a\n  profile: stock\n" + two:                                                                                          `reference "x": name one of the targets`,
		"reference: a\ntargets:\n- name: a\n  profile: knative\n" + two:                                                                                        `profile "knative": want stock`,
		"reference: a\ntargets:\n- name: A\n  profile: stock\n" + two:                                                                                          `name "A": use lowercase`,
		"reference: a\ntargets:\n- name: a\n  profile: stock\n- name: a\n  profile: stock\n":                                                                   "a is listed twice",
		"reference: a\ntargets:\n- name: a\n  profile: stock\n  gateway: http://x:1\n" + two:                                                                   "give its kubeconfig too",
		"reference: a\ntargets:\n- name: a\n  profile: stock\n  provider: envoy\n" + two:                                                                       "provider",
		"reference: a\ntargets:\n- name: a\n  profile: stock\n  kubeconfig: /k\n" + two:                                                                        `gateway "": the Knative gateway's http://host:port`,
		"reference: a\ntargets:\n- name: a\n  profile: stock\n  kubeconfig: /k\n  gateway: http://x:1\n" + two:                                                 "registry: name the registry the cluster pulls",
		"reference: a\ntargets:\n- name: a\n  profile: lampyr\n  kubeconfig: /k\n  gateway: http://x:1\n  registry: {pull: r:1, push: localhost:5002}\n" + two: "leave push out",
		"reference: a\ntargets:\n- name: a\n  profile: stock\n  kubeconfig: /k\n  gateway: http://x:1\n  registry: {pul: r}\n" + two:                           "registry: want host[:port] or {pull: ..., push: ...}",
		"reference: a\nspare: 1\ntargets:\n- name: a\n  profile: stock\n" + two:                                                                                `unknown field "spare"`,
	} {
		if _, err := LoadTargets(writeTargets(t, body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", body, err, want)
		}
	}
}

// A target's per-installation facts (registry host, sealed template,
// route host) are mapped onto the reference's before comparing, so what
// differs is behaviour; with the same facts nothing is rewritten.
func TestAlignMapsFactsOntoTheReference(t *testing.T) {
	ref := Facts{"registry": "localhost:5002", "template/handler": "localhost:5002/t@sha256:aaa", "host/handler": "handler.portability.example.com"}
	if Aligner(ref, ref) != nil {
		t.Fatal("identical facts must not rewrite anything")
	}
	other := Facts{"registry": "reg.internal:5000", "template/handler": "reg.internal:5000/t@sha256:bbb", "host/handler": "handler.portability.kn.example.org"}
	r := Aligner(other, ref)
	got := Align(r, &Response{Status: 200, Echo: &Echo{Host: "handler.portability.kn.example.org", Env: map[string]string{"T": "reg.internal:5000/t@sha256:bbb", "I": "reg.internal:5000/fixtures/handler@sha256:ccc"}}})
	if got.Echo.Host != "handler.portability.example.com" || got.Echo.Env["T"] != "localhost:5002/t@sha256:aaa" || got.Echo.Env["I"] != "localhost:5002/fixtures/handler@sha256:ccc" {
		t.Errorf("aligned: %+v", got.Echo)
	}
	spec := Align(r, map[string]any{"spec": map[string]any{"image": "reg.internal:5000/fixtures/handler@sha256:ccc"}})
	if spec["spec"].(map[string]any)["image"] != "localhost:5002/fixtures/handler@sha256:ccc" {
		t.Errorf("aligned map: %v", spec)
	}
	// A difference that is not a fact survives the alignment, named.
	d := DiffTargets("the answer", "stock", "other", &Response{Status: 200}, Align(r, &Response{Status: 500}))
	if !strings.Contains(d, "between stock (the reference) and other (-stock +other)") || !strings.Contains(d, "Status") {
		t.Errorf("diff: %s", d)
	}
}

func TestNWayReportPutsEachTargetBesideTheReference(t *testing.T) {
	checks := []Check{
		NewCheck("request hello", time.Second, "", []TargetResult{{Target: "stock-tk", Result: ResultReference}, {Target: "stock-gw", Result: ResultSame}, {Target: "lampyr-gw", Result: ResultSame}}),
		NewCheck("request echo-get", time.Second, "", []TargetResult{{Target: "stock-tk", Result: ResultReference}, {Target: "stock-gw", Result: ResultSame},
			{Target: "lampyr-gw", Result: ResultDiffers, Detail: "the answer differs between stock-tk (the reference) and lampyr-gw (-stock-tk +lampyr-gw):\n-  Status: 200\n+  Status: 502"}}),
		NewCheck("unread bodies", time.Second, "stock-tk: 3 failures", []TargetResult{{Target: "stock-tk", Result: ResultReference}, {Target: "stock-gw", Result: ResultSame}, {Target: "lampyr-gw", Result: ResultSame}}),
	}
	facts := []TargetFacts{
		{Name: "stock-tk", Reference: true, Profile: "stock", Mode: "managed", Implementation: upstream.Implementation{Name: "knative-serving", Version: "v0.50.0", Networking: "traefik-knative"}, Cluster: upstream.Cluster{KubernetesVersion: "v1.35.4", Nodes: 1, Gateway: "http://127.0.0.1:40001"}},
		{Name: "stock-gw", Profile: "stock", Mode: "managed", Implementation: upstream.Implementation{Name: "knative-serving", Networking: "gateway-api"}},
		{Name: "lampyr-gw", Profile: "lampyr", Mode: "external", Context: "kind-lampyr", Implementation: upstream.Implementation{Name: "lampyr", Networking: "gateway-api"}},
	}
	r := NewNWayReport("stock-tk", facts, checks, time.Minute)
	if r.Passed != 1 || r.Total != 3 || r.Result != "failure" {
		t.Errorf("totals: %d/%d %s", r.Passed, r.Total, r.Result)
	}
	md := r.Markdown()
	for _, want := range []string{
		"- stock-tk (the reference): knative-serving v0.50.0, stock profile; networking traefik-knative; Kubernetes v1.35.4 (1 node(s)), managed; gateway http://127.0.0.1:40001",
		"(context kind-lampyr)",
		"| check | stock-tk (reference) | stock-gw | lampyr-gw | result | time |",
		"| request hello | reference | same | same | pass | 1s |",
		"| request echo-get | reference | same | differs | FAIL | 1s |",
		"| unread bodies | FAIL | same | same | FAIL | 1s |",
		"lampyr-gw (differs):\n\n```\nthe answer differs between stock-tk (the reference) and lampyr-gw (-stock-tk +lampyr-gw)",
		"stock-tk (FAIL):\n\n```\nstock-tk: 3 failures",
		"1/3 checks passed in 1m0s.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	dir := t.TempDir()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back NWayReport
	if err := json.Unmarshal(raw, &back); err != nil || back.Kind != "PortabilityReport" || back.Checks[1].Targets[2].Result != ResultDiffers || back.Targets[2].Context != "kind-lampyr" {
		t.Errorf("report.json round trip: %v %+v", err, back)
	}
}

// The example targets files load.
func TestTheRepositoryTargetsFilesLoad(t *testing.T) {
	files, _ := filepath.Glob("targets/*.yaml")
	if len(files) < 3 {
		t.Fatalf("portability/targets/*.yaml: %v", files)
	}
	for _, f := range files {
		if _, err := LoadTargets(f); err != nil {
			t.Error(err)
		}
	}
}

func TestApplyKnown(t *testing.T) {
	f := &Targets{Reference: "stock", Targets: []Target{{Name: "stock", Profile: "stock"}, {Name: "stock-tk", Profile: "stock"}, {Name: "lampyr", Profile: "lampyr"}},
		Known: []Known{{Target: "stock-tk", Check: "domain mapping", Reason: "traefik-knative has no host rewrite"}}}
	if err := f.Validate("t.yaml"); err != nil {
		t.Fatal(err)
	}
	results := func(tk string) []TargetResult {
		return []TargetResult{{Target: "stock", Result: ResultReference}, {Target: "stock-tk", Result: tk, Detail: "404"}, {Target: "lampyr", Result: ResultSame}}
	}
	// The declared difference passes, reported as known with its reason.
	c := NewCheck("domain mapping", time.Second, "", f.ApplyKnown("domain mapping", results(ResultError)))
	if !c.Passed || c.Targets[1].Result != ResultKnown || !strings.Contains(c.Targets[1].Detail, "no host rewrite") {
		t.Fatalf("known difference: %+v", c)
	}
	// Another check, or another target's difference, is not excused.
	if c := NewCheck("stream", time.Second, "", f.ApplyKnown("stream", results(ResultDiffers))); c.Passed {
		t.Fatalf("a difference in another check passed: %+v", c)
	}
	lr := results(ResultSame)
	lr[2] = TargetResult{Target: "lampyr", Result: ResultError, Detail: "404"}
	if c := NewCheck("domain mapping", time.Second, "", f.ApplyKnown("domain mapping", lr)); c.Passed {
		t.Fatalf("an undeclared target's error passed: %+v", c)
	}
	// A declared difference that did not happen is stale and fails.
	c = NewCheck("domain mapping", time.Second, "", f.ApplyKnown("domain mapping", results(ResultSame)))
	if c.Passed || c.Targets[1].Result != ResultStale || !strings.Contains(c.Detail, "remove the declaration") {
		t.Fatalf("stale declaration: %+v", c)
	}
	md := NewNWayReport("stock", nil, []Check{NewCheck("domain mapping", time.Second, "", f.ApplyKnown("domain mapping", results(ResultError)))}, time.Second).Markdown()
	if !strings.Contains(md, "## Known differences") || !strings.Contains(md, "domain mapping, stock-tk: traefik-knative has no host rewrite") {
		t.Fatalf("report does not list the known difference:\n%s", md)
	}
	// Declarations are checked when the file loads.
	for _, k := range []Known{{Target: "nope", Check: "x", Reason: "y"}, {Target: "stock", Check: "x", Reason: "y"}, {Target: "lampyr", Check: "", Reason: "y"}, {Target: "lampyr", Check: "x"}} {
		g := *f
		g.Known = []Known{k}
		if err := g.Validate("t.yaml"); err == nil || !strings.Contains(err.Error(), "known[0]") {
			t.Errorf("%+v: %v, want an error naming known[0]", k, err)
		}
	}
}
