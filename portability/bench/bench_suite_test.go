package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
)

// The suite's own variables (docs/environment.md).
const (
	benchSeconds      = "LAMPYR_BENCH_SECONDS"
	benchColdCycles   = "LAMPYR_BENCH_COLD_CYCLES"
	benchIdleSeconds  = "LAMPYR_BENCH_IDLE_CPU_SECONDS"
	benchQuietMillis  = "LAMPYR_BENCH_QUIET_MILLICORES"
	benchReadySamples = "LAMPYR_BENCH_READY_SAMPLES"
	// benchScaleServices and benchScaleBatch: the scale spec's idle
	// Services (200) and how many it applies at once (20).
	benchScaleServices = "LAMPYR_BENCH_SCALE_SERVICES"
	benchScaleBatch    = "LAMPYR_BENCH_SCALE_BATCH"
	// benchBackendCycles: cold requests per Service in the fiber-backend
	// spec (label backends, backends_test.go).
	benchBackendCycles = "LAMPYR_BENCH_BACKEND_CYCLES"
	benchSetupTimeout  = 60 * time.Minute
)

var suite = harness.New(harness.Config{
	Name:         "bench-portability",
	Folder:       "bench",
	Recipe:       "just bench-portability",
	Clusters:     harness.Paired(),
	Knobs:        []string{benchSeconds, benchColdCycles, benchIdleSeconds, benchQuietMillis, benchReadySamples, benchBackendCycles, benchScaleServices, benchScaleBatch},
	SetupTimeout: benchSetupTimeout,
})

func TestBench(t *testing.T) { suite.Run(t) }

var (
	_ = suite.Setup("building the handler (runnable and snapshot), settling both nodes", setupBench)
	_ = suite.Finish("writing the reports, deleting the bench namespace, resetting stock's autoscaler", finishBench)
)

const ns = "bench"

// side is one platform of the pair.
type side = harness.Target

// benchRun is the suite's state, made by setupBench and read by the specs.
type benchRun struct {
	stock, lampyr *side
	sides         []*side
	// sealer is this machine's ly identity, which signs the templates
	// (authorized by the lampyr install profile).
	sealer   *ly.Sealer
	runnable string
	snap     name.Digest
	built    *ly.Built
	project  *ly.Project
	inst     *ly.Installation
	report   *Results
	artDir   string
	client   *http.Client
}

// the is the bench's state.
func the() *benchRun { return harness.State[*benchRun](suite) }

// settle waits (up to 5 min) until both nodes are quiet: freshly created
// clusters keep two cores busy for minutes (controllers' first syncs, image
// unpacking), and measuring then says more about the machine than about
// either implementation. Quiet: each node under LAMPYR_BENCH_QUIET_MILLICORES
// (default 400) over a 10 s window.
func settle(ctx context.Context, sides []*side) (note string) {
	limit := float64(suite.IntKnob(benchQuietMillis, 400))
	deadline := time.Now().Add(5 * time.Minute)
	for {
		rates := cpuRates(sides, 10*time.Second)
		quiet := true
		var line []string
		for i, s := range sides {
			mc := rates[i]["node CPU"]
			line = append(line, fmt.Sprintf("%s %.0f millicores", s.Name, mc))
			quiet = quiet && mc < limit
		}
		fmt.Fprintf(GinkgoWriter, "settling: %s\n", strings.Join(line, ", "))
		if quiet || ctx.Err() != nil {
			return ""
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(GinkgoWriter, "settling: still busy after 5 min; measuring anyway (the report's machine facts say so)\n")
			return "nodes were still busy when measuring began: " + strings.Join(line, ", ")
		}
	}
}

// cpuRates samples the sides' CPU counters at the start and end of the
// same window and returns each counter's mean rate over it, in millicores.
func cpuRates(sides []*side, window time.Duration) []map[string]float64 {
	names := make([]string, len(sides))
	for i, s := range sides {
		names[i] = s.Name
	}
	rates, err := CPURates(names, ns, window)
	Expect(err).NotTo(HaveOccurred())
	return rates
}

