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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/clusters/knative"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/impl/ly"
)

func TestBench(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "bench-portability")
}

const ns = "bench"

type side struct {
	name    string
	info    kindcluster.Info
	c       *e2eutil.Clients
	gateway string
}

var (
	// sealer is this machine's ly identity, which signs the templates
	// (authorized by the lampyr install profile).
	sealer   *ly.Sealer
	enabled  = os.Getenv("LAMPYR_E2E") == "1"
	env      *clusters.Env
	stock    = &side{name: "stock"}
	lampyr   = &side{name: "lampyr"}
	sides    = []*side{stock, lampyr}
	created  = map[string]bool{}
	runnable string
	snap     name.Digest
	built    *ly.Built
	project  *ly.Project
	inst     *ly.Installation
	report   = &Results{Samples: map[string]*Sample{}}
	artDir   string
	client   = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
)

// settle waits (up to 5 min) until both nodes are quiet: freshly created
// clusters keep two cores busy for minutes (controllers' first syncs, image
// unpacking), and measuring then says more about the machine than about
// either implementation. Quiet: each node under LAMPYR_BENCH_QUIET_MILLICORES
// (default 400) over a 10 s window.
func settle(ctx context.Context) (note string) {
	limit := float64(envInt("LAMPYR_BENCH_QUIET_MILLICORES", 400))
	deadline := time.Now().Add(5 * time.Minute)
	for {
		rates := cpuRates(10 * time.Second)
		quiet := true
		var line []string
		for i, s := range sides {
			mc := rates[i]["node CPU"]
			line = append(line, fmt.Sprintf("%s %.0f millicores", s.name, mc))
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

func envInt(k string, d int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return d
}

var _ = BeforeSuite(func(ctx SpecContext) {
	if !enabled {
		Skip("the benchmark needs the paired Kind clusters: run it with `just bench-portability` (sets LAMPYR_E2E=1)")
	}
	artDir = filepath.Join(e2eutil.ArtifactsDir(), "bench")
	Expect(os.MkdirAll(artDir, 0o755)).To(Succeed())
	env = clusters.NewEnv(progress.New(GinkgoWriter))
	infos, err := env.Up(ctx, []string{"stock", "lampyr"}, os.Getenv("LAMPYR_KEEP") == "1")
	Expect(err).NotTo(HaveOccurred())
	for i, s := range sides {
		s.info = infos[i]
		created[s.name] = s.info.Created
		s.gateway = s.info.GatewayURL()
		Expect(env.Install(ctx, s.info, s.name, clusters.Networking())).To(Succeed())
		s.c, err = e2eutil.NewClients(s.info.Kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		freshNamespace(ctx, s)
	}
	runnable, err = e2eutil.BuildAndPush(ctx, env.Cache, "lampyr.dev/serving/fixtures/cmd/handler", lampyr.info.Registry, "bench/handler", "runnable")
	Expect(err).NotTo(HaveOccurred())
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	project, err = ly.LoadProject(dir)
	Expect(err).NotTo(HaveOccurred())
	built, err = ly.Build(ctx, dir, project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")})
	Expect(err).NotTo(HaveOccurred())
	tag, _ := ly.ParseImageTag(lampyr.info.Registry + "/bench/handler:snapshot")
	pushed, err := ly.Push(ctx, built, tag)
	Expect(err).NotTo(HaveOccurred())
	snap = pushed.Ref
	lc, err := ly.Connect(lampyr.info.Kubeconfig, "")
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error { inst, err = lc.Describe(ctx); return err }).WithTimeout(time.Minute).Should(Succeed())
	sealer, err = e2eutil.Sealer()
	Expect(err).NotTo(HaveOccurred())
	// A reused stock cluster may still carry the short autoscaler window a
	// previous (interrupted) run set for its cold phase: with it stock
	// scaled to zero during Lampyr's warm turns and answered nothing
	// within its own 5 s windows.
	Expect(resetAutoscaler(ctx)).To(Succeed())
	busy := settle(ctx)
	out, _ := exec.Command("docker", "version", "--format", "{{.Server.Version}}").Output()
	report.Started = time.Now().UTC()
	report.Machine = map[string]string{
		"cpus": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version(), "docker": strings.TrimSpace(string(out)),
		"knative serving": knative.ServingVersion, "networking": networkingFacts() + " (both sides)",
		"memory": memTotal(), "lampyr execution mode": "fresh (home-warm-fibers: installation default)",
	}
	if busy != "" {
		report.Machine["note"] = busy
	}
}, NodeTimeout(60*time.Minute))

// shortAutoscalerKeys are the config-autoscaler keys the cold phase sets
// on stock.
var shortAutoscalerKeys = []string{"stable-window", "scale-to-zero-grace-period"}

// resetAutoscaler removes the cold phase's keys from stock's
// config-autoscaler, back to Knative's defaults.
func resetAutoscaler(ctx context.Context) error {
	data := map[string]any{}
	for _, k := range shortAutoscalerKeys {
		data[k] = nil
	}
	patch, _ := json.Marshal(map[string]any{"data": data})
	_, err := stock.c.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-autoscaler", types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.Join(strings.Fields(line)[1:], " ")
}

var _ = AfterSuite(func(ctx SpecContext) {
	if !enabled || env == nil {
		return
	}
	if len(report.Rows) > 0 {
		raw, _ := report.JSON()
		_ = os.WriteFile(filepath.Join(artDir, "report.json"), raw, 0o644)
		_ = os.WriteFile(filepath.Join(artDir, "report.md"), []byte(report.Markdown()), 0o644)
		_ = os.WriteFile(filepath.Join(artDir, "report.html"), []byte(report.HTML()), 0o644)
		fmt.Fprintf(GinkgoWriter, "\n%s\nreports: %s/report.{json,md,html}\n", report.Markdown(), artDir)
	}
	for _, s := range sides {
		if s.c != nil {
			_ = s.c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		}
	}
	if stock.c != nil {
		_ = resetAutoscaler(ctx)
	}
	if os.Getenv("LAMPYR_KEEP") == "1" {
		return
	}
	for _, s := range sides {
		if created[s.name] {
			Expect(env.Manager().Delete(s.name)).To(Succeed())
		}
	}
}, NodeTimeout(10*time.Minute))

func freshNamespace(ctx context.Context, s *side) {
	Expect(s.c.FreshNamespace(ctx, ns, 3*time.Minute)).To(Succeed())
}

// service is the identical Service applied to both sides (the template is
// sealed for its first Revision; Lampyr needs it, stock ignores it).
func service(svc string, maxScale int32) *unstructured.Unstructured {
	return serviceMode(svc, maxScale, "fresh")
}

// serviceMode is service with Lampyr's execution mode; the annotation is
// part of the identical YAML and means nothing to stock Knative.
func serviceMode(svc string, maxScale int32, mode string) *unstructured.Unstructured {
	p := *project
	p.Name = svc
	p.MaxScale = &maxScale
	if mode == "reuse" {
		p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "30s", IdleAction: "release"}
	}
	tmpl, err := ly.SealTemplate(context.Background(), inst, sealer.Key, ns, svc+"-00001", snap, built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	return ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: runnable, Snapshot: snap.String(), Template: tmpl.String(), Public: true})
}

func apply(ctx context.Context, s *side, u *unstructured.Unstructured) {
	u.SetNamespace(ns)
	Expect(s.c.Apply(ctx, e2eutil.KServices, u, "bench")).To(Succeed())
}

func host(svc string) string { return svc + "." + ns + "." + clusters.Domain }

func deployBoth(ctx context.Context, svc string, maxScale int32) {
	deployBothMode(ctx, svc, maxScale, "fresh")
}

func deployBothMode(ctx context.Context, svc string, maxScale int32, mode string) {
	u := serviceMode(svc, maxScale, mode)
	for _, s := range sides {
		apply(ctx, s, u)
	}
	for _, s := range sides {
		_, err := s.c.WaitReady(ctx, e2eutil.KServices, ns, svc, 4*time.Minute)
		Expect(err).NotTo(HaveOccurred(), "%s on %s", svc, s.name)
		Eventually(func() (int, error) { return GetFunc(client, s.gateway, host(svc), "/")(ctx) }).
			WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(Equal(200), "%s on %s", svc, s.name)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var _ = Describe("stock Knative vs Lampyr, side by side", Label("cluster", "bench"), Ordered, func() {
	// Warm requests: Lampyr reuses live fibers (execution mode reuse, as a
	// latency-sensitive service would declare); cold: fresh fibers.
	BeforeAll(func(ctx SpecContext) { deployBothMode(ctx, "warm", 20, "reuse") })

	It("measures warm latency and throughput at concurrency 1, 4, 16", func(ctx SpecContext) {
		dur := time.Duration(envInt("LAMPYR_BENCH_SECONDS", 5)) * time.Second
		for _, conc := range []int{1, 4, 16} {
			got := map[string]*Sample{"stock": {}, "lampyr": {}}
			var lampyrRouter routerTotals
			// A B B A: alternate which side goes first.
			for round, order := range [][]*side{{stock, lampyr}, {lampyr, stock}} {
				for _, s := range order {
					var before routerTotals
					if s == lampyr {
						var err error
						before, err = scrapeRouters(ctx, lampyr.c.Kube, "warm")
						Expect(err).NotTo(HaveOccurred())
					}
					smp := Load(ctx, conc, dur, GetFunc(client, s.gateway, host("warm"), "/"))
					if s == lampyr {
						after, err := scrapeRouters(ctx, lampyr.c.Kube, "warm")
						Expect(err).NotTo(HaveOccurred())
						lampyrRouter = lampyrRouter.plus(after.minus(before))
					}
					fmt.Fprintf(GinkgoWriter, "warm c=%d round %d %s: %d requests, %d errors, %d unfinished at the window's end, p50 %.2fms p99 %.2fms, %.0f req/s\n", conc, round+1, s.name, len(smp.Latencies), smp.Errors, smp.Unfinished, ms(smp.Percentile(50)), ms(smp.Percentile(99)), smp.Throughput())
					got[s.name].Merge(smp)
				}
			}
			m := fmt.Sprintf("warm c=%d", conc)
			report.Samples[m+"/stock"], report.Samples[m+"/lampyr"] = got["stock"], got["lampyr"]
			report.Rows = append(report.Rows,
				Row{Group: m, Metric: "p50 latency", Unit: "ms", Stock: ms(got["stock"].Percentile(50)), Lampyr: ms(got["lampyr"].Percentile(50)), Goal: "<= 1.0"},
				Row{Group: m, Metric: "p99 latency", Unit: "ms", Stock: ms(got["stock"].Percentile(99)), Lampyr: ms(got["lampyr"].Percentile(99)), Goal: "<= 1.0"},
				Row{Group: m, Metric: "throughput", Unit: "req/s", Stock: got["stock"].Throughput(), Lampyr: got["lampyr"].Throughput()},
				Row{Group: m, Metric: "errors", Unit: "", Stock: float64(got["stock"].Errors), Lampyr: float64(got["lampyr"].Errors)},
				Row{Group: m, Metric: "unfinished at window end", Unit: "", Stock: float64(got["stock"].Unfinished), Lampyr: float64(got["lampyr"].Unfinished)},
			)
			report.Breakdown = append(report.Breakdown, breakdownRows("Lampyr "+m, ms(got["lampyr"].Mean()), lampyrRouter)...)
		}
	})

	It("measures cold requests: stock from zero Pods, Lampyr fresh fibers", func(ctx SpecContext) {
		cycles := envInt("LAMPYR_BENCH_COLD_CYCLES", 20)
		// Stock's autoscaler would keep an idle Revision 60s+30s; the cold
		// cycles need it at zero sooner. Set only now: with a 6 s window
		// during the warm runs stock scaled down while Lampyr's turn ran and
		// its next round paid a scale-up (first run: p99 4.2 s). The window
		// does not change how long a scale from zero takes.
		patch := `{"data":{"stable-window":"6s","scale-to-zero-grace-period":"6s"}}`
		_, err := stock.c.Kube.CoreV1().ConfigMaps("knative-serving").Patch(ctx, "config-autoscaler", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		Expect(err).NotTo(HaveOccurred())
		deployBoth(ctx, "cold", 20)
		got := map[string]*Sample{"stock": {}, "lampyr": {}}
		do := func(s *side) {
			t0 := time.Now()
			code, err := GetFunc(client, s.gateway, host("cold"), "/")(ctx)
			if err != nil {
				code = -1
			}
			got[s.name].Add(time.Since(t0), code)
		}
		before, err := scrapeRouters(ctx, lampyr.c.Kube, "cold")
		Expect(err).NotTo(HaveOccurred())
		for i := 0; i < cycles; i++ {
			// Stock: wait until the Revision has no Pod at all.
			Eventually(func() (int, error) {
				pods, err := stock.c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=cold"})
				if err != nil {
					return -1, err
				}
				return len(pods.Items), nil
			}).WithTimeout(3*time.Minute).WithPolling(250*time.Millisecond).Should(BeZero(), "stock never scaled cold to zero (cycle %d)", i)
			do(stock)
			// Lampyr: every fresh request gets a fiber no request used.
			time.Sleep(time.Second)
			do(lampyr)
			fmt.Fprintf(GinkgoWriter, "cold cycle %d: stock %.0fms, lampyr %.1fms\n", i+1, got["stock"].Millis[i], got["lampyr"].Millis[i])
		}
		after, err := scrapeRouters(ctx, lampyr.c.Kube, "cold")
		Expect(err).NotTo(HaveOccurred())
		report.Breakdown = append(report.Breakdown, breakdownRows("Lampyr cold request", ms(got["lampyr"].Mean()), after.minus(before))...)
		report.Samples["cold/stock"], report.Samples["cold/lampyr"] = got["stock"], got["lampyr"]
		for _, p := range []float64{50, 90, 99} {
			report.Rows = append(report.Rows, Row{Group: "cold request", Metric: fmt.Sprintf("p%.0f", p), Unit: "ms",
				Stock: ms(got["stock"].Percentile(p)), Lampyr: ms(got["lampyr"].Percentile(p)), Goal: "<= 0.01", Note: fmt.Sprintf("%d cycles", cycles)})
		}
		Expect(got["stock"].Errors+got["lampyr"].Errors).To(BeZero(), "cold requests failed: stock %v lampyr %v", got["stock"].Codes, got["lampyr"].Codes)
	})

	It("measures apply -> Ready and apply -> first response over 5 Revisions", func(ctx SpecContext) {
		// Free the grant capacity the earlier Services reserve (max-scale x
		// memory; the installation default is 8Gi): the first run's fifth
		// Revision was refused for capacity and never became Ready.
		for _, s := range sides {
			for _, old := range []string{"warm", "cold"} {
				_ = s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, old, metav1.DeleteOptions{})
			}
		}
		ready := map[string]*Sample{"stock": {}, "lampyr": {}}
		var timelines []*timeline
		first := map[string]*Sample{"stock": {}, "lampyr": {}}
		for i := 0; i < 5; i++ {
			svc := fmt.Sprintf("ready-%d", i)
			u := service(svc, 5)
			order := []*side{stock, lampyr}
			if i%2 == 1 {
				order = []*side{lampyr, stock}
			}
			for _, s := range order {
				t0 := time.Now()
				var stop chan struct{}
				if s == lampyr {
					stop = make(chan struct{})
					timelines = append(timelines, watchRevision(ctx, s.c, svc+"-00001", stop))
				}
				apply(ctx, s, u)
				Eventually(func() bool {
					o, err := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, svc, metav1.GetOptions{})
					return err == nil && e2eutil.IsReady(o)
				}).WithTimeout(4*time.Minute).WithPolling(100*time.Millisecond).Should(BeTrue(), "%s on %s", svc, s.name)
				ready[s.name].Add(time.Since(t0), 200)
				if stop != nil {
					close(stop)
				}
				Eventually(func() (int, error) { return GetFunc(client, s.gateway, host(svc), "/")(ctx) }).
					WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).Should(Equal(200))
				first[s.name].Add(time.Since(t0), 200)
				fmt.Fprintf(GinkgoWriter, "%s on %s: Ready after %.1fs, first response after %.1fs\n", svc, s.name, ready[s.name].Millis[i]/1000, first[s.name].Millis[i]/1000)
			}
		}
		report.Breakdown = append(report.Breakdown, timelineRows(timelines)...)
		report.Samples["apply-to-ready/stock"], report.Samples["apply-to-ready/lampyr"] = ready["stock"], ready["lampyr"]
		report.Rows = append(report.Rows,
			Row{Group: "apply -> Ready", Metric: "median", Unit: "ms", Stock: ms(ready["stock"].Percentile(50)), Lampyr: ms(ready["lampyr"].Percentile(50)), Goal: "<= 0.5"},
			Row{Group: "apply -> first response", Metric: "median", Unit: "ms", Stock: ms(first["stock"].Percentile(50)), Lampyr: ms(first["lampyr"].Percentile(50)), Goal: "<= 0.5"},
		)
	})

	It("measures behaviour at 2x max-scale concurrent requests", func(ctx SpecContext) {
		deployBoth(ctx, "cap", 2)
		for _, s := range sides {
			smp := Load(ctx, 4, 10*time.Second, GetFunc(client, s.gateway, host("cap"), "/stream?n=10&delayms=100"))
			report.Samples["cap/"+s.name] = smp
			fmt.Fprintf(GinkgoWriter, "cap %s: %d requests, codes %v, p50 %.0fms p99 %.0fms\n", s.name, len(smp.Latencies), smp.Codes, ms(smp.Percentile(50)), ms(smp.Percentile(99)))
		}
		st, lp := report.Samples["cap/stock"], report.Samples["cap/lampyr"]
		report.Rows = append(report.Rows,
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "completed", Unit: "", Stock: float64(st.Codes[200]), Lampyr: float64(lp.Codes[200])},
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "503s", Unit: "", Stock: float64(st.Codes[503]), Lampyr: float64(lp.Codes[503])},
			Row{Group: "2x max-scale (4 clients, max-scale 2, 1 s streams)", Metric: "p99 latency", Unit: "ms", Stock: ms(st.Percentile(99)), Lampyr: ms(lp.Percentile(99))},
		)
	})

	It("measures the idle footprint with 0 and 20 idle Services", func(ctx SpecContext) {
		for _, s := range sides {
			Expect(s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})).To(Succeed())
		}
		settle := func() {
			for _, s := range sides {
				Eventually(func() (int, error) {
					// Every Pod of the namespace (stock), and Lampyr's
					// Homes for it, which run in lampyr-homes.
					pods, err := s.c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
					if err != nil {
						return 0, err
					}
					homes, err := e2eutil.HomePods(ctx, s.c, ns, "")
					if err != nil {
						return 0, err
					}
					return len(pods.Items) + len(homes.Items), nil
				}).WithTimeout(4*time.Minute).WithPolling(time.Second).Should(BeZero(), "%s: Pods of deleted Services still running", s.name)
			}
			time.Sleep(10 * time.Second)
		}
		measure := func(label string) {
			for _, what := range []string{"node memory", "serving planes memory", "workload memory"} {
				var v [2]float64
				for i, s := range sides {
					fp, err := footprint(s.info.Name)
					Expect(err).NotTo(HaveOccurred())
					v[i] = fp[what]
				}
				report.Rows = append(report.Rows, Row{Group: "idle, " + label, Metric: what, Unit: "MiB", Stock: v[0], Lampyr: v[1], Goal: map[bool]string{true: "<= 1.0"}[label == "20 Services" && what == "node memory"]})
			}
			// CPU: both nodes over the same window, from cumulative
			// counters (the node's cgroup; each container's CRI stats).
			window := time.Duration(envInt("LAMPYR_BENCH_IDLE_CPU_SECONDS", 30)) * time.Second
			rates := cpuRates(window)
			for _, what := range []string{"node CPU", "serving planes CPU", "workload CPU"} {
				var v [2]float64
				for i := range sides {
					v[i] = rates[i][what]
				}
				report.Rows = append(report.Rows, Row{Group: "idle, " + label, Metric: what, Unit: "millicores", Stock: v[0], Lampyr: v[1], Note: fmt.Sprintf("%s window", window)})
			}
		}
		settle()
		measure("0 Services")
		var svcs []*unstructured.Unstructured
		for i := 0; i < 20; i++ {
			svcs = append(svcs, service(fmt.Sprintf("idle-%d", i), 2))
		}
		for _, s := range sides {
			for _, u := range svcs {
				apply(ctx, s, u)
			}
		}
		for _, s := range sides {
			for _, u := range svcs {
				_, err := s.c.WaitReady(ctx, e2eutil.KServices, ns, u.GetName(), 5*time.Minute)
				Expect(err).NotTo(HaveOccurred(), "%s on %s", u.GetName(), s.name)
			}
		}
		// Stock scales the idle Services to zero; Lampyr keeps a Home per
		// Revision. Both are "idle".
		Eventually(func() (int, error) {
			pods, err := stock.c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service"})
			return len(pods.Items), err
		}).WithTimeout(5*time.Minute).WithPolling(2*time.Second).Should(BeZero(), "stock idle Services never reached zero Pods")
		time.Sleep(10 * time.Second)
		measure("20 Services")
	})
})

