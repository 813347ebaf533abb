// The portability proof: one digest-pinned Knative Service, applied
// identically to stock Knative and to Lampyr (the paired clusters, on the
// harness of clusters/harness), answers every request the same way. With
// LAMPYR_PORTABILITY_TARGETS naming a targets file (targets.go) it runs over
// that list instead: existing clusters by kubeconfig, managed Kind clusters
// each with its own networking provider, or both, every one compared with
// the reference.
package portability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/ly"
)

// unreadBodyRequests (default 1000) is how many requests the unread-body
// spec sends to each side.
const unreadBodyRequests = "LAMPYR_UNREAD_BODY_REQUESTS"

var suite = harness.New(harness.Config{
	Name:     "portability",
	Recipe:   "just test-knative-portability",
	Clusters: harness.Paired(),
	KeepVar:  environ.PortabilityKeep,
	Knobs:    []string{unreadBodyRequests, TargetsVar},
	Choose: func(o harness.Options) ([]harness.Cluster, error) {
		ts, err := ChooseTargets(o.Knobs[TargetsVar])
		if err != nil {
			return nil, err
		}
		return ts.Clusters(), nil
	},
	// Three managed clusters built and installed on two cores.
	SetupTimeout: 90 * time.Minute,
})

func TestPortability(t *testing.T) { suite.Run(t) }

var (
	_ = suite.Setup("building the handler, sealing its Services on Lampyr, applying them to every target", setupProof)
	_ = suite.Finish("writing the report, deleting the proof's Services from external targets", finishProof)
)

const (
	pkg = "lampyr.dev/serving/fixtures/cmd/handler"
	// svcName is the HTTP/1 Service (lampyr.yaml in fixtures/cmd/handler).
	svcName = "handler"
	// grpcName is the same handler declared h2c (gRPC).
	grpcName = "handler-grpc"
	// backendName is the cluster-local Service the bindings spec has the
	// handler call by its cluster DNS name. Built, sealed and applied like
	// the others, but only by that spec: the others count exactly the
	// first two Services' Revisions.
	backendName = "handler-backend"
)

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// proof is the suite's state, made by setupProof and read by the specs
// through the suite's context.
type proof struct {
	*Fleet
	// list is the targets file (or the pair).
	list     *Targets
	services []*Fixture
	backend  *Fixture
	artDir   string
	start    time.Time

	mu sync.Mutex
	// hosts are each target's route hostnames, by target and Service.
	hosts map[string]map[string]string
	// createdNS: the proof created its namespace on that target (an
	// external target's is deleted at the end).
	createdNS map[string]bool
	checks    []Check
}

// the is the proof's state.
func the() *proof { return harness.State[*proof](suite) }

// ns is the namespace the proof deploys into on every target.
func ns() string { return the().Namespace }

// hostOn is svc's route hostname on t, as its Service's status.url says
// (each cluster's config-domain decides it).
func (p *proof) hostOn(t *harness.Target, svc string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.hosts[t.Name][svc]; h != "" {
		return h
	}
	return svc + "." + p.Namespace + "." + clusters.Domain
}

// readHosts records each target's route hostname of each Service.
func (p *proof) readHosts(ctx context.Context, names ...string) error {
	for _, t := range p.Targets {
		for _, n := range names {
			u, err := t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(p.Namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("Service %s on %s: %w", n, t.Name, err)
			}
			url, _, _ := unstructured.NestedString(u.Object, "status", "url")
			_, host, _ := strings.Cut(url, "://")
			p.mu.Lock()
			if p.hosts[t.Name] == nil {
				p.hosts[t.Name] = map[string]string{}
			}
			p.hosts[t.Name][n] = host
			p.mu.Unlock()
		}
	}
	return nil
}

