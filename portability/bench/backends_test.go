package bench

// Fiber backends side by side (issue 35): the same handlers as Lampyr
// Services on the process backend and on the gvisor backend (a runsc
// sandbox per fiber, restored from a checkpoint of the initialized
// handler), each with the installation's warm pool and with none, measured
// through the gateway. Lampyr only: stock has no fibers (the cold spec
// compares it). Run it alone:
//
//	just bench-portability -ginkgo.label-filter=backends
//
// Knobs: LAMPYR_BENCH_BACKEND_CYCLES (cold requests per Service, default
// 10), LAMPYR_BENCH_SECONDS (each fresh-throughput window, default 5).
// Table: _artifacts/bench/backends.md and backends.json.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/ly"
)

// backendFixture is one handler of the backend bench.
type backendFixture struct {
	name    string // short, in Service names
	what    string // for people
	project *ly.Project
	built   *ly.Built
	snap    name.Digest
}

// backendService is one Service of the backend bench.
type backendService struct {
	name    string
	backend string
	warm    string // home-warm-fibers when its Home was made ("" = default)
	fx      *backendFixture
	first   time.Duration // its first request (no warm fiber: makes the checkpoint on gvisor)
	cold    *Sample
	preinit string // the Revision's FibersPreinitialized, as read at the end
}

// BackendResults is what backends.json holds.
type BackendResults struct {
	Started  time.Time         `json:"started"`
	Load     string            `json:"load"`
	Cycles   int               `json:"cycles"`
	Services []BackendRow      `json:"services"`
	Fresh    map[string]Sample `json:"freshThroughput"`
}

// BackendRow is one Service's figures.
type BackendRow struct {
	Service, Backend, Handler, WarmFibers, Preinitialized string
	FirstMs, P50Ms, P90Ms, MaxMs                          float64
	Errors                                                int
}

// configLampyr reads config-lampyr's data.
func configLampyr(ctx context.Context) map[string]string {
	cm, err := the().lampyr.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	return cm.Data
}

// patchConfigLampyr sets (nil: removes) config-lampyr keys.
func patchConfigLampyr(ctx context.Context, data map[string]any) {
	patch, _ := json.Marshal(map[string]any{"data": data})
	_, err := the().lampyr.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred(), "patching config-lampyr with %v", data)
}

// buildFixture builds dir's snapshot and pushes it to Lampyr's registry.
func buildFixture(ctx context.Context, short, what, dir string) *backendFixture {
	fx := &backendFixture{name: short, what: what}
	var err error
	fx.project, err = ly.LoadProject(filepath.Join(e2eutil.RepoRoot(), dir))
	Expect(err).NotTo(HaveOccurred())
	fx.built, err = ly.Build(ctx, filepath.Join(e2eutil.RepoRoot(), dir), fx.project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), short)})
	Expect(err).NotTo(HaveOccurred(), "building %s", dir)
	tag, _ := ly.ParseImageTag(the().lampyr.Registry + "/bench/" + fx.project.Name + ":snapshot")
	pushed, err := ly.Push(ctx, fx.built, tag)
	Expect(err).NotTo(HaveOccurred(), "pushing %s", dir)
	fx.snap = pushed.Ref
	return fx
}

// manifest is fx as the Lampyr Service svc (fresh mode, max-scale 1; the
// image is the snapshot itself: nothing runs it on stock). One fiber at a
// time is all the bench asks of each (every request is alone), and the
// twelve Services must fit the installation's fiber memory beside what
// the kept pair already runs: at max-scale 3 the ninth was refused
// InsufficientMemory (each reserves memory x max fibers).
func (fx *backendFixture) manifest(svc string) *unstructured.Unstructured {
	r := the()
	p := *fx.project
	p.Name = svc
	one := int32(1)
	p.MaxScale = &one
	tmpl, err := ly.SealTemplate(context.Background(), r.inst, r.sealer.Key, ns, svc+"-00001", fx.snap, fx.built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	return ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: fx.snap.String(), Snapshot: fx.snap.String(), Template: tmpl.String(), Public: true})
}

// homeArg is the value of rev's Home's fiberd argument --<flag>= ("" if
// absent).
func homeArg(ctx context.Context, rev, flag string) string {
	homes, err := e2eutil.HomePods(ctx, the().lampyr.Clients, ns, rev)
	Expect(err).NotTo(HaveOccurred())
	for _, p := range homes.Items {
		for _, c := range p.Spec.Containers {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
					return v
				}
			}
		}
	}
	return ""
}

// revisionCondition is rev's condition t as "Status Reason: message" ("absent").
func revisionCondition(ctx context.Context, rev, t string) string {
	u, err := the().lampyr.Clients.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == t {
			s := fmt.Sprint(m["status"])
			if r, _ := m["reason"].(string); r != "" {
				s += " " + r
			}
			if msg, _ := m["message"].(string); msg != "" {
				s += ": " + msg
			}
			return s
		}
	}
	return "absent"
}

