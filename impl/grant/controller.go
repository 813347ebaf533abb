package grant

import (
	"context"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	namespaceinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/namespace"
	filteredpodinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/pod/filtered"
	"knative.dev/pkg/configmap"
	"knative.dev/pkg/controller"
	nsconfigmapinformer "knative.dev/pkg/injection/clients/namespacedkube/informers/core/v1/configmap"
	nssecretinformer "knative.dev/pkg/injection/clients/namespacedkube/informers/core/v1/secret"
	"knative.dev/pkg/kmeta"
	"knative.dev/pkg/logging"
	pkgreconciler "knative.dev/pkg/reconciler"
	"knative.dev/pkg/system"

	grantinformer "lampyr.dev/serving/impl/client/injection/informers/fiberd/v1alpha1/capacitygrant"
	grantreconciler "lampyr.dev/serving/impl/client/injection/reconciler/fiberd/v1alpha1/capacitygrant"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/homes"
	"lampyr.dev/serving/impl/grant/resources"
)

// Workers is how many grants the controller reconciles at once.
const Workers = 4

// Options are what the grant controller takes besides its informers; the
// zero value is production's.
type Options struct {
	// Keys are the installation's keys (nil: EnsureKeys in the system
	// namespace, creating them at first start).
	Keys *Keys
	// Templates fetches sealed templates (nil: from their registry).
	Templates TemplateFetcher
	// Snapshots checks snapshot artifacts (nil: in their registry).
	Snapshots SnapshotChecker
}

// quotaPodSelector selects the quota Pods the grant controller keeps in
// tenant namespaces (and caches: nothing else of those namespaces).
var quotaPodSelector = labels.Set{resources.ComponentKey: contract.QuotaPodComponent}.String()

// FilteredInformerSelectors must be passed to
// knative.dev/pkg/client/injection/kube/informers/factory/filtered.WithSelectors
// on the context given to sharedmain, before NewController runs.
func FilteredInformerSelectors() []string { return []string{quotaPodSelector} }

// NewController is the grant controller's injection.ControllerConstructor
// (impl/cmd/grant-controller runs it with sharedmain). It reads
// CapacityGrants through the generated informer, the Home objects through
// the Homes-namespace informers (package homes), and config-lampyr,
// lampyr-template-sealers and the fleet key Secret through the system
// namespace's informers.
func NewController(ctx context.Context, cmw configmap.Watcher) *controller.Impl {
	return newController(ctx, cmw, Options{})
}

