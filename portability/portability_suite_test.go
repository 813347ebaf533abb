package portability

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/impl/ly"
)

func TestPortability(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "portability")
}

const (
	ns  = "portability"
	pkg = "lampyr.dev/serving/fixtures/cmd/handler"
	// svcName is the HTTP/1 Service (lampyr.yaml in fixtures/cmd/handler).
	svcName = "handler"
	// grpcName is the same handler declared h2c (gRPC).
	grpcName = "handler-grpc"
)

// fixtureService is a ly service directory of the fixture handler; each is
// deployed as its own Knative Service.
type fixtureService struct {
	name     string
	dir      string // relative to the repository root
	snapshot string
	template string
}

var fixtureServices = []*fixtureService{
	{name: svcName, dir: "fixtures/cmd/handler"},
	{name: grpcName, dir: "fixtures/services/handler-grpc"},
}

// backend is the cluster-local Service the bindings spec has the handler
// call by its cluster DNS name. Built, sealed and applied like
// fixtureServices, but only by that spec: the others count exactly the
// fixtureServices' Revisions.
var backend = &fixtureService{name: "handler-backend", dir: "fixtures/services/handler-backend"}

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// side is one platform of the pair.
type side struct {
	name    string // cluster name and install profile
	info    kindcluster.Info
	c       *e2eutil.Clients
	gateway string
}

var (
	enabled = os.Getenv("LAMPYR_E2E") == "1"
	keep    = os.Getenv("LAMPYR_PORTABILITY_KEEP") == "1"
	env     *clusters.Env
	stock   = &side{name: "stock"}
	lampyr  = &side{name: "lampyr"}
	sides   = []*side{stock, lampyr}
	// created: clusters this run created (deleted at the end unless kept);
	// clusters that existed before are left as they were found.
	created  = map[string]bool{}
	suiteT0  time.Time
	runnable string // the handler as a runnable image, digest-pinned
	lyBin    string // the ly CLI, built from this tree
	checks   []Check
	checksMu sync.Mutex
	artDir   string
)

func host() string { return hostOf(svcName) }

func hostOf(svc string) string { return svc + "." + ns + "." + clusters.Domain }

func record(name string, start time.Time, err *string) {
	checksMu.Lock()
	defer checksMu.Unlock()
	c := Check{Name: name, Passed: *err == "", Detail: *err, Duration: time.Since(start)}
	checks = append(checks, c)
}

var _ = BeforeSuite(func(ctx SpecContext) {
	if !enabled {
		Skip("the portability proof creates real Kind clusters: run it with `just test-knative-portability` (sets LAMPYR_E2E=1)")
	}
	suiteT0 = time.Now()
	artDir = filepath.Join(e2eutil.ArtifactsDir(), "portability")
	Expect(os.MkdirAll(artDir, 0o755)).To(Succeed())
	log := progress.New(GinkgoWriter)
	env = clusters.NewEnv(log)
	infos, err := env.Up(ctx, []string{stock.name, lampyr.name}, keep)
	Expect(err).NotTo(HaveOccurred())
	for i, s := range sides {
		s.info = infos[i]
		created[s.name] = s.info.Created
		s.gateway = s.info.GatewayURL()
		s.c, err = e2eutil.NewClients(s.info.Kubeconfig)
		Expect(err).NotTo(HaveOccurred())
	}
	// Installation is a server-side apply of rendered manifests: idempotent
	// on a reused cluster. One at a time: each builds images on 2 cores.
	for _, s := range sides {
		Expect(env.Install(ctx, s.info, s.name, clusters.Networking())).To(Succeed())
	}
	for _, s := range sides {
		_, err := s.c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		if s == lampyr {
			// On Lampyr the tenant namespace enforces Pod Security
			// "restricted" (no Lampyr Pod runs in it); stock runs the
			// Service's Pods there.
			Expect(e2eutil.RestrictPodSecurity(ctx, s.c, ns)).To(Succeed())
		}
		for _, f := range fixtureServices {
			deleteService(ctx, s, f.name)
		}
		// Left by a run that kept its clusters.
		deleteService(ctx, s, backend.name)
	}

	By("building the handler as a runnable image (the project's image builder)")
	runnable, err = e2eutil.BuildAndPush(ctx, env.Cache, pkg, lampyr.info.Registry, "portability/handler", "runnable")
	Expect(err).NotTo(HaveOccurred())
	fmt.Fprintf(GinkgoWriter, "runnable image: %s\n", runnable)

	lyBin = filepath.Join(GinkgoT().TempDir(), "ly")
	goBuild := exec.CommandContext(ctx, "go", "build", "-o", lyBin, "./impl/cmd/ly")
	goBuild.Dir = e2eutil.RepoRoot()
	out, err := goBuild.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
	for _, f := range fixtureServices {
		sealOnLampyr(ctx, f)
	}
	applyOnBoth(ctx, fixtureServices...)
}, NodeTimeout(60*time.Minute))

