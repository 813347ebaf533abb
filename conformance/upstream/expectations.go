package upstream

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Expectations is what an implementation declares about an upstream suite
// before it runs: the features it claims, the ones it does not, and for each
// test it does not pass, which feature that test needs and why. A failure
// not declared here fails the run; a declared test that passes is reported,
// so the declaration can be removed.
type Expectations struct {
	// Implementation names what the file is about ("knative-serving", "lampyr").
	Implementation string `json:"implementation"`
	// Claimed and Unsupported are feature names, for the report.
	Claimed     []string  `json:"claimedFeatures,omitempty"`
	Unsupported []Feature `json:"unsupportedFeatures,omitempty"`
	// Tests declares, by "suite/TestName", what is expected of a test.
	Tests []Declared `json:"tests,omitempty"`
}

// Feature is an unsupported feature, why it is not claimed, and the
// upstream tests that show it is missing. A claim is checked on every run
// (Report.Finish): a feature whose tests all pass is stale and fails the
// run, as a declared failure of Lampyr's own suite that passes does.
type Feature struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
	// Tests are "<suite>/<TestName>" tests that fail, or cannot run,
	// without the feature, besides the tests declared with this feature
	// (both count: Expectations.FeatureTests). LoadExpectations refuses a
	// feature that names none: a claim nothing can check.
	Tests []string `json:"tests,omitempty"`
	// Intermittent: the tests fail on some runs only (a race the
	// implementation does not always lose, "routing right after a
	// change"); a run in which they all pass reports the claim as
	// unconfirmed instead of failing it as stale.
	Intermittent bool `json:"intermittent,omitempty"`
}

// Declared is one test's declared outcome.
type Declared struct {
	// Test is "<suite>/<TestName>", e.g. "api/TestSingleConcurrency".
	Test string `json:"test"`
	// Outcome is "fail" (run it; it is expected to fail) or "skip" (do not
	// run it: it would disturb the rest, or hang until its timeout).
	Outcome string `json:"outcome"`
	// Feature is the feature the test needs (one of Unsupported, or a
	// networking-layer feature).
	Feature string `json:"feature"`
	Reason  string `json:"reason"`
}

// LoadExpectations reads and checks a declaration file of Knative's
// upstream suites: every unsupported feature must name the tests that
// show it (RequireFeatureTests).
func LoadExpectations(path string) (*Expectations, error) {
	e, err := ReadExpectations(path)
	if err != nil {
		return nil, err
	}
	return e, e.RequireFeatureTests(path)
}

// ReadExpectations reads and checks a declaration file without requiring
// tests of its unsupported features: Lampyr's own suite knows the tests
// of each of its features (conformance/lampyr fills them in).
func ReadExpectations(path string) (*Expectations, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("expectations: %w", err)
	}
	var e Expectations
	if err := yaml.UnmarshalStrict(b, &e); err != nil {
		return nil, fmt.Errorf("expectations %s: %w", path, err)
	}
	return &e, e.Validate(path)
}

// RequireFeatureTests refuses an unsupported feature that names no test,
// neither in its own tests nor as the feature of a declared test: nothing
// could ever show the claim true or stale.
func (e *Expectations) RequireFeatureTests(path string) error {
	for i, f := range e.Unsupported {
		if len(e.FeatureTests(f.Name)) == 0 {
			return fmt.Errorf("expectations %s: unsupportedFeatures[%d] (%s) names no test: list under its tests the <suite>/<TestName> tests that fail without it (or declare them under tests with feature %q), so every run checks the claim", path, i, f.Name, f.Name)
		}
	}
	return nil
}

