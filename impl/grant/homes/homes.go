// Package homes is Knative injection for the informers of Home objects: the
// Pods, Services and Secrets the grant controller runs for each grant, in
// the Homes namespace only and selected by the Home component label. It is
// written like knative.dev/pkg/injection/clients/namespacedkube: the grant
// controller may list and watch these kinds in the Homes namespace only
// (impl/config/grant-controller/200-rbac.yaml), so the cluster-wide
// informers of knative.dev/pkg/client/injection/kube cannot be used.
package homes

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corev1informers "k8s.io/client-go/informers/core/v1"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/grant/resources"
)

func init() {
	injection.Default.RegisterInformerFactory(WithInformerFactory)
	injection.Default.RegisterInformer(WithPods)
	injection.Default.RegisterInformer(WithServices)
	injection.Default.RegisterInformer(WithSecrets)
}

type namespaceKey struct{}

// WithNamespace sets the Homes namespace the informers are scoped to.
func WithNamespace(ctx context.Context, namespace string) context.Context {
	return context.WithValue(ctx, namespaceKey{}, namespace)
}

// Namespace is the Homes namespace set by WithNamespace, or
// contract.HomesNamespace.
func Namespace(ctx context.Context) string {
	if ns, ok := ctx.Value(namespaceKey{}).(string); ok && ns != "" {
		return ns
	}
	return contract.HomesNamespace
}

type factoryKey struct{}

// WithInformerFactory puts the Homes informer factory in the context: one
// namespace, Home objects only (label resources.ComponentKey).
func WithInformerFactory(ctx context.Context) context.Context {
	return context.WithValue(ctx, factoryKey{},
		informers.NewSharedInformerFactoryWithOptions(kubeclient.Get(ctx), controller.GetResyncPeriod(ctx),
			informers.WithNamespace(Namespace(ctx)),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
				lo.LabelSelector = resources.ComponentKey + "=" + resources.Component
			})))
}

func factory(ctx context.Context) informers.SharedInformerFactory {
	f, ok := ctx.Value(factoryKey{}).(informers.SharedInformerFactory)
	if !ok {
		logging.FromContext(ctx).Panic("Unable to fetch the Homes informer factory from context (is lampyr.dev/serving/impl/grant/homes imported?).")
	}
	return f
}

type podsKey struct{}
type servicesKey struct{}
type secretsKey struct{}

// WithPods registers the Home Pod informer.
func WithPods(ctx context.Context) (context.Context, controller.Informer) {
	inf := factory(ctx).Core().V1().Pods()
	return context.WithValue(ctx, podsKey{}, inf), inf.Informer()
}

// WithServices registers the Home Service informer.
func WithServices(ctx context.Context) (context.Context, controller.Informer) {
	inf := factory(ctx).Core().V1().Services()
	return context.WithValue(ctx, servicesKey{}, inf), inf.Informer()
}

// WithSecrets registers the Home Secret informer.
func WithSecrets(ctx context.Context) (context.Context, controller.Informer) {
	inf := factory(ctx).Core().V1().Secrets()
	return context.WithValue(ctx, secretsKey{}, inf), inf.Informer()
}

// Pods is the Home Pod informer.
func Pods(ctx context.Context) corev1informers.PodInformer {
	return get[corev1informers.PodInformer](ctx, podsKey{})
}

// Services is the Home Service informer.
func Services(ctx context.Context) corev1informers.ServiceInformer {
	return get[corev1informers.ServiceInformer](ctx, servicesKey{})
}

// Secrets is the Home Secret informer.
func Secrets(ctx context.Context) corev1informers.SecretInformer {
	return get[corev1informers.SecretInformer](ctx, secretsKey{})
}

func get[T any](ctx context.Context, key any) T {
	v, ok := ctx.Value(key).(T)
	if !ok {
		logging.FromContext(ctx).Panicf("Unable to fetch the Homes %T informer from context (is lampyr.dev/serving/impl/grant/homes imported?).", key)
	}
	return v
}
