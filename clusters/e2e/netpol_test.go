package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/kind/pkg/cluster/nodes"
	kindexec "sigs.k8s.io/kind/pkg/exec"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
)

// The offline CNI (ptp) enforces no NetworkPolicy; every framework cluster
// runs kube-router's NetworkPolicy controller for that. This spec fails on a
// cluster without it: the deny steps never start refusing.
//
// Both pods run the handler fixture, which has no HTTP client; requests are
// sent from the client pod's own network namespace by the node's curl
// (nsenter --net), so they leave with the client pod's address through its
// veth, exactly as the pod's own traffic would.
var _ = Describe("NetworkPolicy enforcement", Label("cluster", "netpol"), func() {
	It("refuses what a NetworkPolicy denies and lets through what it allows, ingress and egress", func(ctx SpecContext) {
		t := suite.Targets()[0]
		info, c := t.Info, t.Clients
		ref, err := harness.Image(suite.In(ctx), t, "lampyr.dev/serving/fixtures/cmd/handler")
		Expect(err).NotTo(HaveOccurred())
		ns := "netpol-" + rand.String(5)
		_, err = c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx context.Context) {
			_ = c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		})
		for _, app := range []string{"server", "client", "other"} {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns, Labels: map[string]string{"app": app}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "handler", Image: ref, ImagePullPolicy: corev1.PullIfNotPresent,
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			}
			_, err := c.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
		}
		svc, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(8080)}}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())

		pods := map[string]*corev1.Pod{}
		for _, app := range []string{"server", "client", "other"} {
			Eventually(func() (bool, error) {
				p, err := c.Kube.CoreV1().Pods(ns).Get(ctx, app, metav1.GetOptions{})
				pods[app] = p
				return err == nil && podReady(*p) && p.Status.PodIP != "", err
			}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeTrue(), "pod %s/%s not Ready", ns, app)
		}
		node, err := env().Manager().Nodes(info.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(node).To(HaveLen(1))
		client, other := newPodNet(ctx, node[0], pods["client"]), newPodNet(ctx, node[0], pods["other"])
		server := []string{
			fmt.Sprintf("http://%s:8080/", pods["server"].Status.PodIP), // pod to pod
			fmt.Sprintf("http://%s/", svc.Spec.ClusterIP),               // pod to ClusterIP (kube-proxy DNAT)
		}
		enforcer := fmt.Sprintf("is the %s running on %s?", clusters.NetworkPolicyEnforcer("").Describe(), info.Name)
		api, err := c.Kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())

		By("without a policy, the client and another pod reach the server by pod IP and ClusterIP, and the API server")
		for _, from := range []*podNet{client, other} {
			Eventually(from.reachesAll).WithContext(ctx).WithArguments(server).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		}
		Expect(client.get(ctx, "https://"+api.Spec.ClusterIP+"/readyz", "--insecure")).To(Succeed(), "a pod in a namespace without policies reaches the API server")

		By("a default-deny ingress policy in the namespace: the same requests are refused")
		applyPolicy(ctx, c, ns, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "default-deny-ingress"},
			Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		})
		for _, from := range []*podNet{client, other} {
			Eventually(from.refusedAll).WithContext(ctx).WithArguments(server).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(),
				"default-deny-ingress is not enforced: %s", enforcer)
			from.logRefusals(ctx, server)
		}

		By("an ingress policy allowing app=client on TCP 8080: the client gets through again, the other pod does not")
		tcp, port := corev1.ProtocolTCP, intstr.FromInt(8080)
		applyPolicy(ctx, c, ns, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "allow-client"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		})
		Eventually(client.reachesAll).WithContext(ctx).WithArguments(server).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "allow-client is not enforced")
		Consistently(other.refusedAll).WithContext(ctx).WithArguments(server).WithTimeout(5*time.Second).WithPolling(time.Second).Should(Succeed(), "a pod without the client's labels got through")
		other.logRefusals(ctx, server)

		By("an egress policy denying everything from the client: refused, although the server's ingress allows it")
		applyPolicy(ctx, c, ns, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "client-deny-egress"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			},
		})
		Eventually(client.refusedAll).WithContext(ctx).WithArguments(server).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "client-deny-egress is not enforced")
		client.logRefusals(ctx, server)

		By("deleting the egress policy: the client gets through again")
		Expect(c.Kube.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "client-deny-egress", metav1.DeleteOptions{})).To(Succeed())
		Eventually(client.reachesAll).WithContext(ctx).WithArguments(server).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	})
})

func applyPolicy(ctx context.Context, c *e2eutil.Clients, ns string, p *networkingv1.NetworkPolicy) {
	GinkgoHelper()
	p.Namespace = ns
	_, err := c.Kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, p, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
}

// podNet sends requests from a pod's network namespace with the node's curl.
type podNet struct {
	node nodes.Node
	name string
	pid  string
}

func newPodNet(ctx context.Context, node nodes.Node, pod *corev1.Pod) *podNet {
	GinkgoHelper()
	Expect(pod.Status.ContainerStatuses).NotTo(BeEmpty())
	_, id, ok := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	Expect(ok).To(BeTrue(), "pod %s has no container ID", pod.Name)
	lines, err := kindexec.OutputLines(node.CommandContext(ctx, "crictl", "inspect", "--output", "go-template", "--template", "{{.info.pid}}", id))
	Expect(err).NotTo(HaveOccurred(), "crictl inspect %s", id)
	Expect(lines).NotTo(BeEmpty())
	return &podNet{node: node, name: pod.Name, pid: strings.TrimSpace(lines[0])}
}

// get succeeds when url answers 200 within 3 seconds.
func (p *podNet) get(ctx context.Context, url string, curlArgs ...string) error {
	args := append([]string{"--target", p.pid, "--net", "curl", "--silent", "--show-error", "--max-time", "3", "--output", "/dev/null", "--write-out", "%{http_code}"}, curlArgs...)
	cmd := p.node.CommandContext(ctx, "nsenter", append(args, url)...)
	var status, stderr strings.Builder
	cmd.SetStdout(&status)
	cmd.SetStderr(&stderr)
	err := cmd.Run()
	if err != nil || status.String() != "200" {
		return fmt.Errorf("%s -> %s: HTTP status %q, %s", p.name, url, status.String(), strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (p *podNet) reachesAll(ctx context.Context, urls []string) error {
	for _, u := range urls {
		if err := p.get(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// refusedAll succeeds when every url fails.
func (p *podNet) refusedAll(ctx context.Context, urls []string) error {
	for _, u := range urls {
		if err := p.get(ctx, u); err == nil {
			return fmt.Errorf("%s -> %s answered 200", p.name, u)
		}
	}
	return nil
}

// logRefusals writes how each url was refused into the report (kube-router
// rejects with an ICMP port-unreachable: curl fails at once with "Couldn't
// connect to server").
func (p *podNet) logRefusals(ctx context.Context, urls []string) {
	for _, u := range urls {
		fmt.Fprintf(GinkgoWriter, "refused as expected: %v\n", p.get(ctx, u))
	}
}
