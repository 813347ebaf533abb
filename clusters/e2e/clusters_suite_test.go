// The clusters suite proves the offline cluster inputs end to end: two real
// Kind clusters created in parallel from the offline node image, a pod from an
// image built by the project's image builder answering on 127.0.0.1, and an
// image pushed to localhost:5002 from the host pulled by a pod in each
// cluster. It also interrupts a creation and checks nothing is left behind.
package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
)

var suite = harness.New(harness.Config{
	Name:   "clusters",
	Recipe: "just test-clusters",
	// Bare clusters: the suite proves the offline inputs, not a profile.
	Clusters: []harness.Cluster{{Name: "e2e-a"}, {Name: "e2e-b"}},
})

func TestClusters(t *testing.T) { suite.Run(t) }

// A failed spec's dump also holds each node's logs (kind export logs).
var _ = suite.OnFailure(func(ctx context.Context, t *harness.Target, dir string) {
	if env, err := harness.Env(ctx); err == nil {
		_ = env.Manager().ExportLogs(t.Name, filepath.Join(dir, "kind-logs"))
	}
})

// env is the run's cluster framework (its cache and cluster manager).
func env() *clusters.Env {
	e, err := harness.Env(suite.Context())
	Expect(err).NotTo(HaveOccurred())
	return e
}

var _ = Describe("offline paired clusters", Label("cluster"), func() {
	It("has every node Ready and every kube-system pod (CoreDNS, kube-proxy, control plane) Ready in both clusters", Label("nodes"), func(ctx SpecContext) {
		for _, t := range suite.Targets() {
			n := t.Name
			Eventually(func() ([]string, error) {
				pods, err := t.Clients.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
				if err != nil {
					return nil, err
				}
				var notReady []string
				for _, p := range pods.Items {
					if !podReady(p) {
						notReady = append(notReady, p.Name)
					}
				}
				if len(pods.Items) == 0 {
					notReady = append(notReady, "(no pods yet)")
				}
				return notReady, nil
			}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(BeEmpty(), "cluster %s: kube-system pods not Ready", n)
		}
		for _, t := range suite.Targets() {
			n := t.Name
			nodes, err := t.Clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(nodes.Items).NotTo(BeEmpty())
			for _, node := range nodes.Items {
				Expect(nodeReady(node)).To(BeTrue(), "cluster %s node %s not Ready: %v", n, node.Name, node.Status.Conditions)
			}
		}
	})

	It("serves a pod built by the image builder and pulled from localhost:5002 in each cluster, on 127.0.0.1", Label("registry", "images"), func(ctx SpecContext) {
		ref, err := harness.Image(suite.In(ctx), suite.Targets()[0], "lampyr.dev/serving/fixtures/cmd/handler")
		Expect(err).NotTo(HaveOccurred())
		Expect(ref).To(ContainSubstring("@sha256:"), "the pod must pull by digest")
		for _, t := range suite.Targets() {
			c, info := t.Clients, t.Info
			Expect(deployHandler(ctx, c, ref)).To(Succeed())
			url := info.GatewayURL() + "/"
			Eventually(func() (string, error) { return get(url) }).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).
				Should(Equal("Hello World!\n"), "cluster %s: %s", info.Name, url)
			pod, err := c.Kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=handler"})
			Expect(err).NotTo(HaveOccurred())
			Expect(pod.Items).To(HaveLen(1))
			Expect(pod.Items[0].Status.ContainerStatuses[0].ImageID).To(HaveSuffix(ref[strings.Index(ref, "@")+1:]),
				"cluster %s ran a different image than the one pushed", info.Name)
		}
	})

	It("leaves no container behind when creation is interrupted", Label("lifecycle"), func(ctx SpecContext) {
		bin := filepath.Join(e2eutil.RepoRoot(), "build", "lampyr-clusters")
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./clusters/cmd/lampyr-clusters")
		build.Dir = e2eutil.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build lampyr-clusters: %s", out)
		name := "e2e-interrupt"
		cmd := exec.CommandContext(ctx, bin, "up", name)
		cmd.Dir = e2eutil.RepoRoot()
		// The default behaviour is under test: a run with LAMPYR_KEEP=1
		// (which keeps an interrupted creation's containers) must not
		// change the verdict.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "LAMPYR_KEEP=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		Expect(cmd.Start()).To(Succeed())
		// Interrupt once the node container exists: mid-creation.
		Eventually(func() string { return containers(name) }).WithTimeout(3 * time.Minute).WithPolling(200 * time.Millisecond).ShouldNot(BeEmpty())
		Expect(cmd.Process.Signal(syscall.SIGINT)).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		Eventually(done).WithTimeout(3 * time.Minute).Should(Receive())
		Expect(containers(name)).To(BeEmpty(), "interrupted creation left containers behind")
		_, err = os.Stat(env().Manager().KubeconfigPath(name))
		Expect(os.IsNotExist(err)).To(BeTrue(), "interrupted creation left a kubeconfig behind")
	})
})

func containers(cluster string) string {
	out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster="+cluster).Output()
	return strings.TrimSpace(string(out))
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func deployHandler(ctx context.Context, c *e2eutil.Clients, ref string) error {
	labels := map[string]string{"app": "handler"}
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "handler", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "handler", Image: ref, ImagePullPolicy: corev1.PullIfNotPresent,
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "handler", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(8080), NodePort: clusters.DefaultNodePort}},
		},
	}
	if _, err := c.Kube.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := c.Kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	return err
}

func get(url string) (string, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
