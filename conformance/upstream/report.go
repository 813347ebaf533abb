package upstream

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Report is a ConformanceReport in the manner of Gateway API's: who was
// tested, on what, what it claims, and each test's result with its reason.
type Report struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Implementation is what ran the Knative API on the cluster.
	Implementation Implementation `json:"implementation"`
	Date           time.Time      `json:"date"`
	// Mode is "managed" (clusters this project created) or "third-party"
	// (any cluster given by kubeconfig and gateway).
	Mode    string  `json:"mode"`
	Cluster Cluster `json:"cluster"`
	// TestConfig lists what the run changed on the cluster before testing,
	// as upstream's own test installation does.
	TestConfig  []string  `json:"testConfig,omitempty"`
	Claimed     []string  `json:"claimedFeatures,omitempty"`
	Unsupported []Feature `json:"unsupportedFeatures,omitempty"`
	// Claims is what this run showed of each unsupported feature
	// (CheckClaims): a stale claim fails the report.
	Claims []ClaimCheck `json:"claimChecks,omitempty"`
	// Suites holds every suite run against the implementation: Knative's
	// upstream suites (knative-conformance) and Lampyr's own
	// (conformance/lampyr, which adds its section with AddSuite), so one
	// report is what a third party publishes.
	Suites []SuiteReport `json:"suites"`
	// Result is success (every suite ran clean), partial (a test the
	// implementation must pass was skipped or declared failing) or failure
	// (an undeclared failure, or a suite that did not run).
	Result    string   `json:"result"`
	Reproduce []string `json:"reproduce"`
}

// Implementation names the Knative implementation under test.
type Implementation struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	URL     string `json:"url,omitempty"`
	// Networking is the KIngress implementation and its class.
	Networking string `json:"networking"`
}

// Cluster records facts about the cluster tested.
type Cluster struct {
	Name              string `json:"name,omitempty"`
	Kubeconfig        string `json:"kubeconfig,omitempty"`
	KubernetesVersion string `json:"kubernetesVersion"`
	Nodes             int    `json:"nodes"`
	Gateway           string `json:"gateway"`
	Host              string `json:"host,omitempty"`
}

// SuiteReport is one suite's run.
type SuiteReport struct {
	Suite      Suite      `json:"suite"`
	Seconds    float64    `json:"seconds"`
	Statistics Statistics `json:"statistics"`
	Result     string     `json:"result"`
	// Error is set when the suite could not run at all.
	Error            string   `json:"error,omitempty"`
	Undeclared       []string `json:"undeclaredFailures,omitempty"`
	UnexpectedPasses []string `json:"unexpectedPasses,omitempty"`
	MissingDeclared  []string `json:"missingDeclared,omitempty"`
	Tests            []Result `json:"tests,omitempty"`
	Command          []string `json:"command"`
	// Claimed and Unsupported are set when a suite declares its own
	// features (Lampyr's suite: conformance/expectations/lampyr.yaml);
	// the report's top-level ones are the upstream suites'.
	Claimed     []string  `json:"claimedFeatures,omitempty"`
	Unsupported []Feature `json:"unsupportedFeatures,omitempty"`
	// Selection says which of the suite's tests the run selected (a
	// Ginkgo label filter or focus), when not all: the result is then
	// at best partial.
	Selection string `json:"selection,omitempty"`
}

// Statistics counts a suite's tests by outcome.
type Statistics struct {
	Passed           int `json:"passed"`
	Failed           int `json:"failed"`
	Skipped          int `json:"skipped"`
	ExpectedFailures int `json:"expectedFailures"`
}

// NewSuiteReport fills a suite's section from its verdict.
func NewSuiteReport(s Suite, seconds float64, results []Result, v Verdict, cmd []string) SuiteReport {
	sr := SuiteReport{Suite: s, Seconds: seconds, Tests: results, Command: cmd,
		Statistics:       Statistics{Passed: v.Passed, Failed: v.Failed, Skipped: v.Skipped, ExpectedFailures: v.ExpectedFailures},
		Undeclared:       v.Undeclared,
		UnexpectedPasses: v.UnexpectedPasses,
		MissingDeclared:  v.Missing,
	}
	switch {
	case !v.OK():
		sr.Result = "failure"
	case v.ExpectedFailures > 0 || declaredSkips(results) > 0:
		sr.Result = "partial"
	default:
		sr.Result = "success"
	}
	return sr
}