// FeatureTests are the tests that show feature name is missing: the
// feature's own tests, then those declared with it, each once, in that
// order.
func (e *Expectations) FeatureTests(name string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(t string) {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, f := range e.Unsupported {
		if f.Name == name {
			for _, t := range f.Tests {
				add(t)
			}
		}
	}
	for _, d := range e.Tests {
		if d.Feature == name {
			add(d.Test)
		}
	}
	return out
}

// UnsupportedWithTests are the unsupported features with every test that
// shows each (FeatureTests): what a report records and checks.
func (e *Expectations) UnsupportedWithTests() []Feature {
	if e == nil {
		return nil
	}
	out := make([]Feature, len(e.Unsupported))
	for i, f := range e.Unsupported {
		f.Tests = e.FeatureTests(f.Name)
		out[i] = f
	}
	return out
}

// Validate names the first malformed entry and how to fix it.
func (e *Expectations) Validate(path string) error {
	if e.Implementation == "" {
		return fmt.Errorf("expectations %s: implementation is empty: name what the file declares (e.g. lampyr)", path)
	}
	features := map[string]bool{}
	for i, f := range e.Unsupported {
		switch {
		case f.Name == "" || f.Reason == "":
			return fmt.Errorf("expectations %s: unsupportedFeatures[%d]: name and reason are required", path, i)
		case features[f.Name]:
			return fmt.Errorf("expectations %s: unsupportedFeatures[%d]: %s is declared twice", path, i, f.Name)
		}
		features[f.Name] = true
		for j, t := range f.Tests {
			if !strings.Contains(t, "/") {
				return fmt.Errorf("expectations %s: unsupportedFeatures[%d] (%s).tests[%d] %q: write <suite>/<TestName> (suites: api, runtime, ingress)", path, i, f.Name, j, t)
			}
		}
	}
	seen := map[string]bool{}
	for i, d := range e.Tests {
		switch {
		case !strings.Contains(d.Test, "/"):
			return fmt.Errorf("expectations %s: tests[%d].test %q: write <suite>/<TestName> (suites: api, runtime, ingress)", path, i, d.Test)
		case d.Outcome != Fail && d.Outcome != Skip:
			return fmt.Errorf("expectations %s: tests[%d] (%s).outcome %q: must be fail or skip", path, i, d.Test, d.Outcome)
		case d.Feature == "" || d.Reason == "":
			return fmt.Errorf("expectations %s: tests[%d] (%s): feature and reason are required: say which feature the test needs and why it is not claimed", path, i, d.Test)
		case seen[d.Test]:
			return fmt.Errorf("expectations %s: tests[%d]: %s is declared twice", path, i, d.Test)
		}
		seen[d.Test] = true
	}
	return nil
}

// For returns the declarations of one suite, by test name.
func (e *Expectations) For(suite string) map[string]Declared {
	out := map[string]Declared{}
	if e == nil {
		return out
	}
	for _, d := range e.Tests {
		if s, name, _ := strings.Cut(d.Test, "/"); s == suite {
			out[name] = d
		}
	}
	return out
}

// Skips lists the tests of a suite declared "skip".
func (e *Expectations) Skips(suite string) []string {
	var out []string
	for name, d := range e.For(suite) {
		if d.Outcome == Skip {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Verdict of a suite's run against its declarations.
type Verdict struct {
	Passed, Failed, Skipped, ExpectedFailures int
	// Undeclared are failures no declaration covers: they fail the run.
	Undeclared []string
	// UnexpectedPasses are declared failures that passed: remove their
	// declaration.
	UnexpectedPasses []string
	// Missing are declared tests the suite did not report (renamed or gone
	// upstream): remove or fix their declaration.
	Missing []string
}

// Apply marks declared failures and skips on results (in place, adding a
// result for each declared skip, which go test does not report) and returns
// the verdict.
func Apply(suite string, results []Result, decl map[string]Declared) ([]Result, Verdict) {
	var v Verdict
	reported := map[string]bool{}
	for i := range results {
		r := &results[i]
		reported[r.Name] = true
		d, ok := decl[r.Name]
		if ok {
			r.Feature, r.Declared = d.Feature, d.Reason
		}
		switch {
		case r.Outcome == Fail && ok:
			r.Outcome = ExpectedFail
			v.ExpectedFailures++
		case r.Outcome == Fail:
			v.Failed++
			v.Undeclared = append(v.Undeclared, suite+"/"+r.Name)
		case r.Outcome == Pass && ok:
			v.Passed++
			v.UnexpectedPasses = append(v.UnexpectedPasses, suite+"/"+r.Name)
		case r.Outcome == Pass:
			v.Passed++
		case r.Outcome == Skip:
			v.Skipped++
		}
	}
	names := make([]string, 0, len(decl))
	for n := range decl {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := decl[n]
		if reported[n] {
			continue
		}
		if d.Outcome == Skip {
			results = append(results, Result{Name: n, Outcome: Skip, Feature: d.Feature, Declared: d.Reason, Reason: "not run: declared skip"})
			v.Skipped++
			continue
		}
		v.Missing = append(v.Missing, suite+"/"+n)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Name < results[j].Name })
	return results, v
}

// OK tells whether the run conforms to its declarations.
func (v Verdict) OK() bool { return len(v.Undeclared) == 0 && len(v.Missing) == 0 }
