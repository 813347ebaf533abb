package lampyr

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/conformance/upstream"
)

// Run is what the specs need once the suite's setup has run.
type Run struct {
	Decl    *Declarations
	Target  *harness.Target
	Fixture *Fixture
	// Prepare makes a test's T; nil: a fresh namespace on Target
	// (NewT), deleted after the test passed. Tests of the suite's own
	// wiring give one that needs no cluster.
	Prepare func(ctx context.Context, test Test) (*T, error)
	// Report is the ConformanceReport's header (implementation, mode,
	// cluster); the suite adds its section.
	Report upstream.Report
	// ReportDir receives report.{yaml,md} and junit.xml; ReportInto, when
	// set, is an existing report.yaml (knative-conformance's) that gets
	// this suite's section too, so one report covers both.
	ReportDir, ReportInto string
}

// Report entry names a spec records.
const (
	AssertionEntry = "lampyr-assertion"
	FailureEntry   = "lampyr-assertion-failure"
)

// Define declares, at the top level of a suite, one Ginkgo spec per test
// ("<name>: <description>", with the test's labels) under a container
// labelled labels, and the report written after the suite. run returns the
// suite's Run, set up in BeforeSuite (nil: the suite did not set up; no
// report is written).
func Define(tests []Test, run func() *Run, labels ...string) bool {
	names := map[string]string{}
	Describe("Lampyr conformance", Label(labels...), func() {
		for _, test := range tests {
			text := test.Name + ": " + test.Description
			names[text] = test.Name
			It(text, Label(test.Labels...), func(ctx SpecContext) { runTest(ctx, run(), test) }, NodeTimeout(15*time.Minute))
		}
	})
	return ReportAfterSuite("Lampyr ConformanceReport", func(r Report) {
		if run() == nil {
			return
		}
		var specs []SpecResult
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			specs = append(specs, specResult(names[s.LeafNodeText], s))
		}
		Expect(run().WriteReport(specs, r)).To(Succeed())
	})
}

func specResult(name string, s types.SpecReport) SpecResult {
	res := SpecResult{Name: name, Seconds: s.RunTime.Seconds(), Message: s.Failure.Message}
	switch {
	case s.State == types.SpecStatePassed:
		res.State = "passed"
	case s.State == types.SpecStateSkipped || s.State == types.SpecStatePending:
		res.State = "skipped"
	default:
		res.State = "failed"
		if s.Failure.Location.FileName != "" {
			res.Message = s.Failure.Location.String() + ": " + s.Failure.Message
		}
	}
	for _, e := range s.ReportEntries {
		switch e.Name {
		case AssertionEntry:
			res.Assertion = e.Value.String()
		case FailureEntry:
			res.Message = e.Value.String()
		}
	}
	return res
}

func runTest(ctx SpecContext, r *Run, test Test) {
	Expect(r).NotTo(BeNil(), "the suite did not set up")
	dec := r.Decl.Decide(test)
	if dec.Skip != "" {
		Skip(dec.Skip)
	}
	prepare := r.Prepare
	if prepare == nil {
		prepare = r.namespaced
	}
	t, err := prepare(ctx, test)
	Expect(err).NotTo(HaveOccurred(), "preparing test %s", test.Name)
	failure := Intercept(func() {
		if test.Manifests != nil {
			for _, u := range test.Manifests(ctx, t) {
				t.Apply(ctx, u)
			}
		}
		test.Assert(ctx, t)
	})
	if failure == "" {
		AddReportEntry(AssertionEntry, AssertionPassed, ReportEntryVisibilityNever)
	} else {
		AddReportEntry(AssertionEntry, AssertionFailed, ReportEntryVisibilityNever)
		AddReportEntry(FailureEntry, failure, ReportEntryVisibilityNever)
	}
	if err := dec.Judge(failure); err != nil {
		Fail(err.Error())
	}
	if failure != "" {
		Logf("declared failure (needs %s: %s), and it failed: %s", dec.Declared.Feature, dec.Declared.Reason, failure)
	}
}

