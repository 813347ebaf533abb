package revision

import (
	"context"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	filteredconfigmapinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/configmap/filtered"
	serviceinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/service"
	filteredsliceinformer "knative.dev/pkg/client/injection/kube/informers/discovery/v1/endpointslice/filtered"
	"knative.dev/pkg/configmap"
	cminformer "knative.dev/pkg/configmap/informer"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection/clients/dynamicclient"
	"knative.dev/pkg/kmeta"
	"knative.dev/pkg/logging"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	revisioninformer "knative.dev/serving/pkg/client/injection/informers/serving/v1/revision"
	revisionreconciler "knative.dev/serving/pkg/client/injection/reconciler/serving/v1/revision"

	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
	"lampyr.dev/serving/impl/routermeta"
)

// Label selectors of the filtered informers this controller uses, so it
// caches only its own ConfigMaps and EndpointSlices plus fiber-router's
// slices instead of every ConfigMap and EndpointSlice in the cluster.
var (
	routerMetadataSelector = labels.Set{routermeta.LabelKey: "true"}.String()
	mirrorSliceSelector    = labels.Set{discoveryv1.LabelManagedBy: resources.EndpointSliceManagedBy}.String()
	routerSliceSelector    = labels.Set{discoveryv1.LabelServiceName: config.RouterServiceName}.String()
)

// FilteredInformerSelectors must be passed to
// knative.dev/pkg/client/injection/kube/informers/factory/filtered.WithSelectors
// on the context given to sharedmain, before NewController runs.
func FilteredInformerSelectors() []string {
	return []string{routerMetadataSelector, mirrorSliceSelector, routerSliceSelector}
}

// NewController wires the Lampyr Revision reconciler; pass it to sharedmain
// in place of knative.dev/serving/pkg/reconciler/revision.NewController.
func NewController(ctx context.Context, cmw configmap.Watcher) *controller.Impl {
	logger := logging.FromContext(ctx)
	revisionInformer := revisioninformer.Get(ctx)
	serviceInformer := serviceinformer.Get(ctx)
	metadataInformer := filteredconfigmapinformer.Get(ctx, routerMetadataSelector)
	mirrorSliceInformer := filteredsliceinformer.Get(ctx, mirrorSliceSelector)
	routerSliceInformer := filteredsliceinformer.Get(ctx, routerSliceSelector)
	grants := grantInformer(ctx)

	r := &Reconciler{
		kubeclient:           kubeclient.Get(ctx),
		grants:               &dynamicGrants{client: dynamicclient.Get(ctx), lister: grants.Lister()},
		serviceLister:        serviceInformer.Lister(),
		routerMetadataLister: metadataInformer.Lister(),
		mirrorSliceLister:    mirrorSliceInformer.Lister(),
		routerSliceLister:    routerSliceInformer.Lister(),
		artifacts:            &RegistryVerifier{},
		sealer:               &RegistrySealer{Kube: kubeclient.Get(ctx)},
		prober:               HTTPProber{},
	}

	impl := revisionreconciler.NewImpl(ctx, r, func(impl *controller.Impl) controller.Options {
		// Any config change can change what a Revision becomes (backend
		// strategy, defaults that decide acceptance): resync them all.
		resync := func(string, interface{}) { impl.GlobalResync(revisionInformer.Informer()) }
		store := config.NewStore(logger.Named("config-store"), resync)
		// config-lampyr lives in the Lampyr namespace, not Knative's, so it
		// needs its own watcher. It is started here, synchronously, so the
		// first reconciles already see the installation's backend strategy
		// instead of creating Services of the default kind and switching.
		lampyrWatcher := cminformer.NewInformedWatcher(kubeclient.Get(ctx), config.Namespace())
		store.WatchConfigs(cmw, lampyrWatcher)
		if err := lampyrWatcher.Start(ctx.Done()); err != nil {
			logger.Fatalw("Failed to start the config-lampyr watcher", "error", err)
		}
		return controller.Options{ConfigStore: store}
	})

	revisionInformer.Informer().AddEventHandler(controller.HandleAll(impl.Enqueue))

	owned := cache.FilteringResourceEventHandler{
		FilterFunc: controller.FilterController(&v1.Revision{}),
		Handler:    controller.HandleAll(impl.EnqueueControllerOf),
	}
	serviceInformer.Informer().AddEventHandler(owned)
	metadataInformer.Informer().AddEventHandler(owned)
	mirrorSliceInformer.Informer().AddEventHandler(owned)
	grants.Informer().AddEventHandler(owned)

	// fiber-router's endpoints changed (rollout, restart, scale): every
	// mirrored EndpointSlice must follow, so re-enqueue every Revision.
	routerSliceInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj interface{}) bool {
			acc, err := kmeta.DeletionHandlingAccessor(obj)
			return err == nil && acc.GetNamespace() == config.Namespace()
		},
		Handler: controller.HandleAll(func(interface{}) {
			impl.GlobalResync(revisionInformer.Informer())
		}),
	})

	return impl
}
