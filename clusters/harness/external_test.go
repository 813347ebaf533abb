package harness

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
)

// A closed port: a listener opened and closed again.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func crd(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiextensions.k8s.io/v1")
	u.SetKind("CustomResourceDefinition")
	u.SetName(name)
	return u
}

// fakeClients is a cluster whose API holds objs (CRDs) and kube objects.
func fakeClients(objs []runtime.Object, kube ...runtime.Object) *e2eutil.Clients {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{crds: "CustomResourceDefinitionList"}, objs...)
	return &e2eutil.Clients{Kube: kubefake.NewClientset(kube...), Dynamic: dyn}
}

// Preflight names the target and everything missing, in one error: a
// gateway that refuses connections, a registry that does not answer, and
// on a lampyr target the missing CapacityGrant CRD and lampyr-system.
func TestPreflightNamesWhatIsMissing(t *testing.T) {
	ctx := context.Background()
	knativeOnly := []runtime.Object{crd("services.serving.knative.dev")}
	tg := &Target{Name: "other-lampyr", Profile: clusters.ProfileLampyr, Kubeconfig: "/k", Gateway: "http://" + closedAddr(t),
		Registry: closedAddr(t), Clients: fakeClients(knativeOnly)}
	err := Preflight(ctx, tg, PreflightOptions{Timeout: 5 * time.Second})
	if err == nil {
		t.Fatal("a target without gateway, registry or Lampyr passed the preflight")
	}
	for _, want := range []string{
		"target other-lampyr (profile lampyr, KUBECONFIG=/k)",
		"no reachable gateway: dialling " + strings.TrimPrefix(tg.Gateway, "http://"),
		"no registry access: pushing a tiny image to " + tg.Registry + "/" + PreflightRepo,
		"no Lampyr: CustomResourceDefinition capacitygrants.fiberd.io",
		"no Lampyr: namespace " + contract.SystemNamespace,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("preflight error does not say %q:\n%v", want, err)
		}
	}

	// Everything there: a gateway that accepts, a registry (in process)
	// that takes the tiny image, Lampyr's CRD and namespace.
	gw := httptest.NewServer(nil)
	defer gw.Close()
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	regHost := strings.TrimPrefix(reg.URL, "http://")
	tg = &Target{Name: "lampyr-b", Profile: clusters.ProfileLampyr, Kubeconfig: "/k", Gateway: gw.URL, Registry: "registry.cluster.local:5000", Push: regHost,
		Clients: fakeClients(append(knativeOnly, crd("capacitygrants.fiberd.io")), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: contract.SystemNamespace}})}
	if err := Preflight(ctx, tg, PreflightOptions{}); err != nil {
		t.Fatalf("a complete lampyr target: %v", err)
	}
	ref, err := PushProbe(ctx, tg)
	if err != nil || !strings.HasPrefix(ref, "registry.cluster.local:5000/"+PreflightRepo+"@sha256:") {
		t.Errorf("the probe is pushed to Push and named by Registry: %s, %v", ref, err)
	}

	// A stock target without Knative.
	tg = &Target{Name: "bare", Profile: clusters.ProfileStock, Kubeconfig: "/k", Gateway: gw.URL, Clients: fakeClients(nil)}
	if err := Preflight(ctx, tg, PreflightOptions{}); err == nil || !strings.Contains(err.Error(), "no Knative Serving") {
		t.Errorf("a cluster without Knative: %v", err)
	}
}

func TestDialGatewayWantsAURL(t *testing.T) {
	for _, gw := range []string{"127.0.0.1:80", "ftp://x:1", ""} {
		if err := DialGateway(context.Background(), gw); err == nil || !strings.Contains(err.Error(), "want http://host:port") {
			t.Errorf("DialGateway(%q) = %v", gw, err)
		}
	}
}

// The node decides a pull either way; until then the check waits.
func TestPullVerdict(t *testing.T) {
	waiting := func(reason string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "m"}}}}}}
	}
	for _, tc := range []struct {
		pod        *corev1.Pod
		done, fail bool
	}{
		{&corev1.Pod{}, false, false},
		{waiting("ContainerCreating"), false, false},
		{waiting("ErrImagePull"), true, true},
		{waiting("ImagePullBackOff"), true, true},
		{waiting("CreateContainerError"), true, false},
		{waiting("RunContainerError"), true, false},
		{&corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{ImageID: "sha256:x", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}}, true, false},
		{&corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "StartError"}}}}}}, true, false},
	} {
		done, err := PullVerdict(tc.pod)
		if done != tc.done || (err != nil) != tc.fail {
			t.Errorf("%+v: done %v, err %v", tc.pod.Status, done, err)
		}
	}
}

// A target given by kubeconfig and context gets a kubeconfig of that
// context alone, so every client and `ly` use it.
func TestContextKubeconfigKeepsOneContext(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "config")
	cfg := `apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: 'https://127.0.0.1:1'}}
- {name: b, cluster: {server: 'https://127.0.0.1:2'}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: kind-a, context: {cluster: a, user: u}}
- {name: kind-b, context: {cluster: b, user: u}}
current-context: kind-a
`
	if err := os.WriteFile(src, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := ContextKubeconfig(src, "kind-b", filepath.Join(dir, "run", "b.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := clientcmd.LoadFromFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got.CurrentContext != "kind-b" || len(got.Contexts) != 1 || len(got.Clusters) != 1 || got.Clusters["b"].Server != "https://127.0.0.1:2" {
		t.Errorf("kubeconfig of kind-b: %+v", got)
	}
	if _, err := ContextKubeconfig(src, "kind-c", filepath.Join(dir, "c")); err == nil || !strings.Contains(err.Error(), `no context "kind-c"`) {
		t.Errorf("a context the file lacks: %v", err)
	}
}

// The pull check reads the node's verdict from its Pod: here a kubelet
// that reports ErrImagePull.
func TestCheckPullReportsThePullError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := fakeClients(nil)
	tg := &Target{Name: "s", Clients: c}
	go func() {
		for ctx.Err() == nil {
			pods, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			if err == nil && len(pods.Items) == 1 {
				p := &pods.Items[0]
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "dial tcp: lookup registry.internal: no such host"}}}}
				_, _ = c.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	err := CheckPull(ctx, tg, "registry.internal:5000/x@sha256:0")
	if err == nil || !strings.Contains(err.Error(), "the node could not pull it: ErrImagePull: dial tcp: lookup registry.internal") {
		t.Fatalf("CheckPull = %v", err)
	}
	if nss, _ := c.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); len(nss.Items) != 0 {
		t.Errorf("the pull check's namespace is left behind: %v", nss.Items)
	}
}