// sealOnLampyr builds f as a Lampyr snapshot artifact and has `ly deploy`
// push it and seal its template for the Service's first Revision, then
// deletes that Service, so that applyOnBoth creates it anew from the same
// manifest as on stock.
func sealOnLampyr(ctx context.Context, f *fixtureService) {
	By("building " + f.name + " as a Lampyr snapshot artifact with `ly build`")
	artifactDir := filepath.Join(GinkgoT().TempDir(), "artifact-"+f.name)
	svcDir := filepath.Join(e2eutil.RepoRoot(), f.dir)
	runLy(ctx, lyBin, "build", svcDir, "--artifact", artifactDir)

	By("deploying " + f.name + " on Lampyr with `ly deploy` (push, seal the template), then deleting that Service")
	events := runLy(ctx, lyBin, "deploy", svcDir, "--artifact", artifactDir,
		"--image", lampyr.info.Registry+"/portability/"+f.name+":snapshot",
		"--kubeconfig", lampyr.info.Kubeconfig, "--namespace", ns, "--output", "json")
	var res ly.DeployResult
	for _, e := range events {
		if e.Event == "result" {
			raw, _ := json.Marshal(e.Fields)
			Expect(json.Unmarshal(raw, &res)).To(Succeed())
		}
	}
	Expect(res.Template).To(ContainSubstring("@sha256:"), "ly deploy printed no template reference")
	Expect(res.Revision).To(Equal(f.name+"-00001"), "the template is sealed for the first Revision of a new Service")
	f.snapshot, f.template = res.Snapshot, res.Template
	runLy(ctx, lyBin, "delete", f.name, "--kubeconfig", lampyr.info.Kubeconfig, "--namespace", ns)
}

// serviceManifest is the one Service applied to both clusters for f: the
// runnable image for stock, the sealed snapshot for Lampyr, visibility as
// the workspace says (as `ly deploy` decides it). It is written to the
// artifacts folder.
func serviceManifest(f *fixtureService) *unstructured.Unstructured {
	dir := filepath.Join(e2eutil.RepoRoot(), f.dir)
	p, err := ly.LoadProject(dir)
	Expect(err).NotTo(HaveOccurred())
	ws, _, err := ly.FindWorkspace(dir)
	Expect(err).NotTo(HaveOccurred())
	svc := ly.ServiceManifest(p, ly.ServiceInputs{Namespace: ns, Image: runnable, Snapshot: f.snapshot, Template: f.template, Public: ws.Public(p.Name)})
	manifest, err := yaml.Marshal(svc.Object)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(artDir, "service-"+f.name+".yaml"), manifest, 0o644)).To(Succeed())
	fmt.Fprintf(GinkgoWriter, "the Service applied to both clusters:\n%s", manifest)
	return svc
}

// applyOnBoth applies each Service identically to both clusters, then
// waits until every one is Ready on each.
func applyOnBoth(ctx context.Context, fs ...*fixtureService) {
	var wg sync.WaitGroup
	type waited struct {
		side *side
		svc  string
		err  error
	}
	results := make(chan waited, len(sides)*len(fs))
	for _, f := range fs {
		By("applying one identical Service " + f.name + " to both clusters")
		body, err := serviceManifest(f).MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		for _, s := range sides {
			force := true
			_, err := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Patch(ctx, f.name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "portability", Force: &force})
			Expect(err).NotTo(HaveOccurred(), "applying %s on %s", f.name, s.name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				_, err := s.c.WaitReady(ctx, e2eutil.KServices, ns, f.name, 4*time.Minute)
				fmt.Fprintf(GinkgoWriter, "%s: Service %s Ready after %s\n", s.name, f.name, time.Since(t0).Round(100*time.Millisecond))
				results <- waited{s, f.name, err}
			}()
		}
	}
	wg.Wait()
	close(results)
	for r := range results {
		Expect(r.err).NotTo(HaveOccurred(), "Service %s on %s", r.svc, r.side.name)
	}
}

