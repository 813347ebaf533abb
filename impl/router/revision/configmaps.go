package revision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
)

// ConfigMapSource watches the router metadata ConfigMaps the Lampyr
// controller writes in its own namespace, selected by their label
// (docs/contracts.md §2, docs/security.md §4). Tenants cannot write that
// namespace, and no other namespace is read: a labelled ConfigMap a tenant
// creates in its own namespace is never seen.
type ConfigMapSource struct {
	client kubernetes.Interface
	// namespace holds the metadata (Lampyr's system namespace).
	namespace string
	// homesNamespace is where Home Services live: the only Services whose
	// names a Home endpoint may use.
	homesNamespace string
	resync         time.Duration

	// registration's HasSynced turns true once our handler (not just the
	// informer's store) has seen every ConfigMap of the initial list.
	registration atomic.Pointer[cache.ResourceEventHandlerRegistration]
}

// NewConfigMapSource returns a Source over the router metadata ConfigMaps in
// namespace, whose Home endpoints must be IP addresses or Services in
// homesNamespace. Refused metadata goes to the Sink's Refuse.
func NewConfigMapSource(client kubernetes.Interface, namespace, homesNamespace string, resync time.Duration) *ConfigMapSource {
	return &ConfigMapSource{client: client, namespace: namespace, homesNamespace: homesNamespace, resync: resync}
}

// Run implements Source.
func (s *ConfigMapSource) Run(ctx context.Context, sink Sink) error {
	// An empty namespace means "every namespace" to an informer: exactly
	// the forgeable metadata this source exists to shut out.
	if s.namespace == "" {
		return errors.New("router metadata namespace is empty; pass Lampyr's system namespace (--metadata-namespace)")
	}
	if s.homesNamespace == "" {
		return errors.New("homes namespace is empty; pass the namespace of the Home Services (--homes-namespace)")
	}
	selector := labels.Set{contract.RouterMetadataLabel: "true"}.AsSelector().String()
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync,
		informers.WithNamespace(s.namespace),
		// Only the labelled ConfigMaps: the router must not cache every
		// ConfigMap of the namespace.
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().ConfigMaps().Informer()
	apply := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		m, refused := Decode(cm, s.homesNamespace)
		if refused != nil {
			sink.Refuse(refused)
			return
		}
		// Ranked by when the controller first published it, the same
		// on every replica (Table: the oldest are held at a bound).
		sink.UpsertAt(m, cm.CreationTimestamp.Time)
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				sink.Delete(keyOf(cm))
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

// Decode turns a router metadata ConfigMap into metadata, or says why it must
// not be used: routermeta.FromConfigMap refuses one whose name, labels and
// data disagree (or that is malformed or too big), and a Home endpoint
// outside homesNamespace is refused here. The router would otherwise dial
// whatever the metadata names, and present it a credential.
func Decode(cm *corev1.ConfigMap, homesNamespace string) (routermeta.Metadata, *RefusedError) {
	k := keyOf(cm)
	m, err := routermeta.FromConfigMap(cm)
	if err != nil {
		return m, &RefusedError{Key: k, Reason: RefusedMalformed, Err: err}
	}
	// Metadata of a Revision that is not ready may have no endpoint yet.
	if m.HomeEndpoint != "" {
		if err := routermeta.CheckHomeEndpoint(m.HomeEndpoint, homesNamespace); err != nil {
			return m, &RefusedError{Key: k, Reason: RefusedEndpoint, Err: fmt.Errorf(
				"configmap %s/%s: data.homeEndpoint: %w (fiber-router dials only Home Pod IPs and Services in --homes-namespace)", cm.Namespace, cm.Name, err)}
		}
	}
	return m, nil
}

// keyOf is the Revision a router metadata ConfigMap stands for, from its name
// ("route.<namespace>.<revision>", routermeta.Name). The name, not the data
// or labels: FromConfigMap accepts a ConfigMap only when its name matches its
// data and labels, and a name never changes, so a refusal or a deletion
// always removes what that ConfigMap fed, even when its data or labels were
// changed or are gone. Namespaces have no dots, so the split is unambiguous.
// A name that is not a metadata name maps to a key no Revision has (no
// namespace), so its refusal is still reported once and forgotten with it.
func keyOf(cm *corev1.ConfigMap) Key {
	rest, ok := strings.CutPrefix(cm.Name, routermeta.NamePrefix)
	if ns, rev, found := strings.Cut(rest, "."); ok && found && ns != "" && rev != "" {
		return Key{Namespace: ns, Name: rev}
	}
	return Key{Name: cm.Name}
}
