package upstream

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const goTestJSON = `{"Action":"start","Package":"knative.dev/serving/test/conformance/api/v1"}
{"Action":"run","Test":"TestBlueGreenRoute"}
{"Action":"output","Test":"TestBlueGreenRoute","Output":"=== RUN   TestBlueGreenRoute\n"}
{"Action":"pass","Test":"TestBlueGreenRoute","Elapsed":21.5}
{"Action":"run","Test":"TestSingleConcurrency"}
{"Action":"run","Test":"TestSingleConcurrency/sub"}
{"Action":"output","Test":"TestSingleConcurrency/sub","Output":"    single_threaded_test.go:88: Error: 2 concurrent requests reached the container\n"}
{"Action":"fail","Test":"TestSingleConcurrency/sub","Elapsed":3}
{"Action":"fail","Test":"TestSingleConcurrency","Elapsed":30.2}
{"Action":"run","Test":"TestMustHaveSysctlReadOnly"}
{"Action":"output","Test":"TestMustHaveSysctlReadOnly","Output":"    sysctl_test.go:30: Skipping: sysctls are an optional API\n"}
{"Action":"skip","Test":"TestMustHaveSysctlReadOnly","Elapsed":0}
{"Action":"run","Test":"TestServiceCreateWithEmptyDir"}
{"Action":"output","Test":"TestServiceCreateWithEmptyDir","Output":"    service_test.go:895: \n"}
{"Action":"skip","Test":"TestServiceCreateWithEmptyDir","Elapsed":0}
{"Action":"run","Test":"TestRevisionTimeout"}
{"Action":"output","Test":"TestRevisionTimeout","Output":"    revision_timeout_test.go:99: Service not Ready: RevisionFailed\n"}
{"Action":"fail","Test":"TestRevisionTimeout","Elapsed":120}
{"Action":"output","Output":"FAIL\n"}
{"Action":"fail","Package":"knative.dev/serving/test/conformance/api/v1","Elapsed":150}
`

func TestParseRollsUpSubtestsAndKeepsCauses(t *testing.T) {
	var seen []string
	rs, loose := Parse(strings.NewReader(goTestJSON), func(r Result) { seen = append(seen, r.Name) })
	if len(rs) != 5 || len(seen) != 5 {
		t.Fatalf("results %+v (callbacks %v)", rs, seen)
	}
	by := map[string]Result{}
	for _, r := range rs {
		by[r.Name] = r
	}
	if r := by["TestSingleConcurrency"]; r.Outcome != Fail || r.Subtests != 1 || len(r.FailedSubtests) != 1 ||
		Cause(r.Reason) != "single_threaded_test.go:88: Error: 2 concurrent requests reached the container" {
		t.Errorf("TestSingleConcurrency: %+v (cause %q)", r, Cause(r.Reason))
	}
	if r := by["TestMustHaveSysctlReadOnly"]; r.Outcome != Skip || !strings.Contains(r.Reason, "optional API") {
		t.Errorf("skip: %+v", r)
	}
	if r := by["TestServiceCreateWithEmptyDir"]; r.Outcome != Skip || !strings.Contains(r.Reason, "without a message at service_test.go:895") {
		t.Errorf("a skip without a message says where: %+v", r)
	}
	if r := by["TestBlueGreenRoute"]; r.Outcome != Pass || r.Seconds != 21.5 || r.Reason != "" {
		t.Errorf("pass: %+v", r)
	}
	if !strings.Contains(loose, "FAIL") {
		t.Errorf("output outside tests is kept for build errors: %q", loose)
	}
}