// namespaced is a T on the cluster in a fresh namespace of the test's own,
// deleted once the test passed.
func (r *Run) namespaced(ctx context.Context, test Test) (*T, error) {
	t, err := NewT(ctx, r.Target, r.Fixture, test)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", NamespacePrefix+test.Name, err)
	}
	DeferCleanup(func(ctx SpecContext) {
		// The harness dumps the cluster after a failed spec; the
		// namespace stays for a person to look at (the next run's
		// NewT replaces it).
		if CurrentSpecReport().Failed() {
			Logf("failed: namespace %s left as it is", t.Namespace)
			return
		}
		// Also with LAMPYR_KEEP=1 (which keeps the cluster): every
		// passed test's Services would hold fiber capacity. Not waited
		// for: Lampyr finalizes in the background; the finalization test
		// is the one that waits.
		_ = t.Clients.Kube.CoreV1().Namespaces().Delete(ctx, t.Namespace, metav1.DeleteOptions{})
	})
	return t, nil
}

// WriteReport checks the specs' results against the declarations and
// writes the ConformanceReport: into ReportDir, and into ReportInto's
// report when set.
func (r *Run) WriteReport(specs []SpecResult, gr Report) error {
	var sel []string
	if f := gr.SuiteConfig.LabelFilter; f != "" {
		sel = append(sel, "label-filter "+f)
	}
	if f := gr.SuiteConfig.FocusStrings; len(f) > 0 {
		sel = append(sel, "focus "+strings.Join(f, ", "))
	}
	if f := gr.SuiteConfig.SkipStrings; len(f) > 0 {
		sel = append(sel, "skip "+strings.Join(f, ", "))
	}
	cmd := append([]string{"go", "test", "./conformance/lampyr/"}, os.Args[1:]...)
	sr := r.Decl.Report(specs, gr.RunTime.Seconds(), strings.Join(sel, "; "), cmd)
	rep := r.Report
	rep.Suites = nil
	rep.AddSuite(sr)
	if err := rep.Write(r.ReportDir); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "Lampyr conformance: %s: %d passed, %d failed, %d expected failures, %d skipped; report %s\n",
		sr.Result, sr.Statistics.Passed, sr.Statistics.Failed, sr.Statistics.ExpectedFailures, sr.Statistics.Skipped, filepath.Join(r.ReportDir, "report.yaml"))
	for _, l := range []struct {
		what  string
		names []string
	}{{"undeclared failure", sr.Undeclared}, {"declared to fail, passed (remove the declaration)", sr.UnexpectedPasses}, {"declared, but the suite has no such test", sr.MissingDeclared}} {
		for _, n := range l.names {
			fmt.Fprintf(os.Stderr, "  %s: %s\n", l.what, n)
		}
	}
	if r.ReportInto == "" {
		return nil
	}
	into, err := upstream.ReadReport(r.ReportInto)
	if err != nil {
		return fmt.Errorf("-lampyr.report-into: %w", err)
	}
	if into.Implementation.Name != rep.Implementation.Name {
		return fmt.Errorf("-lampyr.report-into %s is a report on %q, this run tested %q: give the report of the same implementation", r.ReportInto, into.Implementation.Name, rep.Implementation.Name)
	}
	into.AddSuite(sr)
	if err := into.Write(filepath.Dir(r.ReportInto)); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "Lampyr conformance: section added to %s (%s)\n", r.ReportInto, into.Result)
	return nil
}

// ClusterFacts fills the report's cluster section from the cluster.
func ClusterFacts(ctx context.Context, c *e2eutil.Clients, into *upstream.Cluster) error {
	v, err := c.Kube.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	into.KubernetesVersion = v.GitVersion
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	into.Nodes = len(nodes.Items)
	into.Host, _ = os.Hostname()
	return nil
}
