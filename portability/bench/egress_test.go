package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// The cost of the egress design (issue 31 §4): fibers' outbound
// connections leave through their namespace's egress Pod, and every fresh
// fiber gets a network namespace with fiberd's user-space stack behind it.
// Two figures, from one run:
//
//   - a /call round trip (the Service calls a plain Deployment's Service in
//     its own namespace) through each side's gateway, stock and Lampyr
//     alternated A B B A, on the warm Service (Lampyr reuses live fibers,
//     so the figure is the egress path, not a fiber start);
//   - fresh fibers per second on Lampyr with config-lampyr fiber-egress
//     "cluster" and "off", alternated on B B A (the installation's own
//     setting is put back at the end).
var _ = Describe("the egress path's cost", Label("cluster", "bench", "egress"), Ordered, func() {
	const db = "egress-db"
	dbURL := "http://" + db + "." + ns + ".svc.cluster.local/"

	BeforeAll(func(ctx SpecContext) {
		for _, s := range the().sides {
			ensureDB(ctx, s, db)
		}
	})
	// The db is the bench namespace's only Pod that no Knative Service
	// owns: the footprint spec (which may run after this one) counts the
	// namespace's Pods down to zero.
	AfterAll(func(ctx SpecContext) {
		for _, s := range the().sides {
			_ = s.Clients.Kube.AppsV1().Deployments(ns).Delete(ctx, db, metav1.DeleteOptions{})
			_ = s.Clients.Kube.CoreV1().Services(ns).Delete(ctx, db, metav1.DeleteOptions{})
		}
	})

	It("measures a /call round trip stock vs Lampyr, alternated", func(ctx SpecContext) {
		// A Service of its own (Lampyr: reuse, as the warm one), so that
		// this figure does not depend on what the specs before it left:
		// re-applying their Service would seal its template anew and
		// make a second Revision its first Revision's template refuses.
		const svc = "egress-call"
		deployBothMode(ctx, svc, 20, "reuse")
		DeferCleanup(func(ctx SpecContext) {
			for _, s := range the().sides {
				_ = s.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Delete(ctx, svc, metav1.DeleteOptions{})
			}
		})
		path := "/call?url=" + dbURL
		for _, s := range the().sides {
			Eventually(func() (string, error) { return callOnce(ctx, s, svc, path) }).
				WithTimeout(2*time.Minute).WithPolling(time.Second).Should(ContainSubstring(`"status": 200`), "/call on %s", s.Name)
		}
		dur := time.Duration(suite.IntKnob(benchSeconds, 5)) * time.Second
		got := map[string]*Sample{"stock": {}, "lampyr": {}}
		direct := map[string]*Sample{"stock": {}, "lampyr": {}}
		for round, order := range [][]*side{{the().stock, the().lampyr}, {the().lampyr, the().stock}} {
			for _, s := range order {
				smp := Load(ctx, 1, dur, GetFunc(the().client, s.Gateway, host(svc), path))
				base := Load(ctx, 1, dur, GetFunc(the().client, s.Gateway, host(svc), "/"))
				fmt.Fprintf(GinkgoWriter, "egress /call round %d %s: %d requests, %d errors, p50 %.2fms p99 %.2fms; / alone p50 %.2fms\n",
					round+1, s.Name, len(smp.Latencies), smp.Errors, ms(smp.Percentile(50)), ms(smp.Percentile(99)), ms(base.Percentile(50)))
				got[s.Name].Merge(smp)
				direct[s.Name].Merge(base)
			}
		}
		r := the().report
		r.Samples["egress call, c=1/stock"], r.Samples["egress call, c=1/lampyr"] = got["stock"], got["lampyr"]
		extra := func(side string) float64 {
			return ms(got[side].Percentile(50)) - ms(direct[side].Percentile(50))
		}
		addRows(
			Row{Group: "egress /call (c=1, same-namespace Deployment)", Metric: "p50 round trip", Unit: "ms", Stock: ms(got["stock"].Percentile(50)), Lampyr: ms(got["lampyr"].Percentile(50))},
			Row{Group: "egress /call (c=1, same-namespace Deployment)", Metric: "p99 round trip", Unit: "ms", Stock: ms(got["stock"].Percentile(99)), Lampyr: ms(got["lampyr"].Percentile(99))},
			Row{Group: "egress /call (c=1, same-namespace Deployment)", Metric: "p50 added by the call (/call minus /)", Unit: "ms", Stock: extra("stock"), Lampyr: extra("lampyr")},
			Row{Group: "egress /call (c=1, same-namespace Deployment)", Metric: "errors", Stock: float64(got["stock"].Errors), Lampyr: float64(got["lampyr"].Errors)},
		)
		Expect(got["lampyr"].Errors+got["stock"].Errors).To(BeZero(), "/call errors (stock %d, Lampyr %d)", got["stock"].Errors, got["lampyr"].Errors)
	})

	It("measures fresh fibers/s with fiber-egress cluster vs off", func(ctx SpecContext) {
		l := the().lampyr
		cms := l.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace)
		cm, err := cms.Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		orig, had := cm.Data[lampyrconfig.KeyFiberEgress]
		DeferCleanup(func(ctx SpecContext) {
			v := any(orig)
			if !had {
				v = nil
			}
			patchConfig(ctx, v)
			// Every Home in the namespace rolls back before the next
			// measurement.
			grants, err := l.Clients.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			for _, g := range grants.Items {
				waitHome(ctx, g.GetName(), orig != lampyrconfig.EgressOff)
			}
		})
		const svc = "egress-fresh"
		u := serviceMode(svc, 4, "fresh")
		apply(ctx, l, u)
		_, err = l.Clients.WaitReady(ctx, e2eutil.KServices, ns, svc, 4*time.Minute)
		Expect(err).NotTo(HaveOccurred())
		dur := time.Duration(suite.IntKnob(benchSeconds, 5)) * time.Second
		got := map[string]*Sample{lampyrconfig.EgressCluster: {}, lampyrconfig.EgressOff: {}}
		// B B A after the first A: cluster, off, off, cluster.
		for _, mode := range []string{lampyrconfig.EgressCluster, lampyrconfig.EgressOff, lampyrconfig.EgressOff, lampyrconfig.EgressCluster} {
			patchConfig(ctx, mode)
			waitHome(ctx, svc+"-00001", mode != lampyrconfig.EgressOff)
			smp := Load(ctx, 4, dur, GetFunc(the().client, l.Gateway, host(svc), "/"))
			fmt.Fprintf(GinkgoWriter, "egress fresh fibers, fiber-egress %s: %d requests, %d errors, %.1f fibers/s, p50 %.2fms\n", mode, len(smp.Latencies), smp.Errors, smp.Throughput(), ms(smp.Percentile(50)))
			got[mode].Merge(smp)
		}
		on, off := got[lampyrconfig.EgressCluster], got[lampyrconfig.EgressOff]
		the().report.Breakdown = append(the().report.Breakdown,
			Row{Group: "egress cost (fresh fibers, c=4)", Metric: "fibers/s, fiber-egress cluster", Unit: "req/s", Lampyr: on.Throughput()},
			Row{Group: "egress cost (fresh fibers, c=4)", Metric: "fibers/s, fiber-egress off", Unit: "req/s", Lampyr: off.Throughput(),
				Note: fmt.Sprintf("cluster/off %.3g", on.Throughput()/off.Throughput())},
			Row{Group: "egress cost (fresh fibers, c=4)", Metric: "p50, fiber-egress cluster", Unit: "ms", Lampyr: ms(on.Percentile(50))},
			Row{Group: "egress cost (fresh fibers, c=4)", Metric: "p50, fiber-egress off", Unit: "ms", Lampyr: ms(off.Percentile(50))},
		)
		Expect(on.Errors+off.Errors).To(BeZero(), "fresh-fiber errors (cluster %d, off %d)", on.Errors, off.Errors)
	})
})