// runLy runs the ly binary, echoing its output, and returns its JSON events
// (when --output json).
func runLy(ctx context.Context, bin string, args ...string) []ly.Event {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = e2eutil.RepoRoot()
	cmd.Stderr = GinkgoWriter
	out, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(cmd.Start()).To(Succeed())
	var events []ly.Event
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintf(GinkgoWriter, "ly: %s\n", line)
		var e ly.Event
		if json.Unmarshal([]byte(line), &e) == nil && e.Event != "" {
			events = append(events, e)
		}
	}
	Expect(cmd.Wait()).To(Succeed(), "ly %s", strings.Join(args, " "))
	return events
}

func deleteService(ctx context.Context, s *side, svcName string) {
	err := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, svcName, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() bool {
		_, err := s.c.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, svcName+"-00001", metav1.GetOptions{})
		_, serr := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, svcName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(serr)
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(BeTrue(), "Service %s on %s still present", svcName, s.name)
}

var _ = ReportAfterEach(func(ctx SpecContext, r SpecReport) {
	if !r.Failed() {
		return
	}
	for _, s := range sides {
		if s.c == nil {
			continue
		}
		dir := filepath.Join(artDir, "dump", strings.ReplaceAll(r.LeafNodeText, " ", "_"), s.name)
		if err := e2eutil.Dump(ctx, s.c, dir); err != nil {
			fmt.Fprintf(GinkgoWriter, "dump %s: %v\n", s.name, err)
		}
	}
})

var _ = AfterSuite(func(ctx SpecContext) {
	if !enabled || env == nil {
		return
	}
	if artDir != "" && len(checks) > 0 {
		cl := map[string]string{}
		net := clusters.Networking()
		if p, err := networking.Get(net); err == nil {
			net = p.Name() + ": " + p.Describe()
		}
		for _, s := range sides {
			cl[s.name] = fmt.Sprintf("networking %s; gateway %s, KUBECONFIG=%s", net, s.gateway, s.info.Kubeconfig)
		}
		rep := RenderReport(checks, cl, time.Since(suiteT0))
		_ = os.WriteFile(filepath.Join(artDir, "report.md"), []byte(rep), 0o644)
		fmt.Fprintf(GinkgoWriter, "\n%s\nreport: %s\n", rep, filepath.Join(artDir, "report.md"))
	}
	if keep {
		var b strings.Builder
		fmt.Fprintf(&b, "\nLAMPYR_PORTABILITY_KEEP=1: both clusters are left running.\n")
		for _, s := range sides {
			fmt.Fprintf(&b, "  %-6s curl -H 'Host: %s' %s/echo\n", s.name, host(), s.gateway)
			fmt.Fprintf(&b, "         KUBECONFIG=%s kubectl get ksvc -n %s\n", s.info.Kubeconfig, ns)
		}
		fmt.Fprintf(&b, "  delete them with: just cluster-down stock lampyr\n")
		fmt.Fprint(GinkgoWriter, b.String())
		fmt.Fprint(os.Stderr, b.String())
		return
	}
	for _, s := range sides {
		if created[s.name] {
			By("deleting cluster " + s.name + " (set LAMPYR_PORTABILITY_KEEP=1 to keep it)")
			Expect(env.Manager().Delete(s.name)).To(Succeed())
		} else {
			fmt.Fprintf(GinkgoWriter, "cluster %s existed before this run: left running\n", s.name)
		}
	}
}, NodeTimeout(10*time.Minute))

// onBoth runs f against each side.
func onBoth[T any](f func(s *side) (T, error)) (T, T) {
	a, err := f(stock)
	Expect(err).NotTo(HaveOccurred(), "on stock")
	b, err := f(lampyr)
	Expect(err).NotTo(HaveOccurred(), "on lampyr")
	return a, b
}