func TestApplyDeclarations(t *testing.T) {
	rs, _ := Parse(strings.NewReader(goTestJSON), nil)
	decl := map[string]Declared{
		"TestSingleConcurrency": {Test: "api/TestSingleConcurrency", Outcome: Fail, Feature: "f1", Reason: "r1"},
		"TestBlueGreenRoute":    {Test: "api/TestBlueGreenRoute", Outcome: Fail, Feature: "f2", Reason: "r2"},
		"TestProbe":             {Test: "api/TestProbe", Outcome: Skip, Feature: "probes", Reason: "no probes"},
		"TestGone":              {Test: "api/TestGone", Outcome: Fail, Feature: "x", Reason: "y"},
	}
	rs, v := Apply("api", rs, decl)
	if v.Passed != 1 || v.Failed != 1 || v.ExpectedFailures != 1 || v.Skipped != 3 {
		t.Errorf("verdict %+v", v)
	}
	if strings.Join(v.Undeclared, ",") != "api/TestRevisionTimeout" {
		t.Errorf("undeclared %v", v.Undeclared)
	}
	if strings.Join(v.UnexpectedPasses, ",") != "api/TestBlueGreenRoute" {
		t.Errorf("unexpected passes %v", v.UnexpectedPasses)
	}
	if strings.Join(v.Missing, ",") != "api/TestGone" {
		t.Errorf("missing %v", v.Missing)
	}
	if v.OK() {
		t.Error("an undeclared failure must fail the run")
	}
	var probe Result
	for _, r := range rs {
		if r.Name == "TestProbe" {
			probe = r
		}
	}
	if probe.Outcome != Skip || probe.Feature != "probes" || probe.Declared != "no probes" {
		t.Errorf("a declared skip is reported with its reason: %+v", probe)
	}
	sr := NewSuiteReport(Suite{Name: "api"}, 1, rs, v, nil)
	if sr.Result != "failure" {
		t.Errorf("suite result %s", sr.Result)
	}
	_, clean := Apply("api", []Result{{Name: "TestA", Outcome: Fail}}, map[string]Declared{"TestA": {Outcome: Fail, Feature: "f", Reason: "r"}})
	if sr := NewSuiteReport(Suite{Name: "api"}, 1, nil, clean, nil); sr.Result != "partial" {
		t.Errorf("declared failures only: %s, want partial", sr.Result)
	}
}

func TestExpectationsNameTheBadField(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"implementation: x\ntests:\n- test: TestA\n  outcome: fail\n  feature: f\n  reason: r\n":               "tests[0].test \"TestA\": write <suite>/<TestName>",
		"implementation: x\ntests:\n- test: api/TestA\n  outcome: maybe\n  feature: f\n  reason: r\n":          "tests[0] (api/TestA).outcome \"maybe\"",
		"implementation: x\ntests:\n- test: api/TestA\n  outcome: fail\n":                                      "feature and reason are required",
		"implementation: x\ntests:\n- test: api/TestA\n  outcome: fail\n  feature: f\n  reason: r\n  why: z\n": "unknown field \"why\"",
		"tests: []\n": "implementation is empty",
	} {
		p := filepath.Join(dir, "e.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadExpectations(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", body, err, want)
		}
	}
}

func TestTheRepositoryExpectationsLoad(t *testing.T) {
	files, _ := filepath.Glob("../expectations/*.yaml")
	if len(files) == 0 {
		t.Fatal("no conformance/expectations/*.yaml")
	}
	for _, f := range files {
		if _, err := LoadExpectations(f); err != nil {
			t.Error(err)
		}
	}
}

func TestReportRoundTripsAndRenders(t *testing.T) {
	rs, _ := Parse(strings.NewReader(goTestJSON), nil)
	rs, v := Apply("api", rs, map[string]Declared{"TestRevisionTimeout": {Outcome: Fail, Feature: "timeoutSeconds", Reason: "not yet"}})
	rep := &Report{Implementation: Implementation{Name: "lampyr", Version: "v1"}, Date: time.Unix(0, 0), Mode: "managed",
		Suites: []SuiteReport{NewSuiteReport(Suite{Name: "api", Package: "p"}, 150, rs, v, []string{"go", "test"})}, Reproduce: []string{"just test-conformance"}}
	rep.Finish()
	if rep.Result != "failure" {
		t.Errorf("an undeclared failure (TestSingleConcurrency) makes the report a failure, got %s", rep.Result)
	}
	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := yaml.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Kind != "ConformanceReport" || len(back.Suites[0].Tests) != 5 || back.Suites[0].Statistics.ExpectedFailures != 1 {
		t.Errorf("round trip: %+v", back)
	}
	j, _ := os.ReadFile(filepath.Join(dir, "junit.xml"))
	if !strings.Contains(string(j), `<skipped message="expected-fail (needs timeoutSeconds): not yet">`) || !strings.Contains(string(j), `<failure message="single_threaded_test.go:88`) {
		t.Errorf("junit:\n%s", j)
	}
	side := SideBySide(&back, rep)
	if !strings.Contains(side, "| api | TestRevisionTimeout | expected-fail | expected-fail | not yet |") {
		t.Errorf("side by side:\n%s", side)
	}
}

