// Package declaredrun runs the Lampyr conformance suite's wiring (Define:
// specs, declarations, the ConformanceReport) on tests that need no
// cluster, so conformance/lampyr's TestDeclaredRuns can run it as a real
// Ginkgo run with different declarations and check the exit status and the
// report. Alone (no -declaredrun.declarations) it skips.
package declaredrun

import (
	"context"
	"flag"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"lampyr.dev/serving/conformance/lampyr"
	"lampyr.dev/serving/conformance/upstream"
)

var (
	declarations = flag.String("declaredrun.declarations", "", "declarations file")
	reportDir    = flag.String("declaredrun.report", "", "report directory")
)

// Tests: one that passes, one that fails, one of a feature the
// declarations do not claim.
var Tests = []lampyr.Test{
	{Name: "passes", Description: "passes", Feature: lampyr.FeatureServing, Labels: []string{lampyr.LabelRouting},
		Assert: func(ctx context.Context, t *lampyr.T) { Expect(t.Namespace).To(Equal("fake-passes")) }},
	{Name: "fails", Description: "fails", Feature: lampyr.FeatureRestart, Labels: []string{lampyr.LabelRestart},
		Assert: func(ctx context.Context, t *lampyr.T) {
			Expect("down").To(Equal("up"), "the component came back")
			panic("not reached: a failed assertion stops the test")
		}},
	{Name: "unclaimed", Description: "is of an unclaimed feature", Feature: lampyr.FeatureKeyRotation,
		Assert: func(ctx context.Context, t *lampyr.T) { panic("not reached: the feature is not claimed") }},
}

var run *lampyr.Run

func TestDeclaredRun(t *testing.T) {
	if *declarations == "" {
		t.Skip("run by conformance/lampyr's TestDeclaredRuns")
	}
	decl, err := lampyr.LoadDeclarations(*declarations, Tests)
	if err != nil {
		t.Fatal(err)
	}
	run = &lampyr.Run{Decl: decl, ReportDir: *reportDir,
		Report: upstream.Report{Mode: "managed", Implementation: upstream.Implementation{Name: decl.Exp.Implementation}},
		Prepare: func(_ context.Context, test lampyr.Test) (*lampyr.T, error) {
			return &lampyr.T{Namespace: "fake-" + test.Name}, nil
		}}
	RegisterFailHandler(Fail)
	RunSpecs(t, "declaredrun")
}

var _ = lampyr.Define(Tests, func() *lampyr.Run { return run })