// expectSame fails with a readable diff naming the field.
func expectSame(name, what string, a, b any) {
	start := CurrentSpecReport().StartTime
	d := Diff(what, a, b)
	record(name, start, &d)
	Expect(d).To(BeEmpty())
}

var _ = Describe("one digest-pinned Knative Service on stock Knative and on Lampyr", Label("cluster", "portability"), Ordered, ContinueOnFailure, func() {
	BeforeAll(func(ctx SpecContext) {
		// Both are Ready; the first request may still be on its way through
		// the gateway's configuration. Wait until both answer.
		for _, s := range sides {
			Eventually(func() (int, error) {
				r, err := Do(ctx, s.gateway, host(), RequestSet[0])
				if err != nil {
					return 0, err
				}
				return r.Status, nil
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(200), "%s never answered through %s", s.name, s.gateway)
		}
	})

	for _, r := range RequestSet {
		It("answers "+r.Name+" identically", func(ctx SpecContext) {
			a, b := onBoth(func(s *side) (*Response, error) { return Do(ctx, s.gateway, host(), r) })
			expectSame("request "+r.Name, "the answer to "+r.Method+" "+r.Path, a, b)
		})
	}

	It("streams the same chunks, incrementally", func(ctx SpecContext) {
		a, b := onBoth(func(s *side) (*Stream, error) { return DoStream(ctx, s.gateway, host(), 5, 200) })
		Expect(a.Incremental).To(BeTrue(), "stock delivered the stream at once: %+v", a)
		expectSame("stream", "the streamed answer of /stream", a, b)
	})

	It("echoes WebSocket messages identically", func(ctx SpecContext) {
		msgs := []string{"one", "two", strings.Repeat("x", 4096)}
		a, b := onBoth(func(s *side) ([]string, error) { return WebSocketEcho(ctx, s.gateway, host(), msgs) })
		Expect(a).To(HaveLen(len(msgs)))
		expectSame("websocket", "the WebSocket replies on /ws", a, b)
	})

	It("answers every request whose body the handler does not read", func(ctx SpecContext) {
		n := 1000
		if v, err := strconv.Atoi(os.Getenv("LAMPYR_UNREAD_BODY_REQUESTS")); err == nil && v > 0 {
			n = v
		}
		start := CurrentSpecReport().StartTime
		a, b := onBoth(func(s *side) (*UnreadBodyTally, error) { return UnreadBodies(ctx, s.gateway, host(), n), nil })
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
		record("unread bodies", start, &detail)
		Expect(problems).To(BeEmpty())
	})

	It("answers gRPC over h2c identically", func(ctx SpecContext) {
		for _, s := range sides {
			Eventually(func() error {
				_, err := Do(ctx, s.gateway, hostOf(grpcName), RequestSet[0])
				return err
			}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "%s never answered %s", s.name, grpcName)
		}
		a, b := onBoth(func(s *side) (*GRPCAnswers, error) { return GRPCHealth(ctx, s.gateway, hostOf(grpcName)) })
		Expect(a.Check).To(Equal("SERVING"), "stock: %+v", a)
		expectSame("grpc", "the gRPC health answers of "+grpcName, a, b)
		ha, hb := onBoth(func(s *side) (*Response, error) { return Do(ctx, s.gateway, hostOf(grpcName), RequestSet[1]) })
		expectSame("request echo-get over h2c", "the answer to GET /echo from the h2c Service", ha, hb)
	})

	for _, name := range []string{svcName, grpcName} {
		It("serves the same defaulted Service spec for "+name, func(ctx SpecContext) {
			a, b := onBoth(func(s *side) (map[string]any, error) {
				u, err := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
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

	It("serves the same Knative CRD specs", func(ctx SpecContext) {
		for _, name := range []string{"services", "configurations", "revisions", "routes", "domainmappings"} {
			crd := name + ".serving.knative.dev"
			a, b := onBoth(func(s *side) (map[string]any, error) {
				u, err := s.c.Dynamic.Resource(crds).Get(ctx, crd, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return CRDSpec(u), nil
			})
			expectSame("CRD "+crd, "CustomResourceDefinition "+crd, a, b)
		}
	})

	It("ran the Service on fibers on Lampyr and on Pods on stock", func(ctx SpecContext) {
		// The proof is only meaningful if each side ran its own way.
		start := time.Now()
		var problem string
		defer func() { record("each side ran its own way", start, &problem) }()
		pods, err := stock.c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + svcName})
		Expect(err).NotTo(HaveOccurred())
		grants, err := lampyr.c.Dynamic.Resource(ly.GrantResource).Namespace(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = stock.c.Dynamic.Resource(ly.GrantResource).Namespace(ns).List(ctx, metav1.ListOptions{})
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
		ld, err := lampyr.c.Kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(ld.Items).To(BeEmpty(), "Lampyr must not run Revisions as Deployments")
	})

	// Service bindings (issue 19): a Revision reaches another Service by
	// its cluster DNS name. The public handler calls the cluster-local
	// backend (the same fixture) with GET /call and reports what it got;
	// last in the container because it adds a Service the checks above do
	// not expect.
	It("calls a cluster-local Service by its DNS name identically", Label("bindings"), func(ctx SpecContext) {
		if !keep {
			DeferCleanup(func(ctx SpecContext) {
				for _, s := range sides {
					deleteService(ctx, s, backend.name)
				}
			})
		}
		sealOnLampyr(ctx, backend)
		applyOnBoth(ctx, backend)
		for _, s := range sides {
			u, err := s.c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, backend.name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(u.GetLabels()).To(HaveKeyWithValue(ly.LabelVisibility, ly.VisibilityClusterLocal),
				"%s on %s must be cluster-local: it is not in %s's ingress.services", backend.name, s.name, ly.WorkspaceFile)
		}

		fqdn := backend.name + "." + ns + ".svc.cluster.local"
		calls := []Request{
			{Name: "call-fqdn", Method: "GET", Path: CallPath("http://" + fqdn + "/")},
			// /echo tells the backend apart from the caller: K_SERVICE,
			// and the Host it was reached by.
			{Name: "call-fqdn-echo", Method: "GET", Path: CallPath("http://" + fqdn + "/echo?via=call")},
			// <service>.<namespace>: resolved through the search path, and
			// one of the hosts Knative routes a cluster-local Service by.
			{Name: "call-short", Method: "GET", Path: CallPath("http://" + backend.name + "." + ns + "/")},
			{Name: "call-missing", Method: "GET", Path: CallPath("http://nope." + ns + ".svc.cluster.local/")},
		}
		// Ready means the cluster-local Route is programmed; still, give
		// each side a minute to reach the backend before comparing (a side
		// that never does shows in the diff).
		for _, s := range sides {
			r, err := awaitCall(ctx, s, calls[0], time.Minute)
			raw, _ := json.Marshal(r)
			fmt.Fprintf(GinkgoWriter, "%s: calling %s: %s (err %v)\n", s.name, fqdn, raw, err)
		}

		a, b := onBoth(func(s *side) ([]*Response, error) {
			var out []*Response
			for _, r := range calls {
				resp, err := Do(ctx, s.gateway, host(), r)
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
			record("binding "+r.Name, CurrentSpecReport().StartTime, &d)
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
		Expect(a[1].Call.Echo.Env).To(HaveKeyWithValue("K_SERVICE", backend.name), "stock reached another Service than %s", backend.name)
		Expect(a[2].Call.Status).To(Equal(200), "stock did not reach %s.%s: %+v", backend.name, ns, a[2].Call)
		Expect(a[3].Call.Error).To(Equal("dns"), "stock: a name that does not exist: %+v", a[3].Call)
		Expect(diffs).To(BeEmpty())
	})
})

// awaitCall sends r (a /call) to s until the callee answered 200 or
// timeout passes, and returns the last answer.
func awaitCall(ctx context.Context, s *side, r Request, timeout time.Duration) (*Response, error) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := Do(ctx, s.gateway, host(), r)
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
	d, err := stock.c.Kube.AppsV1().Deployments(ns).Get(ctx, svcName+"-00001-deployment", metav1.GetOptions{})
	return err == nil && d.Status.Replicas == 0
}

func writeJSON(name string, v any) {
	raw, _ := json.MarshalIndent(v, "", "  ")
	_ = os.WriteFile(filepath.Join(artDir, name), raw, 0o644)
}
