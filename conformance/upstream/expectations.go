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

// Feature is an unsupported feature and why it is not claimed.
type Feature struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
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

// LoadExpectations reads and checks a declaration file.
func LoadExpectations(path string) (*Expectations, error) {
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

// Validate names the first malformed entry and how to fix it.
func (e *Expectations) Validate(path string) error {
	if e.Implementation == "" {
		return fmt.Errorf("expectations %s: implementation is empty: name what the file declares (e.g. lampyr)", path)
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
