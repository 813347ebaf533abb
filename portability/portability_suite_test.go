// The portability proof: one digest-pinned Knative Service, applied
// identically to stock Knative and to Lampyr (the paired clusters, on the
// harness of clusters/harness), answers every request the same way.
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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/clusters/networking"
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
	Knobs:    []string{unreadBodyRequests},
})

func TestPortability(t *testing.T) { suite.Run(t) }

var (
	_ = suite.Setup("building the handler, sealing its Services on Lampyr, applying them to both clusters", setupProof)
	_ = suite.Finish("writing the report", finishProof)
)

const (
	ns  = "portability"
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
	*Pair
	services []*Fixture
	backend  *Fixture
	artDir   string
	start    time.Time

	checksMu sync.Mutex
	checks   []Check
}

// the is the proof's state.
func the() *proof { return harness.State[*proof](suite) }

func host() string { return hostOf(svcName) }

func hostOf(svc string) string { return svc + "." + ns + "." + clusters.Domain }

func (p *proof) record(name string, start time.Time, err *string) {
	p.checksMu.Lock()
	defer p.checksMu.Unlock()
	p.checks = append(p.checks, Check{Name: name, Passed: *err == "", Detail: *err, Duration: time.Since(start)})
}

func setupProof(ctx context.Context, _ *envconf.Config) (context.Context, error) {
	p := &proof{
		services: []*Fixture{
			{Name: svcName, Dir: "fixtures/cmd/handler"},
			{Name: grpcName, Dir: "fixtures/services/handler-grpc"},
		},
		backend: &Fixture{Name: backendName, Dir: "fixtures/services/handler-backend"},
		artDir:  harness.Artifacts(ctx),
		start:   time.Now(),
	}
	var err error
	if p.Pair, err = NewPair(ctx, ns, "portability"); err != nil {
		return ctx, err
	}
	ctx = harness.With(ctx, p)
	for _, s := range p.Sides() {
		_, err := s.Clients.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		if s == p.Lampyr {
			// On Lampyr the tenant namespace enforces Pod Security
			// "restricted" (no Lampyr Pod runs in it); stock runs the
			// Service's Pods there.
			Expect(e2eutil.RestrictPodSecurity(ctx, s.Clients, ns)).To(Succeed())
		}
		for _, f := range p.services {
			deleteService(ctx, s, f.Name)
		}
		// Left by a run that kept its clusters.
		deleteService(ctx, s, p.backend.Name)
	}

	By("building the handler as a runnable image (the project's image builder)")
	if p.Runnable, err = harness.Image(ctx, p.Lampyr, pkg); err != nil {
		return ctx, err
	}
	fmt.Fprintf(GinkgoWriter, "runnable image: %s\n", p.Runnable)
	if p.Ly, err = harness.LyBinary(ctx); err != nil {
		return ctx, err
	}
	for _, f := range p.services {
		p.seal(ctx, f)
	}
	Expect(p.ApplyOnBoth(ctx, p.services...)).To(Succeed())
	return ctx, nil
}

// seal has `ly deploy` seal f's template on Lampyr for the first Revision
// of a new Service (Pair.Seal).
func (p *proof) seal(ctx context.Context, f *Fixture) {
	By("building " + f.Name + " with `ly build`, sealing it on Lampyr with `ly deploy`, then deleting that Service")
	res, err := p.Seal(ctx, f)
	Expect(err).NotTo(HaveOccurred())
	Expect(res.Revision).To(Equal(f.Name+"-00001"), "the template is sealed for the first Revision of a new Service")
}