// facts are t's per-target values a comparison maps onto the reference's
// (Aligner): registry, runnable image, sealed templates and snapshots,
// route hostnames.
func (p *proof) facts(t *harness.Target) Facts {
	f := Facts{"registry": t.Registry, "runnable": p.Runnable[t.Name]}
	for _, fx := range append(append([]*Fixture(nil), p.services...), p.backend) {
		snap, tmpl := p.sealedFor(fx, t)
		f["snapshot/"+fx.Name], f["template/"+fx.Name] = snap, tmpl
	}
	p.mu.Lock()
	for svc, h := range p.hosts[t.Name] {
		f["host/"+svc] = h
	}
	p.mu.Unlock()
	return f
}

// ordered are the targets, the reference first.
func (p *proof) ordered() []*harness.Target {
	return append([]*harness.Target{p.Reference}, p.Others()...)
}

func (p *proof) record(c Check) {
	p.mu.Lock()
	p.checks = append(p.checks, c)
	p.mu.Unlock()
	if len(c.Targets) > 0 {
		var b strings.Builder
		for _, r := range c.Targets {
			fmt.Fprintf(&b, "%s: %s\n", r.Target, r.Result)
		}
		AddReportEntry("targets: "+c.Name, b.String())
	}
}

func setupProof(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	list, err := ChooseTargets(suite.Knob(TargetsVar))
	if err != nil {
		return ctx, err
	}
	p := &proof{
		list: list,
		services: []*Fixture{
			{Name: svcName, Dir: "fixtures/cmd/handler"},
			{Name: grpcName, Dir: "fixtures/services/handler-grpc"},
		},
		backend:   &Fixture{Name: backendName, Dir: "fixtures/services/handler-backend"},
		artDir:    harness.Artifacts(ctx),
		start:     time.Now(),
		hosts:     map[string]map[string]string{},
		createdNS: map[string]bool{},
	}
	names := make([]string, len(list.Targets))
	for i, t := range list.Targets {
		names[i] = t.Name
	}
	if p.Fleet, err = NewFleet(ctx, names, list.Reference, list.Namespace, "portability"); err != nil {
		return ctx, err
	}
	ctx = harness.With(ctx, p)
	for _, t := range p.Targets {
		_, err := t.Clients.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred(), "creating namespace %s on %s", p.Namespace, t.Name)
			p.createdNS[t.Name] = true
		}
		if t.Profile == clusters.ProfileLampyr {
			// On Lampyr the tenant namespace enforces Pod Security
			// "restricted" (no Lampyr Pod runs in it); stock runs the
			// Service's Pods there.
			Expect(e2eutil.RestrictPodSecurity(ctx, t.Clients, p.Namespace)).To(Succeed())
			if t.External {
				Expect(sealerAuthorized(ctx, t, p.Namespace)).To(Succeed())
			}
		}
		for _, f := range p.services {
			deleteService(ctx, t, p.Namespace, f.Name)
		}
		// Left by a run that kept its clusters.
		deleteService(ctx, t, p.Namespace, p.backend.Name)
	}

	By("building the handler as a runnable image (the project's image builder), in each target's registry")
	for _, t := range p.Targets {
		if p.Runnable[t.Name], err = harness.Image(ctx, t, pkg); err != nil {
			return ctx, fmt.Errorf("the runnable image for %s: %w", t.Name, err)
		}
		fmt.Fprintf(GinkgoWriter, "runnable image for %s: %s\n", t.Name, p.Runnable[t.Name])
	}
	if p.Ly, err = harness.LyBinary(ctx); err != nil {
		return ctx, err
	}
	for _, f := range p.services {
		p.seal(ctx, f)
	}
	Expect(p.Apply(ctx, p.services...)).To(Succeed())
	Expect(p.readHosts(ctx, svcName, grpcName)).To(Succeed())
	return ctx, nil
}

