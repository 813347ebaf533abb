// Lampyr's own conformance suite, on a real Lampyr installation: the
// declared tests of tests.go, each in a namespace of its own, checked against
// the implementation's declarations (claimed features, declared failures) and
// written as a ConformanceReport, the same type conformance/upstream writes
// for Knative's suites.
//
// The cluster comes from clusters/harness. Managed (default): the "lampyr"
// Kind cluster with the lampyr profile, created or reused. Third-party:
// LAMPYR_CONFORMANCE_KUBECONFIG and LAMPYR_CONFORMANCE_GATEWAY (http://host:port
// of the Knative gateway) name an existing Lampyr installation; nothing is
// created but the tests' namespaces, their Services and the fixture's
// snapshot artifact (pushed to the installation's registry, as `ly deploy`
// would).
//
// Flags (after the package: `go test ./conformance/lampyr/ -lampyr.declarations=mine.yaml`):
// -lampyr.declarations, -lampyr.report, -lampyr.report-into.
package lampyr

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/install/networking"
)

var (
	declarationsFlag = flag.String("lampyr.declarations", "", "the implementation's claims and declared outcomes (default: conformance/expectations/lampyr.yaml)")
	reportFlag       = flag.String("lampyr.report", "", "directory of the ConformanceReport (default: $LAMPYR_ARTIFACTS/conformance/lampyr-suite)")
	reportIntoFlag   = flag.String("lampyr.report-into", "", "an existing report.yaml of the same implementation (knative-conformance's) to add this suite's section to")
)

const cluster = "lampyr"

var suite = harness.New(harness.Config{
	Name:         "lampyr-conformance",
	Recipe:       "just test-lampyr-conformance",
	Clusters:     []harness.Cluster{{Name: cluster, Profile: clusters.ProfileLampyr}},
	ExternalVars: true,
})

// declarations are checked before anything else, with or without a
// cluster: a stale declaration fails at once.
var declarations *Declarations

func TestLampyrConformance(t *testing.T) {
	path := *declarationsFlag
	if path == "" {
		path = filepath.Join(e2eutil.RepoRoot(), "conformance", "expectations", "lampyr.yaml")
	}
	var err error
	if declarations, err = LoadDeclarations(path, Tests); err != nil {
		t.Fatal(err)
	}
	suite.Run(t)
}

var _ = Define(Tests, func() *Run {
	r, _ := harness.Value[*Run](suite.Context())
	return r
}, "cluster", "lampyr", "conformance")

var _ = suite.Setup("building the fixture handler's snapshot artifact (ly build) and pushing it to the installation's registry", setup)

func setup(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	t, err := harness.TargetFrom(ctx, cluster)
	if err != nil {
		return ctx, err
	}
	opts := suite.Options()
	root := e2eutil.RepoRoot()
	r := &Run{Decl: declarations, Target: t, ReportDir: *reportFlag, ReportInto: *reportIntoFlag}
	if r.ReportDir == "" {
		r.ReportDir = filepath.Join(opts.Artifacts, "conformance", "lampyr-suite")
	}
	r.Report = upstream.Report{Date: time.Now().UTC(), Mode: "managed",
		Implementation: upstream.Implementation{Name: declarations.Exp.Implementation, Version: upstream.GitVersion(root), URL: "https://lampyr.dev/serving"},
		Cluster:        upstream.Cluster{Name: t.Name, Gateway: t.Gateway}}
	if t.External {
		r.Report.Mode = "third-party"
		r.Report.Cluster = upstream.Cluster{Kubeconfig: t.Kubeconfig, Gateway: t.Gateway}
	}
	if t.Provider != "" {
		p, err := networking.Get(t.Provider)
		if err != nil {
			return ctx, err
		}
		r.Report.Implementation.Networking = p.Name() + ": " + p.Describe()
	}
	if err := ClusterFacts(ctx, t.Clients, &r.Report.Cluster); err != nil {
		return ctx, fmt.Errorf("cluster %s does not answer: %w", t.Name, err)
	}
	r.Report.Reproduce = []string{
		fmt.Sprintf("git clone <this repository> && cd serving && git checkout %s", r.Report.Implementation.Version),
		"just test-lampyr-conformance   # managed; or LAMPYR_E2E=1 LAMPYR_CONFORMANCE_KUBECONFIG=... LAMPYR_CONFORMANCE_GATEWAY=http://host:port go test ./conformance/lampyr/ -lampyr.declarations=their.yaml",
	}
	if r.Fixture, err = BuildFixture(ctx, t.Installation, filepath.Join(GinkgoT().TempDir(), "artifact")); err != nil {
		return ctx, err
	}
	return harness.With(ctx, r), nil
}
