package lampyr

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/conformance/upstream"
)

// The declaration and report logic, without a cluster.

func fakeTests() []Test {
	nop := func(context.Context, *T) {}
	return []Test{
		{Name: "a", Feature: FeatureServing, Labels: []string{LabelRouting}, Assert: nop},
		{Name: "b", Feature: FeatureRestart, Labels: []string{LabelRestart}, Assert: nop},
		{Name: "c", Feature: FeatureKeyRotation, Assert: nop},
		{Name: "d", Feature: FeatureServing, Assert: nop},
	}
}

func exp(tests ...upstream.Declared) *upstream.Expectations {
	return &upstream.Expectations{Implementation: "x", Claimed: []string{"serving", "restart-recovery"},
		Unsupported: []upstream.Feature{{Name: "fleet-key-rotation", Reason: "one key forever"}}, Tests: tests}
}

func TestRepositoryDeclarationsMatchTheSuite(t *testing.T) {
	d, err := LoadDeclarations(filepath.Join(e2eutil.RepoRoot(), "conformance", "expectations", "lampyr.yaml"), Tests)
	if err != nil {
		t.Fatal(err)
	}
	for _, test := range Tests {
		if dec := d.Decide(test); dec.Skip != "" || dec.Declared != nil {
			t.Errorf("%s: this repository's Lampyr claims every feature and declares nothing, got %+v", test.Name, dec)
		}
	}
}

func TestCheckNamesEachMistake(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *upstream.Expectations
		want string
	}{
		{"stale", exp(upstream.Declared{Test: "lampyr/gone", Outcome: upstream.Fail, Feature: "serving", Reason: "r"}), `"lampyr/gone": the suite has no such test`},
		{"other suite", exp(upstream.Declared{Test: "api/a", Outcome: upstream.Fail, Feature: "serving", Reason: "r"}), "write lampyr/<test>"},
		{"wrong feature", exp(upstream.Declared{Test: "lampyr/a", Outcome: upstream.Fail, Feature: "repair", Reason: "r"}), "the test needs feature serving"},
		{"unclaimed", exp(upstream.Declared{Test: "lampyr/c", Outcome: upstream.Fail, Feature: "fleet-key-rotation", Reason: "r"}), "feature fleet-key-rotation is not claimed"},
		{"no reason", exp(upstream.Declared{Test: "lampyr/a", Outcome: upstream.Fail, Feature: "serving"}), "feature and reason are required"},
		{"unknown claim", &upstream.Expectations{Implementation: "x", Claimed: []string{"teleport"}}, `claimedFeatures[0] "teleport": no such feature`},
		{"feature's test of another feature", &upstream.Expectations{Implementation: "x", Unsupported: []upstream.Feature{{Name: "fleet-key-rotation", Reason: "r", Tests: []string{"lampyr/a"}}}}, `tests[0] "lampyr/a": not a lampyr test of feature fleet-key-rotation`},
		{"both", &upstream.Expectations{Implementation: "x", Claimed: []string{"serving"}, Unsupported: []upstream.Feature{{Name: "serving", Reason: "r"}}}, "both claimed and unsupported"},
	} {
		_, err := Check("f.yaml", tc.e, fakeTests())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	dup := append(fakeTests(), Test{Name: "a", Feature: FeatureServing, Assert: func(context.Context, *T) {}})
	if _, err := Check("f.yaml", exp(), dup); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("a test defined twice: %v", err)
	}
}

func TestDecideAndJudge(t *testing.T) {
	d, err := Check("f.yaml", exp(
		upstream.Declared{Test: "lampyr/b", Outcome: upstream.Fail, Feature: "restart-recovery", Reason: "slow"},
		upstream.Declared{Test: "lampyr/d", Outcome: upstream.Skip, Feature: "serving", Reason: "hangs"},
	), fakeTests())
	if err != nil {
		t.Fatal(err)
	}
	tests := fakeTests()
	a, b, c, dd := d.Decide(tests[0]), d.Decide(tests[1]), d.Decide(tests[2]), d.Decide(tests[3])
	if a.Skip != "" || a.Declared != nil {
		t.Errorf("claimed, undeclared: %+v", a)
	}
	if !strings.Contains(c.Skip, "feature fleet-key-rotation is not claimed (f.yaml: one key forever)") {
		t.Errorf("unclaimed: %q", c.Skip)
	}
	if !strings.Contains(dd.Skip, "declared skip in f.yaml (needs serving): hangs") {
		t.Errorf("declared skip: %q", dd.Skip)
	}
	if b.Skip != "" || b.Declared == nil {
		t.Errorf("declared failure runs: %+v", b)
	}
	if err := a.Judge(""); err != nil {
		t.Errorf("pass: %v", err)
	}
	if err := a.Judge("x.go:1: boom"); err == nil || err.Error() != "x.go:1: boom" {
		t.Errorf("undeclared failure: %v", err)
	}
	if err := b.Judge("x.go:1: boom"); err != nil {
		t.Errorf("declared failure that fails: %v", err)
	}
	if err := b.Judge(""); err == nil || !strings.Contains(err.Error(), "lampyr/b is declared to fail in f.yaml (needs restart-recovery: slow), but it passed: remove the declaration") {
		t.Errorf("declared failure that passes: %v", err)
	}
}

