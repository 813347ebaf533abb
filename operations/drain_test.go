package operations

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/grant/resources"
)

// schedulableNodes are s's nodes that take workloads (not cordoned, no
// NoSchedule taint).
func schedulableNodes(ctx context.Context, s *side) []string {
	l, err := s.Clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, n := range l.Items {
		ok := !n.Spec.Unschedulable
		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule {
				ok = false
			}
		}
		if ok {
			out = append(out, n.Name)
		}
	}
	return out
}

// podsByNode counts the Pods matching selector in namespace per node.
func podsByNode(ctx context.Context, s *side, namespace, selector string) map[string]int {
	l, err := s.Clients.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	Expect(err).NotTo(HaveOccurred())
	out := map[string]int{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName]++
		}
	}
	return out
}

// cordon marks node unschedulable (or schedulable again).
func cordon(ctx context.Context, s *side, node string, on bool) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	_, err := s.Clients.Kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred(), "cordon=%v %s on %s", on, node, s.Name)
}

// drain does what `kubectl drain --ignore-daemonsets --delete-emptydir-data`
// does: cordon the node, evict every Pod on it but DaemonSets' and static
// ones through the Eviction API (retrying while a PodDisruptionBudget
// refuses, for 30 s, then deleting the Pod), and wait until they are gone.
// It returns how long that took.
func drain(ctx context.Context, s *side, node string) time.Duration {
	start := time.Now()
	cordon(ctx, s, node, true)
	l, err := s.Clients.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	Expect(err).NotTo(HaveOccurred())
	var evicted []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, static := p.Annotations["kubernetes.io/config.mirror"]; static {
			continue
		}
		ds := false
		for _, o := range p.OwnerReferences {
			if o.Kind == "DaemonSet" {
				ds = true
			}
		}
		if ds {
			continue
		}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
		refusedSince := time.Time{}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			err := s.Clients.Kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, ev)
			switch {
			case err == nil, apierrs.IsNotFound(err):
				return true, nil
			case apierrs.IsTooManyRequests(err):
				// A PodDisruptionBudget says not now. Upstream Knative's
				// webhook and activator PDBs (minAvailable 80%) refuse
				// every eviction of a single replica, so `kubectl drain`
				// would wait forever on a small cluster; after 30 s the
				// Pod is deleted instead, as an operator forcing the
				// drain would (--disable-eviction), and said so.
				if refusedSince.IsZero() {
					refusedSince = time.Now()
				}
				if time.Since(refusedSince) < 30*time.Second {
					return false, nil
				}
				fmt.Fprintf(GinkgoWriter, "%s: %s/%s: its PodDisruptionBudget refused eviction for 30s (%v); deleted instead\n", s.Name, p.Namespace, p.Name, err)
				return true, ignoreNotFound(s.Clients.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}))
			}
			return false, err
		})
		Expect(err).NotTo(HaveOccurred(), "evicting %s/%s from %s on %s", p.Namespace, p.Name, node, s.Name)
		evicted = append(evicted, p)
	}
	for _, p := range evicted {
		err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := s.Clients.Kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			return apierrs.IsNotFound(err) || (err == nil && got.UID != p.UID), nil
		})
		Expect(err).NotTo(HaveOccurred(), "%s/%s did not leave %s on %s", p.Namespace, p.Name, node, s.Name)
	}
	fmt.Fprintf(GinkgoWriter, "%s: drained %s: %d Pods evicted in %s\n", s.Name, node, len(evicted), time.Since(start).Round(time.Second))
	return time.Since(start)
}

// machine says what the run costs this machine: its load and available
// memory, and each Kind node container's CPU and memory (docker stats, one
// sample).
func machine(ctx context.Context) string {
	load, _ := os.ReadFile("/proc/loadavg")
	var avail string
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemAvailable:") || strings.HasPrefix(l, "MemTotal:") {
				avail += strings.Join(strings.Fields(l), " ") + "; "
			}
		}
	}
	out, err := exec.CommandContext(ctx, "docker", "stats", "--no-stream", "--format", "{{.Name}}\t{{.CPUPerc}}\t{{.MemUsage}}").Output()
	if err != nil {
		out = []byte("docker stats: " + err.Error())
	}
	return fmt.Sprintf("  load %s  %s\n  %s", strings.TrimSpace(string(load)), avail, strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "\n  "))
}

func ignoreNotFound(err error) error {
	if apierrs.IsNotFound(err) {
		return nil
	}
	return err
}

var _ = Describe("more than one node", Label("cluster", "operations", "multinode"), Ordered, func() {
	It("drains the node that runs the Revision's Pod (kubectl drain), on both, with a second node to go to", func(ctx SpecContext) {
		for _, s := range the().sides {
			if n := schedulableNodes(ctx, s); len(n) < 2 {
				Skip(fmt.Sprintf("%s has %d schedulable node(s) (%s): draining one needs another to move to; create the pair with LAMPYR_CLUSTER_WORKERS=2 (after `just cluster-down --all`)", s.Name, len(n), strings.Join(n, ", ")))
			}
		}
		deployBoth(ctx, "drained")
		// Where things run before: Homes of every Service of the suite,
		// fiber-router's replicas, the stock Revision's Pods.
		l := the().lampyr
		fmt.Fprintf(GinkgoWriter, "before: lampyr Homes per node %v, fiber-router per node %v; stock drained Pods per node %v\n",
			podsByNode(ctx, l, contract.HomesNamespace, resources.ComponentKey+"="+resources.Component), podsByNode(ctx, l, contract.SystemNamespace, "app=fiber-router"),
			podsByNode(ctx, the().stock, ns, "serving.knative.dev/revision=drained-00001"))
		fmt.Fprintf(GinkgoWriter, "machine before the drain:\n%s\n", machine(ctx))
		p := probe(ctx, "drained")
		steady(ctx)
		p.Phase("draining")
		took := map[string]time.Duration{}
		for _, s := range the().sides {
			pods := revisionPods(ctx, s, "drained-00001")
			pns, pname, _ := strings.Cut(pods[0], "/")
			pod, err := s.Clients.Kube.CoreV1().Pods(pns).Get(ctx, pname, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			node := pod.Spec.NodeName
			// Uncordoned whatever happens, before the drain can fail.
			DeferCleanup(func(ctx SpecContext) { cordon(ctx, s, node, false) })
			took[s.Name+" "+node] = drain(ctx, s, node)
		}
		p.Phase("after")
		steady(ctx)
		fmt.Fprintf(GinkgoWriter, "machine after the drain:\n%s\n", machine(ctx))
		r := finish(p, "drain-node")
		fmt.Fprintf(GinkgoWriter, "drains: %v; after: lampyr Homes per node %v, fiber-router per node %v\n", took,
			podsByNode(ctx, l, contract.HomesNamespace, resources.ComponentKey+"="+resources.Component), podsByNode(ctx, l, contract.SystemNamespace, "app=fiber-router"))
		judge(r, "draining the Revision's node")
	})
})
