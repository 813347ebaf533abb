package feasibility

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/portability"
)

// The suite's own variables (docs/environment.md).
const (
	// envProviders restricts the gate to some providers (comma-separated
	// names); unset, every provider is measured (those that need a
	// registry are recorded as skipped offline).
	envProviders = "LAMPYR_FEASIBILITY_PROVIDERS"
	// envSabotage, for showing that a failure is reported with its
	// evidence and not as a hang: "router-zero" scales fiber-router to zero
	// during proof 6.
	envSabotage = "LAMPYR_FEASIBILITY_SABOTAGE"
)

var suite = harness.New(harness.Config{
	Name:     "feasibility",
	Recipe:   "just test-feasibility",
	Clusters: []harness.Cluster{{Name: clusterName, Profile: clusters.ProfileLampyr}},
	Knobs:    []string{envProviders, envSabotage},
	// Each provider is installed in turn by its specs (gateProviders: the
	// default last, so the cluster is left on it); the harness installs
	// the first, so the shared setup has a Lampyr to talk to.
	Provider: func(o harness.Options) string {
		if ps := gateProviders(o); len(ps) > 0 {
			return ps[0]
		}
		return o.Provider
	},
})

func TestFeasibility(t *testing.T) { suite.Run(t) }

var (
	_ = suite.Setup("building and pushing the handler's snapshot", setupGate)
	_ = suite.Finish("writing the matrix, restoring the strategy and fiber-router", finishGate)
)

const (
	clusterName = "lampyr"
	systemNS    = "lampyr-system"
	svcName     = "split"
)

// gate is the suite's state, made by setupGate and read by the specs.
type gate struct {
	*harness.Target
	// sealer is this machine's ly identity, which signs the templates
	// (authorized by the lampyr install profile).
	sealer  *ly.Sealer
	project *ly.Project
	built   *ly.Built
	snap    name.Digest
	matrix  *Matrix
	artDir  string
	// routerReplicas is fiber-router's replica count before a sabotage.
	routerReplicas int32
}

// the is the gate's state.
func the() *gate { return harness.State[*gate](suite) }

func setupGate(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	t, err := harness.TargetFrom(ctx, clusterName)
	if err != nil {
		return ctx, err
	}
	g := &gate{Target: t, matrix: &Matrix{}, artDir: harness.Artifacts(ctx)}
	if p, err := networking.Get(t.Provider); err == nil {
		g.matrix.SetProvider(p.Name(), p.Describe())
	}
	if g.sealer, err = e2eutil.Sealer(); err != nil {
		return ctx, err
	}
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	if g.project, err = ly.LoadProject(dir); err != nil {
		return ctx, err
	}
	if g.built, err = ly.Build(ctx, dir, g.project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")}); err != nil {
		return ctx, err
	}
	tag, err := ly.ParseImageTag(t.Registry + "/feasibility/handler:gate")
	if err != nil {
		return ctx, err
	}
	pushed, err := ly.Push(ctx, g.built, tag)
	if err != nil {
		return ctx, err
	}
	g.snap = pushed.Ref
	return harness.With(ctx, g), nil
}

func finishGate(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	g, ok := harness.Value[*gate](ctx)
	if !ok {
		return ctx, nil
	}
	fmt.Fprintf(GinkgoWriter, "\nBackend feasibility matrix:\n%s", g.matrix.Table())
	if raw, err := g.matrix.JSON(); err == nil {
		_ = os.WriteFile(filepath.Join(g.artDir, "matrix.json"), raw, 0o644)
		_ = os.WriteFile(filepath.Join(g.artDir, "matrix.txt"), []byte(g.matrix.Table()), 0o644)
	}
	// Leave the installation on its default strategy for the provider it
	// runs, and undo a sabotage.
	err := g.setStrategy(ctx, install.BackendStrategyFor(g.Provider))
	if g.routerReplicas > 0 {
		scale := fmt.Sprintf(`{"spec":{"replicas":%d}}`, g.routerReplicas)
		_, serr := g.Clients.Kube.AppsV1().Deployments(systemNS).Patch(ctx, "fiber-router", types.MergePatchType, []byte(scale), metav1.PatchOptions{})
		err = errors.Join(err, serr)
	}
	return ctx, err
}

