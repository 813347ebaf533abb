package grant

import (
	"context"
	"fmt"
	"time"

	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

// Options wires the controller to a cluster.
type Options struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// SystemNamespace holds config-lampyr and the installation's keys.
	SystemNamespace string
	Keys            *Keys
	Resync          time.Duration
}

// Controller is a wired grant controller.
type Controller struct {
	Impl      *controller.Impl
	informers []cache.SharedIndexInformer
	starters  []func(stop <-chan struct{})
}

// NewController builds the grant controller: a CapacityGrant informer
// (dynamic, no generated clientset), informers for the Home objects (by
// label, so only Homes are cached) and config-lampyr.
func NewController(ctx context.Context, o Options) *Controller {
	logger := logging.FromContext(ctx)
	if o.Resync == 0 {
		o.Resync = 10 * time.Hour
	}
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(o.Dynamic, o.Resync)
	grantInformer := dynFactory.ForResource(GrantGVR)
	homes := informers.NewSharedInformerFactoryWithOptions(o.Kube, o.Resync,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = resources.ComponentKey + "=" + resources.Component
		}))
	sys := informers.NewSharedInformerFactoryWithOptions(o.Kube, o.Resync, informers.WithNamespace(o.SystemNamespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = "metadata.name=" + config.ConfigMapName
		}))
	cmInformer := sys.Core().V1().ConfigMaps()

	r := &Reconciler{
		kube:      o.Kube,
		grants:    &dynamicGrants{client: o.Dynamic, lister: grantInformer.Lister()},
		pods:      homes.Core().V1().Pods().Lister(),
		services:  homes.Core().V1().Services().Lister(),
		secrets:   homes.Core().V1().Secrets().Lister(),
		keys:      o.Keys,
		diagnoser: HTTPHomeDiagnoser{},
		now:       time.Now,
		pending:   map[string]int64{},
	}
	r.config = func() (*config.Config, error) {
		cm, err := cmInformer.Lister().ConfigMaps(o.SystemNamespace).Get(config.ConfigMapName)
		if apierrs.IsNotFound(err) {
			return config.FromConfigMap(nil)
		}
		if err != nil {
			return nil, err
		}
		return config.FromConfigMap(cm)
	}
	// One worker: admission is a decision over all grants, best made one at
	// a time; the work per grant is small.
	impl := controller.NewContext(ctx, r, controller.ControllerOptions{WorkQueueName: "CapacityGrants", Logger: logger, Concurrency: 1})

	grantInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    impl.Enqueue,
		UpdateFunc: controller.PassNew(impl.Enqueue),
		// A deleted grant frees capacity that refused grants may now fit in.
		DeleteFunc: func(any) { impl.GlobalResync(grantInformer.Informer()) },
	})
	owned := cache.FilteringResourceEventHandler{
		FilterFunc: controller.FilterControllerGVK(v1alpha1.SchemeGroupVersion.WithKind("CapacityGrant")),
		Handler:    controller.HandleAll(impl.EnqueueControllerOf),
	}
	homes.Core().V1().Pods().Informer().AddEventHandler(owned)
	homes.Core().V1().Services().Informer().AddEventHandler(owned)
	homes.Core().V1().Secrets().Informer().AddEventHandler(owned)
	// A configuration change may admit grants refused for capacity.
	cmInformer.Informer().AddEventHandler(controller.HandleAll(func(any) { impl.GlobalResync(grantInformer.Informer()) }))

	return &Controller{
		Impl: impl,
		informers: []cache.SharedIndexInformer{
			grantInformer.Informer().(cache.SharedIndexInformer),
			homes.Core().V1().Pods().Informer(), homes.Core().V1().Services().Informer(), homes.Core().V1().Secrets().Informer(),
			cmInformer.Informer(),
		},
		starters: []func(<-chan struct{}){dynFactory.Start, homes.Start, sys.Start},
	}
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
