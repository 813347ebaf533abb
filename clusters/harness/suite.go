package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/e2e-framework/pkg/env"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/progress"
)

// Config declares a suite.
type Config struct {
	// Name is the Ginkgo suite's name.
	Name string
	// Folder is the suite's artifacts subfolder (default Name).
	Folder string
	// Recipe is the command that runs the suite (`just test-stock`), named
	// when it skips.
	Recipe string
	// Clusters are the clusters the suite runs on, with their profiles.
	Clusters []Cluster
	// Choose, when set, replaces Clusters with what it returns for the
	// run's options (a suite knob naming other clusters).
	Choose func(Options) ([]Cluster, error)
	// KeepVar is the variable that keeps the clusters (default
	// environ.Keep).
	KeepVar string
	// ExternalVars: the suite may run on a third party's installation
	// named by environ.ConformanceKubeconfig and ConformanceGateway (one
	// declared cluster only).
	ExternalVars bool
	// Provider, when set, chooses the networking provider the harness
	// installs from the run's options (default: Options.Provider), e.g. the
	// first of several a suite measures in turn.
	Provider func(Options) string
	// Knobs are the suite's own variables (LAMPYR_BENCH_SECONDS...), read
	// by New with the others and found with Suite.Knob.
	Knobs []string
	// SetupTimeout and FinishTimeout bound BeforeSuite and AfterSuite
	// (default 60 and 10 minutes).
	SetupTimeout, FinishTimeout time.Duration
}

// Suite is a suite's harness: the one package-level value a suite holds
// for Ginkgo. New registers its BeforeSuite, AfterSuite and ReportAfterEach.
type Suite struct {
	cfg  Config
	opts Options
	// steps are the suite's own setup and finish steps, after the
	// harness's.
	setup, finish []step
	onFailure     []FailureFunc
	// values is the context the setup steps returned, detached from the
	// Ginkgo node that ran them.
	values context.Context
	econf  *envconf.Config
}

type step struct {
	name string
	fn   env.Func
}

// FailureFunc adds to a failed spec's dump: dir is the spec's dump folder
// for target t.
type FailureFunc func(ctx context.Context, t *Target, dir string)

// New declares a suite, reading the environment (clusters/environ) once.
func New(cfg Config) *Suite {
	if cfg.KeepVar == "" {
		cfg.KeepVar = environ.Keep
	}
	opts := Options{
		Enabled:   environ.Set(environ.E2E),
		Keep:      environ.Set(cfg.KeepVar),
		KeepVar:   cfg.KeepVar,
		Artifacts: environ.ArtifactsDir(),
		Provider:  environ.Provider(),
		Clusters:  environ.Clusters(),
	}
	opts.Knobs = map[string]string{}
	for _, k := range cfg.Knobs {
		opts.Knobs[k] = os.Getenv(k)
	}
	if cfg.ExternalVars {
		if kc := os.Getenv(environ.ConformanceKubeconfig); kc != "" {
			opts.External = &External{Kubeconfig: kc, Gateway: os.Getenv(environ.ConformanceGateway)}
		}
	}
	return NewWithOptions(cfg, opts)
}

// NewWithOptions declares a suite with options given explicitly.
func NewWithOptions(cfg Config, opts Options) *Suite {
	if cfg.SetupTimeout == 0 {
		cfg.SetupTimeout = 60 * time.Minute
	}
	if cfg.FinishTimeout == 0 {
		cfg.FinishTimeout = 10 * time.Minute
	}
	s := &Suite{cfg: cfg, opts: opts, econf: envconf.New()}
	BeforeSuite(s.runSetup, NodeTimeout(cfg.SetupTimeout))
	AfterSuite(s.runFinish, NodeTimeout(cfg.FinishTimeout))
	ReportAfterEach(s.dumpOnFailure)
	return s
}

// Setup adds a setup step, run after the harness's own (clusters, installs,
// Lampyr installations) and the suite's earlier ones. It returns true, for
// `var _ = suite.Setup(...)`.
func (s *Suite) Setup(name string, fn env.Func) bool {
	s.setup = append(s.setup, step{name, fn})
	return true
}

// Finish adds a finish step, run before the harness's own (dump if the
// setup failed, keep or delete clusters). Every finish step runs, even
// after a failed setup or an earlier failed step.
func (s *Suite) Finish(name string, fn env.Func) bool {
	s.finish = append(s.finish, step{name, fn})
	return true
}

// OnFailure adds to every failed spec's dump.
func (s *Suite) OnFailure(fn FailureFunc) bool {
	s.onFailure = append(s.onFailure, fn)
	return true
}

// Run is the suite's go test entry point.
func (s *Suite) Run(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, s.cfg.Name)
}

// Options are the run's options.
func (s *Suite) Options() Options { return s.opts }