// A rooted suite (networking's ingress conformance) runs every test as a
// subtest of one Go test, some with "/" in their names: go test's -skip
// must select exactly the declared ones, and the results are the suite's
// tests, not the root. Runs real go test on a suite of that shape.
func TestRootedSuiteSkipsAndParsesSubtestsByName(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs a small test package")
	}
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/rooted\n\ngo 1.22\n")
	write("rooted_test.go", `package rooted

import "testing"

func TestRoot(t *testing.T) {
	for _, name := range []string{"basics", "basics/http2", "dispatch/path", "dispatch/rule", "update"} {
		t.Run(name, func(t *testing.T) {
			t.Run("inner", func(t *testing.T) {
				if name == "dispatch/rule" {
					t.Error("Error: rule not applied")
				}
			})
		})
	}
}
`)
	s := Suite{Name: "ingress", Package: "./", Root: "TestRoot", Tests: []string{"basics", "basics/http2", "dispatch/path", "dispatch/rule", "update"}}
	var raw strings.Builder
	rs, err := Run(t.Context(), Invocation{Suite: s, Dir: dir, Skip: []string{"basics/http2", "update"}, Raw: &raw, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Result{}
	for _, r := range rs {
		got[r.Name] = r
	}
	if len(rs) != 3 {
		t.Fatalf("want basics, dispatch/path and dispatch/rule (the two skipped are not run), got %+v\n%s", rs, raw.String())
	}
	if r := got["basics"]; r.Outcome != Pass || r.Subtests != 1 {
		t.Errorf("basics: %+v", r)
	}
	if r := got["dispatch/rule"]; r.Outcome != Fail || len(r.FailedSubtests) != 1 || r.FailedSubtests[0] != "inner" || Cause(r.Reason) != "rooted_test.go:10: Error: rule not applied" {
		t.Errorf("dispatch/rule: %+v (cause %q)", r, Cause(r.Reason))
	}
	if _, ok := got["TestRoot"]; ok {
		t.Error("the root is not one of the suite's tests")
	}
	_, v := Apply("ingress", rs, map[string]Declared{"dispatch/rule": {Outcome: Fail, Feature: "f", Reason: "r"}, "update": {Outcome: Skip, Feature: "f", Reason: "r"}})
	if !v.OK() || v.ExpectedFailures != 1 || v.Skipped != 1 || v.Passed != 2 {
		t.Errorf("verdict %+v", v)
	}
}

// An unsupported feature must name the tests that show it: its own, or
// tests declared with it. One that names none is refused when the file is
// loaded, naming the feature and the fix.
func TestAFeatureNamingNoTestIsRefused(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"implementation: x\nunsupportedFeatures:\n- name: volumes\n  reason: r\n":                                                                   "unsupportedFeatures[0] (volumes) names no test",
		"implementation: x\nunsupportedFeatures:\n- name: volumes\n  reason: r\n  tests: [TestSecretVolume]\n":                                      "tests[0] \"TestSecretVolume\": write <suite>/<TestName>",
		"implementation: x\nunsupportedFeatures:\n- name: volumes\n  reason: r\n  tests: [api/A]\n- name: volumes\n  reason: r\n  tests: [api/B]\n": "volumes is declared twice",
		"implementation: x\nunsupportedFeatures:\n- name: volumes\n  tests: [api/A]\n":                                                              "name and reason are required",
	} {
		p := filepath.Join(dir, "e.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadExpectations(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", body, err, want)
		}
	}
	ok := "implementation: x\nunsupportedFeatures:\n- name: volumes\n  reason: r\n  tests: [api/TestSecretVolume]\n- name: env\n  reason: r\ntests:\n- test: runtime/TestConfigsViaEnv\n  outcome: skip\n  feature: env\n  reason: r\n"
	p := filepath.Join(dir, "ok.yaml")
	if err := os.WriteFile(p, []byte(ok), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := LoadExpectations(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.UnsupportedWithTests(); strings.Join(got[0].Tests, ",") != "api/TestSecretVolume" || strings.Join(got[1].Tests, ",") != "runtime/TestConfigsViaEnv" {
		t.Errorf("features' tests: %+v", got)
	}
}

// A claim is checked against the run: shown when a test it names fails,
// stale when every one passes (the run fails), unchecked when some did
// not run, unconfirmed when an intermittent feature's tests all pass.
func TestClaimsAreCheckedAgainstTheRun(t *testing.T) {
	suites := []SuiteReport{
		{Suite: Suite{Name: "api"}, Result: "success", Tests: []Result{{Name: "TestA", Outcome: Pass}, {Name: "TestB", Outcome: ExpectedFail}, {Name: "TestS", Outcome: Skip}}},
		{Suite: Suite{Name: "runtime"}, Result: "success", Tests: []Result{{Name: "TestR", Outcome: Pass}}},
	}
	features := []Feature{
		{Name: "shown", Reason: "r", Tests: []string{"api/TestA", "api/TestB"}},
		{Name: "stale", Reason: "r", Tests: []string{"api/TestA", "runtime/TestR"}},
		{Name: "skipped", Reason: "r", Tests: []string{"api/TestA", "api/TestS"}},
		{Name: "elsewhere", Reason: "r", Tests: []string{"ingress/tls"}},
		{Name: "flaky", Reason: "r", Tests: []string{"runtime/TestR"}, Intermittent: true},
	}
	got := map[string]string{}
	for _, c := range CheckClaims(features, suites) {
		got[c.Feature] = c.Verdict
	}
	want := map[string]string{"shown": ClaimShown, "stale": ClaimStale, "skipped": ClaimUnchecked, "elsewhere": ClaimUnchecked, "flaky": ClaimUnconfirmed}
	for f, v := range want {
		if got[f] != v {
			t.Errorf("%s: verdict %q, want %q", f, got[f], v)
		}
	}

	// The same report without the stale claim succeeds; with it, it fails.
	rep := &Report{Implementation: Implementation{Name: "lampyr"}, Unsupported: []Feature{features[0], features[2]}, Suites: suites}
	rep.Finish()
	if rep.Result != "success" {
		t.Fatalf("no stale claim: result %s", rep.Result)
	}
	rep.Unsupported = append(rep.Unsupported, features[1])
	rep.Finish()
	if rep.Result != "failure" || len(StaleClaims(rep.Claims)) != 1 {
		t.Fatalf("a stale claim must fail the report: result %s, claims %+v", rep.Result, rep.Claims)
	}
	j, err := rep.JUnit()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `<testcase name="stale" classname="claims" time="0">`) || !strings.Contains(string(j), `stale claim: every test it names passed`) {
		t.Errorf("junit has no failing claims case:\n%s", j)
	}
	if md := Markdown(rep); !strings.Contains(md, "**Stale claims (every test they name passed: remove them):** stale") ||
		!strings.Contains(md, "| stale | stale | api/TestA: pass, runtime/TestR: pass |") {
		t.Errorf("markdown:\n%s", md)
	}
}

