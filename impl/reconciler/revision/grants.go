package revision

// This file is the only place that knows CapacityGrants are reached through
// the dynamic client: docs/contracts.md names no typed client yet
// (impl/client/ does not exist). When the fiberd engineer generates one,
// replace dynamicGrants and grantInformer with it; the reconciler only sees
// grantStore.

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/injection/clients/dynamicclient"
	"knative.dev/pkg/logging"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
)

// grantStore is what the reconciler needs of CapacityGrants: reads from the
// informer cache, writes through the API.
type grantStore interface {
	Get(namespace, name string) (*fiberdv1alpha1.CapacityGrant, error)
	Create(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error
	Update(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error
	Delete(ctx context.Context, namespace, name string) error
}

// dynamicGrants implements grantStore with the dynamic client and a dynamic
// informer's lister, converting with the default unstructured converter.
type dynamicGrants struct {
	client dynamic.Interface
	lister cache.GenericLister
}

func (d *dynamicGrants) Get(namespace, name string) (*fiberdv1alpha1.CapacityGrant, error) {
	obj, err := d.lister.ByNamespace(namespace).Get(name)
	if err != nil {
		return nil, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("capacitygrant %s/%s: unexpected cache object %T", namespace, name, obj)
	}
	g := &fiberdv1alpha1.CapacityGrant{}
	// FromUnstructured copies, so the informer's object is never mutated.
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), g); err != nil {
		return nil, fmt.Errorf("capacitygrant %s/%s: %w", namespace, name, err)
	}
	return g, nil
}

func toUnstructured(g *fiberdv1alpha1.CapacityGrant) (*unstructured.Unstructured, error) {
	g = g.DeepCopy()
	g.APIVersion = fiberdv1alpha1.SchemeGroupVersion.String()
	g.Kind = "CapacityGrant"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func (d *dynamicGrants) Create(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error {
	u, err := toUnstructured(g)
	if err != nil {
		return err
	}
	_, err = d.client.Resource(contract.CapacityGrants).Namespace(g.Namespace).Create(ctx, u, metav1.CreateOptions{})
	return err
}

func (d *dynamicGrants) Update(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error {
	u, err := toUnstructured(g)
	if err != nil {
		return err
	}
	_, err = d.client.Resource(contract.CapacityGrants).Namespace(g.Namespace).Update(ctx, u, metav1.UpdateOptions{})
	return err
}

func (d *dynamicGrants) Delete(ctx context.Context, namespace, name string) error {
	return d.client.Resource(contract.CapacityGrants).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{})
}

// The CapacityGrant informer is registered with injection so that
// sharedmain starts it and waits for its sync with every other informer.
func init() {
	injection.Default.RegisterInformer(withGrantInformer)
	injection.Fake.RegisterInformer(withGrantInformer)
}

type grantInformerKey struct{}

func withGrantInformer(ctx context.Context) (context.Context, controller.Informer) {
	f := dynamicinformer.NewDynamicSharedInformerFactory(dynamicclient.Get(ctx), controller.GetResyncPeriod(ctx))
	inf := f.ForResource(contract.CapacityGrants)
	return context.WithValue(ctx, grantInformerKey{}, inf), inf.Informer()
}

func grantInformer(ctx context.Context) informers.GenericInformer {
	inf, ok := ctx.Value(grantInformerKey{}).(informers.GenericInformer)
	if !ok {
		logging.FromContext(ctx).Panic("Unable to fetch the CapacityGrant informer from context.")
	}
	return inf
}