func setupBench(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	r := &benchRun{report: &Results{Samples: map[string]*Sample{}}, artDir: harness.Artifacts(ctx),
		client: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	var err error
	if r.stock, err = harness.TargetFrom(ctx, "stock"); err != nil {
		return ctx, err
	}
	if r.lampyr, err = harness.TargetFrom(ctx, "lampyr"); err != nil {
		return ctx, err
	}
	r.sides = []*side{r.stock, r.lampyr}
	ctx = harness.With(ctx, r)
	for _, s := range r.sides {
		freshNamespace(ctx, s, s == r.lampyr)
	}
	if r.runnable, err = harness.Image(ctx, r.lampyr, "lampyr.dev/serving/fixtures/cmd/handler"); err != nil {
		return ctx, err
	}
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	if r.project, err = ly.LoadProject(dir); err != nil {
		return ctx, err
	}
	if r.built, err = ly.Build(ctx, dir, r.project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")}); err != nil {
		return ctx, err
	}
	tag, _ := ly.ParseImageTag(r.lampyr.Registry + "/bench/handler:snapshot")
	pushed, err := ly.Push(ctx, r.built, tag)
	if err != nil {
		return ctx, err
	}
	r.snap = pushed.Ref
	r.inst = r.lampyr.Installation
	if r.sealer, err = e2eutil.Sealer(); err != nil {
		return ctx, err
	}
	// A reused stock cluster may still carry the short autoscaler window a
	// previous (interrupted) run set for its cold phase: with it stock
	// scaled to zero during Lampyr's warm turns and answered nothing
	// within its own 5 s windows.
	if err := resetAutoscaler(ctx, r.stock); err != nil {
		return ctx, err
	}
	busy := settle(ctx, r.sides)
	out, _ := exec.Command("docker", "version", "--format", "{{.Server.Version}}").Output()
	r.report.Started = time.Now().UTC()
	r.report.Machine = map[string]string{
		"cpus": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version(), "docker": strings.TrimSpace(string(out)),
		"knative serving": knative.ServingVersion, "networking": networkingFacts(r.lampyr.Provider) + " (both sides)",
		"memory": MemTotal(), "lampyr execution mode": "fresh (home-warm-fibers: installation default)",
	}
	if busy != "" {
		r.report.Machine["note"] = busy
	}
	return ctx, nil
}

// shortAutoscalerKeys are the config-autoscaler keys the cold phase sets
// on stock.
var shortAutoscalerKeys = []string{"stable-window", "scale-to-zero-grace-period"}

// resetAutoscaler removes the cold phase's keys from stock's
// config-autoscaler, back to Knative's defaults.
func resetAutoscaler(ctx context.Context, stock *side) error {
	data := map[string]any{}
	for _, k := range shortAutoscalerKeys {
		data[k] = nil
	}
	patch, _ := json.Marshal(map[string]any{"data": data})
	_, err := stock.Clients.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-autoscaler", types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func finishBench(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	r, ok := harness.Value[*benchRun](ctx)
	if !ok {
		return ctx, nil
	}
	if len(r.report.Rows) > 0 {
		raw, _ := r.report.JSON()
		_ = os.WriteFile(filepath.Join(r.artDir, "report.json"), raw, 0o644)
		_ = os.WriteFile(filepath.Join(r.artDir, "report.md"), []byte(r.report.Markdown()), 0o644)
		_ = os.WriteFile(filepath.Join(r.artDir, "report.html"), []byte(r.report.HTML()), 0o644)
		fmt.Fprintf(GinkgoWriter, "\n%s\nreports: %s/report.{json,md,html}\n", r.report.Markdown(), r.artDir)
		fmt.Fprintln(GinkgoWriter, renderPNG(ctx, filepath.Join(r.artDir, "report.html"), filepath.Join(r.artDir, "report.png")))
	}
	for _, s := range r.sides {
		_ = s.Clients.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	return ctx, resetAutoscaler(ctx, r.stock)
}

// screenshotHeight is how high the window Chromium renders the report
// into is (the whole bench's report fits); TrimPNG cuts what the page
// leaves blank.
const screenshotHeight = 16000

// renderPNG renders the HTML report to a PNG with headless Chromium
// (Debian's chromium, which `just bench-portability` installs) and says
// what it did; without Chromium it says so and renders nothing.
func renderPNG(ctx context.Context, page, png string) string {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		return "report.png not rendered: no chromium on PATH (apt-get install chromium)"
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--window-size=1200,"+strconv.Itoa(screenshotHeight), "--screenshot="+png, "file://"+page).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("report.png not rendered: chromium: %v: %s", err, out)
	}
	h, clipped, err := TrimPNG(png, 40)
	switch {
	case err != nil:
		return fmt.Sprintf("report rendered: %s (its blank tail not cut: %v)", png, err)
	case clipped:
		return fmt.Sprintf("report rendered: %s (the first %d pixels of the page; report.html has all of it)", png, h)
	}
	return fmt.Sprintf("report rendered: %s (%d pixels high)", png, h)
}

// freshNamespace makes the bench's namespace anew. On Lampyr its
// administrator gives it the whole installation's fiber memory
// (contract.FiberMemoryShareAnnotation: 100%): the bench is the only
// tenant, and its max-scale 20 Services (20 x 128Mi each) held side by
// side exceed the default per-namespace share (50% of
// fiber-memory-capacity), which refused the cold Service with
// NamespaceShareExceeded once issue 31's share arrived.
func freshNamespace(ctx context.Context, s *side, lampyr bool) {
	Expect(s.Clients.FreshNamespace(ctx, ns, 3*time.Minute)).To(Succeed())
	if !lampyr {
		return
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"100%%"}}}`, contract.FiberMemoryShareAnnotation)
	_, err := s.Clients.Kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred(), "giving namespace %s the installation's fiber memory on %s", ns, s.Name)
}

// service is the identical Service applied to both sides (the template is
// sealed for its first Revision; Lampyr needs it, stock ignores it).
func service(svc string, maxScale int32) *unstructured.Unstructured {
	return serviceMode(svc, maxScale, "fresh")
}

// serviceMode is service with Lampyr's execution mode; the annotation is
// part of the identical YAML and means nothing to stock Knative.
func serviceMode(svc string, maxScale int32, mode string) *unstructured.Unstructured {
	r := the()
	p := *r.project
	p.Name = svc
	p.MaxScale = &maxScale
	if mode == "reuse" {
		p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "30s", IdleAction: "release"}
	}
	tmpl, err := ly.SealTemplate(context.Background(), r.inst, r.sealer.Key, ns, svc+"-00001", r.snap, r.built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	return ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: r.runnable, Snapshot: r.snap.String(), Template: tmpl.String(), Public: true})
}

func apply(ctx context.Context, s *side, u *unstructured.Unstructured) {
	u.SetNamespace(ns)
	Expect(s.Clients.Apply(ctx, e2eutil.KServices, u, "bench")).To(Succeed())
}

func host(svc string) string { return svc + "." + ns + "." + clusters.Domain }

func deployBoth(ctx context.Context, svc string, maxScale int32) {
	deployBothMode(ctx, svc, maxScale, "fresh")
}

func deployBothMode(ctx context.Context, svc string, maxScale int32, mode string) {
	u := serviceMode(svc, maxScale, mode)
	for _, s := range the().sides {
		apply(ctx, s, u)
	}
	for _, s := range the().sides {
		_, err := s.Clients.WaitReady(ctx, e2eutil.KServices, ns, svc, 4*time.Minute)
		Expect(err).NotTo(HaveOccurred(), "%s on %s", svc, s.Name)
		Eventually(func() (int, error) { return GetFunc(the().client, s.Gateway, host(svc), "/")(ctx) }).
			WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(Equal(200), "%s on %s", svc, s.Name)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loadNow is the machine's load average now (1, 5 and 15 minutes): every
// figure carries it, as machines of this kind differ up to 3x.
func loadNow() string {
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// addRows adds rows to the report, each with the machine's load now
// unless it carries the load of its own measurement.
func addRows(rows ...Row) {
	for i := range rows {
		if rows[i].Load == "" {
			rows[i].Load = loadNow()
		}
	}
	the().report.Rows = append(the().report.Rows, rows...)
}

// podAutoscalers are Knative's PodAutoscalers (stock's KPA).
var podAutoscalers = schema.GroupVersionResource{Group: "autoscaling.internal.knative.dev", Version: "v1alpha1", Resource: "podautoscalers"}

// stockScale is what stock's autoscaler wants for rev and what it has.
func stockScale(ctx context.Context, rev string) (desired, actual int64, err error) {
	pa, err := the().stock.Clients.Dynamic.Resource(podAutoscalers).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	desired, _, _ = unstructured.NestedInt64(pa.Object, "status", "desiredScale")
	actual, _, _ = unstructured.NestedInt64(pa.Object, "status", "actualScale")
	return desired, actual, nil
}

// warmUp loads both sides in turn (stock's window, then Lampyr's, as the
// measurement does) until stock's autoscaler has scaled for concurrency
// conc: its PodAutoscaler's desired scale equals its actual scale, the
// same over two rounds running. Without it stock's measured rounds mixed
// scale-up with serving, and its starting Pods took CPU from Lampyr's.
func warmUp(ctx context.Context, svc string, conc int, window time.Duration) {
	deadline := time.Now().Add(3 * time.Minute)
	var last, stable int64 = -1, 0
	for round := 1; ; round++ {
		for _, s := range the().sides {
			Load(ctx, conc, window, GetFunc(the().client, s.Gateway, host(svc), "/"))
		}
		desired, actual, err := stockScale(ctx, svc+"-00001")
		Expect(err).NotTo(HaveOccurred())
		fmt.Fprintf(GinkgoWriter, "warm-up c=%d round %d: stock desired %d, actual %d Pods\n", conc, round, desired, actual)
		if desired == actual && desired == last {
			stable++
		} else {
			stable = 0
		}
		last = desired
		if stable >= 1 {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(GinkgoWriter, "warm-up c=%d: stock still scaling after 3 min; measuring anyway\n", conc)
			return
		}
	}
}

// gone waits until the Revision rev has no Pod left on either side (on
// Lampyr its Home and its quota Pod), so a sample's teardown does not
// overlap the next sample.
func gone(ctx context.Context, rev string) {
	for _, s := range the().sides {
		Eventually(func() (int, error) {
			pods, err := s.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=" + rev})
			if err != nil {
				return -1, err
			}
			n := len(pods.Items)
			if s == the().lampyr {
				homes, err := e2eutil.HomePods(ctx, s.Clients, ns, rev)
				if err != nil {
					return -1, err
				}
				n += len(homes.Items)
			}
			return n, nil
		}).WithTimeout(3*time.Minute).WithPolling(500*time.Millisecond).Should(BeZero(), "the Pods of deleted Revision %s on %s", rev, s.Name)
	}
}

// setWarmFibers sets the installation's home-warm-fibers (config-lampyr);
// "" removes it (the default, 2). Homes made after it use it; running
// Homes keep theirs.
func setWarmFibers(ctx context.Context, v string) {
	var val any = v
	if v == "" {
		val = nil
	}
	patch, _ := json.Marshal(map[string]any{"data": map[string]any{lampyrconfig.KeyHomeWarmFibers: val}})
	_, err := the().lampyr.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred(), "setting %s to %q", lampyrconfig.KeyHomeWarmFibers, v)
}

// homeWarmFibers is the --warm-fibers argument of rev's Home.
func homeWarmFibers(ctx context.Context, rev string) string {
	homes, err := e2eutil.HomePods(ctx, the().lampyr.Clients, ns, rev)
	Expect(err).NotTo(HaveOccurred())
	for _, p := range homes.Items {
		for _, c := range p.Spec.Containers {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--warm-fibers="); ok {
					return v
				}
			}
		}
	}
	return ""
}

var _ = Describe("stock Knative vs Lampyr, side by side", Label("cluster", "bench"), Ordered, func() {
	// Warm requests: Lampyr reuses live fibers (execution mode reuse, as a
	// latency-sensitive service would declare); cold: fresh fibers.
	BeforeAll(func(ctx SpecContext) { deployBothMode(ctx, "warm", 20, "reuse") })

	It("measures warm latency and throughput at concurrency 1, 4, 16", Label("warm"), func(ctx SpecContext) {
		dur := time.Duration(suite.IntKnob(benchSeconds, 5)) * time.Second
		for _, conc := range []int{1, 4, 16} {
			// The Service's containerConcurrency is 1: stock scales toward
			// conc/0.7 Pods. Measure once it has.
			warmUp(ctx, "warm", conc, dur)
			load := loadNow()
			got := map[string]*Sample{"stock": {}, "lampyr": {}}
			var lampyrRouter routerTotals
			// A B B A: alternate which side goes first.
			for round, order := range [][]*side{{the().stock, the().lampyr}, {the().lampyr, the().stock}} {
				for _, s := range order {
					var before routerTotals
					if s == the().lampyr {
						var err error
						before, err = scrapeRouters(ctx, the().lampyr.Clients.Kube, "warm")
						Expect(err).NotTo(HaveOccurred())
					}
					smp := Load(ctx, conc, dur, GetFunc(the().client, s.Gateway, host("warm"), "/"))
					if s == the().lampyr {
						after, err := scrapeRouters(ctx, the().lampyr.Clients.Kube, "warm")
						Expect(err).NotTo(HaveOccurred())
						lampyrRouter = lampyrRouter.plus(after.minus(before))
					}
					fmt.Fprintf(GinkgoWriter, "warm c=%d round %d %s: %d requests, %d errors, %d unfinished at the window's end, p50 %.2fms p99 %.2fms, %.0f req/s\n", conc, round+1, s.Name, len(smp.Latencies), smp.Errors, smp.Unfinished, ms(smp.Percentile(50)), ms(smp.Percentile(99)), smp.Throughput())
					got[s.Name].Merge(smp)
				}
			}
			desired, actual, err := stockScale(ctx, "warm-00001")
			Expect(err).NotTo(HaveOccurred())
			load += " -> " + loadNow()
			m := fmt.Sprintf("warm c=%d", conc)
			note := fmt.Sprintf("stock at %d Pods (desired %d)", actual, desired)
			the().report.Samples[m+"/stock"], the().report.Samples[m+"/lampyr"] = got["stock"], got["lampyr"]
			addRows(
				Row{Group: m, Metric: "p50 latency", Unit: "ms", Stock: ms(got["stock"].Percentile(50)), Lampyr: ms(got["lampyr"].Percentile(50)), Goal: "<= 1.0", Note: note, Load: load},
				Row{Group: m, Metric: "p99 latency", Unit: "ms", Stock: ms(got["stock"].Percentile(99)), Lampyr: ms(got["lampyr"].Percentile(99)), Goal: "<= 1.0", Note: note, Load: load},
				Row{Group: m, Metric: "throughput", Unit: "req/s", Stock: got["stock"].Throughput(), Lampyr: got["lampyr"].Throughput(), Load: load},
				Row{Group: m, Metric: "errors", Unit: "", Stock: float64(got["stock"].Errors), Lampyr: float64(got["lampyr"].Errors), Load: load},
				Row{Group: m, Metric: "unfinished at window end", Unit: "", Stock: float64(got["stock"].Unfinished), Lampyr: float64(got["lampyr"].Unfinished), Load: load},
			)
			the().report.Breakdown = append(the().report.Breakdown, breakdownRows("Lampyr "+m, ms(got["lampyr"].Mean()), lampyrRouter)...)
		}
	})

	It("measures cold requests: stock from zero Pods, Lampyr fresh fibers from its warm pool and with no warm fiber", Label("cold", "scaling"), func(ctx SpecContext) {
		cycles := suite.IntKnob(benchColdCycles, 20)
		// Stock's autoscaler would keep an idle Revision 60s+30s; the cold
		// cycles need it at zero sooner. Set only now: with a 6 s window
		// during the warm runs stock scaled down while Lampyr's turn ran and
		// its next round paid a scale-up (first run: p99 4.2 s). The window
		// does not change how long a scale from zero takes. Reset when the
		// spec ends: the apply -> Ready samples ran with it before.
		patch := `{"data":{"stable-window":"6s","scale-to-zero-grace-period":"6s"}}`
		_, err := the().stock.Clients.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-autoscaler", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(resetAutoscaler(ctx, the().stock)).To(Succeed()) })
		deployBoth(ctx, "cold", 20)
		// The same Service on Lampyr alone, whose Home keeps no warm fiber
		// (home-warm-fibers 0 while it is made): every request starts a
		// fiber. Stock has no such thing: its cold request is the same.
		setWarmFibers(ctx, "0")
		DeferCleanup(func(ctx SpecContext) { setWarmFibers(ctx, "") })
		// The grant controller reads config-lampyr through an informer;
		// the assertion below fails if it had not seen the change.
		time.Sleep(2 * time.Second)
		nowarm := service("cold-nowarm", 20)
		apply(ctx, the().lampyr, nowarm)
		_, err = the().lampyr.Clients.WaitReady(ctx, e2eutil.KServices, ns, "cold-nowarm", 4*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		Expect(homeWarmFibers(ctx, "cold-nowarm-00001")).To(Equal("0"), "the no-warm-fiber Home was made with warm fibers")
		setWarmFibers(ctx, "")

		// The floor beside them: the same handler fork+exec'd on this host.
		floor, err := newPlainFloor(ctx, the().snap.String(), GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())

		got := map[string]*Sample{"stock": {}, "lampyr": {}, "nowarm": {}, "floor": {}}
		do := func(what string) {
			if what == "floor" {
				d, err := floor.once(ctx)
				Expect(err).NotTo(HaveOccurred())
				got[what].Add(d, http.StatusOK)
				return
			}
			s, svc := the().stock, "cold"
			switch what {
			case "lampyr":
				s = the().lampyr
			case "nowarm":
				s, svc = the().lampyr, "cold-nowarm"
			}
			t0 := time.Now()
			code, err := GetFunc(the().client, s.Gateway, host(svc), "/")(ctx)
			if err != nil {
				code = -1
			}
			got[what].Add(time.Since(t0), code)
		}
		before, err := scrapeRouters(ctx, the().lampyr.Clients.Kube, "cold")
		Expect(err).NotTo(HaveOccurred())
		beforeNoWarm, err := scrapeRouters(ctx, the().lampyr.Clients.Kube, "cold-nowarm")
		Expect(err).NotTo(HaveOccurred())
		load := loadNow()
		for i := 0; i < cycles; i++ {
			// Stock: wait until the Revision has no Pod at all.
			Eventually(func() (int, error) {
				pods, err := the().stock.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=cold"})
				if err != nil {
					return -1, err
				}
				return len(pods.Items), nil
			}).WithTimeout(3*time.Minute).WithPolling(250*time.Millisecond).Should(BeZero(), "stock never scaled cold to zero (cycle %d)", i)
			// A B A B: stock first in even cycles, Lampyr first in odd
			// ones, so neither always runs beside the other's aftermath
			// (stock's new Pod starting).
			order := []string{"stock", "lampyr", "nowarm", "floor"}
			if i%2 == 1 {
				order = []string{"floor", "lampyr", "nowarm", "stock"}
			}
			for j, what := range order {
				if j > 0 {
					time.Sleep(time.Second)
				}
				do(what)
			}
			fmt.Fprintf(GinkgoWriter, "cold cycle %d (%s first): stock %.0fms, lampyr %.1fms, lampyr with no warm fiber %.1fms, the handler fork+exec'd on the host %.1fms, load %s\n", i+1, order[0], got["stock"].Millis[i], got["lampyr"].Millis[i], got["nowarm"].Millis[i], got["floor"].Millis[i], loadNow())
		}
		load += " -> " + loadNow()
		after, err := scrapeRouters(ctx, the().lampyr.Clients.Kube, "cold")
		Expect(err).NotTo(HaveOccurred())
		afterNoWarm, err := scrapeRouters(ctx, the().lampyr.Clients.Kube, "cold-nowarm")
		Expect(err).NotTo(HaveOccurred())
		the().report.Breakdown = append(the().report.Breakdown, breakdownRows("Lampyr cold request", ms(got["lampyr"].Mean()), after.minus(before))...)
		the().report.Breakdown = append(the().report.Breakdown, breakdownRows("Lampyr cold request, no warm fiber", ms(got["nowarm"].Mean()), afterNoWarm.minus(beforeNoWarm))...)
		the().report.Samples["cold/stock"], the().report.Samples["cold/lampyr"] = got["stock"], got["lampyr"]
		the().report.Samples["cold, no warm fiber/stock"], the().report.Samples["cold, no warm fiber/lampyr"] = got["stock"], got["nowarm"]
		for _, p := range []float64{50, 90, 99} {
			addRows(Row{Group: "cold request", Metric: fmt.Sprintf("p%.0f", p), Unit: "ms",
				Stock: ms(got["stock"].Percentile(p)), Lampyr: ms(got["lampyr"].Percentile(p)), Goal: "<= 0.01", Note: fmt.Sprintf("%d cycles", cycles), Load: load})
		}
		for _, p := range []float64{50, 90, 99} {
			addRows(Row{Group: "cold request, no warm fiber", Metric: fmt.Sprintf("p%.0f", p), Unit: "ms",
				Stock: ms(got["stock"].Percentile(p)), Lampyr: ms(got["nowarm"].Percentile(p)), Goal: "<= 0.01", Note: fmt.Sprintf("%d cycles; Lampyr's Home keeps no warm fiber; host rcu_expedited %s", cycles, hostRCUExpedited()), Load: load})
		}
		// No goal: the floor under any process-per-fiber backend, in the
		// Lampyr column so that its ratio to stock's cold request shows.
		the().report.Samples["cold, no warm fiber/floor"] = got["floor"]
		for _, p := range []float64{50, 90, 99} {
			addRows(Row{Group: "cold request, no warm fiber", Metric: fmt.Sprintf("p%.0f floor: the same handler fork+exec'd on this host, to its first answer (no sandbox, no gateway)", p), Unit: "ms",
				Stock: ms(got["stock"].Percentile(p)), Lampyr: ms(got["floor"].Percentile(p)), Note: fmt.Sprintf("%d cycles, in turn with the rows above", cycles), Load: load})
		}
		Expect(homeWarmFibers(ctx, "cold-nowarm-00001")).To(Equal("0"), "the no-warm-fiber Home was replaced by one with warm fibers during the cycles")
		Expect(got["stock"].Errors+got["lampyr"].Errors+got["nowarm"].Errors).To(BeZero(), "cold requests failed: stock %v lampyr %v lampyr with no warm fiber %v", got["stock"].Codes, got["lampyr"].Codes, got["nowarm"].Codes)
	})

	It("measures apply -> Ready and apply -> first response, with every sample's timeline", Label("readiness"), func(ctx SpecContext) {
		// Free the grant capacity the earlier Services reserve (max-scale x
		// memory; the installation default is 8Gi): the first run's fifth
		// Revision was refused for capacity and never became Ready. Each
		// sample's Service goes before the next one starts, Pods and all.
		for _, s := range the().sides {
			for _, old := range []string{"warm", "cold", "cold-nowarm"} {
				_ = s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, old, metav1.DeleteOptions{})
			}
		}
		for _, old := range []string{"warm", "cold", "cold-nowarm"} {
			gone(ctx, old+"-00001")
		}
		samples := suite.IntKnob(benchReadySamples, 20)
		ready := map[string]*Sample{"stock": {}, "lampyr": {}}
		first := map[string]*Sample{"stock": {}, "lampyr": {}}
		load := loadNow()
		for i := 0; i < samples; i++ {
			svc := fmt.Sprintf("ready-%d", i)
			u := service(svc, 5)
			order := []*side{the().stock, the().lampyr}
			if i%2 == 1 {
				order = []*side{the().lampyr, the().stock}
			}
			for _, s := range order {
				t0 := time.Now()
				stop := make(chan struct{})
				tl := watchRevision(ctx, s.Clients, s == the().lampyr, svc+"-00001", t0, stop)
				apply(ctx, s, u)
				Eventually(func() bool {
					o, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, svc, metav1.GetOptions{})
					return err == nil && e2eutil.IsReady(o)
				}).WithTimeout(4*time.Minute).WithPolling(100*time.Millisecond).Should(BeTrue(), "%s on %s", svc, s.Name)
				d := time.Since(t0)
				ready[s.Name].Add(d, 200)
				tl.at("Service Ready", d)
				// What the gateway answered before the first 200 (after
				// Ready, so on both sides a Route that says Ready but does
				// not serve yet): "404 x3" and the like.
				var before attempts
				Eventually(func() (int, error) {
					code, err := GetFunc(the().client, s.Gateway, host(svc), "/")(ctx)
					if code != 200 {
						before.add(code, err)
					}
					return code, err
				}).WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).Should(Equal(200))
				d = time.Since(t0)
				first[s.Name].Add(d, 200)
				tl.at("first response", d)
				close(stop)
				the().report.Timelines = append(the().report.Timelines, tl.sample(s.Name, svc, loadNow()))
				fmt.Fprintf(GinkgoWriter, "%s on %s: Ready after %.2fs, first response after %.2fs (before it: %s), load %s\n", svc, s.Name, ready[s.Name].Millis[i]/1000, first[s.Name].Millis[i]/1000, before, loadNow())
			}
			for _, s := range the().sides {
				Expect(s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, svc, metav1.DeleteOptions{})).To(Succeed())
			}
			gone(ctx, svc+"-00001")
		}
		load += " -> " + loadNow()
		the().report.Samples["apply-to-ready/stock"], the().report.Samples["apply-to-ready/lampyr"] = ready["stock"], ready["lampyr"]
		addRows(
			Row{Group: "apply -> Ready", Metric: "median", Unit: "ms", Stock: ms(ready["stock"].Percentile(50)), Lampyr: ms(ready["lampyr"].Percentile(50)), Goal: "<= 0.5", Note: fmt.Sprintf("%d samples a side", samples), Load: load},
			Row{Group: "apply -> Ready", Metric: "p90", Unit: "ms", Stock: ms(ready["stock"].Percentile(90)), Lampyr: ms(ready["lampyr"].Percentile(90)), Load: load},
			Row{Group: "apply -> first response", Metric: "median", Unit: "ms", Stock: ms(first["stock"].Percentile(50)), Lampyr: ms(first["lampyr"].Percentile(50)), Goal: "<= 0.5", Load: load},
		)
		rows := timelineRows(the().report.Timelines)
		for i := range rows {
			rows[i].Load = load
		}
		addRows(rows...)
	})

	It("measures behaviour at 2x max-scale concurrent requests", Label("scaling"), func(ctx SpecContext) {
		deployBoth(ctx, "cap", 2)
		for _, s := range the().sides {
			smp := Load(ctx, 4, 10*time.Second, GetFunc(the().client, s.Gateway, host("cap"), "/stream?n=10&delayms=100"))
			the().report.Samples["cap/"+s.Name] = smp
			fmt.Fprintf(GinkgoWriter, "cap %s: %d requests, codes %v, p50 %.0fms p99 %.0fms\n", s.Name, len(smp.Latencies), smp.Codes, ms(smp.Percentile(50)), ms(smp.Percentile(99)))
		}
		st, lp := the().report.Samples["cap/stock"], the().report.Samples["cap/lampyr"]
		addRows(
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "completed", Unit: "", Stock: float64(st.Codes[200]), Lampyr: float64(lp.Codes[200])},
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "503s", Unit: "", Stock: float64(st.Codes[503]), Lampyr: float64(lp.Codes[503])},
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "p99 latency", Unit: "ms", Stock: ms(st.Percentile(99)), Lampyr: ms(lp.Percentile(99))},
		)
	})

	It("measures what an idle Service costs: 20 idle Services minus none, per Service", Label("footprint"), func(ctx SpecContext) {
		for _, s := range the().sides {
			Expect(s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})).To(Succeed())
		}
		window := time.Duration(suite.IntKnob(benchIdleSeconds, 60)) * time.Second
		emptied := func() { emptyBoth(ctx) }
		measure := func(label string) idleMeasure { return measureIdle(ctx, label, window) }
		emptied()
		zero := measure("0 Services")
		const n = 20
		var svcs []*unstructured.Unstructured
		for i := 0; i < n; i++ {
			svcs = append(svcs, service(fmt.Sprintf("idle-%d", i), 2))
		}
		for _, s := range the().sides {
			for _, u := range svcs {
				apply(ctx, s, u)
			}
		}
		for _, s := range the().sides {
			for _, u := range svcs {
				_, err := s.Clients.WaitReady(ctx, e2eutil.KServices, ns, u.GetName(), 5*time.Minute)
				Expect(err).NotTo(HaveOccurred(), "%s on %s", u.GetName(), s.Name)
			}
		}
		// Stock scales the idle Services to zero; Lampyr keeps a Home per
		// Revision. Both are "idle".
		Eventually(func() (int, error) {
			pods, err := the().stock.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service"})
			return len(pods.Items), err
		}).WithTimeout(5*time.Minute).WithPolling(2*time.Second).Should(BeZero(), "stock idle Services never reached zero Pods")
		homesIdle(ctx, n)
		time.Sleep(10 * time.Second)
		settle(ctx, the().sides)
		twenty := measure(fmt.Sprintf("%d Services", n))
		load := zero.load + "; " + twenty.load
		addRows(
			Row{Group: "idle cost per Service", Metric: "node memory", Unit: "MiB", Stock: (twenty.mem[0] - zero.mem[0]) / n, Lampyr: (twenty.mem[1] - zero.mem[1]) / n, Goal: "<= 1.0",
				Note: fmt.Sprintf("(%d Services - 0) / %d, node working set, mean over %s each", n, n, window), Load: load},
			Row{Group: "idle cost per Service", Metric: "node CPU", Unit: "millicores", Stock: (twenty.cpu[0] - zero.cpu[0]) / n, Lampyr: (twenty.cpu[1] - zero.cpu[1]) / n, Goal: "<= 1.0",
				Note: fmt.Sprintf("(%d Services - 0) / %d, over %s each", n, n, window), Load: load},
		)
	})

	It("holds N idle Services on one node, all Ready and each answering its first request", Label("scale"), func(ctx SpecContext) {
		n := suite.IntKnob(benchScaleServices, 200)
		batch := suite.IntKnob(benchScaleBatch, 20)
		window := time.Duration(suite.IntKnob(benchIdleSeconds, 60)) * time.Second
		for _, s := range the().sides {
			Expect(s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})).To(Succeed())
		}
		// Each scale Service: max-scale 1, 64 MiB a fiber (the same
		// limit on stock's container). Lampyr admits a grant's memory x
		// max fibers against fiber-memory-capacity (8Gi by default: 128
		// of these); the platform sizes it for the node, here 16Gi of the
		// node's 24 GiB for 200 Revisions. Restored afterwards.
		before := configLampyr(ctx)[lampyrconfig.KeyFiberMemoryCapacity]
		patchConfigLampyr(ctx, map[string]any{lampyrconfig.KeyFiberMemoryCapacity: "16Gi"})
		DeferCleanup(func(ctx SpecContext) {
			var v any
			if before != "" {
				v = before
			}
			patchConfigLampyr(ctx, map[string]any{lampyrconfig.KeyFiberMemoryCapacity: v})
		})
		emptyBoth(ctx)
		zero := measureIdle(ctx, "scale, 0 Services", window)
		mk := func(i int) *unstructured.Unstructured {
			r := the()
			p := *r.project
			p.Name = fmt.Sprintf("scale-%03d", i)
			one := int32(1)
			p.MaxScale, p.Memory = &one, "64Mi"
			tmpl, err := ly.SealTemplate(context.Background(), r.inst, r.sealer.Key, ns, p.Name+"-00001", r.snap, r.built.Config, p.Policy())
			Expect(err).NotTo(HaveOccurred())
			return ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: r.runnable, Snapshot: r.snap.String(), Template: tmpl.String(), Public: true})
		}
		// Batches, each side in turn (which side goes first alternates):
		// apply a batch, wait for every Service of it to be Ready, send each
		// its first request. Stock starts a Pod per new Revision (initial
		// scale 1) and scales it to zero a minute later; 200 at once would
		// not fit its node's CPU.
		held := map[string]int{}
		took := map[string]time.Duration{}
		first := map[string]*Sample{"stock": {}, "lampyr": {}}
		for b, k := 0, 0; b < n; b, k = b+batch, k+1 {
			sides := the().sides
			if k%2 == 1 {
				sides = []*side{sides[1], sides[0]}
			}
			for _, s := range sides {
				t0 := time.Now()
				var svcs []*unstructured.Unstructured
				for i := b; i < n && i < b+batch; i++ {
					u := mk(i)
					apply(ctx, s, u)
					svcs = append(svcs, u)
				}
				for _, u := range svcs {
					_, err := s.Clients.WaitReady(ctx, e2eutil.KServices, ns, u.GetName(), 10*time.Minute)
					Expect(err).NotTo(HaveOccurred(), "%s on %s (%d of %d Services Ready before it)", u.GetName(), s.Name, held[s.Name], n)
				}
				for _, u := range svcs {
					get := GetFunc(the().client, s.Gateway, host(u.GetName()), "/")
					sent := time.Now()
					var code int
					Eventually(func() (int, error) { c, err := get(ctx); code = c; return c, err }).
						WithTimeout(2*time.Minute).WithPolling(200*time.Millisecond).Should(Equal(200), "first request to %s on %s", u.GetName(), s.Name)
					first[s.Name].Add(time.Since(sent), code)
					held[s.Name]++
				}
				took[s.Name] += time.Since(t0)
				fmt.Fprintf(GinkgoWriter, "scale: %s holds %d Services Ready and answering (batch of %d in %.1fs), load %s\n", s.Name, held[s.Name], len(svcs), time.Since(t0).Seconds(), loadNow())
			}
		}
		// Idle: stock at zero Pods, and every Lampyr Home Running (its
		// reservation given back once idle, when config-lampyr
		// home-idle-after says so).
		Eventually(func() (int, error) {
			pods, err := the().stock.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service"})
			return len(pods.Items), err
		}).WithTimeout(6*time.Minute).WithPolling(2*time.Second).Should(BeZero(), "stock's idle Services never reached zero Pods")
		homesIdle(ctx, n)
		time.Sleep(10 * time.Second)
		settle(ctx, the().sides)
		full := measureIdle(ctx, fmt.Sprintf("scale, %d Services", n), window)
		// Every Lampyr Service still answers after the idle window (a Home
		// that died or lost its fibers while idle would not); on stock every
		// tenth (each a scale from zero, about 3 s here: all 200 would take
		// ten minutes and say nothing new).
		answering, tried := map[string]int{}, map[string]int{}
		for _, s := range the().sides {
			for i := 0; i < n; i++ {
				if s == the().stock && i%10 != 0 {
					continue
				}
				tried[s.Name]++
				if code, err := GetFunc(the().client, s.Gateway, host(fmt.Sprintf("scale-%03d", i)), "/")(ctx); err == nil && code == 200 {
					answering[s.Name]++
				}
			}
		}
		load := zero.load + "; " + full.load
		fn := float64(n)
		addRows(
			Row{Group: fmt.Sprintf("scale: %d idle Services on one node", n), Metric: "Ready and answering their first request", Unit: "Services", Stock: float64(held["stock"]), Lampyr: float64(held["lampyr"]), Goal: ">= 1.0",
				Note: fmt.Sprintf("goal: all %d on each side; batches of %d, sides alternating; took stock %.0fs, Lampyr %.0fs", n, batch, took["stock"].Seconds(), took["lampyr"].Seconds()), Load: load},
			Row{Group: fmt.Sprintf("scale: %d idle Services on one node", n), Metric: "answering again after the idle window", Unit: "share", Stock: float64(answering["stock"]) / float64(tried["stock"]), Lampyr: float64(answering["lampyr"]) / float64(tried["lampyr"]), Goal: ">= 1.0",
				Note: fmt.Sprintf("stock %d of %d tried (every tenth), Lampyr %d of %d", answering["stock"], tried["stock"], answering["lampyr"], tried["lampyr"]), Load: load},
			Row{Group: fmt.Sprintf("scale: %d idle Services on one node", n), Metric: "first request, median", Unit: "ms", Stock: ms(first["stock"].Percentile(50)), Lampyr: ms(first["lampyr"].Percentile(50)),
				Note: "right after Ready: stock's initial Pod is still up", Load: load},
			Row{Group: fmt.Sprintf("scale: %d idle Services on one node", n), Metric: "node working set", Unit: "MiB", Stock: full.mem[0], Lampyr: full.mem[1], Note: fmt.Sprintf("mean over %s; with 0 Services: stock %.0f, Lampyr %.0f", window, zero.mem[0], zero.mem[1]), Load: load},
			Row{Group: fmt.Sprintf("scale: %d idle Services on one node", n), Metric: "node CPU", Unit: "millicores", Stock: full.cpu[0], Lampyr: full.cpu[1], Note: fmt.Sprintf("%s window; with 0 Services: stock %.0f, Lampyr %.0f", window, zero.cpu[0], zero.cpu[1]), Load: load},
			Row{Group: "idle cost per Service", Metric: fmt.Sprintf("node memory, %d Services", n), Unit: "MiB", Stock: (full.mem[0] - zero.mem[0]) / fn, Lampyr: (full.mem[1] - zero.mem[1]) / fn, Goal: "<= 1.0",
				Note: fmt.Sprintf("(%d Services - 0) / %d, node working set, mean over %s each", n, n, window), Load: load},
			Row{Group: "idle cost per Service", Metric: fmt.Sprintf("node CPU, %d Services", n), Unit: "millicores", Stock: (full.cpu[0] - zero.cpu[0]) / fn, Lampyr: (full.cpu[1] - zero.cpu[1]) / fn, Goal: "<= 1.0",
				Note: fmt.Sprintf("(%d Services - 0) / %d, over %s each", n, n, window), Load: load},
		)
		for _, s := range the().sides {
			Expect(s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})).To(Succeed())
		}
		Expect(held).To(HaveKeyWithValue("lampyr", n), "Lampyr held %d of %d idle Services", held["lampyr"], n)
		Expect(answering["lampyr"]).To(Equal(n), "Lampyr: %d of %d idle Services answered after the idle window", answering["lampyr"], n)
	})
})

// emptyBoth waits until the bench namespace has no Pod on either side (nor
// a Home of Lampyr's for it), then until both nodes are quiet (settle): the
// first footprint run measured 20 Services while their Homes' starts still
// loaded the machine (load 10 falling to 5 over the window).
func emptyBoth(ctx context.Context) {
	for _, s := range the().sides {
		Eventually(func() (int, error) {
			// Every Pod of the namespace (stock), and Lampyr's Homes for
			// it, which run in lampyr-homes.
			pods, err := s.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return 0, err
			}
			homes, err := e2eutil.HomePods(ctx, s.Clients, ns, "")
			if err != nil {
				return 0, err
			}
			// Lampyr's quota Pods are never scheduled: they hold nothing
			// on the node and go with their grants.
			n := len(homes.Items)
			for _, p := range pods.Items {
				if p.Spec.NodeName != "" || len(p.Spec.SchedulingGates) == 0 {
					n++
				}
			}
			return n, nil
		}).WithTimeout(6*time.Minute).WithPolling(time.Second).Should(BeZero(), "%s: Pods of deleted Services still running", s.Name)
	}
	time.Sleep(10 * time.Second)
	settle(ctx, the().sides)
}

// homesIdle waits until Lampyr's n Homes of the bench namespace are idle
// as the installation defines it, as the specs wait for stock's Pods to be
// gone: each Running, its reservation given back (config-lampyr
// home-idle-after; annotation lampyr.dev/home-reservation) unless that is
// turned off.
func homesIdle(ctx context.Context, n int) {
	off := configLampyr(ctx)[lampyrconfig.KeyHomeIdleAfter] == "0"
	Eventually(func() (string, error) {
		homes, err := e2eutil.HomePods(ctx, the().lampyr.Clients, ns, "")
		if err != nil {
			return "", err
		}
		running, given := 0, 0
		for _, p := range homes.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
			if p.Annotations["lampyr.dev/home-reservation"] == "idle" {
				given++
			}
		}
		if off {
			given = running
		}
		return fmt.Sprintf("%d Homes Running, %d with their reservation given back", running, given), nil
	}).WithTimeout(5*time.Minute).WithPolling(5*time.Second).Should(Equal(fmt.Sprintf("%d Homes Running, %d with their reservation given back", n, n)), "Lampyr's Homes never became idle")
	fmt.Fprintf(GinkgoWriter, "Lampyr's %d Homes are idle (reservation given back: %v), load %s\n", n, !off, loadNow())
}

// idleMeasure is both nodes over one window: the mean working set and the
// CPU rate, stock first.
type idleMeasure struct {
	mem, cpu [2]float64
	load     string
}

// measureIdle samples both nodes over the same window: memory (the node's
// working set) every 5 s, averaged, and CPU from cumulative counters over
// the whole window; it adds the report's rows for label.
func measureIdle(ctx context.Context, label string, window time.Duration) idleMeasure {
	var out idleMeasure
	names := []string{the().stock.Name, the().lampyr.Name}
	var mem [2][]float64
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(5 * time.Second) {
			for i, n := range names {
				v, err := NodeWorkingSetMiB(n)
				Expect(err).NotTo(HaveOccurred())
				mem[i] = append(mem[i], v)
			}
		}
	}()
	start := loadNow()
	rates := cpuRates(the().sides, window)
	<-done
	out.load = start + " -> " + loadNow()
	for i := range names {
		var sum float64
		for _, v := range mem[i] {
			sum += v
		}
		out.mem[i] = sum / float64(len(mem[i]))
		out.cpu[i] = rates[i]["node CPU"]
		fmt.Fprintf(GinkgoWriter, "idle, %s, %s: node working set %.0f MiB (mean of %d samples), node CPU %.0f millicores over %s, load %s\n", label, names[i], out.mem[i], len(mem[i]), out.cpu[i], window, out.load)
	}
	for _, what := range []string{"node memory", "serving planes memory", "workload memory"} {
		var v [2]float64
		for i, s := range the().sides {
			fp, err := Footprint(s.Name, ns)
			Expect(err).NotTo(HaveOccurred())
			v[i] = fp[what]
		}
		addRows(Row{Group: "idle, " + label, Metric: what, Unit: "MiB", Stock: v[0], Lampyr: v[1], Note: "one sample (docker stats, crictl)"})
	}
	addRows(Row{Group: "idle, " + label, Metric: "node working set", Unit: "MiB", Stock: out.mem[0], Lampyr: out.mem[1], Note: fmt.Sprintf("mean over %s", window), Load: out.load},
		Row{Group: "idle, " + label, Metric: "node CPU", Unit: "millicores", Stock: out.cpu[0], Lampyr: out.cpu[1], Note: fmt.Sprintf("%s window", window), Load: out.load})
	return out
}

// networkingFacts names the networking provider installed on both sides.
func networkingFacts(provider string) string {
	p, err := networking.Get(provider)
	if err != nil {
		return provider
	}
	return p.Name() + ": " + p.Describe()
}
