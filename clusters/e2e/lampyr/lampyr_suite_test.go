// The lampyr suite runs Lampyr's control plane on a real Kind cluster with
// the `lampyr` install profile: a valid Service becomes Ready with its
// CapacityGrant, Home and backend Service and answers through the gateway
// from a fiber; invalid Services are Ready=False naming the field; a refused
// grant surfaces in ResourcesAvailable; killing the controller pod
// repeatedly mid-reconcile converges and leaves no orphans.
package lampyr

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/clusters/networking"
	"lampyr.dev/serving/clusters/progress"
	"lampyr.dev/serving/impl/ly"
)

func TestLampyr(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lampyr")
}

const (
	clusterName = "lampyr"
	ns          = "lampyr-e2e"
	systemNS    = "lampyr-system"
)

var (
	// sealer is this machine's ly identity, which signs the templates
	// (authorized by the lampyr install profile).
	sealer  *ly.Sealer
	enabled = os.Getenv("LAMPYR_E2E") == "1"
	env     *clusters.Env
	info    kindcluster.Info
	c       *e2eutil.Clients
	lc      *ly.Cluster
	inst    *ly.Installation
	gateway string
	created bool
	project *ly.Project
	built   *ly.Built
	snap    name.Digest // the fixture handler's snapshot artifact in the registry
	// provider is the networking provider installed (clusters.Networking).
	provider networking.Provider
)

var _ = BeforeSuite(func(ctx SpecContext) {
	if !enabled {
		Skip("cluster suites create real Kind clusters: run them with `just test-lampyr` (sets LAMPYR_E2E=1)")
	}
	env = clusters.NewEnv(progress.New(GinkgoWriter), environ.Clusters())
	infos, err := env.Up(ctx, []string{clusterName}, os.Getenv("LAMPYR_KEEP") == "1")
	Expect(err).NotTo(HaveOccurred())
	info = infos[0]
	created = info.Created // this run created it (or recreated a stale one): delete it at the end
	provider, err = networking.Get(environ.Provider())
	Expect(err).NotTo(HaveOccurred())
	Expect(env.Install(ctx, info, "lampyr", provider.Name())).To(Succeed())
	AddReportEntry("networking", provider.Name()+": "+provider.Describe())
	c, err = e2eutil.NewClients(info.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	gateway = info.GatewayURL()
	lc, err = ly.Connect(info.Kubeconfig, "")
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error { inst, err = lc.Describe(ctx); return err }).WithTimeout(time.Minute).Should(Succeed())
	sealer, err = e2eutil.Sealer()
	Expect(err).NotTo(HaveOccurred())
	// A reused cluster may hold a previous run's namespace: start clean
	// (templates are sealed for each Service's first Revision).
	if err := c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err == nil {
		Eventually(func() bool {
			_, err := c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeTrue(), "namespace %s of a previous run is still terminating", ns)
	}
	_, err = c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	// A tenant namespace on Lampyr can enforce Pod Security "restricted":
	// nothing of a Revision runs in it (docs/security.md).
	Expect(e2eutil.RestrictPodSecurity(ctx, c, ns)).To(Succeed())
	By("building the fixture handler's snapshot artifact (ly build) and pushing it")
	dir := filepath.Join(e2eutil.RepoRoot(), "fixtures/cmd/handler")
	project, err = ly.LoadProject(dir)
	Expect(err).NotTo(HaveOccurred())
	built, err = ly.Build(ctx, dir, project, ly.BuildOptions{ArtifactDir: filepath.Join(GinkgoT().TempDir(), "artifact")})
	Expect(err).NotTo(HaveOccurred())
	tag, err := ly.ParseImageTag(info.Registry + "/lampyr-e2e/handler:e2e")
	Expect(err).NotTo(HaveOccurred())
	pushed, err := ly.Push(ctx, built, tag)
	Expect(err).NotTo(HaveOccurred())
	snap = pushed.Ref
}, NodeTimeout(60*time.Minute))

var _ = AfterSuite(func() {
	if env == nil || !created {
		return
	}
	if os.Getenv("LAMPYR_KEEP") == "1" {
		fmt.Fprintf(GinkgoWriter, "LAMPYR_KEEP=1: cluster %s left running (just cluster-down %s)\n", clusterName, clusterName)
		return
	}
	Expect(env.Manager().Delete(clusterName)).To(Succeed())
})

var _ = ReportAfterEach(func(ctx SpecContext, r SpecReport) {
	if r.Failed() && c != nil {
		dir := filepath.Join(environ.ArtifactsDir(), "lampyr", strings.ReplaceAll(r.LeafNodeText, " ", "_"))
		_ = e2eutil.Dump(ctx, c, dir)
	}
})

// service seals a template for svc's first Revision and returns the
// Service manifest ly deploy would apply, with mutate applied.
func service(ctx context.Context, svc string, mutate func(p *ly.Project, tspec map[string]any, ann map[string]any)) *unstructured.Unstructured {
	p := *project
	p.Name = svc
	tmpl, err := ly.SealTemplate(ctx, inst, sealer.Key, ns, svc+"-00001", snap, built.Config, p.Policy())
	Expect(err).NotTo(HaveOccurred())
	u := ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: snap.String(), Snapshot: snap.String(), Template: tmpl.String(), Public: true})
	if mutate != nil {
		tspec, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
		ann, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "metadata", "annotations")
		mutate(&p, tspec, ann)
		Expect(unstructured.SetNestedMap(u.Object, tspec, "spec", "template", "spec")).To(Succeed())
		Expect(unstructured.SetNestedMap(u.Object, ann, "spec", "template", "metadata", "annotations")).To(Succeed())
	}
	return u
}