func TestReportAppliesDeclarations(t *testing.T) {
	d, err := Check("f.yaml", exp(upstream.Declared{Test: "lampyr/b", Outcome: upstream.Fail, Feature: "restart-recovery", Reason: "slow"}), fakeTests())
	if err != nil {
		t.Fatal(err)
	}
	unclaimed := SpecResult{Name: "c", State: "skipped", Message: "feature fleet-key-rotation is not claimed"}
	for _, tc := range []struct {
		name   string
		specs  []SpecResult
		sel    string
		result string
		check  func(upstream.SuiteReport) bool
	}{
		{"expected failure", []SpecResult{{Name: "a", State: "passed", Assertion: AssertionPassed}, {Name: "b", State: "passed", Assertion: AssertionFailed, Message: "x.go:1: boom"}, unclaimed, {Name: "d", State: "passed", Assertion: AssertionPassed}}, "", "partial",
			func(s upstream.SuiteReport) bool {
				return s.Statistics == upstream.Statistics{Passed: 2, ExpectedFailures: 1, Skipped: 1} && s.Tests[1].Outcome == upstream.ExpectedFail && s.Tests[1].Declared == "slow" &&
					s.Tests[2].Declared == "not claimed: one key forever" && s.Tests[0].Labels[0] == LabelRouting
			}},
		{"undeclared failure", []SpecResult{{Name: "a", State: "failed", Assertion: AssertionFailed, Message: "x.go:1: boom"}, {Name: "b", State: "passed", Assertion: AssertionFailed}, unclaimed, {Name: "d", State: "passed", Assertion: AssertionPassed}}, "", "failure",
			func(s upstream.SuiteReport) bool {
				return strings.Join(s.Undeclared, ",") == "lampyr/a" && s.Tests[0].Reason == "x.go:1: boom"
			}},
		{"declared failure passed", []SpecResult{{Name: "a", State: "passed", Assertion: AssertionPassed}, {Name: "b", State: "failed", Assertion: AssertionPassed, Message: "declared to fail"}, unclaimed, {Name: "d", State: "passed", Assertion: AssertionPassed}}, "", "failure",
			func(s upstream.SuiteReport) bool {
				return strings.Join(s.UnexpectedPasses, ",") == "lampyr/b" && s.Tests[1].Outcome == upstream.Pass
			}},
		{"failed outside the assertion", []SpecResult{{Name: "a", State: "failed", Assertion: AssertionPassed, Message: "cleanup failed"}, {Name: "b", State: "passed", Assertion: AssertionFailed}, unclaimed, {Name: "d", State: "failed", Message: "namespace"}}, "", "failure",
			func(s upstream.SuiteReport) bool { return strings.Join(s.Undeclared, ",") == "lampyr/a,lampyr/d" }},
		{"label filter", []SpecResult{{Name: "a", State: "skipped"}, {Name: "b", State: "skipped"}, unclaimed, {Name: "d", State: "passed", Assertion: AssertionPassed}}, "label-filter routing", "partial",
			func(s upstream.SuiteReport) bool {
				return s.Tests[0].Reason == NotSelected && s.Selection == "label-filter routing"
			}},
	} {
		s := d.Report(tc.specs, 10, tc.sel, []string{"go", "test"})
		if s.Result != tc.result || !tc.check(s) {
			t.Errorf("%s: result %s (want %s): %+v", tc.name, s.Result, tc.result, s)
		}
		if strings.Join(s.Claimed, ",") != "restart-recovery,serving" || len(s.Unsupported) != 1 || strings.Join(s.Unsupported[0].Tests, ",") != "lampyr/c" {
			t.Errorf("%s: the suite's claims: %v %v", tc.name, s.Claimed, s.Unsupported)
		}
	}
}