// sealerAuthorized fails fast when an external Lampyr's administrator has
// not authorized this machine's ly identity for ns (ly deploy would seal a
// template the cluster refuses, and the Service would time out).
func sealerAuthorized(ctx context.Context, t *harness.Target, ns string) error {
	path, err := ly.SealerKeyPath("")
	if err != nil {
		return err
	}
	mine, err := ly.LoadSealer(path, false)
	if err != nil {
		return nil // no identity yet: ly deploy makes one and says what to do
	}
	rep, err := ly.DescribeSealers(ctx, t.Ly, mine)
	if err != nil {
		return nil
	}
	if ok, known := rep.Authorized(ns); known && !ok {
		return fmt.Errorf("target %s: this machine's ly sealer identity (key %s) is not authorized for namespace %s: an administrator runs `ly cluster authorize-sealer NAME --public-key KEY --namespaces %s` (`ly sealer show -n %s` prints it)", t.Name, rep.MyKeyID, ns, ns, ns)
	}
	return nil
}

// seal has `ly deploy` seal f's template on every lampyr target for the
// first Revision of a new Service (Fleet.Seal).
func (p *proof) seal(ctx context.Context, f *Fixture) {
	By("building " + f.Name + " with `ly build`, sealing it on each Lampyr with `ly deploy`, then deleting that Service")
	Expect(p.Fleet.Seal(ctx, f)).To(Succeed())
}

func deleteService(ctx context.Context, s *harness.Target, ns, svcName string) {
	err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, svcName, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() bool {
		_, err := s.Clients.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, svcName+"-00001", metav1.GetOptions{})
		_, serr := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, svcName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(serr)
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(BeTrue(), "Service %s on %s still present", svcName, s.Name)
}

func finishProof(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	p, ok := harness.Value[*proof](ctx)
	if !ok {
		return ctx, nil
	}
	if len(p.checks) > 0 {
		rep := NewNWayReport(p.Reference.Name, p.TargetFacts(ctx, p.list), p.checks, time.Since(p.start))
		rep.Reproduce = []string{"just test-knative-portability"}
		if path := suite.Knob(TargetsVar); path != "" {
			rep.Reproduce = []string{"just test-portability-targets " + path}
		}
		if err := rep.Write(p.artDir); err != nil {
			return ctx, err
		}
		fmt.Fprintf(GinkgoWriter, "\n%s\nreport: %s (and report.json)\n", rep.Markdown(), filepath.Join(p.artDir, "report.md"))
	}
	keep := suite.Options().Keep
	if keep {
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s=1: every target is left running, with the proof's Services.\n", environ.PortabilityKeep)
		for _, t := range p.Targets {
			fmt.Fprintf(&b, "  %-10s curl -H 'Host: %s' %s/echo\n", t.Name, p.hostOn(t, svcName), t.Gateway)
			fmt.Fprintf(&b, "             KUBECONFIG=%s kubectl get ksvc -n %s\n", t.Kubeconfig, p.Namespace)
		}
		fmt.Fprint(GinkgoWriter, b.String())
		fmt.Fprint(os.Stderr, b.String())
		return ctx, nil
	}
	// An external target is someone else's cluster: take away what the
	// proof made there (a managed one is deleted, or left as found).
	var errs []string
	for _, t := range p.Targets {
		if !t.External {
			continue
		}
		for _, n := range []string{svcName, grpcName, backendName} {
			err := t.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(p.Namespace).Delete(ctx, n, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("deleting Service %s/%s on %s: %v", p.Namespace, n, t.Name, err))
			}
		}
		if p.createdNS[t.Name] {
			if err := t.Clients.Kube.CoreV1().Namespaces().Delete(ctx, p.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Sprintf("deleting namespace %s on %s: %v", p.Namespace, t.Name, err))
			}
		}
	}
	if len(errs) > 0 {
		return ctx, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return ctx, nil
}

// answer is one target's answer to a spec's question.
type answer[T any] struct {
	t   *harness.Target
	v   T
	err error
}