func newController(ctx context.Context, cmw configmap.Watcher, o Options) *controller.Impl {
	logger := logging.FromContext(ctx)
	kube := kubeclient.Get(ctx)
	systemNS, homesNS := system.Namespace(), homes.Namespace(ctx)
	if o.Keys == nil {
		keys, err := EnsureKeys(ctx, kube, systemNS)
		if err != nil {
			logger.Fatalw("Loading the installation's keys", "namespace", systemNS, "error", err)
		}
		o.Keys = keys
	}
	if o.Templates == nil {
		o.Templates = RegistryTemplates{}
	}
	if o.Snapshots == nil {
		o.Snapshots = RegistrySnapshots{}
	}

	grantInformer := grantinformer.Get(ctx)
	podInformer, serviceInformer, secretInformer := homes.Pods(ctx), homes.Services(ctx), homes.Secrets(ctx)
	cmInformer, systemSecretInformer := nsconfigmapinformer.Get(ctx), nssecretinformer.Get(ctx)
	quotaPodInformer := filteredpodinformer.Get(ctx, quotaPodSelector)
	namespaceInformer := namespaceinformer.Get(ctx)

	r := &Reconciler{
		kube:            kube,
		grants:          grantInformer.Lister(),
		homesNamespace:  homesNS,
		pods:            podInformer.Lister(),
		services:        serviceInformer.Lister(),
		secrets:         secretInformer.Lister(),
		systemNamespace: systemNS,
		fleetSecret: func() (*corev1.Secret, error) {
			return systemSecretInformer.Lister().Secrets(systemNS).Get(contract.FleetKeyName)
		},
		sealersConfig: func() (*corev1.ConfigMap, error) {
			return cmInformer.Lister().ConfigMaps(systemNS).Get(contract.SealersConfigMap)
		},
		keys:       o.Keys,
		quotaPods:  quotaPodInformer.Lister(),
		namespaces: namespaceInformer.Lister(),
		diagnoser:  HTTPHomeDiagnoser{},
		pusher:     HTTPGrantPusher{},
		now:        time.Now,
		grantID:    newGrantID,
		pending:    map[string]int64{},
	}
	ranges := &clusterRanges{kube: kube}
	// config-lampyr, parsed once per change by Knative's config store; a
	// change may admit grants refused for capacity.
	var impl *controller.Impl
	sparesKey := types.NamespacedName{Namespace: homesNS, Name: SparesKeyName}
	store := config.NewStore(logger.Named("config-store"), func(string, any) {
		if impl != nil {
			impl.GlobalResync(grantInformer.Informer())
			impl.EnqueueKey(sparesKey)
		}
	})
	if w, ok := cmw.(config.DefaultingWatcher); ok {
		store.WatchConfigs(w, systemNS)
	} else {
		logger.Warnw("The configmap watcher cannot stand in a default: config-lampyr is not watched, its defaults apply")
	}
	r.config = func(context.Context) (*lampyrconfig.Config, error) {
		// A copy: the store's value is shared by every reconcile (and the
		// egress API), and the cluster's egress ranges are filled in per use.
		cfg := *store.Load()
		ranges.withEgressDefaults(ctx, &cfg, logger.Warnf)
		cfg.EgressAPI = lampyrconfig.EgressAPIURL(systemNS)
		return &cfg, nil
	}
	// Homes ask for their namespace's egress Pod (egress_api.go).
	startEgressAPI(ctx, newEgressAPI(r))

	impl = grantreconciler.NewImpl(ctx, r, func(*controller.Impl) controller.Options {
		return controller.Options{
			ConfigStore: store,
			// On promotion (the generated reconciler then enqueues every
			// grant), also look at every Home: one whose grant went while
			// no replica led is deleted by its grant's key.
			PromoteFunc: func(pkgreconciler.Bucket) {
				enqueueHomes(impl, r)
				impl.EnqueueKey(sparesKey)
			},
		}
	})
	// Several workers, so that renewals never wait behind another grant's
	// work (a template fetch used to hold the one worker for up to 30 s);
	// admission itself stays one decision at a time (admitMu).
	impl.Concurrency = Workers
	// Template and snapshot reads run off the workers (template.go).
	r.fetches = NewFetches(ctx, o.Templates, o.Snapshots, func() []remote.Option {
		if p := r.registryOptions.Load(); p != nil {
			return *p
		}
		return nil
	}, impl.EnqueueKey)

	grantInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    impl.Enqueue,
		UpdateFunc: controller.PassNew(impl.Enqueue),
		DeleteFunc: func(obj any) {
			// Its Home goes (ObserveDeletion), and the capacity it held
			// may admit refused grants.
			impl.EnqueueKey(deletedKey(obj))
			impl.GlobalResync(grantInformer.Informer())
		},
	})
	// A Home object leads back to its grant by its labels (no owner
	// reference crosses namespaces); one whose grant is gone is deleted
	// by that reconcile, also for objects found at start.
	toGrant := controller.HandleAll(func(obj any) {
		acc, err := kmeta.DeletionHandlingAccessor(obj)
		if err != nil {
			return
		}
		if ns, name, ok := resources.GrantKeyOf(acc); ok {
			impl.EnqueueKey(types.NamespacedName{Namespace: ns, Name: name})
		}
	})
	podInformer.Informer().AddEventHandler(toGrant)
	// The spares are kept by a key of their own (spare.go): a spare that
	// starts, ends or is claimed or deleted is looked at.
	r.enqueueSparesAfter = func(d time.Duration) {
		if d == 0 {
			impl.EnqueueKey(sparesKey)
		} else {
			impl.EnqueueKeyAfter(sparesKey, d)
		}
	}
	podInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			acc, err := kmeta.DeletionHandlingAccessor(obj)
			return err == nil && acc.GetLabels()[resources.SpareLabel] != ""
		},
		Handler: controller.HandleAll(func(any) { impl.EnqueueKey(sparesKey) }),
	})
	// A quota Pod deleted, ended or ungated in its namespace is replaced
	// (or the grant loses its admission) by its grant's reconcile.
	quotaPodInformer.Informer().AddEventHandler(toGrant)
	// A share given to a namespace may admit its refused grants.
	namespaceInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(any) bool { return true },
		Handler: controller.HandleAll(func(obj any) {
			if ns, ok := obj.(*corev1.Namespace); ok {
				if _, set := ns.Annotations[contract.FiberMemoryShareAnnotation]; set {
					impl.GlobalResync(grantInformer.Informer())
				}
			}
		}),
	})
	serviceInformer.Informer().AddEventHandler(toGrant)
	secretInformer.Informer().AddEventHandler(toGrant)
	// A trust or fleet key change may change which templates open.
	resyncAll := controller.HandleAll(func(any) { impl.GlobalResync(grantInformer.Informer()) })
	cmInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: controller.FilterWithName(contract.SealersConfigMap), Handler: resyncAll})
	systemSecretInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: controller.FilterWithName(contract.FleetKeyName), Handler: resyncAll})

	logger.Infow("Grant controller set up", "systemNamespace", systemNS, "homesNamespace", homesNS)
	return impl
}

// enqueueHomes enqueues the grant of every Home object in the caches.
func enqueueHomes(impl *controller.Impl, r *Reconciler) {
	seen := map[types.NamespacedName]bool{}
	add := func(o metav1.Object) {
		if ns, name, ok := resources.GrantKeyOf(o); ok {
			k := types.NamespacedName{Namespace: ns, Name: name}
			if !seen[k] {
				seen[k] = true
				impl.EnqueueKey(k)
			}
		}
	}
	if pods, err := r.pods.Pods(r.homesNamespace).List(everything); err == nil {
		for _, o := range pods {
			add(o)
		}
	}
	if svcs, err := r.services.Services(r.homesNamespace).List(everything); err == nil {
		for _, o := range svcs {
			add(o)
		}
	}
	if secrets, err := r.secrets.Secrets(r.homesNamespace).List(everything); err == nil {
		for _, o := range secrets {
			add(o)
		}
	}
}

// deletedKey is the namespace/name of a deleted object (or tombstone).
func deletedKey(obj any) types.NamespacedName {
	acc, err := kmeta.DeletionHandlingAccessor(obj)
	if err != nil {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: acc.GetNamespace(), Name: acc.GetName()}
}
