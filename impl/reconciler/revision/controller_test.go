package revision

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	filteredfactory "knative.dev/pkg/client/injection/kube/informers/factory/filtered"
	"knative.dev/pkg/configmap"
	rtesting "knative.dev/pkg/reconciler/testing"
	apisconfig "knative.dev/serving/pkg/apis/config"
	asconfig "knative.dev/serving/pkg/autoscaler/config"

	// Fake clients and informers for everything NewController asks for.
	_ "knative.dev/pkg/client/injection/kube/client/fake"
	_ "knative.dev/pkg/client/injection/kube/informers/core/v1/configmap/filtered/fake"
	_ "knative.dev/pkg/client/injection/kube/informers/core/v1/service/fake"
	_ "knative.dev/pkg/client/injection/kube/informers/discovery/v1/endpointslice/filtered/fake"
	_ "knative.dev/pkg/client/injection/kube/informers/factory/filtered/fake"
	_ "knative.dev/serving/pkg/client/injection/client/fake"
	_ "knative.dev/serving/pkg/client/injection/informers/serving/v1/revision/fake"

	_ "lampyr.dev/serving/impl/client/injection/client/fake"
	_ "lampyr.dev/serving/impl/client/injection/informers/fiberd/v1alpha1/capacitygrant/fake"
)

// TestNewController wires the controller the way sharedmain does (minus
// starting it): every informer it asks for is injected, both config
// watchers load, and config-lampyr may be absent.
func TestNewController(t *testing.T) {
	ctx, _ := rtesting.SetupFakeContext(t, func(ctx context.Context) context.Context {
		return filteredfactory.WithSelectors(ctx, FilteredInformerSelectors()...)
	})
	cmw := configmap.NewStaticWatcher(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apisconfig.DefaultsConfigName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apisconfig.FeaturesConfigName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: asconfig.ConfigName}},
	)
	if impl := NewController(ctx, cmw); impl == nil {
		t.Fatal("NewController returned nil")
	}
}

// The filtered informers' selectors must parse on the API server side; the
// fake informers never check them.
func TestFilteredInformerSelectorsParse(t *testing.T) {
	for _, sel := range FilteredInformerSelectors() {
		if _, err := labels.Parse(sel); err != nil {
			t.Errorf("selector %q: %v", sel, err)
		}
	}
}