// Knob is the value of one of the suite's declared Knobs ("" when unset);
// a name the suite did not declare fails the spec.
func (s *Suite) Knob(name string) string {
	v, ok := s.opts.Knobs[name]
	if !ok {
		Fail(fmt.Sprintf("%s is not one of suite %s's declared knobs (harness.Config.Knobs): declare it, and list it in docs/environment.md", name, s.cfg.Name))
	}
	return v
}

// IntKnob is a positive integer knob, or def when unset or not one.
func (s *Suite) IntKnob(name string, def int) int {
	if v, err := strconv.Atoi(s.Knob(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Context is the context the setup steps passed on (targets, the suite's
// own values); its cancellation is not a spec's: pass a spec's own
// context to calls, and read values from this one.
func (s *Suite) Context() context.Context {
	if s.values == nil {
		return context.Background()
	}
	return s.values
}

// In joins a node's context (its deadline and cancellation) with the
// suite's values, for calling the harness's funcs from a spec.
func (s *Suite) In(ctx context.Context) context.Context {
	return joined{Context: ctx, values: s.Context()}
}

// Target is the Target named name; a spec fails if there is none.
func (s *Suite) Target(name string) *Target {
	t, err := TargetFrom(s.Context(), name)
	Expect(err).NotTo(HaveOccurred())
	return t
}

// State is the suite's own state of type T, put in the context by a setup
// step with With; a spec fails if the setup did not put one.
func State[T any](s *Suite) T {
	v, ok := Value[T](s.Context())
	// The suite's context is published when every setup step has returned,
	// so a setup step itself must pass its state on explicitly.
	Expect(ok).To(BeTrue(), "suite %s: no %T in the context: the setup step that makes it did not run, or a setup step read it (pass the value explicitly there; State works from specs and finish steps)", s.cfg.Name, v)
	return v
}

// Targets are every target, in declared order.
func (s *Suite) Targets() []*Target { return Targets(s.Context()) }

// Artifacts is the suite's artifacts folder.
func (s *Suite) Artifacts() string {
	if s.cfg.Folder != "" {
		return filepath.Join(s.opts.Artifacts, s.cfg.Folder)
	}
	return filepath.Join(s.opts.Artifacts, s.cfg.Name)
}

// Config is e2e-framework's configuration: on a single-cluster suite, the
// kubeconfig of that cluster once the setup ran.
func (s *Suite) Config() *envconf.Config { return s.econf }

// SkipReason is why the suite skips without LAMPYR_E2E=1.
func (s *Suite) SkipReason() string {
	return fmt.Sprintf("the %s suite runs on real Kind clusters: run it with `%s` (sets %s=1)", s.cfg.Name, s.cfg.Recipe, environ.E2E)
}

// joined has a Ginkgo node's deadline and cancellation and, after the
// node's own values, the suite's.
type joined struct {
	context.Context
	values context.Context
}

func (j joined) Value(k any) any {
	if v := j.Context.Value(k); v != nil {
		return v
	}
	return j.values.Value(k)
}

// harnessSteps are the harness's setup steps for the declared clusters.
func (s *Suite) harnessSteps() []step {
	cs := s.cfg.Clusters
	if s.opts.External != nil {
		return []step{
			{"connecting to the external installation " + s.opts.External.Kubeconfig, ConnectExternal(cs[0], *s.opts.External)},
			{"reading the Lampyr installation", DescribeLampyr()},
		}
	}
	// Clusters that name an External installation are connected and
	// checked first (seconds; a missing gateway or Lampyr stops the run
	// before anything is built); the others are Kind clusters this run
	// creates or reuses.
	var managed, external []Cluster
	var names, extNames []string
	for _, c := range cs {
		if c.External != nil {
			external = append(external, c)
			extNames = append(extNames, c.Name)
			continue
		}
		managed = append(managed, c)
		names = append(names, c.Name)
	}
	var steps []step
	if len(external) > 0 {
		steps = append(steps, step{"connecting to and checking the external installations " + strings.Join(extNames, ", "), ConnectExternals(external...)})
	}
	if len(managed) > 0 {
		steps = append(steps,
			step{"creating or reusing clusters " + strings.Join(names, ", "), CreateOrReuse(managed...)},
			step{"installing the declared profiles", Install(managed...)})
	}
	return append(steps, step{"reading the Lampyr installations", DescribeLampyr()})
}

func (s *Suite) runSetup(ctx SpecContext) {
	if !s.opts.Enabled {
		Skip(s.SkipReason())
	}
	if s.cfg.Choose != nil {
		cs, err := s.cfg.Choose(s.opts)
		Expect(err).NotTo(HaveOccurred(), "choosing suite %s's clusters", s.cfg.Name)
		s.cfg.Clusters = cs
	}
	if s.opts.External != nil && len(s.cfg.Clusters) != 1 {
		Fail(fmt.Sprintf("an external installation stands for one cluster; suite %s declares %d", s.cfg.Name, len(s.cfg.Clusters)))
	}
	log := progress.New(GinkgoWriter)
	r := &run{
		suite: filepath.Base(s.Artifacts()), opts: s.opts, log: log, artifacts: s.Artifacts(),
		env: clusters.NewEnv(log, s.opts.Clusters), images: map[string]string{},
	}
	Expect(os.MkdirAll(r.artifacts, 0o755)).To(Succeed())
	vals := withTargets(context.WithValue(context.Background(), runKey{}, r))
	s.values = vals
	if s.opts.External == nil {
		prov, err := networking.Get(s.opts.Provider)
		Expect(err).NotTo(HaveOccurred(), "the networking provider (%s)", environ.Networking)
		r.opts.Provider = prov.Name()
		if s.cfg.Provider != nil {
			prov, err = networking.Get(s.cfg.Provider(r.opts))
			Expect(err).NotTo(HaveOccurred(), "the networking provider suite %s chose", s.cfg.Name)
			r.opts.Provider = prov.Name()
		}
		AddReportEntry("networking", prov.Name()+": "+prov.Describe())
		if per := statedProviders(s.cfg.Clusters); per != "" {
			AddReportEntry("networking per cluster", per)
		}
	}
	var timings []string
	defer func() {
		AddReportEntry("setup steps", strings.Join(timings, "\n"))
		// Where the setup's time went, slowest step first (the builds,
		// clusters and installs overlap).
		log.Summary("setup "+s.cfg.Name+": where the time went", 2*time.Second)
	}()
	for _, st := range append(s.harnessSteps(), s.setup...) {
		By(st.name)
		t0 := time.Now()
		out, err := st.fn(joined{Context: ctx, values: s.values}, s.econf)
		timings = append(timings, fmt.Sprintf("%s: %s", st.name, time.Since(t0).Round(100*time.Millisecond)))
		fmt.Fprintf(GinkgoWriter, "setup: %s\n", timings[len(timings)-1])
		if err != nil {
			Fail(fmt.Sprintf("setup: %s: %v", st.name, err))
		}
		if out != nil {
			s.values = context.WithoutCancel(out)
		}
		if ts := Targets(s.values); len(ts) == 1 && s.econf.KubeconfigFile() == "" {
			s.econf.WithKubeconfigFile(ts[0].Kubeconfig)
		}
	}
	r.setupDone = true
}

func (s *Suite) runFinish(ctx SpecContext) {
	if !s.opts.Enabled || s.values == nil {
		return
	}
	steps := append([]step(nil), s.finish...)
	steps = append(steps,
		step{"dumping every cluster if the setup failed", DumpIfSetupFailed()},
		step{"keeping or deleting the clusters this run created", KeepOrDeleteCreated()},
	)
	var errs []error
	for _, st := range steps {
		out, err := st.fn(joined{Context: ctx, values: s.values}, s.econf)
		if err != nil {
			errs = append(errs, fmt.Errorf("finish: %s: %w", st.name, err))
			fmt.Fprintf(GinkgoWriter, "finish: %s: %v\n", st.name, err)
		}
		if out != nil {
			s.values = context.WithoutCancel(out)
		}
	}
	if err := errors.Join(errs...); err != nil {
		Fail(err.Error())
	}
}

// dumpOnFailure writes each target's conditions, events and pod logs into
// <artifacts>/dump/<spec>/<target> when a spec failed.
func (s *Suite) dumpOnFailure(ctx SpecContext, r SpecReport) {
	if !r.Failed() || s.values == nil {
		return
	}
	dir := filepath.Join(s.Artifacts(), "dump", strings.ReplaceAll(r.LeafNodeText, " ", "_"))
	jctx := joined{Context: ctx, values: s.values}
	if err := DumpTargets(jctx, dir); err != nil {
		fmt.Fprintf(GinkgoWriter, "dump: %v\n", err)
	}
	for _, t := range Targets(s.values) {
		for _, f := range s.onFailure {
			f(jctx, t, filepath.Join(dir, t.Name))
		}
	}
	fmt.Fprintf(GinkgoWriter, "dumped the clusters' state into %s\n", dir)
}

// statedProviders lists the clusters that state their own provider or are
// external ("" when none does: every cluster gets the run's).
func statedProviders(cs []Cluster) string {
	var out []string
	for _, c := range cs {
		switch {
		case c.External != nil:
			out = append(out, fmt.Sprintf("%s: external (%s)", c.Name, orNone(c.External.Provider)))
		case c.Provider != "":
			out = append(out, c.Name+": "+c.Provider)
		}
	}
	return strings.Join(out, "\n")
}
