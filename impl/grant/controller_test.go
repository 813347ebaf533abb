package grant

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

// TestControllerWiring runs the real controller (informers, handlers, work
// queue) against fake clients: a new grant gets a Home and a status, and a
// Home Pod turning Ready makes the grant Ready through the Pod informer.
func TestControllerWiring(t *testing.T) {
	ctx, cancel := context.WithCancel(logging.WithLogger(context.Background(), logging.FromContext(context.Background())))
	defer cancel()
	kube := kubefake.NewSimpleClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: "lampyr-system"},
		Data:       map[string]string{config.KeyHomeImage: "kind.local/fiberd:test"},
	})
	g := grant("wired-00001")
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GrantGVR: "CapacityGrantList"}, &unstructured.Unstructured{Object: m})

	c := NewController(ctx, Options{Kube: kube, Dynamic: dyn, SystemNamespace: "lampyr-system", Keys: testKeys})
	go c.Run(ctx)

	get := func() *v1alpha1.CapacityGrant {
		u, err := dyn.Resource(GrantGVR).Namespace("default").Get(ctx, "wired-00001", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g, err := fromUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if cond() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	waitUntil("admission and a Home Pod", func() bool {
		_, err := kube.CoreV1().Pods("default").Get(ctx, "wired-00001-home", metav1.GetOptions{})
		return err == nil && get().Status.IsAdmitted()
	})
	p, _ := kube.CoreV1().Pods("default").Get(ctx, "wired-00001-home", metav1.GetOptions{})
	if p.Spec.Containers[0].Image != "kind.local/fiberd:test" {
		t.Fatalf("Home image %q: config-lampyr not read through its informer", p.Spec.Containers[0].Image)
	}
	if got := get().Status.HomeEndpoint; got != resources.HomeEndpoint(g) {
		t.Fatalf("homeEndpoint before the Home is Ready: %q, want the Service's", got)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.244.0.7"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := kube.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the grant to become Ready after its Home Pod did", func() bool { return get().Status.IsReady() })
	if got := get().Status.HomeEndpoint; got != "10.244.0.7:9090" {
		t.Fatalf("homeEndpoint of a Ready Home %q, want its Pod's address", got)
	}
}