// networkingFacts names the networking provider installed on both sides.
func networkingFacts() string {
	p, err := networking.Get(clusters.Networking())
	if err != nil {
		return clusters.Networking()
	}
	return p.Name() + ": " + p.Describe()
}

// footprint reads, inside a cluster's node, the memory of the whole node
// (its cgroup, as docker stats reports it), of the serving control and data
// plane (knative-serving, lampyr-system, traefik), and of the workload (the
// bench's namespace; on Lampyr its Homes, in lampyr-homes, where only this
// bench's Revisions run), from crictl stats (working set), in MiB.
func footprint(cluster string) (map[string]float64, error) {
	node := cluster + "-control-plane"
	out, err := exec.Command("docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", node).Output()
	if err != nil {
		return nil, fmt.Errorf("docker stats %s: %w", node, err)
	}
	used, _, _ := strings.Cut(strings.TrimSpace(string(out)), "/")
	fp := map[string]float64{"node memory": parseMiB(strings.TrimSpace(used))}
	stats, err := criStats(node)
	if err != nil {
		return nil, err
	}
	for _, c := range stats {
		switch c.namespace {
		case "knative-serving", "lampyr-system", "traefik":
			fp["serving planes memory"] += c.workingSet / (1 << 20)
		case ns, e2eutil.LampyrHomesNamespace:
			fp["workload memory"] += c.workingSet / (1 << 20)
		}
	}
	return fp, nil
}

