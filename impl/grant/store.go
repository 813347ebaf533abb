package grant

import (
	"context"

	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
)

// GrantGVR is the CapacityGrant resource.
var GrantGVR = contract.CapacityGrants

// grantStore is what the reconciler needs of CapacityGrants. CapacityGrants
// are reached through the dynamic client (no generated clientset), so this is
// the only place that converts.
type grantStore interface {
	Get(namespace, name string) (*v1alpha1.CapacityGrant, error)
	List() ([]*v1alpha1.CapacityGrant, error)
	UpdateStatus(ctx context.Context, g *v1alpha1.CapacityGrant) error
}

type dynamicGrants struct {
	client dynamic.Interface
	lister cache.GenericLister
}

func fromUnstructured(obj runtime.Object) (*v1alpha1.CapacityGrant, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, apierrs.NewInternalError(errUnexpected(obj))
	}
	g := &v1alpha1.CapacityGrant{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, g); err != nil {
		return nil, err
	}
	return g, nil
}

type unexpected struct{ obj runtime.Object }

func (u unexpected) Error() string { return "unexpected object type in CapacityGrant cache" }

func errUnexpected(obj runtime.Object) error { return unexpected{obj} }

func (d *dynamicGrants) Get(namespace, name string) (*v1alpha1.CapacityGrant, error) {
	obj, err := d.lister.ByNamespace(namespace).Get(name)
	if err != nil {
		return nil, err
	}
	return fromUnstructured(obj)
}

func (d *dynamicGrants) List() ([]*v1alpha1.CapacityGrant, error) {
	objs, err := d.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.CapacityGrant, 0, len(objs))
	for _, o := range objs {
		g, err := fromUnstructured(o)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

func (d *dynamicGrants) UpdateStatus(ctx context.Context, g *v1alpha1.CapacityGrant) error {
	g.APIVersion = v1alpha1.SchemeGroupVersion.String()
	g.Kind = "CapacityGrant"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
	if err != nil {
		return err
	}
	_, err = d.client.Resource(GrantGVR).Namespace(g.Namespace).UpdateStatus(ctx, &unstructured.Unstructured{Object: m}, metav1.UpdateOptions{})
	return err
}
