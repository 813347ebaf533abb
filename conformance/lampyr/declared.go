package lampyr

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/conformance/upstream"
)

// SuiteName names this suite in declarations ("lampyr/<test>") and in the
// ConformanceReport.
const SuiteName = "lampyr"

// Suite is this suite's section header in a ConformanceReport.
var Suite = upstream.Suite{Name: SuiteName, Package: "lampyr.dev/serving/conformance/lampyr", Module: "lampyr.dev/serving"}

// Feature is a behaviour an implementation claims. Every test needs one;
// an implementation that does not claim it has the test skipped.
type Feature string

// The suite's features.
const (
	FeatureInstallation   Feature = "installation"
	FeatureServing        Feature = "serving"
	FeatureTemplateSubset Feature = "template-subset"
	FeatureMaxScale       Feature = "max-scale"
	FeatureTimeout        Feature = "timeout-seconds"
	FeatureImageSnapshots Feature = "image-snapshots"
	FeatureCapacity       Feature = "capacity-grants"
	FeatureReadiness      Feature = "readiness-conditions"
	FeatureRepair         Feature = "repair"
	FeatureFresh          Feature = "execution-fresh"
	FeatureReuse          Feature = "execution-reuse"
	FeatureRestart        Feature = "restart-recovery"
	FeatureKeyRotation    Feature = "fleet-key-rotation"
	FeatureFinalization   Feature = "finalization"
)

// Features says what claiming each feature means (the declarations file's
// vocabulary).
var Features = map[Feature]string{
	FeatureInstallation:   "the lampyr install profile: no stock controller, activator or autoscaler; Lampyr's three Deployments",
	FeatureServing:        "a Service's Revision gets a CapacityGrant, a Home outside the tenant's namespace, a backend Service, router metadata, and is served from fibers through the gateway",
	FeatureTemplateSubset: "every Revision template field outside the subset is Ready=False naming it, with no grant; the supported fields reach the CapacityGrant",
	FeatureMaxScale:       "one request per fiber, never more than max-scale fibers at once",
	FeatureTimeout:        "timeoutSeconds ends a request, a stream and a WebSocket",
	FeatureImageSnapshots: "image-only Services run from the snapshot config-lampyr maps their image to; a missing snapshot is ContainerMissing",
	FeatureCapacity:       "a grant over the installation's limits keeps the Revision not Ready with ResourcesAvailable=False naming the limit",
	FeatureReadiness:      "a Home that cannot load its template keeps the Revision not Ready with the Home's reason",
	FeatureRepair:         "a deleted backend Service and router metadata are restored",
	FeatureFresh:          "execution mode fresh: a process per request",
	FeatureReuse:          "execution mode reuse: fibers kept between requests over fiberd tunnels, released after idleTimeout",
	FeatureRestart:        "Services become Ready and are served while a Lampyr component is killed mid-operation",
	FeatureKeyRotation:    "a fleet key rotation keeps Revisions sealed to the old key running, and seals new ones to the new key",
	FeatureFinalization:   "deleting Services removes everything Lampyr made for their Revisions",
}

// Test is one declared conformance test: what it needs, what it applies
// and what it asserts. The suite is a list of them (Tests).
type Test struct {
	// Name is short and stable: the report's row, the declarations'
	// "lampyr/<Name>", the first words of the spec and the test's
	// namespace (NamespacePrefix + Name).
	Name string
	// Description completes the spec's text.
	Description string
	Feature     Feature
	// Labels select tests (-ginkgo.label-filter=restart).
	Labels []string
	// Manifests are the objects the test applies, in order, in its own
	// namespace before Assert runs. It may prepare what they refer to
	// (an image mapping in config-lampyr), registering its cleanup with
	// DeferCleanup.
	Manifests func(ctx context.Context, t *T) []*unstructured.Unstructured
	// Assert makes the test's assertions with Gomega (not in other
	// goroutines: a failure stops Assert, and the suite decides with
	// the declarations whether it fails the run).
	Assert func(ctx context.Context, t *T)
}