func (g *gate) setStrategy(ctx context.Context, s string) error {
	patch := fmt.Sprintf(`{"data":{"backend-strategy":%q}}`, s)
	_, err := g.Clients.Kube.CoreV1().ConfigMaps(systemNS).Patch(ctx, "config-lampyr", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// proof runs one bounded check and records it; a failure is a matrix
// entry with its evidence, not a failed spec (the gate decides at the end).
func proof(provider, strategy, name string, f func() (evidence string, recovery time.Duration, err error)) bool {
	start := time.Now()
	ev, rec, err := f()
	r := Result{Provider: provider, Strategy: strategy, Proof: name, Outcome: OutcomePass, Evidence: ev, Duration: time.Since(start), Recovery: rec}
	if err != nil {
		r.Outcome, r.Evidence = OutcomeFail, err.Error()
	}
	the().matrix.Add(r)
	fmt.Fprintf(GinkgoWriter, "[%s/%s] %s: %s (%s) %s\n", provider, strategy, name, r.Outcome, r.Duration.Round(100*time.Millisecond), r.Evidence)
	return err == nil
}

// echo GETs /echo on host and returns the handler's K_REVISION and the
// headers it received.
func echo(ctx context.Context, host string) (string, http.Header, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, the().Gateway+"/echo", nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", nil, 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", nil, resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var e struct {
		Headers http.Header       `json:"headers"`
		Env     map[string]string `json:"env"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return "", nil, resp.StatusCode, fmt.Errorf("body %q: %w", body, err)
	}
	return e.Env["K_REVISION"], e.Headers, 200, nil
}

// firstGood polls until host answers 200 from one of the Revisions, or
// the bound passes.
func firstGood(ctx context.Context, host string, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	var last error
	for time.Since(start) < bound {
		if _, _, _, err := echo(ctx, host); err == nil {
			return time.Since(start), nil
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("no good response within %s; last: %v", bound, last)
}

func ksvc(ns string, traffic []any, rev string) *unstructured.Unstructured {
	g := the()
	p := *g.project
	p.Name = svcName
	tmpl, err := ly.SealTemplate(context.Background(), g.Installation, g.sealer.Key, ns, rev, g.snap, g.built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	u := ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: g.snap.String(), Snapshot: g.snap.String(), Template: tmpl.String(), Public: true})
	if traffic != nil {
		Expect(unstructured.SetNestedSlice(u.Object, traffic, "spec", "traffic")).To(Succeed())
	}
	return u
}

func apply(ctx context.Context, u *unstructured.Unstructured) {
	Expect(the().Clients.Apply(ctx, e2eutil.KServices, u, "feasibility")).To(Succeed())
}

func freshNamespace(ctx context.Context, ns string) {
	Expect(the().Clients.FreshNamespace(ctx, ns, 3*time.Minute)).To(Succeed())
}

// waitRouterReady waits for fiber-router's Deployment to be fully rolled
// out (bounded).
func waitRouterReady(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		d, err := the().Clients.Kube.AppsV1().Deployments(systemNS).Get(ctx, "fiber-router", metav1.GetOptions{})
		if err == nil && d.Status.ObservedGeneration >= d.Generation && d.Spec.Replicas != nil &&
			d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.ReadyReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas {
			// The replaced Pods must be gone too: a draining Pod still
			// answers, and recovery means the new Pods carry the traffic.
			pods, err := the().Clients.Kube.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
			if err == nil && len(pods.Items) == int(*d.Spec.Replicas) {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("fiber-router not rolled out within %s", bound)
}

// gateProviders are the providers the gate installs and measures here, in
// order: the default one (the run's provider) last, so the cluster is
// left on what every other suite installs.
func gateProviders(o harness.Options) []string {
	var out []string
	def := ""
	if p, err := networking.Get(o.Provider); err == nil {
		def = p.Name()
	}
	for _, n := range measuredProviders(o) {
		p, _ := networking.Get(n)
		if p.NeedsRegistry() != "" && !o.Clusters.Online {
			continue
		}
		if n != def {
			out = append(out, n)
		}
	}
	for _, n := range measuredProviders(o) {
		if n == def {
			out = append(out, n)
		}
	}
	return out
}

// measuredProviders are the providers in the matrix: LAMPYR_FEASIBILITY_PROVIDERS
// or all.
func measuredProviders(o harness.Options) []string {
	v := o.Knobs[envProviders]
	if v == "" {
		return networking.Names()
	}
	var out []string
	for _, n := range strings.Split(v, ",") {
		p, err := networking.Get(strings.TrimSpace(n))
		if err != nil {
			panic(fmt.Sprintf("%s: %v", envProviders, err))
		}
		out = append(out, p.Name())
	}
	return out
}

// installProvider installs the lampyr profile with prov (switching the
// cluster from the provider it ran) and records the switch.
func installProvider(ctx context.Context, prov string) error {
	g := the()
	if g.Provider == prov {
		return nil
	}
	start := time.Now()
	if err := harness.Reinstall(suite.In(ctx), g.Target, prov); err != nil {
		return err
	}
	p, _ := networking.Get(prov)
	g.matrix.SetProvider(prov, p.Describe())
	fmt.Fprintf(GinkgoWriter, "cluster %s now runs networking %s (%s), installed in %s\n", clusterName, prov, p.Describe(), time.Since(start).Round(time.Second))
	return nil
}

var _ = Describe("Revision backend feasibility gate", Label("cluster", "feasibility"), Ordered, func() {
	order := gateProviders(suite.Options())
	for _, prov := range measuredProviders(suite.Options()) {
		p, err := networking.Get(prov)
		if err != nil {
			panic(err)
		}
		if why := p.NeedsRegistry(); why != "" && !suite.Options().Clusters.Online {
			for _, strategy := range Strategies {
				It(fmt.Sprintf("proves %s with the %s strategy", prov, strategy), Label(prov, strategy), func() {
					for _, pr := range Proofs {
						the().matrix.Add(Result{Provider: prov, Strategy: strategy, Proof: pr, Outcome: OutcomeSkipped, Evidence: "needs a container registry: " + why})
					}
					Skip(fmt.Sprintf("%s needs a container registry (%s); set LAMPYR_ONLINE=1 on a machine that can pull", prov, why))
				})
			}
		}
	}
	for _, prov := range order {
		for _, strategy := range Strategies {
			It(fmt.Sprintf("proves %s with the %s strategy", prov, strategy), Label(prov, strategy), func(ctx SpecContext) {
				Expect(installProvider(ctx, prov)).To(Succeed(), "installing the lampyr profile with %s", prov)
				runGate(ctx, prov, strategy)
			})
		}
	}

	It("selects, per provider, the strategy the install profile uses", Label("selection"), func() {
		sel := the().matrix.Selected()
		fmt.Fprintf(GinkgoWriter, "\n%s", the().matrix.Table())
		Expect(order).NotTo(BeEmpty(), "no networking provider can run here")
		for _, prov := range order {
			Expect(sel).To(HaveKey(prov), "no backend strategy passed every proof on %s: the gate stops here (no custom Route reconciler, no fork)\n%s", prov, the().matrix.Table())
			Expect(sel[prov]).To(Equal(install.BackendStrategyFor(prov)), "the install profile's default for %s must follow the gate (install.BackendStrategyFor)", prov)
		}
	})
})

func runGate(ctx context.Context, prov, strategy string) {
	ns := "feas-" + prov + "-" + strategy
	Expect(the().setStrategy(ctx, strategy)).To(Succeed())
	freshNamespace(ctx, ns)
	// Each run's two Revisions hold fiber memory (max-scale x memory) in
	// the installation's capacity: with a namespace per provider and
	// strategy, four runs would not fit in the default 8Gi. Delete the
	// namespace when its run ends (its evidence is in the matrix and, on a
	// failure, in the dump), unless LAMPYR_KEEP=1.
	DeferCleanup(func(ctx SpecContext) {
		if suite.Options().Keep {
			return
		}
		Expect(the().Clients.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})).To(Succeed())
		Eventually(func() bool {
			_, err := the().Clients.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeTrue(), "namespace %s still terminating: its Revisions keep their fiber memory", ns)
	}, NodeTimeout(4*time.Minute))
	host := svcName + "." + ns + "." + clusters.Domain
	tagHost := func(tag string) string { return tag + "-" + svcName + "." + ns + "." + clusters.Domain }
	rev1, rev2 := svcName+"-00001", svcName+"-00002"

	By("deploying two Revisions split 50/50, tagged one and two")
	apply(ctx, ksvc(ns, nil, rev1))
	_, err := the().Clients.WaitReady(ctx, e2eutil.Revisions, ns, rev1, 3*time.Minute)
	Expect(err).NotTo(HaveOccurred(), "Revision %s", rev1)
	apply(ctx, ksvc(ns, []any{
		map[string]any{"revisionName": rev1, "percent": int64(50), "tag": "one"},
		map[string]any{"latestRevision": true, "percent": int64(50), "tag": "two"},
	}, rev2))
	_, err = the().Clients.WaitReady(ctx, e2eutil.Revisions, ns, rev2, 3*time.Minute)
	Expect(err).NotTo(HaveOccurred(), "Revision %s", rev2)
	svc, _ := the().Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, svcName, metav1.GetOptions{})
	backend, _ := the().Clients.Kube.CoreV1().Services(ns).Get(ctx, rev1, metav1.GetOptions{})
	if backend != nil {
		fmt.Fprintf(GinkgoWriter, "backend Service %s/%s: type %s externalName %q clusterIP %s\n", ns, rev1, backend.Spec.Type, backend.Spec.ExternalName, backend.Spec.ClusterIP)
	}

	proof(prov, strategy, Proofs[0], func() (string, time.Duration, error) {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ing, err := the().Clients.Dynamic.Resource(e2eutil.Ingresses).Namespace(ns).Get(ctx, svcName, metav1.GetOptions{})
			if err == nil {
				// Ready for the 50/50 configuration, not the 100% one the
				// KIngress had before rev2: its spec names rev2 and its
				// status observed that spec. Measuring the split against a
				// Ready left over from the old spec counted the old routes
				// (CI, 2026-12-02: split-00001 132 of 200, the first ~64
				// requests all to it).
				spec, _ := json.Marshal(ing.Object["spec"])
				observed, _, _ := unstructured.NestedInt64(ing.Object, "status", "observedGeneration")
				current := strings.Contains(string(spec), `"`+rev2+`"`) && observed == ing.GetGeneration()
				if s, r, m := e2eutil.Condition(ing, "Ready"); s == "True" && current {
					ss := ""
					if svc != nil {
						ss, _, _ = e2eutil.Condition(svc, "Ready")
					}
					return fmt.Sprintf("KIngress %s/%s Ready (Service Ready=%s)", ns, svcName, ss), 0, nil
				} else if time.Now().After(deadline) {
					return "", 0, fmt.Errorf("KIngress not Ready for the 50/50 spec within 2m: Ready=%s %s %s (spec names %s: %v; observedGeneration %d of %d)", s, r, m, rev2, strings.Contains(string(spec), `"`+rev2+`"`), observed, ing.GetGeneration())
				}
			} else if time.Now().After(deadline) {
				return "", 0, fmt.Errorf("KIngress not found within 2m: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	// Give the gateway a bounded moment to pick the routes up.
	_, warmErr := firstGood(ctx, host, time.Minute)

	proof(prov, strategy, Proofs[1], func() (string, time.Duration, error) {
		if warmErr != nil {
			return "", 0, warmErr
		}
		counts := map[string]int{}
		for i := 0; i < 200; i++ {
			rev, _, _, err := echo(ctx, host)
			if err != nil {
				return "", 0, fmt.Errorf("request %d: %v (so far %v)", i, err, counts)
			}
			counts[rev]++
		}
		ev := fmt.Sprintf("200 requests: %s %d, %s %d", rev1, counts[rev1], rev2, counts[rev2])
		if counts[rev1] < 70 || counts[rev1] > 130 || counts[rev2] < 70 || counts[rev2] > 130 {
			return "", 0, fmt.Errorf("split outside 35-65%%: %s", ev)
		}
		return ev, 0, nil
	})

	proof(prov, strategy, Proofs[2], func() (string, time.Duration, error) {
		for _, want := range []string{rev1, rev2} {
			got, hdr, _, err := echo(ctx, tagHost(map[string]string{rev1: "one", rev2: "two"}[want]))
			if err != nil {
				return "", 0, err
			}
			if got != want {
				return "", 0, fmt.Errorf("selected %s, handler ran as %s", want, got)
			}
			for _, h := range []string{"Knative-Serving-Revision", "Knative-Serving-Namespace"} {
				if v := hdr.Get(h); v != "" {
					return "", 0, fmt.Errorf("the handler saw %s: %s (fiber-router must consume it)", h, v)
				}
			}
		}
		return "K_REVISION matched the selected Revision for both; Knative-Serving-Revision/-Namespace consumed", 0, nil
	})

	proof(prov, strategy, Proofs[3], func() (string, time.Duration, error) {
		for i := 0; i < 20; i++ {
			got, _, _, err := echo(ctx, tagHost("one"))
			if err != nil {
				return "", 0, err
			}
			if got != rev1 {
				return "", 0, fmt.Errorf("request %d to tag one reached %s", i, got)
			}
		}
		return fmt.Sprintf("20/20 requests to %s reached %s", tagHost("one"), rev1), 0, nil
	})

	proof(prov, strategy, Proofs[4], func() (string, time.Duration, error) {
		h := tagHost("one")
		r, err := portability.Do(ctx, the().Gateway, h, portability.RequestSet[0])
		if err != nil {
			return "", 0, err
		}
		if r.Status != 200 || r.Body != "Hello World!\n" {
			return "", 0, fmt.Errorf("GET / answered %d %q", r.Status, r.Body)
		}
		st, err := portability.DoStream(ctx, the().Gateway, h, 5, 200)
		if err != nil {
			return "", 0, err
		}
		if st.Status != 200 || len(st.Chunks) != 5 || !st.Incremental {
			return "", 0, fmt.Errorf("stream: %+v", st)
		}
		ws, err := portability.WebSocketEcho(ctx, the().Gateway, h, []string{"a", "b"})
		if err != nil {
			return "", 0, err
		}
		if strings.Join(ws, ",") != "echo: a,echo: b" {
			return "", 0, fmt.Errorf("websocket replies %q", ws)
		}
		return "HTTP 200, 5 chunks incrementally, 2 WebSocket echoes", 0, nil
	})

	sabotage := suite.Knob(envSabotage) == "router-zero"
	proof(prov, strategy, Proofs[5], func() (string, time.Duration, error) {
		if warmErr != nil {
			return "", 0, fmt.Errorf("not attempted: the Service never answered (%v)", warmErr)
		}
		patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
		start := time.Now()
		if _, err := the().Clients.Kube.AppsV1().Deployments(systemNS).Patch(ctx, "fiber-router", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return "", 0, err
		}
		if sabotage {
			if d, err := the().Clients.Kube.AppsV1().Deployments(systemNS).Get(ctx, "fiber-router", metav1.GetOptions{}); err == nil && d.Spec.Replicas != nil && *d.Spec.Replicas > 0 {
				the().routerReplicas = *d.Spec.Replicas
			}
			scale := `{"spec":{"replicas":0}}`
			if _, err := the().Clients.Kube.AppsV1().Deployments(systemNS).Patch(ctx, "fiber-router", types.MergePatchType, []byte(scale), metav1.PatchOptions{}); err != nil {
				return "", 0, err
			}
			fmt.Fprintf(GinkgoWriter, "%s=router-zero: fiber-router scaled to zero during proof 6a\n", envSabotage)
		}
		if err := waitRouterReady(ctx, 3*time.Minute); err != nil {
			return "", 0, err
		}
		rolled := time.Since(start)
		d, err := firstGood(ctx, host, time.Minute)
		if err != nil {
			return "", 0, fmt.Errorf("after the rollout (%s): %v", rolled.Round(100*time.Millisecond), err)
		}
		// Every request must succeed again, not just one.
		for i := 0; i < 20; i++ {
			if _, _, _, err := echo(ctx, host); err != nil {
				return "", 0, fmt.Errorf("request %d after recovery: %v", i, err)
			}
		}
		return fmt.Sprintf("rollout done in %s; 20/20 requests good after", rolled.Round(100*time.Millisecond)), rolled + d, nil
	})

	proof(prov, strategy, Proofs[6], func() (string, time.Duration, error) {
		if warmErr != nil {
			return "", 0, fmt.Errorf("not attempted: the Service never answered (%v)", warmErr)
		}
		pods, err := the().Clients.Kube.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
		if err != nil {
			return "", 0, err
		}
		start := time.Now()
		for _, p := range pods.Items {
			if err := the().Clients.Kube.CoreV1().Pods(systemNS).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				return "", 0, err
			}
		}
		d, err := firstGood(ctx, host, 2*time.Minute)
		if err != nil {
			return "", 0, fmt.Errorf("deleted %d fiber-router pods: %v", len(pods.Items), err)
		}
		if err := waitRouterReady(ctx, 3*time.Minute); err != nil {
			return "", 0, err
		}
		for i := 0; i < 20; i++ {
			if _, _, _, err := echo(ctx, host); err != nil {
				return "", 0, fmt.Errorf("request %d after recovery: %v", i, err)
			}
		}
		return fmt.Sprintf("deleted %d pods; first good response after %s; 20/20 good once rolled out (%s)", len(pods.Items), d.Round(10*time.Millisecond), time.Since(start).Round(100*time.Millisecond)), d, nil
	})
}