func deleteService(ctx context.Context, s *harness.Target, svcName string) {
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
		cl := map[string]string{}
		for _, s := range p.Sides() {
			net := s.Provider
			if pr, err := networking.Get(net); err == nil {
				net = pr.Name() + ": " + pr.Describe()
			}
			cl[s.Name] = fmt.Sprintf("networking %s; gateway %s, KUBECONFIG=%s", net, s.Gateway, s.Kubeconfig)
		}
		rep := RenderReport(p.checks, cl, time.Since(p.start))
		if err := os.WriteFile(filepath.Join(p.artDir, "report.md"), []byte(rep), 0o644); err != nil {
			return ctx, err
		}
		fmt.Fprintf(GinkgoWriter, "\n%s\nreport: %s\n", rep, filepath.Join(p.artDir, "report.md"))
	}
	if suite.Options().Keep {
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s=1: both clusters are left running.\n", environ.PortabilityKeep)
		for _, s := range p.Sides() {
			fmt.Fprintf(&b, "  %-6s curl -H 'Host: %s' %s/echo\n", s.Name, host(), s.Gateway)
			fmt.Fprintf(&b, "         KUBECONFIG=%s kubectl get ksvc -n %s\n", s.Kubeconfig, ns)
		}
		fmt.Fprint(GinkgoWriter, b.String())
		fmt.Fprint(os.Stderr, b.String())
	}
	return ctx, nil
}

// onBoth runs f against each side.
func onBoth[T any](f func(s *harness.Target) (T, error)) (T, T) {
	a, err := f(the().Stock)
	Expect(err).NotTo(HaveOccurred(), "on stock")
	b, err := f(the().Lampyr)
	Expect(err).NotTo(HaveOccurred(), "on lampyr")
	return a, b
}

// expectSame fails with a readable diff naming the field.
func expectSame(name, what string, a, b any) {
	start := CurrentSpecReport().StartTime
	d := Diff(what, a, b)
	the().record(name, start, &d)
	Expect(d).To(BeEmpty())
}