func TestInterceptStopsAtTheFirstFailure(t *testing.T) {
	g := NewWithT(t)
	reached := false
	failure := Intercept(func() {
		Expect(1).To(Equal(2), "one is not two")
		reached = true
	})
	g.Expect(reached).To(BeFalse())
	g.Expect(failure).To(ContainSubstring("declared_test.go:"))
	g.Expect(failure).To(ContainSubstring("one is not two"))
	g.Expect(Intercept(func() { Expect(1).To(Equal(1)) })).To(BeEmpty())
	g.Expect(Intercept(func() { panic("bug") })).To(HavePrefix("panic: bug"))
}

// TestDeclaredRuns runs the suite's wiring as a real Ginkgo run
// (internal/declaredrun: tests that need no cluster) with right and wrong
// declarations: the exit status and the ConformanceReport must say what the
// declarations make of the results.
func TestDeclaredRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a test binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "declaredrun.test")
	if out, err := exec.Command("go", "test", "-c", "-o", bin, "./internal/declaredrun").CombinedOutput(); err != nil {
		t.Fatalf("building internal/declaredrun: %v\n%s", err, out)
	}
	const base = "implementation: fake\nclaimedFeatures: [serving, restart-recovery]\nunsupportedFeatures:\n- {name: fleet-key-rotation, reason: one key forever}\ntests:\n"
	const failsDeclared = "- {test: lampyr/fails, outcome: fail, feature: restart-recovery, reason: comes back slowly}\n"
	for _, tc := range []struct {
		name, decl string
		args       []string
		ok         bool
		result     string
		check      func(upstream.SuiteReport) string
	}{
		{"conforming", base + failsDeclared, nil, true, "partial", func(s upstream.SuiteReport) string {
			if s.Statistics != (upstream.Statistics{Passed: 1, ExpectedFailures: 1, Skipped: 1}) {
				return fmt.Sprintf("statistics %+v", s.Statistics)
			}
			return ""
		}},
		{"a passing test declared failing", base + failsDeclared + "- {test: lampyr/passes, outcome: fail, feature: serving, reason: wrong}\n", nil, false, "failure", func(s upstream.SuiteReport) string {
			if strings.Join(s.UnexpectedPasses, ",") != "lampyr/passes" {
				return fmt.Sprintf("unexpected passes %v", s.UnexpectedPasses)
			}
			return ""
		}},
		{"an undeclared failure", base + " []\n", nil, false, "failure", func(s upstream.SuiteReport) string {
			if strings.Join(s.Undeclared, ",") != "lampyr/fails" || !strings.Contains(s.Tests[0].Reason, "the component came back") {
				return fmt.Sprintf("undeclared %v, fails' reason %q", s.Undeclared, s.Tests[0].Reason)
			}
			return ""
		}},
		{"a label filter", base + failsDeclared, []string{"-ginkgo.label-filter=routing"}, true, "partial", func(s upstream.SuiteReport) string {
			if s.Selection != "label-filter routing" || s.Tests[0].Reason != NotSelected {
				return fmt.Sprintf("selection %q, fails' reason %q", s.Selection, s.Tests[0].Reason)
			}
			return ""
		}},
	} {
		sub := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		decl := filepath.Join(sub, "declarations.yaml")
		if err := os.WriteFile(decl, []byte(tc.decl), 0o644); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"-test.run=TestDeclaredRun", "-declaredrun.declarations=" + decl, "-declaredrun.report=" + sub}, tc.args...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if (err == nil) != tc.ok {
			t.Errorf("%s: run succeeded %v, want %v\n%s", tc.name, err == nil, tc.ok, out)
			continue
		}
		rep, err := upstream.ReadReport(filepath.Join(sub, "report.yaml"))
		if err != nil {
			t.Errorf("%s: no report: %v\n%s", tc.name, err, out)
			continue
		}
		s := rep.Suites[0]
		if s.Result != tc.result || rep.Result != tc.result {
			t.Errorf("%s: suite result %s, report %s, want %s", tc.name, s.Result, rep.Result, tc.result)
		}
		if msg := tc.check(s); msg != "" {
			t.Errorf("%s: %s", tc.name, msg)
		}
	}
}