// ensureDB runs a plain Deployment of the handler and a Service db in
// front of it in the bench namespace of s (Pod Security restricted).
func ensureDB(ctx context.Context, s *side, db string) {
	labels := map[string]string{"app": db}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: db, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name: "db", Image: the().runnable, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	_, err := s.Clients.Kube.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred(), "Deployment %s on %s", db, s.Name)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: db, Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	_, err = s.Clients.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred(), "Service %s on %s", db, s.Name)
	}
	Eventually(func() (int32, error) {
		d, err := s.Clients.Kube.AppsV1().Deployments(ns).Get(ctx, db, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		return d.Status.ReadyReplicas, nil
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Equal(int32(1)), "Deployment %s Ready on %s", db, s.Name)
}

// callOnce is one GET of path on svc through s's gateway: its body, or an
// error naming the status.
func callOnce(ctx context.Context, s *side, svc, path string) (string, error) {
	code, body, err := getBody(ctx, s, host(svc), path)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d: %s", code, body)
	}
	return body, err
}

// patchConfig sets config-lampyr fiber-egress on the Lampyr side (nil:
// removes the key, back to the installation's default).
func patchConfig(ctx context.Context, v any) {
	patch := fmt.Sprintf(`{"data":{%q:%s}}`, lampyrconfig.KeyFiberEgress, jsonValue(v))
	_, err := the().lampyr.Clients.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).Patch(ctx, contract.ConfigMapName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred(), "patching %s %s", contract.ConfigMapName, patch)
}

func jsonValue(v any) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprintf("%q", v)
}

// waitHome waits until Revision rev's Home runs one Ready Pod whose fiberd
// has (egress) or lacks (!egress) the egress flags, and nothing else is
// left of an older Home. A Home keeps the fiber-egress mode it started with
// (the grant controller replaces a Home for a new image, not for a
// config-lampyr change), so a Home Pod with the other mode is deleted, as
// an operator applying the change at once would, and its grant makes the
// next one with the current mode.
func waitHome(ctx context.Context, rev string, egress bool) {
	l := the().lampyr
	Eventually(func() (string, error) {
		pods, err := e2eutil.HomePods(ctx, l.Clients, ns, rev)
		if err != nil {
			return "", err
		}
		var state []string
		for _, p := range pods.Items {
			has := false
			for _, c := range p.Spec.Containers {
				has = has || strings.Contains(strings.Join(c.Args, " "), "--egress=")
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			if has != egress && p.DeletionTimestamp == nil {
				if err := l.Clients.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return "", err
				}
			}
			state = append(state, fmt.Sprintf("%s egress=%t ready=%t deleting=%t", p.Name, has, ready, p.DeletionTimestamp != nil))
			if len(pods.Items) == 1 && has == egress && ready && p.DeletionTimestamp == nil {
				return "ok", nil
			}
		}
		return strings.Join(state, "; "), nil
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Equal("ok"), "Home of %s with egress=%t", rev, egress)
	svc := rev
	if i := strings.LastIndex(rev, "-"); i > 0 {
		svc = rev[:i]
	}
	Eventually(func() (string, error) { return callOnce(ctx, l, svc, "/") }).
		WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Equal("Hello World!\n"))
}

// getBody is one GET of path with Host host through s's gateway.
func getBody(ctx context.Context, s *side, host, path string) (int, string, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, s.Gateway+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	resp, err := the().client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}