var _ = Describe("one digest-pinned Knative Service on stock Knative and on Lampyr", Label("cluster", "portability"), Ordered, ContinueOnFailure, func() {
	BeforeAll(func(ctx SpecContext) {
		// Both are Ready; the first request may still be on its way through
		// the gateway's configuration. Wait until both answer.
		for _, s := range the().Sides() {
			Eventually(func() (int, error) {
				r, err := Do(ctx, s.Gateway, host(), RequestSet[0])
				if err != nil {
					return 0, err
				}
				return r.Status, nil
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "%s never answered through %s", s.Name, s.Gateway)
		}
	})

	for _, r := range RequestSet {
		It("answers "+r.Name+" identically", Label("http"), func(ctx SpecContext) {
			a, b := onBoth(func(s *harness.Target) (*Response, error) { return Do(ctx, s.Gateway, host(), r) })
			expectSame("request "+r.Name, "the answer to "+r.Method+" "+r.Path, a, b)
		})
	}

	It("streams the same chunks, incrementally", Label("http", "streaming"), func(ctx SpecContext) {
		a, b := onBoth(func(s *harness.Target) (*Stream, error) { return DoStream(ctx, s.Gateway, host(), 5, 200) })
		Expect(a.Incremental).To(BeTrue(), "stock delivered the stream at once: %+v", a)
		expectSame("stream", "the streamed answer of /stream", a, b)
	})

	It("echoes WebSocket messages identically", Label("websocket"), func(ctx SpecContext) {
		msgs := []string{"one", "two", strings.Repeat("x", 4096)}
		a, b := onBoth(func(s *harness.Target) ([]string, error) { return WebSocketEcho(ctx, s.Gateway, host(), msgs) })
		Expect(a).To(HaveLen(len(msgs)))
		expectSame("websocket", "the WebSocket replies on /ws", a, b)
	})

	It("answers every request whose body the handler does not read", Label("http"), func(ctx SpecContext) {
		n := suite.IntKnob(unreadBodyRequests, 1000)
		start := CurrentSpecReport().StartTime
		a, b := onBoth(func(s *harness.Target) (*UnreadBodyTally, error) { return UnreadBodies(ctx, s.Gateway, host(), n), nil })
		fmt.Fprintf(GinkgoWriter, "unread bodies, stock:  %s\nunread bodies, lampyr: %s\n", a, b)
		var problems []string
		for _, t := range []struct {
			name string
			t    *UnreadBodyTally
		}{{"stock", a}, {"lampyr", b}} {
			if t.t.Failures() > 0 {
				problems = append(problems, fmt.Sprintf("%s: %s", t.name, t.t))
			}
			if len(t.t.Leaks) > 0 {
				problems = append(problems, fmt.Sprintf("%s: an error named an internal address: %s", t.name, t.t.Leaks[0]))
			}
		}
		if a.Continues != b.Continues {
			problems = append(problems, fmt.Sprintf("100 Continue answers: stock %d, lampyr %d", a.Continues, b.Continues))
		}
		detail := strings.Join(problems, "; ")
		the().record("unread bodies", start, &detail)
		Expect(problems).To(BeEmpty())
	})

	It("answers gRPC over h2c identically", Label("grpc"), func(ctx SpecContext) {
		for _, s := range the().Sides() {
			Eventually(func() error {
				_, err := Do(ctx, s.Gateway, hostOf(grpcName), RequestSet[0])
				return err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "%s never answered %s", s.Name, grpcName)
		}
		a, b := onBoth(func(s *harness.Target) (*GRPCAnswers, error) { return GRPCHealth(ctx, s.Gateway, hostOf(grpcName)) })
		Expect(a.Check).To(Equal("SERVING"), "stock: %+v", a)
		expectSame("grpc", "the gRPC health answers of "+grpcName, a, b)
		ha, hb := onBoth(func(s *harness.Target) (*Response, error) { return Do(ctx, s.Gateway, hostOf(grpcName), RequestSet[1]) })
		expectSame("request echo-get over h2c", "the answer to GET /echo from the h2c Service", ha, hb)
	})

	for _, name := range []string{svcName, grpcName} {
		It("serves the same defaulted Service spec for "+name, Label("api"), func(ctx SpecContext) {
			a, b := onBoth(func(s *harness.Target) (map[string]any, error) {
				u, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return ServiceSpec(u), nil
			})
			writeJSON("defaulted-"+name+"-stock.json", a)
			writeJSON("defaulted-"+name+"-lampyr.json", b)
			expectSame("defaulted Service spec "+name, "the defaulted Service "+ns+"/"+name, a, b)
		})
	}

	It("serves the same Knative CRD specs", Label("api"), func(ctx SpecContext) {
		for _, name := range []string{"services", "configurations", "revisions", "routes", "domainmappings"} {
			crd := name + ".serving.knative.dev"
			a, b := onBoth(func(s *harness.Target) (map[string]any, error) {
				u, err := s.Clients.Dynamic.Resource(crds).Get(ctx, crd, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return CRDSpec(u), nil
			})
			expectSame("CRD "+crd, "CustomResourceDefinition "+crd, a, b)
		}
	})

	It("ran the Service on fibers on Lampyr and on Pods on stock", Label("execution"), func(ctx SpecContext) {
		// The proof is only meaningful if each side ran its own way.
		start := time.Now()
		var problem string
		defer func() { the().record("each side ran its own way", start, &problem) }()
		pods, err := the().Stock.Clients.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svcName})
		Expect(err).NotTo(HaveOccurred())
		grants, err := the().Lampyr.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = the().Stock.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{})
		names := []string{}
		for _, g := range grants.Items {
			names = append(names, g.GetName())
		}
		sort.Strings(names)
		switch {
		case len(pods.Items) == 0 && !podsScaledToZero(ctx):
			problem = "stock ran no Pod for the Service"
		case strings.Join(names, ",") != svcName+"-00001,"+grpcName+"-00001":
			problem = fmt.Sprintf("Lampyr has CapacityGrants %v, want exactly [%s-00001 %s-00001]", names, svcName, grpcName)
		case err == nil:
			problem = "the stock cluster serves fiberd.io CapacityGrants: it is not stock"
		}
		Expect(problem).To(BeEmpty())
		ld, err := the().Lampyr.Clients.Kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(ld.Items).To(BeEmpty(), "Lampyr must not run Revisions as Deployments")
	})

	// Service bindings (issue 19): a Revision reaches another Service by
	// its cluster DNS name. The public handler calls the cluster-local
	// backend (the same fixture) with GET /call and reports what it got;
	// last in the container because it adds a Service the checks above do
	// not expect.
	It("calls a cluster-local Service by its DNS name identically", Label("bindings"), func(ctx SpecContext) {
		if !suite.Options().Keep {
			DeferCleanup(func(ctx SpecContext) {
				for _, s := range the().Sides() {
					deleteService(ctx, s, backendName)
				}
			})
		}
		the().seal(ctx, the().backend)
		Expect(the().ApplyOnBoth(ctx, the().backend)).To(Succeed())
		for _, s := range the().Sides() {
			u, err := s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, backendName, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(u.GetLabels()).To(HaveKeyWithValue(ly.LabelVisibility, ly.VisibilityClusterLocal),
				"%s on %s must be cluster-local: it is not in %s's ingress.services", backendName, s.Name, ly.WorkspaceFile)
		}

		fqdn := backendName + "." + ns + ".svc.cluster.local"
		calls := []Request{
			{Name: "call-fqdn", Method: "GET", Path: CallPath("http://" + fqdn + "/")},
			// /echo tells the backend apart from the caller: K_SERVICE,
			// and the Host it was reached by.
			{Name: "call-fqdn-echo", Method: "GET", Path: CallPath("http://" + fqdn + "/echo?via=call")},
			// <service>.<namespace>: resolved through the search path, and
			// one of the hosts Knative routes a cluster-local Service by.
			{Name: "call-short", Method: "GET", Path: CallPath("http://" + backendName + "." + ns + "/")},
			{Name: "call-missing", Method: "GET", Path: CallPath("http://nope." + ns + ".svc.cluster.local/")},
		}
		// Ready means the cluster-local Route is programmed; still, give
		// each side a minute to reach the backend before comparing (a side
		// that never does shows in the diff).
		for _, s := range the().Sides() {
			r, err := awaitCall(ctx, s, calls[0], time.Minute)
			raw, _ := json.Marshal(r)
			fmt.Fprintf(GinkgoWriter, "%s: calling %s: %s (err %v)\n", s.Name, fqdn, raw, err)
		}

		a, b := onBoth(func(s *harness.Target) ([]*Response, error) {
			var out []*Response
			for _, r := range calls {
				resp, err := Do(ctx, s.Gateway, host(), r)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", r.Name, err)
				}
				out = append(out, resp)
			}
			return out, nil
		})
		writeJSON("bindings-stock.json", a)
		writeJSON("bindings-lampyr.json", b)
		var diffs []string
		for i, r := range calls {
			d := Diff("the answer to GET "+r.Path, a[i], b[i])
			the().record("binding "+r.Name, CurrentSpecReport().StartTime, &d)
			if d != "" {
				diffs = append(diffs, d)
			}
		}
		// Stock is the reference: it must show what the case is about.
		for i, r := range a {
			Expect(r.Call).NotTo(BeNil(), "stock answered %s without a call report: %+v", calls[i].Name, r)
		}
		Expect(a[0].Call.Status).To(Equal(200), "stock did not reach %s: %+v", fqdn, a[0].Call)
		Expect(a[1].Call.Echo).NotTo(BeNil(), "stock: %+v", a[1].Call)
		Expect(a[1].Call.Echo.Env).To(HaveKeyWithValue("K_SERVICE", backendName), "stock reached another Service than %s", backendName)
		Expect(a[2].Call.Status).To(Equal(200), "stock did not reach %s.%s: %+v", backendName, ns, a[2].Call)
		Expect(a[3].Call.Error).To(Equal("dns"), "stock: a name that does not exist: %+v", a[3].Call)
		Expect(diffs).To(BeEmpty())
	})
})

// awaitCall sends r (a /call) to s until the callee answered 200 or
// timeout passes, and returns the last answer.
func awaitCall(ctx context.Context, s *harness.Target, r Request, timeout time.Duration) (*Response, error) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := Do(ctx, s.Gateway, host(), r)
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

// podsScaledToZero: stock may have scaled the Revision to zero between the
// requests and this check; its Deployment still exists.
func podsScaledToZero(ctx context.Context) bool {
	d, err := the().Stock.Clients.Kube.AppsV1().Deployments(ns).Get(ctx, svcName+"-00001-deployment", metav1.GetOptions{})
	return err == nil && d.Status.Replicas == 0
}

func writeJSON(name string, v any) {
	raw, _ := json.MarshalIndent(v, "", "  ")
	_ = os.WriteFile(filepath.Join(the().artDir, name), raw, 0o644)
}