// onAll asks every target, the reference first; the reference must
// answer.
func onAll[T any](f func(t *harness.Target) (T, error)) []answer[T] {
	var out []answer[T]
	for _, t := range the().ordered() {
		v, err := f(t)
		out = append(out, answer[T]{t: t, v: v, err: err})
	}
	Expect(out[0].err).NotTo(HaveOccurred(), "on %s (the reference)", out[0].t.Name)
	return out
}

// waitMapped waits for DomainMapping ns/domain on s to be Ready and then
// to answer 200 through s's gateway; the error says which did not happen.
func waitMapped(ctx context.Context, s *harness.Target, ns, domain string) error {
	ready := "not found"
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := s.Clients.Dynamic.Resource(e2eutil.DomainMappings).Namespace(ns).Get(ctx, domain, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		ready = readyOf(u)
		return ready == "True", nil
	})
	if err != nil {
		return fmt.Errorf("DomainMapping %s never became Ready in 2m (Ready %s)", domain, ready)
	}
	last := "no answer"
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		r, err := Do(ctx, s.Gateway, domain, RequestSet[0])
		if err != nil {
			if ctx.Err() == nil { // not the wait's own end cutting this request
				last = err.Error()
			}
			return false, nil
		}
		last = fmt.Sprintf("status %d", r.Status)
		return r.Status == 200, nil
	})
	if err != nil {
		return fmt.Errorf("DomainMapping %s is Ready, but the gateway never answered 200 for it in 1m (last: %s)", domain, last)
	}
	return nil
}

// compare records check name: each target's answer beside the
// reference's, with its facts mapped onto the reference's, differences
// as -reference +target naming the field.
func compare[T any](name, what string, as []answer[T]) Check {
	p := the()
	ref := as[0]
	results := []TargetResult{{Target: ref.t.Name, Result: ResultReference}}
	refFacts := p.facts(ref.t)
	for _, a := range as[1:] {
		if a.err != nil {
			results = append(results, TargetResult{Target: a.t.Name, Result: ResultError, Detail: fmt.Sprintf("%s on %s: %v", what, a.t.Name, a.err)})
			continue
		}
		d := DiffTargets(what, ref.t.Name, a.t.Name, ref.v, Align(Aligner(p.facts(a.t), refFacts), a.v))
		if d == "" {
			results = append(results, TargetResult{Target: a.t.Name, Result: ResultSame})
		} else {
			results = append(results, TargetResult{Target: a.t.Name, Result: ResultDiffers, Detail: d})
		}
	}
	c := NewCheck(name, time.Since(CurrentSpecReport().StartTime), "", p.list.ApplyKnown(name, results))
	p.record(c)
	return c
}

// expectSame fails with a readable diff naming the field and the target.
func expectSame[T any](name, what string, as []answer[T]) {
	c := compare(name, what, as)
	Expect(c.Passed).To(BeTrue(), c.Detail)
}