func declaredSkips(rs []Result) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == Skip && r.Declared != "" {
			n++
		}
	}
	return n
}

// AddSuite puts a suite's section into the report, replacing an earlier
// section of the same suite name (a rerun), and sets the overall result.
func (r *Report) AddSuite(s SuiteReport) {
	for i := range r.Suites {
		if r.Suites[i].Suite.Name == s.Suite.Name {
			r.Suites[i] = s
			r.Finish()
			return
		}
	}
	r.Suites = append(r.Suites, s)
	r.Finish()
}

// ReadReport reads a report.yaml that Write wrote.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := yaml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// Finish checks the unsupported features' claims against the suites'
// results and sets the overall result: failure when a suite failed or a
// claim is stale.
func (r *Report) Finish() {
	r.APIVersion, r.Kind = "conformance.lampyr.dev/v1alpha1", "ConformanceReport"
	r.Result = "success"
	for _, s := range r.Suites {
		switch {
		case s.Result == "failure":
			r.Result = "failure"
		case s.Result == "partial" && r.Result == "success":
			r.Result = "partial"
		}
	}
	r.Claims = CheckClaims(r.Unsupported, r.Suites)
	if len(StaleClaims(r.Claims)) > 0 {
		r.Result = "failure"
	}
}

// Verdicts of a claim (an unsupported feature) in one run.
const (
	// ClaimShown: a test the feature names failed (as declared).
	ClaimShown = "shown"
	// ClaimStale: every test the feature names ran and passed: the
	// implementation has the feature; remove the claim (and its tests'
	// declarations).
	ClaimStale = "stale"
	// ClaimUnconfirmed: as stale, but the feature is intermittent.
	ClaimUnconfirmed = "unconfirmed"
	// ClaimUnchecked: no named test failed and some did not run (declared
	// skips, a suite or selection that left them out).
	ClaimUnchecked = "unchecked"
)

// ClaimCheck is what one run showed of one unsupported feature.
type ClaimCheck struct {
	Feature string      `json:"feature"`
	Verdict string      `json:"verdict"`
	Tests   []ClaimTest `json:"tests"`
}

// ClaimTest is a named test's outcome in the run ("not run" when no suite
// reported it).
type ClaimTest struct {
	Test    string `json:"test"`
	Outcome string `json:"outcome"`
}

// NotRun is the outcome of a named test no suite reported.
const NotRun = "not run"

// CheckClaims judges each feature by the outcomes of the tests it names
// ("<suite>/<TestName>") in suites.
func CheckClaims(features []Feature, suites []SuiteReport) []ClaimCheck {
	outcome := map[string]string{}
	for _, s := range suites {
		for _, t := range s.Tests {
			outcome[s.Suite.Name+"/"+t.Name] = t.Outcome
		}
	}
	var out []ClaimCheck
	for _, f := range features {
		c := ClaimCheck{Feature: f.Name}
		failed, passed := 0, 0
		for _, t := range f.Tests {
			o := outcome[t]
			if o == "" {
				o = NotRun
			}
			c.Tests = append(c.Tests, ClaimTest{Test: t, Outcome: o})
			switch o {
			case Fail, ExpectedFail:
				failed++
			case Pass:
				passed++
			}
		}
		switch {
		case failed > 0:
			c.Verdict = ClaimShown
		case passed > 0 && passed == len(f.Tests) && f.Intermittent:
			c.Verdict = ClaimUnconfirmed
		case passed > 0 && passed == len(f.Tests):
			c.Verdict = ClaimStale
		default:
			c.Verdict = ClaimUnchecked
		}
		out = append(out, c)
	}
	return out
}

// StaleClaims are the claims checks found stale.
func StaleClaims(cs []ClaimCheck) []ClaimCheck {
	var out []ClaimCheck
	for _, c := range cs {
		if c.Verdict == ClaimStale {
			out = append(out, c)
		}
	}
	return out
}