// cpuRates samples both sides' CPU counters at the start and end of the same
// window and returns each counter's mean rate over it, in millicores.
func cpuRates(window time.Duration) [2]map[string]float64 {
	var before, rates [2]map[string]float64
	for i, s := range sides {
		c, err := cpuCounters(s.info.Name)
		Expect(err).NotTo(HaveOccurred())
		before[i] = c
	}
	time.Sleep(window)
	for i, s := range sides {
		c, err := cpuCounters(s.info.Name)
		Expect(err).NotTo(HaveOccurred())
		rates[i] = map[string]float64{}
		for k, v := range c {
			rates[i][k] = (v - before[i][k]) / float64(window.Nanoseconds()) * 1000
		}
	}
	return rates
}

// cpuCounters reads a cluster's cumulative CPU time in nanoseconds: the
// node container's cgroup (cgroup v1 cpuacct or v2 cpu.stat, Docker's
// cgroupfs or systemd layout) and the serving planes' containers (CRI
// stats).
func cpuCounters(cluster string) (map[string]float64, error) {
	node := cluster + "-control-plane"
	out, err := exec.Command("docker", "inspect", "-f", "{{.Id}}", node).Output()
	if err != nil {
		return nil, fmt.Errorf("docker inspect %s: %w", node, err)
	}
	id := strings.TrimSpace(string(out))
	c := map[string]float64{}
	found := false
	for _, f := range []string{
		"/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage",
		"/sys/fs/cgroup/cpuacct/system.slice/docker-" + id + ".scope/cpuacct.usage",
	} {
		if b, err := os.ReadFile(f); err == nil {
			c["node CPU"], _ = strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			found = true
			break
		}
	}
	for _, f := range []string{
		"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat",
		"/sys/fs/cgroup/docker/" + id + "/cpu.stat",
	} {
		if found {
			break
		}
		if b, err := os.ReadFile(f); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					us, _ := strconv.ParseFloat(v, 64)
					c["node CPU"] = us * 1000
					found = true
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no cgroup CPU counter for container %s (looked under /sys/fs/cgroup for Docker's cgroupfs and systemd layouts)", node)
	}
	stats, err := criStats(node)
	if err != nil {
		return nil, err
	}
	for _, st := range stats {
		switch st.namespace {
		case "knative-serving", "lampyr-system", "traefik":
			c["serving planes CPU"] += st.cpuNanos
		case ns, e2eutil.LampyrHomesNamespace:
			c["workload CPU"] += st.cpuNanos
		}
	}
	return c, nil
}

// criStat is one container's CRI stats: its pod's namespace, working set
// (bytes) and cumulative CPU time (ns).
type criStat struct {
	namespace            string
	workingSet, cpuNanos float64
}

// criStats reads every container's stats in a node with crictl.
func criStats(node string) ([]criStat, error) {
	raw, err := exec.Command("docker", "exec", node, "crictl", "stats", "-o", "json").Output()
	if err != nil {
		return nil, fmt.Errorf("crictl stats in %s: %w", node, err)
	}
	type value struct {
		Value string `json:"value"`
	}
	var st struct {
		Stats []struct {
			Attributes struct {
				Labels map[string]string `json:"labels"`
			} `json:"attributes"`
			Memory struct {
				WorkingSetBytes value `json:"workingSetBytes"`
			} `json:"memory"`
			CPU struct {
				UsageCoreNanoSeconds value `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("crictl stats in %s: %w", node, err)
	}
	out := make([]criStat, 0, len(st.Stats))
	for _, s := range st.Stats {
		ws, _ := strconv.ParseFloat(s.Memory.WorkingSetBytes.Value, 64)
		cpu, _ := strconv.ParseFloat(s.CPU.UsageCoreNanoSeconds.Value, 64)
		out = append(out, criStat{namespace: s.Attributes.Labels["io.kubernetes.pod.namespace"], workingSet: ws, cpuNanos: cpu})
	}
	return out, nil
}

func parseMiB(s string) float64 {
	units := map[string]float64{"KiB": 1.0 / 1024, "MiB": 1, "GiB": 1024, "B": 1.0 / (1 << 20)}
	for _, u := range []string{"KiB", "MiB", "GiB", "B"} {
		if strings.HasSuffix(s, u) {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(s, u), 64)
			return v * units[u]
		}
	}
	return 0
}