var _ = Describe("one digest-pinned Knative Service on stock Knative and on Lampyr", Label("cluster", "portability"), Ordered, ContinueOnFailure, func() {
	BeforeAll(func(ctx SpecContext) {
		// All are Ready; the first request may still be on its way through
		// the gateway's configuration. Wait until each answers.
		for _, s := range the().Targets {
			Eventually(func() (int, error) {
				r, err := Do(ctx, s.Gateway, the().hostOn(s, svcName), RequestSet[0])
				if err != nil {
					return 0, err
				}
				return r.Status, nil
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "%s never answered through %s", s.Name, s.Gateway)
		}
	})

	for _, r := range RequestSet {
		It("answers "+r.Name+" identically", Label("http"), func(ctx SpecContext) {
			as := onAll(func(s *harness.Target) (*Response, error) { return Do(ctx, s.Gateway, the().hostOn(s, svcName), r) })
			expectSame("request "+r.Name, "the answer to "+r.Method+" "+r.Path, as)
		})
	}

	It("streams the same chunks, incrementally", Label("http", "streaming"), func(ctx SpecContext) {
		as := onAll(func(s *harness.Target) (*Stream, error) {
			return DoStream(ctx, s.Gateway, the().hostOn(s, svcName), 5, 200)
		})
		Expect(as[0].v.Incremental).To(BeTrue(), "%s (the reference) delivered the stream at once: %+v", as[0].t.Name, as[0].v)
		expectSame("stream", "the streamed answer of /stream", as)
	})

	It("echoes WebSocket messages identically", Label("websocket"), func(ctx SpecContext) {
		msgs := []string{"one", "two", strings.Repeat("x", 4096)}
		as := onAll(func(s *harness.Target) ([]string, error) {
			return WebSocketEcho(ctx, s.Gateway, the().hostOn(s, svcName), msgs)
		})
		Expect(as[0].v).To(HaveLen(len(msgs)))
		expectSame("websocket", "the WebSocket replies on /ws", as)
	})

	It("answers every request whose body the handler does not read", Label("http"), func(ctx SpecContext) {
		n := suite.IntKnob(unreadBodyRequests, 1000)
		start := CurrentSpecReport().StartTime
		as := onAll(func(s *harness.Target) (*UnreadBodyTally, error) {
			return UnreadBodies(ctx, s.Gateway, the().hostOn(s, svcName), n), nil
		})
		ref := as[0].v
		var results []TargetResult
		var refProblem string
		for i, a := range as {
			fmt.Fprintf(GinkgoWriter, "unread bodies, %-8s %s\n", a.t.Name+":", a.v)
			var problems []string
			if a.v.Failures() > 0 {
				problems = append(problems, fmt.Sprintf("%s: %s", a.t.Name, a.v))
			}
			if len(a.v.Leaks) > 0 {
				problems = append(problems, fmt.Sprintf("%s: an error named an internal address: %s", a.t.Name, a.v.Leaks[0]))
			}
			if i == 0 {
				refProblem = strings.Join(problems, "; ")
				results = append(results, TargetResult{Target: a.t.Name, Result: ResultReference})
				continue
			}
			if a.v.Continues != ref.Continues {
				problems = append(problems, fmt.Sprintf("100 Continue answers: %s %d, %s %d", as[0].t.Name, ref.Continues, a.t.Name, a.v.Continues))
			}
			r := TargetResult{Target: a.t.Name, Result: ResultSame}
			if len(problems) > 0 {
				r.Result, r.Detail = ResultFail, strings.Join(problems, "; ")
			}
			results = append(results, r)
		}
		c := NewCheck("unread bodies", time.Since(start), refProblem, the().list.ApplyKnown("unread bodies", results))
		the().record(c)
		Expect(c.Passed).To(BeTrue(), c.Detail)
	})

	It("answers gRPC over h2c identically", Label("grpc"), func(ctx SpecContext) {
		for _, s := range the().Targets {
			Eventually(func() error {
				_, err := Do(ctx, s.Gateway, the().hostOn(s, grpcName), RequestSet[0])
				return err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "%s never answered %s", s.Name, grpcName)
		}
		as := onAll(func(s *harness.Target) (*GRPCAnswers, error) {
			return GRPCHealth(ctx, s.Gateway, the().hostOn(s, grpcName))
		})
		Expect(as[0].v.Check).To(Equal("SERVING"), "%s (the reference): %+v", as[0].t.Name, as[0].v)
		expectSame("grpc", "the gRPC health answers of "+grpcName, as)
		hs := onAll(func(s *harness.Target) (*Response, error) {
			return Do(ctx, s.Gateway, the().hostOn(s, grpcName), RequestSet[1])
		})
		expectSame("request echo-get over h2c", "the answer to GET /echo from the h2c Service", hs)
	})

	for _, name := range []string{svcName, grpcName} {
		It("serves the same defaulted Service spec for "+name, Label("api"), func(ctx SpecContext) {
			as := onAll(func(s *harness.Target) (map[string]any, error) {
				u, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns()).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return ServiceSpec(u), nil
			})
			for _, a := range as {
				writeJSON("defaulted-"+name+"-"+a.t.Name+".json", a.v)
			}
			expectSame("defaulted Service spec "+name, "the defaulted Service "+ns()+"/"+name, as)
		})
	}

	It("serves the same Knative CRD specs", Label("api"), func(ctx SpecContext) {
		for _, name := range []string{"services", "configurations", "revisions", "routes", "domainmappings"} {
			crd := name + ".serving.knative.dev"
			as := onAll(func(s *harness.Target) (map[string]any, error) {
				u, err := s.Clients.Dynamic.Resource(crds).Get(ctx, crd, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return CRDSpec(u), nil
			})
			expectSame("CRD "+crd, "CustomResourceDefinition "+crd, as)
		}
	})

	It("ran the Service on fibers on Lampyr and on Pods on stock", Label("execution"), func(ctx SpecContext) {
		// The proof is only meaningful if each target ran its own way.
		start := time.Now()
		var results []TargetResult
		var refProblem string
		for i, t := range the().ordered() {
			problem := ranItsOwnWay(ctx, t)
			if i == 0 {
				refProblem = problem
				results = append(results, TargetResult{Target: t.Name, Result: ResultReference})
				continue
			}
			r := TargetResult{Target: t.Name, Result: ResultPass}
			if problem != "" {
				r.Result, r.Detail = ResultFail, problem
			}
			results = append(results, r)
		}
		c := NewCheck("each side ran its own way", time.Since(start), refProblem, the().list.ApplyKnown("each side ran its own way", results))
		the().record(c)
		Expect(c.Passed).To(BeTrue(), c.Detail)
	})

	// Service bindings (issue 19): a Revision reaches another Service by
	// its cluster DNS name. The public handler calls the cluster-local
	// backend (the same fixture) with GET /call and reports what it got;
	// last in the container because it adds a Service the checks above do
	// not expect.
	It("serves a DomainMapping identically", Label("domainmapping", "http"), func(ctx SpecContext) {
		p := the()
		// One custom domain, the same on every target so the answers
		// compare as they are (Host included). Claimed explicitly:
		// Knative does not create ClusterDomainClaims unless config-network
		// says so.
		domain := svcName + "." + p.Namespace + ".mapped.example.org"
		cdc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.internal.knative.dev/v1alpha1", "kind": "ClusterDomainClaim",
			"metadata": map[string]any{"name": domain},
			"spec":     map[string]any{"namespace": p.Namespace},
		}}
		dm := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "serving.knative.dev/v1beta1", "kind": "DomainMapping",
			"metadata": map[string]any{"name": domain, "namespace": p.Namespace},
			"spec":     map[string]any{"ref": map[string]any{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": svcName}},
		}}
		if !suite.Options().Keep {
			DeferCleanup(func(ctx SpecContext) {
				for _, s := range p.Targets {
					_ = s.Clients.Dynamic.Resource(e2eutil.DomainMappings).Namespace(p.Namespace).Delete(ctx, domain, metav1.DeleteOptions{})
					_ = s.Clients.Dynamic.Resource(e2eutil.ClusterDomainClaims).Delete(ctx, domain, metav1.DeleteOptions{})
				}
			})
		}
		for _, s := range p.Targets {
			for _, o := range []struct {
				gvr schema.GroupVersionResource
				obj *unstructured.Unstructured
			}{{e2eutil.ClusterDomainClaims, cdc}, {e2eutil.DomainMappings, dm}} {
				var err error
				if o.obj.GetNamespace() == "" {
					_, err = s.Clients.Dynamic.Resource(o.gvr).Create(ctx, o.obj.DeepCopy(), metav1.CreateOptions{})
				} else {
					_, err = s.Clients.Dynamic.Resource(o.gvr).Namespace(o.obj.GetNamespace()).Create(ctx, o.obj.DeepCopy(), metav1.CreateOptions{})
				}
				if err != nil && !apierrors.IsAlreadyExists(err) {
					Fail(fmt.Sprintf("creating %s %s on %s: %v", o.obj.GetKind(), domain, s.Name, err))
				}
			}
		}
		// Ready, then answering through the gateway (its KIngress probes
		// the data plane on gateway-api; give any provider a minute). A
		// target that does neither is that target's result in the table,
		// not the end of the check: the other targets are still compared.
		notServed := map[string]error{}
		for _, s := range p.Targets {
			if err := waitMapped(ctx, s, p.Namespace, domain); err != nil {
				notServed[s.Name] = err
			}
		}
		as := onAll(func(s *harness.Target) ([]*Response, error) {
			if err := notServed[s.Name]; err != nil {
				return nil, err
			}
			var out []*Response
			for _, r := range RequestSet {
				resp, err := Do(ctx, s.Gateway, domain, r)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", r.Name, err)
				}
				out = append(out, resp)
			}
			return out, nil
		})
		expectSame("domain mapping", "the answers for the mapped domain "+domain+" (status, body, headers, K_* environment)", as)
	})

	It("calls a cluster-local Service by its DNS name identically", Label("bindings"), func(ctx SpecContext) {
		p := the()
		if !suite.Options().Keep {
			DeferCleanup(func(ctx SpecContext) {
				for _, s := range p.Targets {
					deleteService(ctx, s, p.Namespace, backendName)
				}
			})
		}
		p.seal(ctx, p.backend)
		Expect(p.Apply(ctx, p.backend)).To(Succeed())
		for _, s := range p.Targets {
			u, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(p.Namespace).Get(ctx, backendName, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(u.GetLabels()).To(HaveKeyWithValue(ly.LabelVisibility, ly.VisibilityClusterLocal),
				"%s on %s must be cluster-local: it is not in %s's ingress.services", backendName, s.Name, ly.WorkspaceFile)
		}

		fqdn := backendName + "." + p.Namespace + ".svc.cluster.local"
		calls := []Request{
			{Name: "call-fqdn", Method: "GET", Path: CallPath("http://" + fqdn + "/")},
			// /echo tells the backend apart from the caller: K_SERVICE,
			// and the Host it was reached by.
			{Name: "call-fqdn-echo", Method: "GET", Path: CallPath("http://" + fqdn + "/echo?via=call")},
			// <service>.<namespace>: resolved through the search path, and
			// one of the hosts Knative routes a cluster-local Service by.
			{Name: "call-short", Method: "GET", Path: CallPath("http://" + backendName + "." + p.Namespace + "/")},
			{Name: "call-missing", Method: "GET", Path: CallPath("http://nope." + p.Namespace + ".svc.cluster.local/")},
		}
		// Ready means the cluster-local Route is programmed; still, give
		// each target a minute to reach the backend before comparing (a
		// target that never does shows in the diff).
		for _, s := range p.Targets {
			r, err := awaitCall(ctx, s, calls[0], time.Minute)
			raw, _ := json.Marshal(r)
			fmt.Fprintf(GinkgoWriter, "%s: calling %s: %s (err %v)\n", s.Name, fqdn, raw, err)
		}

		as := onAll(func(s *harness.Target) ([]*Response, error) {
			var out []*Response
			for _, r := range calls {
				resp, err := Do(ctx, s.Gateway, p.hostOn(s, svcName), r)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", r.Name, err)
				}
				out = append(out, resp)
			}
			return out, nil
		})
		for _, a := range as {
			writeJSON("bindings-"+a.t.Name+".json", a.v)
		}
		var failed []string
		for i, r := range calls {
			per := make([]answer[*Response], len(as))
			for j, a := range as {
				per[j] = answer[*Response]{t: a.t, err: a.err}
				if a.err == nil {
					per[j].v = a.v[i]
				}
			}
			if c := compare("binding "+r.Name, "the answer to GET "+r.Path, per); !c.Passed {
				failed = append(failed, c.Detail)
			}
		}
		// The reference must show what the case is about.
		a, refName := as[0].v, as[0].t.Name
		for i, r := range a {
			Expect(r.Call).NotTo(BeNil(), "%s answered %s without a call report: %+v", refName, calls[i].Name, r)
		}
		Expect(a[0].Call.Status).To(Equal(200), "%s did not reach %s: %+v", refName, fqdn, a[0].Call)
		Expect(a[1].Call.Echo).NotTo(BeNil(), "%s: %+v", refName, a[1].Call)
		Expect(a[1].Call.Echo.Env).To(HaveKeyWithValue("K_SERVICE", backendName), "%s reached another Service than %s", refName, backendName)
		Expect(a[2].Call.Status).To(Equal(200), "%s did not reach %s.%s: %+v", refName, backendName, p.Namespace, a[2].Call)
		Expect(a[3].Call.Error).To(Equal("dns"), "%s: a name that does not exist: %+v", refName, a[3].Call)
		Expect(failed).To(BeEmpty())
	})
})