func apply(ctx context.Context, u *unstructured.Unstructured) {
	u.SetNamespace(ns)
	Expect(c.Apply(ctx, e2eutil.KServices, u, "lampyr-suite")).To(Succeed())
}

func host(svc string) string { return svc + "." + ns + "." + clusters.Domain }

// revisionCondition waits for a Revision condition to reach status and
// returns its reason and message.
func revisionCondition(ctx context.Context, rev, typ, status string, timeout time.Duration) (string, string) {
	var reason, msg string
	Eventually(func() (string, error) {
		u, err := c.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		var s string
		s, reason, msg = e2eutil.Condition(u, typ)
		return s, nil
	}).WithTimeout(timeout).WithPolling(500*time.Millisecond).Should(Equal(status), "Revision %s condition %s", rev, typ)
	return reason, msg
}

func containerMap(tspec map[string]any) map[string]any {
	return tspec["containers"].([]any)[0].(map[string]any)
}

var _ = Describe("Lampyr on Kind (lampyr profile)", Label("cluster", "lampyr"), Ordered, ContinueOnFailure, func() {
	It("runs no stock controller, activator or autoscaler", func(ctx SpecContext) {
		ds, err := c.Kube.AppsV1().Deployments("knative-serving").List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, d := range ds.Items {
			names = append(names, d.Name)
		}
		// Upstream's webhook, and the networking provider's own
		// Deployments there (net-gateway-api's controller and webhook).
		want := []string{"webhook"}
		objs, err := networking.Rendered(provider, clusters.DefaultNodePort)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			if o.GetKind() == "Deployment" && o.GetNamespace() == "knative-serving" {
				want = append(want, o.GetName())
			}
		}
		Expect(names).To(ConsistOf(want), "knative-serving must hold only upstream's webhook and %s's own Deployments", provider.Name())
		ls, err := c.Kube.AppsV1().Deployments(systemNS).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		names = nil
		for _, d := range ls.Items {
			names = append(names, d.Name)
		}
		Expect(names).To(ConsistOf("lampyr-controller", "lampyr-grant-controller", "fiber-router"))
	})

	It("makes a valid Service Ready with its CapacityGrant, Home and backend Service, and serves it from fibers", func(ctx SpecContext) {
		apply(ctx, service(ctx, "valid", nil))
		_, err := c.WaitReady(ctx, e2eutil.KServices, ns, "valid", 4*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		rev := "valid-00001"
		g, err := c.Dynamic.Resource(ly.GrantResource).Namespace(ns).Get(ctx, rev, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred(), "the Revision's CapacityGrant")
		for _, t := range []string{"Admitted", "HomeReady", "Ready"} {
			s, r, m := e2eutil.Condition(g, t)
			Expect(s).To(Equal("True"), "grant condition %s: %s %s", t, r, m)
		}
		gsnap, _, _ := unstructured.NestedString(g.Object, "spec", "snapshotArtifact")
		Expect(gsnap).To(Equal(snap.String()))
		pods, err := e2eutil.HomePods(ctx, c, ns, rev)
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).NotTo(BeEmpty(), "the Revision's Home Pod, in %s", e2eutil.LampyrHomesNamespace)
		for _, p := range pods.Items {
			Expect(p.Status.Phase).To(Equal(corev1.PodRunning), "Home %s", p.Name)
		}
		svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, rev, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred(), "the backend Service the upstream Route reconciler expects, named after the Revision")
		strategy := clusters.BackendStrategyFor(provider.Name())
		if strategy == "externalname" {
			Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeExternalName), "externalname strategy (%s)", provider.Name())
		} else {
			Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP), "endpointslice strategy (%s)", provider.Name())
		}
		Expect(svc.Spec.Selector).To(BeEmpty())
		var ports []int32
		for _, p := range svc.Spec.Ports {
			ports = append(ports, p.Port)
		}
		Expect(ports).To(ContainElement(int32(80)), "port 80 (http) for an http1 Revision, as upstream's Route expects")
		if strategy == "endpointslice" {
			slices, err := c.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + rev})
			Expect(err).NotTo(HaveOccurred())
			Expect(slices.Items).NotTo(BeEmpty(), "mirrored EndpointSlice")
		}
		_, err = c.Kube.CoreV1().ConfigMaps(e2eutil.LampyrSystemNamespace).Get(ctx, e2eutil.RouterMetadataName(ns, rev), metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred(), "router metadata, in %s", e2eutil.LampyrSystemNamespace)
		Eventually(func() (string, error) {
			code, body, _, err := e2eutil.Get(ctx, gateway, host("valid"), "/")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return body, err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("Hello World!\n"))
		code, body, _, err := e2eutil.Get(ctx, gateway, host("valid"), "/echo")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(200))
		Expect(body).To(ContainSubstring(`"K_REVISION": "valid-00001"`))
	})

	It("serves a reuse-mode Service from live fibers kept between requests, over fiberd tunnels", func(ctx SpecContext) {
		p := *project
		p.Name = "reuse"
		p.Execution = ly.Execution{Mode: "reuse", IdleTimeout: "60s", IdleAction: "release"}
		tmpl, err := ly.SealTemplate(ctx, inst, sealer.Key, ns, "reuse-00001", snap, built.Config, p.Policy())
		Expect(err).NotTo(HaveOccurred())
		apply(ctx, ly.ServiceManifest(&p, ly.ServiceInputs{Namespace: ns, Image: snap.String(), Snapshot: snap.String(), Template: tmpl.String(), Public: true}))
		_, err = c.WaitReady(ctx, e2eutil.KServices, ns, "reuse", 4*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		state := func() (string, int, error) {
			code, body, _, err := e2eutil.Get(ctx, gateway, host("reuse"), "/state")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			if err != nil {
				return "", 0, err
			}
			var proc string
			var n int
			if _, err := fmt.Sscan(body, &proc, &n); err != nil {
				return "", 0, fmt.Errorf("/state answered %q: %w", body, err)
			}
			return proc, n, nil
		}
		Eventually(func() error { _, _, err := state(); return err }).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		// Every fiber-router replica leases its own fiber; each fiber's
		// process must count on from request to request.
		last := map[string]int{}
		for i := 0; i < 30; i++ {
			proc, n, err := state()
			Expect(err).NotTo(HaveOccurred(), "request %d", i)
			if prev, ok := last[proc]; ok {
				Expect(n).To(BeNumerically(">", prev), "process %s answered request %d after %d", proc, n, prev)
			}
			last[proc] = n
		}
		d, err := c.Kube.AppsV1().Deployments(systemNS).Get(ctx, "fiber-router", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(len(last)).To(BeNumerically("<=", int(*d.Spec.Replicas)), "31 sequential requests ran in %d fiber processes: %v", len(last), last)
		fmt.Fprintf(GinkgoWriter, "31 requests, fiber processes and their last request numbers: %v\n", last)
		// fiberd says how it carried them: tunnels, joined in the kernel
		// where BPF sockmaps are allowed.
		pods, err := e2eutil.HomePods(ctx, c, ns, "reuse-00001")
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).NotTo(BeEmpty())
		var splice []string
		for _, pod := range pods.Items {
			logs, err := c.Kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "fiberd"}).DoRaw(ctx)
			Expect(err).NotTo(HaveOccurred())
			for _, line := range strings.Split(string(logs), "\n") {
				if strings.Contains(line, "tunnels are spliced in the kernel") || strings.Contains(line, "tunnels copy bytes in user space") {
					splice = append(splice, pod.Name+": "+line)
				}
			}
		}
		Expect(splice).NotTo(BeEmpty(), "fiberd logs no tunnel: reuse-mode requests did not take the tunnel path")
		fmt.Fprintf(GinkgoWriter, "fiberd: %s\n", strings.Join(splice, "; "))
	})

	type invalid struct {
		name, reason, field string
		mutate              func(p *ly.Project, tspec, ann map[string]any)
	}
	for _, tc := range []invalid{
		{"bad-command", "UnsupportedCommand", "command", func(_ *ly.Project, t, _ map[string]any) { containerMap(t)["command"] = []any{"/bin/sh"} }},
		{"bad-env", "UnsupportedEnv", "env", func(_ *ly.Project, t, _ map[string]any) {
			containerMap(t)["env"] = []any{map[string]any{"name": "TARGET", "value": "x"}}
		}},
		{"bad-min-scale", "UnsupportedMinScale", "min-scale", func(_ *ly.Project, _, a map[string]any) { a["autoscaling.knative.dev/min-scale"] = "1" }},
		{"bad-concurrency", "UnsupportedContainerConcurrency", "containerConcurrency", func(_ *ly.Project, t, _ map[string]any) { t["containerConcurrency"] = int64(0) }},
		{"bad-template", "MissingFiberdTemplate", "lampyr.dev/fiberd-template", func(_ *ly.Project, _, a map[string]any) { delete(a, ly.AnnotationFiberdTemplate) }},
		{"bad-image", "UnsupportedImage", "image", func(_ *ly.Project, t, _ map[string]any) {
			containerMap(t)["image"] = "localhost:5002/lampyr-e2e/handler:e2e"
		}},
		{"bad-park", "UnsupportedIdleAction", "idle-action", func(_ *ly.Project, _, a map[string]any) {
			a[ly.AnnotationExecutionMode] = "reuse"
			a[ly.AnnotationIdleTimeout] = "30s"
			a[ly.AnnotationIdleAction] = "park"
		}},
	} {
		It("refuses "+tc.name+" with Ready=False naming "+tc.field, func(ctx SpecContext) {
			apply(ctx, service(ctx, tc.name, tc.mutate))
			reason, msg := revisionCondition(ctx, tc.name+"-00001", "Ready", "False", 2*time.Minute)
			Expect(reason).To(Equal(tc.reason), "message: %s", msg)
			Expect(msg).To(ContainSubstring(tc.field))
			fmt.Fprintf(GinkgoWriter, "%s: Ready=False %s: %s\n", tc.name, reason, msg)
			_, err := c.Dynamic.Resource(ly.GrantResource).Namespace(ns).Get(ctx, tc.name+"-00001", metav1.GetOptions{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a refused Revision gets no CapacityGrant")
		})
	}

	It("surfaces a refused grant in ResourcesAvailable", func(ctx SpecContext) {
		// More memory per fiber than the grant controller's
		// max-memory-per-fiber (2Gi by default).
		apply(ctx, service(ctx, "too-big", func(_ *ly.Project, t, _ map[string]any) {
			containerMap(t)["resources"] = map[string]any{"requests": map[string]any{"memory": "3Gi"}}
		}))
		reason, msg := revisionCondition(ctx, "too-big-00001", "ResourcesAvailable", "False", 2*time.Minute)
		fmt.Fprintf(GinkgoWriter, "too-big: ResourcesAvailable=False %s: %s\n", reason, msg)
		Expect(reason).NotTo(BeEmpty())
		Expect(msg).To(ContainSubstring("2Gi"))
	})

	It("converges with no orphans while the controller pod is killed 10 times mid-reconcile", func(ctx SpecContext) {
		names := []string{"churn-a", "churn-b", "churn-c"}
		for _, n := range names {
			apply(ctx, service(ctx, n, nil))
		}
		for i := 0; i < 10; i++ {
			pods, err := c.Kube.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app=lampyr-controller"})
			Expect(err).NotTo(HaveOccurred())
			for _, p := range pods.Items {
				zero := int64(0)
				Expect(c.Kube.CoreV1().Pods(systemNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
			}
			if i == 4 {
				// Half way: delete one Service while the controller is down,
				// so finalization also happens across restarts.
				Expect(c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, "churn-c", metav1.DeleteOptions{})).To(Succeed())
			}
			// Wait for the replacement to run, then let it work a moment.
			Eventually(func() bool {
				pods, err := c.Kube.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app=lampyr-controller"})
				if err != nil {
					return false
				}
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
						return true
					}
				}
				return false
			}).WithTimeout(2*time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(), "kill %d: no replacement controller", i+1)
			time.Sleep(time.Duration(500+300*i) * time.Millisecond)
			fmt.Fprintf(GinkgoWriter, "killed the controller pod %d time(s)\n", i+1)
		}
		for _, n := range names[:2] {
			_, err := c.WaitReady(ctx, e2eutil.KServices, ns, n, 4*time.Minute)
			Expect(err).NotTo(HaveOccurred())
			code, body, _, err := e2eutil.Get(ctx, gateway, host(n), "/")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
		}
		By("deleting every Service: nothing Lampyr made may remain")
		svcs, err := c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).List(ctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred())
		for _, s := range svcs.Items {
			Expect(c.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, s.GetName(), metav1.DeleteOptions{})).To(Succeed())
		}
		Eventually(func() []string { return leftovers(ctx) }).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeEmpty(), "orphans after deleting every Service")
	})
})

// leftovers lists what Knative or Lampyr left in the suite's namespace.
func leftovers(ctx context.Context) []string { return e2eutil.Leftovers(ctx, c, ns) }
