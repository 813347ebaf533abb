package harness_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters/harness"
)

// The lifecycle on a Ginkgo run of its own, against an external target
// (nothing is created, and with no profile nothing is contacted): the
// steps run in order, the specs read what they passed on, and every finish
// step runs and reports its error.

var (
	dir        = filepath.Join(os.TempDir(), "lampyr-harness-lifecycle")
	kubeconfig = filepath.Join(dir, "kubeconfig")
	ran        []string
	lifecycle  = harness.NewWithOptions(harness.Config{Name: "lifecycle", Clusters: []harness.Cluster{{Name: "ext"}}},
		harness.Options{Enabled: true, Artifacts: dir, External: &harness.External{Kubeconfig: kubeconfig, Gateway: "http://127.0.0.1:1"}})
)

type state struct{ n int }

var (
	_ = lifecycle.Setup("first", func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		ran = append(ran, "setup first")
		return harness.With(ctx, &state{n: 1}), nil
	})
	_ = lifecycle.Setup("second", func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		s, ok := harness.Value[*state](ctx)
		if !ok {
			return ctx, errors.New("the first step's state is not in the second's context")
		}
		s.n++
		ran = append(ran, "setup second")
		return ctx, nil
	})
	_ = lifecycle.Finish("failing", func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		ran = append(ran, "finish failing")
		return ctx, errors.New("could not restore something")
	})
	_ = lifecycle.Finish("after the failure", func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		ran = append(ran, "finish after")
		return ctx, nil
	})
)

var _ = Describe("a suite on the harness", func() {
	It("reads its target and its state", func() {
		t := lifecycle.Target("ext")
		Expect(t.External).To(BeTrue())
		Expect(t.Gateway).To(Equal("http://127.0.0.1:1"))
		Expect(t.Kubeconfig).To(Equal(kubeconfig))
		Expect(lifecycle.Config().KubeconfigFile()).To(Equal(kubeconfig), "a single-cluster suite's envconf names its cluster")
		Expect(harness.State[*state](lifecycle).n).To(Equal(2))
		ran = append(ran, "spec")
	})
})

// failRecorder is Ginkgo's testing.T for the inner run, whose failure is
// expected (the failing finish step).
type failRecorder struct{ failed bool }

func (f *failRecorder) Fail() { f.failed = true }

func TestLifecycle(t *testing.T) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	RegisterFailHandler(Fail)
	f := &failRecorder{}
	suiteCfg, reporterCfg := GinkgoConfiguration()
	passed := RunSpecs(f, "lifecycle", suiteCfg, reporterCfg)
	want := "setup first, setup second, spec, finish failing, finish after"
	if got := strings.Join(ran, ", "); got != want {
		t.Errorf("ran %s, want %s", got, want)
	}
	if passed || !f.failed {
		t.Errorf("a failing finish step must fail the run (passed %v, failed %v)", passed, f.failed)
	}
}