// NamespacePrefix starts every test's namespace.
const NamespacePrefix = "lampyr-conformance-"

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkTests finds mistakes in the suite itself.
func checkTests(tests []Test) error {
	seen := map[string]bool{}
	for i, t := range tests {
		switch {
		case !nameRE.MatchString(t.Name) || len(NamespacePrefix+t.Name) > 63:
			return fmt.Errorf("tests[%d].Name %q: use lowercase letters, digits and '-', at most %d characters (it names a namespace)", i, t.Name, 63-len(NamespacePrefix))
		case seen[t.Name]:
			return fmt.Errorf("tests[%d]: %s is defined twice", i, t.Name)
		case Features[t.Feature] == "":
			return fmt.Errorf("tests[%d] (%s).Feature %q: not in Features; add it there with what claiming it means", i, t.Name, t.Feature)
		case t.Assert == nil:
			return fmt.Errorf("tests[%d] (%s): Assert is nil", i, t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// Declarations are an implementation's claims and declared outcomes for
// this suite (upstream.Expectations, the format conformance/upstream
// reads), checked against the suite's tests.
type Declarations struct {
	// File is where they came from, for messages.
	File        string
	Exp         *upstream.Expectations
	tests       map[string]Test
	claimed     map[Feature]bool
	unsupported map[Feature]string
	declared    map[string]upstream.Declared
}

// LoadDeclarations reads path and checks it against tests.
func LoadDeclarations(path string, tests []Test) (*Declarations, error) {
	// The suite itself knows which tests need each feature: a file for it
	// need not name them (Check fills them in).
	e, err := upstream.ReadExpectations(path)
	if err != nil {
		return nil, err
	}
	return Check(path, e, tests)
}

// Check matches declarations against the suite. Every mistake is an error
// naming the entry and the fix: an unknown feature, a feature both claimed
// and unsupported, a declaration of a test the suite does not have (stale),
// of another suite, with another feature than the test's, or of a test
// whose feature is not claimed (it is skipped anyway).
func Check(path string, e *upstream.Expectations, tests []Test) (*Declarations, error) {
	if err := checkTests(tests); err != nil {
		return nil, err
	}
	if err := e.Validate(path); err != nil {
		return nil, err
	}
	d := &Declarations{File: path, Exp: e, tests: map[string]Test{}, claimed: map[Feature]bool{}, unsupported: map[Feature]string{}, declared: map[string]upstream.Declared{}}
	for _, t := range tests {
		d.tests[t.Name] = t
	}
	known := func() string {
		names := make([]string, 0, len(Features))
		for f := range Features {
			names = append(names, string(f))
		}
		sort.Strings(names)
		return strings.Join(names, ", ")
	}
	for i, c := range e.Claimed {
		f := Feature(c)
		if Features[f] == "" {
			return nil, fmt.Errorf("declarations %s: claimedFeatures[%d] %q: no such feature in the Lampyr suite (known: %s)", path, i, c, known())
		}
		d.claimed[f] = true
	}
	for i, u := range e.Unsupported {
		f := Feature(u.Name)
		switch {
		case Features[f] == "":
			return nil, fmt.Errorf("declarations %s: unsupportedFeatures[%d].name %q: no such feature in the Lampyr suite (known: %s)", path, i, u.Name, known())
		case d.claimed[f]:
			return nil, fmt.Errorf("declarations %s: feature %s is both claimed and unsupported: keep one", path, f)
		case u.Reason == "":
			return nil, fmt.Errorf("declarations %s: unsupportedFeatures[%d] (%s): say why in reason", path, i, u.Name)
		}
		for j, named := range u.Tests {
			suite, name, _ := strings.Cut(named, "/")
			if t, ok := d.tests[name]; suite != SuiteName || !ok || t.Feature != f {
				return nil, fmt.Errorf("declarations %s: unsupportedFeatures[%d] (%s).tests[%d] %q: not a %s test of feature %s (leave tests out: the suite knows them)", path, i, u.Name, j, named, SuiteName, f)
			}
		}
		d.unsupported[f] = u.Reason
	}
	for i, dt := range e.Tests {
		suite, name, _ := strings.Cut(dt.Test, "/")
		t, ok := d.tests[name]
		switch {
		case suite != SuiteName:
			return nil, fmt.Errorf("declarations %s: tests[%d].test %q: this file declares the %s suite: write %s/<test>", path, i, dt.Test, SuiteName, SuiteName)
		case !ok:
			return nil, fmt.Errorf("declarations %s: tests[%d].test %q: the suite has no such test (renamed or removed): fix or remove the declaration (tests: %s)", path, i, dt.Test, strings.Join(d.names(), ", "))
		case Feature(dt.Feature) != t.Feature:
			return nil, fmt.Errorf("declarations %s: tests[%d] (%s).feature %q: the test needs feature %s: write that", path, i, dt.Test, dt.Feature, t.Feature)
		case !d.claimed[t.Feature]:
			return nil, fmt.Errorf("declarations %s: tests[%d] (%s): feature %s is not claimed, so the test is skipped: remove the declaration (or claim the feature)", path, i, dt.Test, t.Feature)
		}
		d.declared[name] = dt
	}
	return d, nil
}

func (d *Declarations) names() []string {
	out := make([]string, 0, len(d.tests))
	for n := range d.tests {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Decision is what the suite does with one test.
type Decision struct {
	Test Test
	// Skip, when set, is why the test does not run.
	Skip string
	// Declared is the test's declaration, if any (a declared failure when
	// the test runs).
	Declared *upstream.Declared
	file     string
}

// Decide says whether a test runs and what is expected of it.
func (d *Declarations) Decide(t Test) Decision {
	dec := Decision{Test: t, file: d.File}
	if dt, ok := d.declared[t.Name]; ok {
		dec.Declared = &dt
	}
	switch {
	case !d.claimed[t.Feature] && d.unsupported[t.Feature] != "":
		dec.Skip = fmt.Sprintf("feature %s is not claimed (%s: %s)", t.Feature, d.File, d.unsupported[t.Feature])
	case !d.claimed[t.Feature]:
		dec.Skip = fmt.Sprintf("feature %s is not claimed in %s", t.Feature, d.File)
	case dec.Declared != nil && dec.Declared.Outcome == upstream.Skip:
		dec.Skip = fmt.Sprintf("declared skip in %s (needs %s): %s", d.File, t.Feature, dec.Declared.Reason)
	}
	return dec
}

// Judge turns the assertion's outcome (failure empty: it passed) into the
// spec's: nil when the run conforms to the declarations. A declared
// failure that fails conforms; an undeclared failure does not, nor does a
// declared failure that passes (remove the declaration).
func (dec Decision) Judge(failure string) error {
	declaredFail := dec.Declared != nil && dec.Declared.Outcome == upstream.Fail
	switch {
	case failure != "" && declaredFail:
		return nil
	case failure != "":
		return fmt.Errorf("%s", failure)
	case declaredFail:
		return fmt.Errorf("%s/%s is declared to fail in %s (needs %s: %s), but it passed: remove the declaration",
			SuiteName, dec.Test.Name, dec.file, dec.Declared.Feature, dec.Declared.Reason)
	}
	return nil
}

// Assertion outcomes a spec records (ReportEntry AssertionEntry).
const (
	AssertionPassed = "passed"
	AssertionFailed = "failed"
)

// SpecResult is what one spec's run says about its test, read from the
// Ginkgo report.
type SpecResult struct {
	Name string
	// State is passed, failed or skipped (Ginkgo's: failed includes
	// panicked, timed out, interrupted and aborted).
	State string
	// Assertion is AssertionPassed or AssertionFailed when Assert ran to
	// an end; empty when the spec ended before (setup failed, skipped).
	Assertion string
	// Message is the assertion's failure, else the spec's failure or skip
	// message.
	Message string
	Seconds float64
}

// NotSelected is the reason of a test the run's filters left out.
const NotSelected = "not selected by the run's filters (-ginkgo.label-filter, -ginkgo.focus)"

// Report checks the specs' results against the declarations, as
// conformance/upstream checks an upstream suite's, and returns the suite's
// section of a ConformanceReport. Stricter than upstream's: a declared
// failure that passed fails the suite too. selection names the run's
// filters ("" when every test was selected).
func (d *Declarations) Report(specs []SpecResult, seconds float64, selection string, cmd []string) upstream.SuiteReport {
	var results []upstream.Result
	for _, s := range specs {
		t := d.tests[s.Name]
		r := upstream.Result{Name: s.Name, Seconds: s.Seconds, Feature: string(t.Feature), Labels: t.Labels}
		switch {
		case s.State == "skipped":
			r.Outcome, r.Reason = upstream.Skip, s.Message
			if r.Reason == "" {
				r.Reason = NotSelected
			}
			if !d.claimed[t.Feature] {
				r.Declared = "not claimed"
				if why := d.unsupported[t.Feature]; why != "" {
					r.Declared = "not claimed: " + why
				}
			}
		case s.Assertion == AssertionFailed:
			// Expected (the spec passed) or not (it failed): Apply tells.
			r.Outcome, r.Reason = upstream.Fail, s.Message
		case s.Assertion == AssertionPassed && (s.State == "passed" || d.declared[s.Name].Outcome == upstream.Fail):
			// A declared failure that passed fails its spec: still a pass.
			r.Outcome = upstream.Pass
		case s.State == "passed":
			r.Outcome = upstream.Pass
		default:
			// Failed outside the assertion (setup, cleanup, a timeout).
			r.Outcome, r.Reason = upstream.Fail, s.Message
		}
		results = append(results, r)
	}
	results, v := upstream.Apply(SuiteName, results, d.declared)
	suite := Suite
	suite.Tests = d.names()
	sr := upstream.NewSuiteReport(suite, seconds, results, v, cmd)
	for f := range d.claimed {
		sr.Claimed = append(sr.Claimed, string(f))
	}
	sort.Strings(sr.Claimed)
	for _, u := range d.Exp.Unsupported {
		// The tests that need it, as the suite declares them (skipped in
		// this run: the feature is not claimed).
		u.Tests = nil
		for _, n := range d.names() {
			if d.tests[n].Feature == Feature(u.Name) {
				u.Tests = append(u.Tests, SuiteName+"/"+n)
			}
		}
		sr.Unsupported = append(sr.Unsupported, u)
	}
	sr.Selection = selection
	notSelected := slices.ContainsFunc(results, func(r upstream.Result) bool { return r.Reason == NotSelected })
	switch {
	case len(v.UnexpectedPasses) > 0:
		sr.Result = "failure"
	case sr.Result == "success" && (notSelected || selection != ""):
		sr.Result = "partial"
	}
	return sr
}
