package grant

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
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
	fleetPEM, _ := testFleet.MarshalPEM()
	g := grant("wired-00001")
	// A leftover Home whose grant is gone: deleted once the caches sync.
	orphan := grant("orphan-00001", admitted)
	kube := kubefake.NewSimpleClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: systemNS},
		Data:       map[string]string{config.KeyHomeImage: "kind.local/fiberd@" + digest},
	}, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: FleetKeyName, Namespace: systemNS},
		Data:       map[string][]byte{FleetPrivateKeyKey: fleetPEM},
	}, homeSecret(orphan, now), homeService(orphan))
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GrantGVR: "CapacityGrantList"}, &unstructured.Unstructured{Object: m})

	templates := &fakeTemplates{m: map[string][]byte{templateRef("wired-00001"): sealFor(t, testSealer, "default", "wired-00001")}}
	c := NewController(ctx, Options{Kube: kube, Dynamic: dyn, SystemNamespace: systemNS, HomesNamespace: homesNS, Keys: testKeys, Templates: templates})
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
	hn := resources.HomeName(g)
	waitUntil("admission and a Home Pod", func() bool {
		_, err := kube.CoreV1().Pods(homesNS).Get(ctx, hn, metav1.GetOptions{})
		return err == nil && get().Status.IsAdmitted()
	})
	p, _ := kube.CoreV1().Pods(homesNS).Get(ctx, hn, metav1.GetOptions{})
	if p.Spec.Containers[0].Image != "kind.local/fiberd@"+digest {
		t.Fatalf("Home image %q: config-lampyr not read through its informer", p.Spec.Containers[0].Image)
	}
	waitUntil("the orphaned Home to be deleted", func() bool {
		_, e1 := kube.CoreV1().Secrets(homesNS).Get(ctx, resources.HomeName(orphan), metav1.GetOptions{})
		_, e2 := kube.CoreV1().Services(homesNS).Get(ctx, resources.HomeName(orphan), metav1.GetOptions{})
		return apierrs.IsNotFound(e1) && apierrs.IsNotFound(e2)
	})
	if got := get().Status.HomeEndpoint; got != resources.HomeEndpoint(g, homesNS) {
		t.Fatalf("homeEndpoint before the Home is Ready: %q, want the Service's", got)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.244.0.7"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := kube.CoreV1().Pods(homesNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the grant to become Ready after its Home Pod did", func() bool { return get().Status.IsReady() })
	if got := get().Status.HomeEndpoint; got != "10.244.0.7:9090" {
		t.Fatalf("homeEndpoint of a Ready Home %q, want its Pod's address", got)
	}
}
