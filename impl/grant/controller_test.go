package grant

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakekubeclient "knative.dev/pkg/client/injection/kube/client/fake"
	cminformer "knative.dev/pkg/configmap/informer"
	"knative.dev/pkg/controller"
	_ "knative.dev/pkg/injection/clients/namespacedkube/informers/core/v1/configmap/fake"
	_ "knative.dev/pkg/injection/clients/namespacedkube/informers/core/v1/secret/fake"
	rtesting "knative.dev/pkg/reconciler/testing"
	"knative.dev/pkg/system"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fakefiberdclient "lampyr.dev/serving/impl/client/injection/client/fake"
	_ "lampyr.dev/serving/impl/client/injection/informers/fiberd/v1alpha1/capacitygrant/fake"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/homes"
	_ "lampyr.dev/serving/impl/grant/homes/fake"

	_ "knative.dev/pkg/client/injection/kube/informers/core/v1/namespace/fake"
	_ "knative.dev/pkg/client/injection/kube/informers/core/v1/pod/filtered/fake"
	filteredfactory "knative.dev/pkg/client/injection/kube/informers/factory/filtered"
	_ "knative.dev/pkg/client/injection/kube/informers/factory/filtered/fake"

	"lampyr.dev/serving/impl/grant/resources"
)

// TestControllerWiring runs the real controller (injection informers,
// handlers, work queue, the generated reconciler) against fake clients: a
// new grant gets a Home and a status, a Home left by a grant that is gone is
// deleted, and a Home Pod turning Ready makes the grant Ready through the
// Pod informer.
func TestControllerWiring(t *testing.T) {
	ctx, cancel, informers := rtesting.SetupFakeContextWithCancel(t, func(ctx context.Context) context.Context {
		return filteredfactory.WithSelectors(homes.WithNamespace(ctx, homesNS), FilteredInformerSelectors()...)
	})
	defer cancel()
	kube, fiberd := fakekubeclient.Get(ctx), fakefiberdclient.Get(ctx)
	ns := system.Namespace()
	fleetPEM, _ := testFleet.MarshalPEM()
	g := grant("wired-00001")
	// A leftover Home whose grant is gone: deleted once the caches sync.
	orphan := grant("orphan-00001", admitted)
	mustCreate := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: contract.ConfigMapName, Namespace: ns},
		Data:       map[string]string{lampyrconfig.KeyHomeImage: "kind.local/fiberd@" + digest},
	}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: contract.FleetKeyName, Namespace: ns},
		Data:       map[string][]byte{contract.FleetPrivateKeyKey: fleetPEM},
	}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = kube.CoreV1().Secrets(homesNS).Create(ctx, homeSecret(orphan, now), metav1.CreateOptions{})
	mustCreate(err)
	_, err = kube.CoreV1().Services(homesNS).Create(ctx, homeService(orphan), metav1.CreateOptions{})
	mustCreate(err)
	_, err = fiberd.FiberdV1alpha1().CapacityGrants("default").Create(ctx, g, metav1.CreateOptions{})
	mustCreate(err)

	templates := &fakeTemplates{m: map[string][]byte{templateRef("wired-00001"): sealFor(t, testSealer, "default", "wired-00001")}}
	// As sharedmain's: an informed watcher of the system namespace, where
	// config-lampyr is read through the config store.
	cmw := cminformer.NewInformedWatcher(kube, ns)
	impl := newController(ctx, cmw, Options{Keys: testKeys, Templates: templates, Snapshots: okSnapshots{}})
	if err := controller.StartInformers(ctx.Done(), informers...); err != nil {
		t.Fatal(err)
	}
	if err := cmw.Start(ctx.Done()); err != nil {
		t.Fatal(err)
	}
	go impl.RunContext(ctx, 1)

	get := func() *v1alpha1.CapacityGrant {
		got, err := fiberd.FiberdV1alpha1().CapacityGrants("default").Get(ctx, "wired-00001", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
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
	if got := get().Status.ObservedGeneration; got != g.Generation {
		t.Errorf("status.observedGeneration %d, want %d", got, g.Generation)
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