func (c ClaimCheck) String() string {
	parts := make([]string, len(c.Tests))
	for i, t := range c.Tests {
		parts[i] = t.Test + " " + t.Outcome
	}
	return fmt.Sprintf("%s: %s (%s)", c.Feature, c.Verdict, strings.Join(parts, ", "))
}

// Write puts report.yaml, junit.xml and report.md into dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := yaml.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.yaml"), b, 0o644); err != nil {
		return err
	}
	if b, err = r.JUnit(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "junit.xml"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(Markdown(r)), 0o644)
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Name    string       `xml:"name,attr"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     float64     `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      float64       `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

// JUnit renders the report as JUnit XML: an expected failure is a skip
// whose message names the feature and the declared reason.
func (r *Report) JUnit() ([]byte, error) {
	js := junitSuites{Name: r.Implementation.Name}
	for _, s := range r.Suites {
		su := junitSuite{Name: s.Suite.Package, Time: s.Seconds}
		for _, t := range s.Tests {
			c := junitCase{Name: t.Name, Classname: s.Suite.Package, Time: t.Seconds}
			switch t.Outcome {
			case Fail:
				c.Failure = &junitMessage{Message: Cause(t.Reason), Body: t.Reason}
				su.Failures++
			case Skip, ExpectedFail:
				msg := Cause(t.Reason)
				if t.Declared != "" {
					msg = fmt.Sprintf("%s (needs %s): %s", t.Outcome, t.Feature, t.Declared)
				}
				c.Skipped = &junitMessage{Message: msg, Body: t.Reason}
				su.Skipped++
			}
			su.Cases = append(su.Cases, c)
			su.Tests++
		}
		js.Suites = append(js.Suites, su)
	}
	if len(r.Claims) > 0 {
		// One case per unsupported feature: a stale claim fails, as an
		// undeclared failure does.
		su := junitSuite{Name: "claims"}
		for _, c := range r.Claims {
			jc := junitCase{Name: c.Feature, Classname: "claims"}
			switch c.Verdict {
			case ClaimStale:
				jc.Failure = &junitMessage{Message: "stale claim: every test it names passed; remove it from the expectations", Body: c.String()}
				su.Failures++
			case ClaimUnchecked, ClaimUnconfirmed:
				jc.Skipped = &junitMessage{Message: c.Verdict, Body: c.String()}
				su.Skipped++
			}
			su.Cases = append(su.Cases, jc)
			su.Tests++
		}
		js.Suites = append(js.Suites, su)
	}
	b, err := xml.MarshalIndent(js, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), b...), nil
}

// Markdown is the human summary of one report.
func Markdown(r *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Conformance: %s %s (%s)\n\n", r.Implementation.Name, r.Implementation.Version, r.Result)
	fmt.Fprintf(&b, "%s, %s mode, Kubernetes %s (%d node(s)), networking %s, gateway %s.\n\n",
		r.Date.UTC().Format(time.RFC3339), r.Mode, r.Cluster.KubernetesVersion, r.Cluster.Nodes, r.Implementation.Networking, r.Cluster.Gateway)
	for _, c := range r.TestConfig {
		fmt.Fprintf(&b, "Test configuration: %s.\n\n", c)
	}
	b.WriteString("| suite | result | passed | failed | expected failures | skipped | seconds |\n|---|---|---|---|---|---|---|\n")
	for _, s := range r.Suites {
		fmt.Fprintf(&b, "| %s (%s %s) | %s | %d | %d | %d | %d | %.0f |\n", s.Suite.Name, s.Suite.Module, s.Suite.Version, s.Result,
			s.Statistics.Passed, s.Statistics.Failed, s.Statistics.ExpectedFailures, s.Statistics.Skipped, s.Seconds)
	}
	if len(r.Claims) > 0 {
		b.WriteString("\n## Claims: what this run showed of each unsupported feature\n\n")
		if st := StaleClaims(r.Claims); len(st) > 0 {
			names := make([]string, len(st))
			for i, c := range st {
				names[i] = c.Feature
			}
			fmt.Fprintf(&b, "**Stale claims (every test they name passed: remove them):** %s\n\n", strings.Join(names, ", "))
		}
		b.WriteString("| feature | verdict | tests |\n|---|---|---|\n")
		for _, c := range r.Claims {
			parts := make([]string, len(c.Tests))
			for i, t := range c.Tests {
				parts[i] = t.Test + ": " + t.Outcome
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", mdCell(c.Feature), c.Verdict, mdCell(strings.Join(parts, ", ")))
		}
	}
	for _, s := range r.Suites {
		fmt.Fprintf(&b, "\n## %s: `%s`\n\n", s.Suite.Name, s.Suite.Package)
		if s.Error != "" {
			fmt.Fprintf(&b, "Did not run: %s\n", s.Error)
			continue
		}
		if len(s.Claimed) > 0 {
			fmt.Fprintf(&b, "Claimed features: %s.\n\n", strings.Join(s.Claimed, ", "))
		}
		for _, f := range s.Unsupported {
			fmt.Fprintf(&b, "Not claimed: %s (%s).\n\n", f.Name, f.Reason)
		}
		if s.Selection != "" {
			fmt.Fprintf(&b, "Selected: %s.\n\n", s.Selection)
		}
		for _, l := range []struct {
			title string
			names []string
		}{{"Undeclared failures", s.Undeclared}, {"Declared failures that passed (remove the declaration)", s.UnexpectedPasses}, {"Declared tests the suite no longer has", s.MissingDeclared}} {
			if len(l.names) > 0 {
				fmt.Fprintf(&b, "**%s:** %s\n\n", l.title, strings.Join(l.names, ", "))
			}
		}
		b.WriteString("| test | outcome | seconds | feature | reason |\n|---|---|---|---|---|\n")
		for _, t := range s.Tests {
			why := Cause(t.Reason)
			if t.Declared != "" {
				why = t.Declared
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %s |\n", t.Name, t.Outcome, t.Seconds, t.Feature, mdCell(why))
		}
	}
	b.WriteString("\n## Reproduce\n\n```\n" + strings.Join(r.Reproduce, "\n") + "\n```\n")
	return b.String()
}

// SideBySide compares a reference report (stock) with another (Lampyr),
// test by test.
func SideBySide(ref, other *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| suite | %s passed | %s passed | %s expected failures | %s undeclared failures |\n|---|---|---|---|---|\n",
		ref.Implementation.Name, other.Implementation.Name, other.Implementation.Name, other.Implementation.Name)
	refSuites := map[string]SuiteReport{}
	for _, x := range ref.Suites {
		refSuites[x.Suite.Name] = x
	}
	for _, s := range other.Suites {
		rs := refSuites[s.Suite.Name]
		fmt.Fprintf(&b, "| %s | %d of %d | %d of %d | %d | %d |\n", s.Suite.Name, rs.Statistics.Passed, len(rs.Tests),
			s.Statistics.Passed, len(s.Tests), s.Statistics.ExpectedFailures, s.Statistics.Failed)
	}
	b.WriteString("\n| suite | test | " + ref.Implementation.Name + " | " + other.Implementation.Name + " | why |\n|---|---|---|---|---|\n")
	for _, s := range other.Suites {
		refOut := map[string]string{}
		for _, t := range refSuites[s.Suite.Name].Tests {
			refOut[t.Name] = t.Outcome
		}
		names := map[string]Result{}
		for _, t := range s.Tests {
			names[t.Name] = t
		}
		keys := make([]string, 0, len(names))
		for k := range names {
			keys = append(keys, k)
		}
		for k := range refOut {
			if _, ok := names[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			t := names[k]
			if t.Outcome == refOut[k] && t.Outcome == Pass {
				continue
			}
			why := t.Declared
			if why == "" {
				why = Cause(t.Reason)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", s.Suite.Name, k, orDash(refOut[k]), orDash(t.Outcome), mdCell(why))
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func mdCell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}

// GitVersion describes the checkout at root (git describe --always
// --dirty): the implementation's version when it is this repository's
// Lampyr, and the commit a report's reproduce commands check out.
func GitVersion(root string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