// The whole path on a repository file: a stale claim added on purpose to
// conformance/expectations/lampyr-gateway-api.yaml (a feature named by a
// test that passed) fails the report the runner writes.
func TestAStaleClaimAddedOnPurposeFailsTheRun(t *testing.T) {
	b, err := os.ReadFile("../expectations/lampyr-gateway-api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), "unsupportedFeatures:\n", "unsupportedFeatures:\n- name: route listing\n  reason: added on purpose by this test\n  tests: [api/TestRouteGetAndList]\n", 1)
	p := filepath.Join(t.TempDir(), "lampyr-gateway-api.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := LoadExpectations(p)
	if err != nil {
		t.Fatal(err)
	}
	// Every declared api test fails as declared (skips are not run); the
	// planted feature's test passes.
	var results []Result
	for _, d := range e.Tests {
		if s, name, _ := strings.Cut(d.Test, "/"); s == "api" && d.Outcome == Fail {
			results = append(results, Result{Name: name, Outcome: Fail})
		}
	}
	results = append(results, Result{Name: "TestRouteGetAndList", Outcome: Pass})
	results, v := Apply("api", results, e.For("api"))
	rep := &Report{Implementation: Implementation{Name: "lampyr"}, Unsupported: e.UnsupportedWithTests(),
		Suites: []SuiteReport{NewSuiteReport(Suite{Name: "api"}, 1, results, v, nil)}}
	if rep.Suites[0].Result != "partial" {
		t.Fatalf("the api suite alone conforms to its declarations: %s", rep.Suites[0].Result)
	}
	rep.Finish()
	stale := StaleClaims(rep.Claims)
	if rep.Result != "failure" || len(stale) != 1 || stale[0].Feature != "route listing" {
		t.Fatalf("result %s, stale %+v: the planted claim must fail the run", rep.Result, stale)
	}
}