// ranItsOwnWay says what is wrong with how t ran the Service ("" when
// nothing): a stock target runs Pods (or scaled them to zero) and serves
// no CapacityGrant API; a lampyr target has exactly one CapacityGrant per
// Service and no Deployment in the namespace.
func ranItsOwnWay(ctx context.Context, t *harness.Target) string {
	n := ns()
	_, grantErr := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(n).List(ctx, metav1.ListOptions{})
	switch t.Profile {
	case clusters.ProfileStock:
		pods, err := t.Clients.Kube.CoreV1().Pods(n).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svcName})
		switch {
		case err != nil:
			return fmt.Sprintf("%s: listing Pods: %v", t.Name, err)
		case len(pods.Items) == 0 && !podsScaledToZero(ctx, t):
			return t.Name + " ran no Pod for the Service"
		case grantErr == nil:
			return t.Name + " serves fiberd.io CapacityGrants: it is not stock"
		}
	case clusters.ProfileLampyr:
		grants, err := t.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Sprintf("%s: listing CapacityGrants: %v", t.Name, err)
		}
		names := []string{}
		for _, g := range grants.Items {
			names = append(names, g.GetName())
		}
		sort.Strings(names)
		if strings.Join(names, ",") != svcName+"-00001,"+grpcName+"-00001" {
			return fmt.Sprintf("%s has CapacityGrants %v, want exactly [%s-00001 %s-00001]", t.Name, names, svcName, grpcName)
		}
		ds, err := t.Clients.Kube.AppsV1().Deployments(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Sprintf("%s: listing Deployments: %v", t.Name, err)
		}
		if len(ds.Items) > 0 {
			return fmt.Sprintf("%s runs %d Deployment(s) in %s: Lampyr must not run Revisions as Deployments", t.Name, len(ds.Items), n)
		}
	}
	return ""
}

// awaitCall sends r (a /call) to s until the callee answered 200 or
// timeout passes, and returns the last answer.
func awaitCall(ctx context.Context, s *harness.Target, r Request, timeout time.Duration) (*Response, error) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := Do(ctx, s.Gateway, the().hostOn(s, svcName), r)
		if err == nil && resp.Call != nil && resp.Call.Status == 200 {
			return resp, nil
		}
		if time.Now().After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return resp, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// podsScaledToZero: a stock target may have scaled the Revision to zero
// between the requests and this check; its Deployment still exists.
func podsScaledToZero(ctx context.Context, t *harness.Target) bool {
	d, err := t.Clients.Kube.AppsV1().Deployments(ns()).Get(ctx, svcName+"-00001-deployment", metav1.GetOptions{})
	return err == nil && d.Status.Replicas == 0
}

func writeJSON(name string, v any) {
	raw, _ := json.MarshalIndent(v, "", "  ")
	_ = os.WriteFile(filepath.Join(the().artDir, name), raw, 0o644)
}

// readyOf is a Knative object's Ready condition status ("" when absent).
func readyOf(u *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}
