package revision

import (
	"context"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	serviceinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/service"
	filteredsliceinformer "knative.dev/pkg/client/injection/kube/informers/discovery/v1/endpointslice/filtered"
	"knative.dev/pkg/configmap"
	cminformer "knative.dev/pkg/configmap/informer"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/kmeta"
	"knative.dev/pkg/logging"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	revisioninformer "knative.dev/serving/pkg/client/injection/informers/serving/v1/revision"
	revisionreconciler "knative.dev/serving/pkg/client/injection/reconciler/serving/v1/revision"

	fiberdclient "lampyr.dev/serving/impl/client/injection/client"
	capacitygrantinformer "lampyr.dev/serving/impl/client/injection/informers/fiberd/v1alpha1/capacitygrant"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

// Label selectors of the filtered informers this controller uses, so it
// caches only its own EndpointSlices plus fiber-router's slices instead of
// every EndpointSlice in the cluster. Router metadata has its own informer,
// on the Lampyr namespace only (routerMetadataInformer).
var (
	routerMetadataSelector = labels.Set{contract.RouterMetadataLabel: "true"}.String()
	mirrorSliceSelector    = labels.Set{discoveryv1.LabelManagedBy: resources.EndpointSliceManagedBy}.String()
	routerSliceSelector    = labels.Set{discoveryv1.LabelServiceName: contract.RouterServiceName}.String()
)

// FilteredInformerSelectors must be passed to
// knative.dev/pkg/client/injection/kube/informers/factory/filtered.WithSelectors
// on the context given to sharedmain, before NewController runs.
func FilteredInformerSelectors() []string {
	return []string{mirrorSliceSelector, routerSliceSelector}
}

// metadataSweepInterval is how often router metadata whose Revision is gone
// is looked for (the finalizer deletes it; this catches a finalizer someone
// removed by hand).
const metadataSweepInterval = 10 * time.Minute

// NewController wires the Lampyr Revision reconciler; pass it to sharedmain
// in place of knative.dev/serving/pkg/reconciler/revision.NewController.
func NewController(ctx context.Context, cmw configmap.Watcher) *controller.Impl {
	logger := logging.FromContext(ctx)
	revisionInformer := revisioninformer.Get(ctx)
	serviceInformer := serviceinformer.Get(ctx)
	metadataInformer := routerMetadataInformer(ctx, config.Namespace())
	mirrorSliceInformer := filteredsliceinformer.Get(ctx, mirrorSliceSelector)
	routerSliceInformer := filteredsliceinformer.Get(ctx, routerSliceSelector)
	grantInformer := capacitygrantinformer.Get(ctx)

	r := &Reconciler{
		kubeclient:           kubeclient.Get(ctx),
		grants:               &typedGrants{client: fiberdclient.Get(ctx).FiberdV1alpha1(), lister: grantInformer.Lister()},
		serviceLister:        serviceInformer.Lister(),
		routerMetadataLister: metadataInformer.Lister(),
		mirrorSliceLister:    mirrorSliceInformer.Lister(),
		routerSliceLister:    routerSliceInformer.Lister(),
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

	// Artifact checks reach registries tenants name: off the workers, one
	// at a time per namespace, re-enqueueing the Revision when done.
	r.artifacts = NewArtifactChecks(ctx, &RegistryVerifier{}, impl.EnqueueKey, ArtifactCheckOptions)

	revisionInformer.Informer().AddEventHandler(controller.HandleAll(impl.Enqueue))

	owned := cache.FilteringResourceEventHandler{
		FilterFunc: controller.FilterController(&v1.Revision{}),
		Handler:    controller.HandleAll(impl.EnqueueControllerOf),
	}
	serviceInformer.Informer().AddEventHandler(owned)
	// Router metadata lives in the Lampyr namespace: no owner reference
	// leads back, its labels do.
	metadataInformer.Informer().AddEventHandler(controller.HandleAll(func(obj interface{}) {
		acc, err := kmeta.DeletionHandlingAccessor(obj)
		if err != nil {
			return
		}
		l := acc.GetLabels()
		if ns, rev := l[contract.RevisionNamespaceLabel], l[contract.RevisionLabel]; ns != "" && rev != "" {
			impl.EnqueueKey(types.NamespacedName{Namespace: ns, Name: rev})
		}
	}))
	go sweepRouterMetadata(ctx, kubeclient.Get(ctx), config.Namespace(), metadataInformer, revisionInformer.Informer())
	mirrorSliceInformer.Informer().AddEventHandler(owned)
	grantInformer.Informer().AddEventHandler(owned)

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

// routerMetadataInformer watches labelled ConfigMaps in the Lampyr
// namespace only, so a tenant's ConfigMaps, labelled or not, are never even
// cached. It is started and synced here, before the reconciler can run.
func routerMetadataInformer(ctx context.Context, ns string) corev1informers.ConfigMapInformer {
	f := informers.NewSharedInformerFactoryWithOptions(kubeclient.Get(ctx), controller.GetResyncPeriod(ctx),
		informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = routerMetadataSelector }))
	inf := f.Core().V1().ConfigMaps()
	inf.Informer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		logging.FromContext(ctx).Fatalw("router metadata informer did not sync (RBAC for ConfigMaps in " + ns + "?)")
	}
	return inf
}

// sweepRouterMetadata deletes router metadata whose Revision no longer
// exists, once both caches are synced and then every
// metadataSweepInterval. Running in more than one replica is harmless: it
// only deletes what belongs to nobody.
func sweepRouterMetadata(ctx context.Context, kube kubernetes.Interface, ns string, metadata corev1informers.ConfigMapInformer, revisions cache.SharedIndexInformer) {
	logger := logging.FromContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), metadata.Informer().HasSynced, revisions.HasSynced) {
		return
	}
	for {
		cms, _ := metadata.Lister().ConfigMaps(ns).List(labels.Everything())
		for _, cm := range cms {
			l := cm.Labels
			key := l[contract.RevisionNamespaceLabel] + "/" + l[contract.RevisionLabel]
			if _, exists, err := revisions.GetStore().GetByKey(key); err != nil || exists {
				continue
			}
			if err := kube.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err == nil {
				logger.Infof("Deleted router metadata %s/%s: Revision %s is gone", ns, cm.Name, key)
			} else if !apierrs.IsNotFound(err) {
				logger.Warnw("Deleting orphaned router metadata", "configmap", ns+"/"+cm.Name, "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(metadataSweepInterval):
		}
	}
}
