package revision

// This file is the only place that knows how CapacityGrants are reached:
// the generated typed clientset and lister (impl/client). The reconciler
// only sees grantStore. The generated informer
// (impl/client/injection/informers/fiberd/v1alpha1/capacitygrant) registers
// itself with injection when imported, so sharedmain starts it and waits
// for its sync with every other informer.

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fiberdclientv1alpha1 "lampyr.dev/serving/impl/client/clientset/versioned/typed/fiberd/v1alpha1"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
)

// grantStore is what the reconciler needs of CapacityGrants: reads from the
// informer cache, writes through the API.
type grantStore interface {
	Get(namespace, name string) (*fiberdv1alpha1.CapacityGrant, error)
	Create(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error
	Update(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error
	Delete(ctx context.Context, namespace, name string) error
}

// typedGrants implements grantStore with the generated clientset and the
// generated informer's lister.
type typedGrants struct {
	client fiberdclientv1alpha1.CapacityGrantsGetter
	lister fiberdlisters.CapacityGrantLister
}

var _ grantStore = (*typedGrants)(nil)

// Get returns a copy of the cached grant: the reconciler merges its spec
// into what it reads, and the informer's object must never be mutated.
func (t *typedGrants) Get(namespace, name string) (*fiberdv1alpha1.CapacityGrant, error) {
	g, err := t.lister.CapacityGrants(namespace).Get(name)
	if err != nil {
		return nil, err
	}
	return g.DeepCopy(), nil
}

func (t *typedGrants) Create(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error {
	_, err := t.client.CapacityGrants(g.Namespace).Create(ctx, g, metav1.CreateOptions{})
	return err
}

func (t *typedGrants) Update(ctx context.Context, g *fiberdv1alpha1.CapacityGrant) error {
	_, err := t.client.CapacityGrants(g.Namespace).Update(ctx, g, metav1.UpdateOptions{})
	return err
}

func (t *typedGrants) Delete(ctx context.Context, namespace, name string) error {
	return t.client.CapacityGrants(namespace).Delete(ctx, name, metav1.DeleteOptions{})
}
