package revision

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"lampyr.dev/serving/impl/routermeta"
)

// ConfigMapSource watches router metadata ConfigMaps in every namespace by
// their label (contracts §2).
type ConfigMapSource struct {
	client kubernetes.Interface
	resync time.Duration
	// OnError is told about ConfigMaps that cannot be used (malformed or
	// forged), so an operator sees why a Revision is not routable.
	OnError func(error)

	// registration's HasSynced turns true once our handler (not just the
	// informer's store) has seen every ConfigMap of the initial list.
	registration atomic.Pointer[cache.ResourceEventHandlerRegistration]
}

// NewConfigMapSource returns a Source over the cluster's ConfigMaps.
func NewConfigMapSource(client kubernetes.Interface, resync time.Duration) *ConfigMapSource {
	return &ConfigMapSource{client: client, resync: resync, OnError: func(error) {}}
}

// Run implements Source.
func (s *ConfigMapSource) Run(ctx context.Context, sink Sink) error {
	selector := labels.Set{routermeta.LabelKey: "true"}.AsSelector().String()
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync,
		// Only the labelled ConfigMaps: the router must not cache every
		// ConfigMap of the cluster.
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().ConfigMaps().Informer()
	apply := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		m, err := Decode(cm)
		if err != nil {
			s.OnError(err)
			// An unusable ConfigMap must not leave an older, usable version
			// of the same Revision routable as if nothing had changed.
			sink.Delete(Key{cm.Namespace, cm.Labels[routermeta.RevisionLabelKey]})
			return
		}
		sink.Upsert(m)
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok {
				return
			}
			if rev := cm.Data["revision"]; rev != "" {
				sink.Delete(Key{cm.Namespace, rev})
			}
			if rev := cm.Labels[routermeta.RevisionLabelKey]; rev != "" {
				sink.Delete(Key{cm.Namespace, rev})
			}
		},
	})
	if err != nil {
		return err
	}
	s.registration.Store(&reg)
	factory.Start(ctx.Done())
	// Readiness polls HasSynced itself; Run only has to live until ctx ends.
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// HasSynced implements Source.
func (s *ConfigMapSource) HasSynced() bool {
	reg := s.registration.Load()
	return reg != nil && (*reg).HasSynced()
}

// Decode turns a ConfigMap into metadata and refuses one whose claims do not
// match where it lives. Anyone who may write ConfigMaps in namespace A could
// otherwise publish metadata for a Revision of namespace B and have the
// router send B's traffic to A's Home.
func Decode(cm *corev1.ConfigMap) (routermeta.Metadata, error) {
	m, err := routermeta.FromConfigMap(cm)
	if err != nil {
		return m, err
	}
	if m.Namespace != cm.Namespace {
		return m, fmt.Errorf("configmap %s/%s claims namespace %q: ignored", cm.Namespace, cm.Name, m.Namespace)
	}
	if cm.Name != routermeta.Name(m.Revision) || cm.Labels[routermeta.RevisionLabelKey] != m.Revision {
		return m, fmt.Errorf("configmap %s/%s claims revision %q but is not named %q and labelled for it: ignored",
			cm.Namespace, cm.Name, m.Revision, routermeta.Name(m.Revision))
	}
	return m, nil
}