var _ = Describe("fiber backends side by side", Label("cluster", "bench", "backends"), Ordered, func() {
	It("measures cold requests through the gateway on the process and gvisor backends, with and without warm fibers, for three handlers", func(ctx SpecContext) {
		cycles := suite.IntKnob(benchBackendCycles, 10)
		window := time.Duration(suite.IntKnob(benchSeconds, 5)) * time.Second
		fixtures := []*backendFixture{
			{name: "hello", what: "the fixture handler", project: the().project, built: the().built, snap: the().snap},
			buildFixture(ctx, "sleepy", "sleeps 1 s before it listens", "fixtures/cmd/sleepy"),
			buildFixture(ctx, "heavy", "touches 100 MiB before it listens", "fixtures/cmd/heavy"),
		}
		keys := []string{lampyrconfig.KeyFiberBackend, lampyrconfig.KeyFiberGVisorPreinit, lampyrconfig.KeyHomeWarmFibers}
		was := configLampyr(ctx)
		DeferCleanup(func(ctx SpecContext) {
			restore := map[string]any{}
			for _, k := range keys {
				if v, ok := was[k]; ok {
					restore[k] = v
				} else {
					restore[k] = nil
				}
			}
			patchConfigLampyr(ctx, restore)
		})

		var svcs []*backendService
		for _, backend := range []string{lampyrconfig.BackendProcess, lampyrconfig.BackendGVisor} {
			for _, warm := range []string{"", "0"} {
				var warmValue any // nil removes the key: the default
				if warm != "" {
					warmValue = warm
				}
				patchConfigLampyr(ctx, map[string]any{lampyrconfig.KeyFiberBackend: backend, lampyrconfig.KeyFiberGVisorPreinit: "true", lampyrconfig.KeyHomeWarmFibers: warmValue})
				// The grant controller reads config-lampyr through an
				// informer; each Home's arguments are checked below.
				time.Sleep(2 * time.Second)
				var group []*backendService
				for _, fx := range fixtures {
					tag := "w"
					if warm == "0" {
						tag = "w0"
					}
					s := &backendService{name: fmt.Sprintf("%s-%s-%s", backend[:2], fx.name, tag), backend: backend, warm: warm, fx: fx, cold: &Sample{}}
					apply(ctx, the().lampyr, fx.manifest(s.name))
					DeferCleanup(func(ctx SpecContext) {
						_ = the().lampyr.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, s.name, metav1.DeleteOptions{})
					})
					group = append(group, s)
				}
				for _, s := range group {
					_, err := the().lampyr.Clients.WaitReady(ctx, e2eutil.KServices, ns, s.name, 4*time.Minute)
					Expect(err).NotTo(HaveOccurred(), "%s never Ready", s.name)
					rev := s.name + "-00001"
					wantArg := backend // the process backend is fiberd's default: no argument
					if backend == lampyrconfig.BackendProcess {
						wantArg = ""
					}
					Expect(homeArg(ctx, rev, "backend")).To(Equal(wantArg), "%s's Home runs another backend", s.name)
					if warm != "" {
						Expect(homeArg(ctx, rev, "warm-fibers")).To(Equal(warm), "%s's Home was made with warm fibers", s.name)
					}
				}
				svcs = append(svcs, group...)
			}
		}
		Expect(configLampyr(ctx)[lampyrconfig.KeyFiberBackend]).To(Equal(lampyrconfig.BackendGVisor))

		get := func(s *backendService) (time.Duration, int) {
			t0 := time.Now()
			code, err := GetFunc(the().client, the().lampyr.Gateway, host(s.name), "/")(ctx)
			if err != nil {
				code = -1
			}
			return time.Since(t0), code
		}
		load := loadNow()
		// The first request of each: with no warm fiber on gvisor it also
		// makes the checkpoint.
		for _, s := range svcs {
			d, code := get(s)
			Expect(code).To(Equal(200), "%s's first request", s.name)
			s.first = d
			time.Sleep(300 * time.Millisecond)
		}
		// Cold cycles: every Service once per cycle, the order rotated each
		// cycle, so no Service always follows the same one. With warm
		// fibers the request takes a pre-started fiber (its pool refills
		// while the other Services are asked); without, it starts one.
		for c := 0; c < cycles; c++ {
			var line []string
			for i := range svcs {
				s := svcs[(i+c)%len(svcs)]
				d, code := get(s)
				s.cold.Add(d, code)
				line = append(line, fmt.Sprintf("%s %.0fms", s.name, ms(d)))
				time.Sleep(300 * time.Millisecond)
			}
			fmt.Fprintf(GinkgoWriter, "backend cold cycle %d: %s; load %s\n", c+1, strings.Join(line, ", "), loadNow())
		}
		// Fresh throughput: back-to-back requests to the fixture handler
		// with the warm pool, each on a never-used fiber, so the rate is
		// how fast the Home starts fibers. A B B A.
		fresh := map[string]*Sample{}
		for _, b := range []string{lampyrconfig.BackendProcess, lampyrconfig.BackendGVisor, lampyrconfig.BackendGVisor, lampyrconfig.BackendProcess} {
			svc := b[:2] + "-hello-w"
			smp := Load(ctx, 1, window, GetFunc(the().client, the().lampyr.Gateway, host(svc), "/"))
			fmt.Fprintf(GinkgoWriter, "fresh throughput %s: %d requests, %d errors, %.2f req/s, p50 %.1fms, load %s\n", b, len(smp.Latencies), smp.Errors, smp.Throughput(), ms(smp.Percentile(50)), loadNow())
			if fresh[b] == nil {
				fresh[b] = &Sample{}
			}
			fresh[b].Merge(smp)
			// Let the pool refill before the other side's window.
			time.Sleep(5 * time.Second)
		}
		load += " -> " + loadNow()

		// What the Revisions say of how their fibers start (issue 35):
		// the grant controller asks a gvisor Home once it is ready, and a
		// Home with no warm fiber again after its first fiber made the
		// checkpoint (every 30 s).
		for _, s := range svcs {
			rev := s.name + "-00001"
			if s.backend != lampyrconfig.BackendGVisor {
				s.preinit = revisionCondition(ctx, rev, "FibersPreinitialized")
				continue
			}
			Eventually(func() string {
				s.preinit = revisionCondition(ctx, rev, "FibersPreinitialized")
				return s.preinit
			}).WithTimeout(90*time.Second).WithPolling(2*time.Second).Should(HavePrefix("True"), "%s: how its fibers start", s.name)
		}

		res := BackendResults{Started: time.Now().UTC(), Load: load, Cycles: cycles, Fresh: map[string]Sample{}}
		for b, smp := range fresh {
			res.Fresh[b] = *smp
		}
		var md strings.Builder
		fmt.Fprintf(&md, "# Fiber backends side by side\n\n%s; load %s; %d cold requests per Service, one per cycle, order rotated; through the gateway.\n\n", res.Started.Format(time.RFC3339), load, cycles)
		md.WriteString("| Service | backend | handler | warm fibers | first request | cold p50 | p90 | max | errors | FibersPreinitialized |\n|---|---|---|---|---:|---:|---:|---:|---:|---|\n")
		sort.SliceStable(svcs, func(i, j int) bool { return svcs[i].fx.name < svcs[j].fx.name })
		var errs []string
		for _, s := range svcs {
			warm := s.warm
			if warm == "" {
				warm = "default"
			}
			row := BackendRow{Service: s.name, Backend: s.backend, Handler: s.fx.what, WarmFibers: warm, Preinitialized: s.preinit,
				FirstMs: ms(s.first), P50Ms: ms(s.cold.Percentile(50)), P90Ms: ms(s.cold.Percentile(90)), MaxMs: ms(s.cold.Percentile(100)), Errors: s.cold.Errors}
			res.Services = append(res.Services, row)
			fmt.Fprintf(&md, "| %s | %s | %s | %s | %.0f ms | %.1f ms | %.1f ms | %.1f ms | %d | %s |\n", row.Service, row.Backend, row.Handler, row.WarmFibers, row.FirstMs, row.P50Ms, row.P90Ms, row.MaxMs, row.Errors, row.Preinitialized)
			if s.cold.Errors > 0 {
				errs = append(errs, fmt.Sprintf("%s: %v", s.name, s.cold.Codes))
			}
		}
		md.WriteString("\n| fresh requests back to back (warm pool, fixture handler) | requests/s | p50 | p99 | errors |\n|---|---:|---:|---:|---:|\n")
		for _, b := range []string{lampyrconfig.BackendProcess, lampyrconfig.BackendGVisor} {
			smp := fresh[b]
			fmt.Fprintf(&md, "| %s | %.2f | %.1f ms | %.1f ms | %d |\n", b, float64(len(smp.Latencies))/(2*window.Seconds()), ms(smp.Percentile(50)), ms(smp.Percentile(99)), smp.Errors)
		}
		fmt.Fprintf(GinkgoWriter, "\n%s\n", md.String())
		dir := the().artDir
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		raw, _ := json.MarshalIndent(res, "", "  ")
		Expect(os.WriteFile(filepath.Join(dir, "backends.json"), raw, 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "backends.md"), []byte(md.String()), 0o644)).To(Succeed())
		Expect(errs).To(BeEmpty(), "cold requests failed")
		Expect(fresh[lampyrconfig.BackendProcess].Errors+fresh[lampyrconfig.BackendGVisor].Errors).To(BeZero(), "fresh requests failed")
	})
})
