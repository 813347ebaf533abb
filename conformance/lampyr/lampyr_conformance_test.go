// Lampyr's own conformance suite, on a real Lampyr installation: the
// declared tests of tests.go, each in a namespace of its own, checked against
// the implementation's declarations (claimed features, declared failures) and
// written as a ConformanceReport, the same type conformance/upstream writes
// for Knative's suites.
//
// Managed (default): it brings up the "lampyr" Kind cluster as `just
// cluster-up lampyr` does. Third-party: LAMPYR_CONFORMANCE_KUBECONFIG and
// LAMPYR_CONFORMANCE_GATEWAY (http://host:port of the Knative gateway) name
// an existing Lampyr installation; nothing is created but the tests'
// namespaces, their Services and the fixture's snapshot artifact (pushed to
// the installation's registry, as `ly deploy` would).
//
// Flags (after the package: `go test ./conformance/lampyr/ -lampyr.declarations=mine.yaml`):
// -lampyr.declarations, -lampyr.report, -lampyr.report-into.
package lampyr

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/install"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/ly"
)

var (
	declarationsFlag = flag.String("lampyr.declarations", "", "the implementation's claims and declared outcomes (default: conformance/expectations/lampyr.yaml)")
	reportFlag       = flag.String("lampyr.report", "", "directory of the ConformanceReport (default: $LAMPYR_ARTIFACTS/conformance/lampyr-suite)")
	reportIntoFlag   = flag.String("lampyr.report-into", "", "an existing report.yaml of the same implementation (knative-conformance's) to add this suite's section to")
)

func TestLampyrConformance(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lampyr-conformance")
}

const cluster = "lampyr"

var (
	enabled = os.Getenv("LAMPYR_E2E") == "1"
	keep    = os.Getenv("LAMPYR_KEEP") == "1"
	env     *clusters.Env
	created bool
	run     *Run
)

var _ = Define(Tests, func() *Run { return run }, "cluster", "lampyr", "conformance")

var _ = BeforeSuite(func(ctx SpecContext) {
	root := e2eutil.RepoRoot()
	path := *declarationsFlag
	if path == "" {
		path = filepath.Join(root, "conformance", "expectations", "lampyr.yaml")
	}
	decl, err := LoadDeclarations(path, Tests)
	if err != nil {
		Fail(err.Error())
	}
	if !enabled {
		Skip("the Lampyr conformance suite needs a real Lampyr cluster: run it with `just test-lampyr-conformance` (sets LAMPYR_E2E=1)")
	}
	r := &Run{Decl: decl, Keep: keep, Artifacts: environ.ArtifactsDir(), ReportDir: *reportFlag, ReportInto: *reportIntoFlag}
	if r.ReportDir == "" {
		r.ReportDir = filepath.Join(r.Artifacts, "conformance", "lampyr-suite")
	}
	r.Report = upstream.Report{Date: time.Now().UTC(), Mode: "managed",
		Implementation: upstream.Implementation{Name: decl.Exp.Implementation, Version: GitVersion(root), URL: "https://lampyr.dev/serving"}}
	tgt := &Target{}
	kubeconfig := os.Getenv("LAMPYR_CONFORMANCE_KUBECONFIG")
	if kubeconfig != "" {
		tgt.Gateway = os.Getenv("LAMPYR_CONFORMANCE_GATEWAY")
		Expect(tgt.Gateway).NotTo(BeEmpty(), "third-party mode: set LAMPYR_CONFORMANCE_GATEWAY to the Knative gateway's http://host:port")
		r.Report.Mode = "third-party"
		r.Report.Cluster = upstream.Cluster{Kubeconfig: kubeconfig, Gateway: tgt.Gateway}
	} else {
		env = clusters.NewEnv(progress.New(GinkgoWriter), environ.Clusters())
		infos, err := env.Up(ctx, []string{cluster}, keep)
		Expect(err).NotTo(HaveOccurred())
		created = infos[0].Created
		tgt.Provider, err = networking.Get(environ.Provider())
		Expect(err).NotTo(HaveOccurred())
		Expect(env.Install(ctx, infos[0], "lampyr", tgt.Provider.Name())).To(Succeed())
		kubeconfig, tgt.Gateway = infos[0].Kubeconfig, infos[0].GatewayURL()
		r.Report.Cluster = upstream.Cluster{Name: cluster, Gateway: tgt.Gateway}
	}
	tgt.Clients, err = e2eutil.NewClients(kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	if tgt.Provider == nil {
		tgt.Provider, err = install.InstalledProvider(ctx, tgt.Clients)
		Expect(err).NotTo(HaveOccurred())
	}
	if tgt.Provider != nil {
		r.Report.Implementation.Networking = tgt.Provider.Name() + ": " + tgt.Provider.Describe()
	}
	Expect(ClusterFacts(ctx, tgt.Clients, &r.Report.Cluster)).To(Succeed())
	tgt.Ly, err = ly.Connect(kubeconfig, "")
	Expect(err).NotTo(HaveOccurred())
	var inst *ly.Installation
	Eventually(func() error { inst, err = tgt.Ly.Describe(ctx); return err }).WithTimeout(time.Minute).Should(Succeed())
	r.Report.Reproduce = []string{
		fmt.Sprintf("git clone <this repository> && cd serving && git checkout %s", r.Report.Implementation.Version),
		"just test-lampyr-conformance   # managed; or LAMPYR_CONFORMANCE_KUBECONFIG=... LAMPYR_CONFORMANCE_GATEWAY=http://host:port",
	}
	By("building the fixture handler's snapshot artifact (ly build) and pushing it to " + inst.Registry)
	fx, err := BuildFixture(ctx, inst, filepath.Join(GinkgoT().TempDir(), "artifact"))
	Expect(err).NotTo(HaveOccurred())
	r.Target, r.Fixture = tgt, fx
	run = r
}, NodeTimeout(60*time.Minute))

var _ = AfterSuite(func() {
	if env == nil || !created {
		return
	}
	if keep {
		fmt.Fprintf(GinkgoWriter, "LAMPYR_KEEP=1: cluster %s left running (just cluster-down %s)\n", cluster, cluster)
		return
	}
	Expect(env.Manager().Delete(cluster)).To(Succeed())
})
