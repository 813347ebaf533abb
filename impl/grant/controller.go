package grant

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/kmeta"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

// Options wires the controller to a cluster.
type Options struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// SystemNamespace holds config-lampyr and the installation's keys.
	SystemNamespace string
	// HomesNamespace holds every Home (default resources.DefaultHomesNamespace).
	HomesNamespace string
	Keys           *Keys
	// Templates fetches sealed templates (default: from their registry).
	Templates TemplateFetcher
	Resync    time.Duration
}

// Controller is a wired grant controller.
type Controller struct {
	Impl      *controller.Impl
	informers []cache.SharedIndexInformer
	starters  []func(stop <-chan struct{})
}

// NewController builds the grant controller: a CapacityGrant informer
// (dynamic, no generated clientset), informers for the Home objects (in the
// Homes namespace only, by label), the fleet key Secret and the two
// ConfigMaps it reads in the system namespace (by name).
func NewController(ctx context.Context, o Options) *Controller {
	logger := logging.FromContext(ctx)
	if o.Resync == 0 {
		o.Resync = 10 * time.Hour
	}
	if o.HomesNamespace == "" {
		o.HomesNamespace = resources.DefaultHomesNamespace
	}
	if o.Templates == nil {
		o.Templates = RegistryTemplates{}
	}
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(o.Dynamic, o.Resync)
	grantInformer := dynFactory.ForResource(GrantGVR)
	homes := informers.NewSharedInformerFactoryWithOptions(o.Kube, o.Resync, informers.WithNamespace(o.HomesNamespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = resources.ComponentKey + "=" + resources.Component
		}))
	byName := func(name string) informers.SharedInformerFactory {
		return informers.NewSharedInformerFactoryWithOptions(o.Kube, o.Resync, informers.WithNamespace(o.SystemNamespace),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.FieldSelector = "metadata.name=" + name }))
	}
	cfgFactory, sealersFactory, fleetFactory := byName(config.ConfigMapName), byName(SealersConfigMap), byName(FleetKeyName)
	cmInformer := cfgFactory.Core().V1().ConfigMaps()
	sealersInformer := sealersFactory.Core().V1().ConfigMaps()
	fleetInformer := fleetFactory.Core().V1().Secrets()

	r := &Reconciler{
		kube:            o.Kube,
		grants:          &dynamicGrants{client: o.Dynamic, lister: grantInformer.Lister()},
		homesNamespace:  o.HomesNamespace,
		pods:            homes.Core().V1().Pods().Lister(),
		services:        homes.Core().V1().Services().Lister(),
		secrets:         homes.Core().V1().Secrets().Lister(),
		systemNamespace: o.SystemNamespace,
		fleetSecret: func() (*corev1.Secret, error) {
			return fleetInformer.Lister().Secrets(o.SystemNamespace).Get(FleetKeyName)
		},
		sealersConfig: func() (*corev1.ConfigMap, error) {
			return sealersInformer.Lister().ConfigMaps(o.SystemNamespace).Get(SealersConfigMap)
		},
		keys:      o.Keys,
		templates: o.Templates,
		diagnoser: HTTPHomeDiagnoser{},
		now:       time.Now,
		pending:   map[string]int64{},
	}
	ranges := &clusterRanges{kube: o.Kube}
	r.config = func() (*config.Config, error) {
		cm, err := cmInformer.Lister().ConfigMaps(o.SystemNamespace).Get(config.ConfigMapName)
		if apierrs.IsNotFound(err) {
			cm, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		cfg, err := config.FromConfigMap(cm)
		if err != nil {
			return nil, err
		}
		ranges.withEgressDefaults(ctx, cfg, logger.Warnf)
		return cfg, nil
	}
	// One worker: admission is a decision over all grants, best made one at
	// a time; the work per grant is small.
	impl := controller.NewContext(ctx, r, controller.ControllerOptions{WorkQueueName: "CapacityGrants", Logger: logger, Concurrency: 1})

	grantInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    impl.Enqueue,
		UpdateFunc: controller.PassNew(impl.Enqueue),
		DeleteFunc: func(obj any) {
			// Its Home goes (the reconcile finds the grant gone), and the
			// capacity it held may admit refused grants.
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
	homes.Core().V1().Pods().Informer().AddEventHandler(toGrant)
	homes.Core().V1().Services().Informer().AddEventHandler(toGrant)
	homes.Core().V1().Secrets().Informer().AddEventHandler(toGrant)
	// A configuration, trust or fleet key change may admit grants refused
	// for capacity, or change which templates open.
	resyncAll := controller.HandleAll(func(any) { impl.GlobalResync(grantInformer.Informer()) })
	cmInformer.Informer().AddEventHandler(resyncAll)
	sealersInformer.Informer().AddEventHandler(resyncAll)
	fleetInformer.Informer().AddEventHandler(resyncAll)

	return &Controller{
		Impl: impl,
		informers: []cache.SharedIndexInformer{
			grantInformer.Informer().(cache.SharedIndexInformer),
			homes.Core().V1().Pods().Informer(), homes.Core().V1().Services().Informer(), homes.Core().V1().Secrets().Informer(),
			cmInformer.Informer(), sealersInformer.Informer(), fleetInformer.Informer(),
		},
		starters: []func(<-chan struct{}){dynFactory.Start, homes.Start, cfgFactory.Start, sealersFactory.Start, fleetFactory.Start},
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

// Run starts the informers, waits for their caches and runs the controller
// until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	for _, s := range c.starters {
		s(ctx.Done())
	}
	syncs := make([]cache.InformerSynced, 0, len(c.informers))
	for _, i := range c.informers {
		syncs = append(syncs, i.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return fmt.Errorf("grant controller: informer caches did not sync (are the CapacityGrant CRD and RBAC installed?)")
	}
	return c.Impl.RunContext(ctx, 1)
}
