// Package grant is the grant controller (the equivalent of
// fiberd-k8s-controller): it admits or refuses each CapacityGrant against the
// installation's fiber capacity, opens and checks the grant's sealed template
// (it alone holds the fleet key), runs its Home (a Pod with fiberd and
// lampyr-helper) in the Homes namespace, issues the Home a signed, expiring
// grant and renews it before expiry, and reports Admitted / HomeReady /
// Ready. Home objects are labelled with their grant and deleted when it is
// gone (docs/security.md §1, §2).
package grant

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"knative.dev/pkg/controller"
	pkgreconciler "knative.dev/pkg/reconciler"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	grantreconciler "lampyr.dev/serving/impl/client/injection/reconciler/fiberd/v1alpha1/capacitygrant"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// errHomeNameTaken stops a reconcile whose Home names are taken by objects
// the grant controller did not make (the condition says which).
var errHomeNameTaken = errors.New("home name taken")

// errLeftover stops a reconcile that is deleting an earlier grant's Home;
// it is looked at again shortly.
var errLeftover = errors.New("leftover home")

// leftoverRetry is when a grant whose name held an earlier Home is looked at
// again, once the deletions reached the informer caches.
const leftoverRetry = time.Second

// Reconciler reconciles CapacityGrants.
type Reconciler struct {
	kube   kubernetes.Interface
	grants fiberdlisters.CapacityGrantLister
	// homesNamespace holds every Home; the listers below see only it.
	homesNamespace string
	pods           corev1listers.PodLister
	services       corev1listers.ServiceLister
	secrets        corev1listers.SecretLister
	// systemNamespace holds the keys and configuration.
	systemNamespace string
	fleetSecret     func() (*corev1.Secret, error)
	sealersConfig   func() (*corev1.ConfigMap, error)
	keys            *Keys
	fleet           fleetKeyring
	// fetches reads templates and snapshots off the workers (NewFetches);
	// registryOptions are the options its reads use (the latest
	// configuration's registry mirrors).
	fetches         Fetches
	registryOptions atomic.Pointer[[]remote.Option]
	// quotaPods sees the quota Pods of every namespace; namespaces, the
	// Namespaces (for an administrator's share annotation).
	quotaPods  corev1listers.PodLister
	namespaces corev1listers.NamespaceLister
	// diagnoser asks a running, not-ready Home's fiberd why (nil: not asked).
	diagnoser HomeDiagnoser
	// config is this reconcile's config-lampyr (the config store's, with
	// the cluster's egress ranges filled in).
	config func(context.Context) (*lampyrconfig.Config, error)
	now    func() time.Time
	// grantID names a newly signed grant (newGrantID: random).
	grantID func(*v1alpha1.CapacityGrant) string
	// newHomeKey makes a new Home's TLS key (homekey.go; nil: random).
	newHomeKey func() (resources.HomeKey, error)

	// admission is serialised, and grants admitted here but not yet visible
	// in the informer cache are remembered, so two grants reconciled back to
	// back cannot both take the last capacity.
	admitMu sync.Mutex
	pending map[string]int64

	// claims are the spare Homes claimed here (spare.go);
	// enqueueSparesAfter looks at the spares again after a while (nil:
	// tests without a work queue).
	claims             claims
	enqueueSparesAfter func(time.Duration)
	// pusher hands claimed spares their grant (nil: not pushed; the
	// Secret volume brings it).
	pusher GrantPusher
	// idle remembers when each Ready Home was last asked whether it is
	// idle (idle.go).
	idle idleHomes
}

func (r *Reconciler) enqueueSpares(after time.Duration) {
	if r.enqueueSparesAfter != nil {
		r.enqueueSparesAfter(after)
	}
}

var (
	_ grantreconciler.Interface         = (*Reconciler)(nil)
	_ pkgreconciler.OnDeletionInterface = (*Reconciler)(nil)
)

// ObserveDeletion implements pkgreconciler.OnDeletionInterface: no owner
// reference can reach across namespaces, so the Home goes because its grant
// is gone, also when that happened while this controller was down (every
// Home object's grant is enqueued at start and on promotion).
func (r *Reconciler) ObserveDeletion(ctx context.Context, key types.NamespacedName) error {
	if key.Namespace == r.homesNamespace && key.Name == SparesKeyName {
		return r.reconcileSpares(ctx)
	}
	r.forget(key.String())
	return r.deleteHome(ctx, key.Namespace, key.Name, "")
}

func (r *Reconciler) forget(key string) {
	r.admitMu.Lock()
	delete(r.pending, key)
	r.admitMu.Unlock()
}

// ReconcileKind implements grantreconciler.Interface; it is the list of
// steps. The generated reconciler initializes the conditions before and
// writes the status (with status.observedGeneration) after, also when a
// step fails.
func (r *Reconciler) ReconcileKind(ctx context.Context, g *v1alpha1.CapacityGrant) pkgreconciler.Event {
	cfg, err := r.config(ctx)
	if err != nil {
		return err
	}
	if !reconcileValidity(g, cfg) || !reconcileImages(g, cfg) {
		return nil
	}
	// The template and the snapshot are read and checked before any
	// capacity is booked: a grant naming digests that do not exist, or a
	// registry that never answers, holds nothing.
	helper, run, again, err := r.reconcileTemplate(ctx, g, cfg)
	if err != nil || !run {
		return lookAgain(again, err)
	}
	admitted, err := r.reconcileAdmission(ctx, g, cfg)
	switch {
	case errors.Is(err, errQuotaPodGone):
		return lookAgain(leftoverRetry, nil)
	case err != nil:
		return err
	case !admitted:
		// A grant that lost its admission loses its Home now, not at its
		// signed grant's expiry (grant-ttl is long, so that Homes outlive
		// a grant controller outage): its reserved memory is the
		// namespace's and the installation's again. The Revision stopped
		// being routed to already, since it is no longer Ready.
		return r.deleteHome(ctx, g.Namespace, g.Name, "")
	}
	r.nameHome(g)
	// A new Home is a spare claimed, when one fits (spare.go).
	if _, err := r.claimSpare(ctx, g, cfg); err != nil {
		return err
	}
	renewIn, err := r.reconcileSecret(ctx, g, cfg, helper)
	switch {
	case errors.Is(err, errHomeNameTaken):
		return nil
	case errors.Is(err, errLeftover):
		return lookAgain(leftoverRetry, nil)
	case err != nil:
		return err
	}
	if err := r.reconcileService(ctx, g); err != nil {
		return ignoreTaken(err)
	}
	home, err := r.reconcilePod(ctx, g, cfg)
	if err != nil {
		return err
	}
	g.Status.HomeEndpoint = resources.HomeEndpointOf(g, r.homesNamespace, home)
	pushedReady := r.pushGrant(ctx, g, home)
	again, fiberdReady := r.diagnoseHome(ctx, g, home)
	if pushedReady || fiberdReady {
		// fiberd itself said ready before the kubelet's next readiness
		// probe did: the Pod's own address, as for a Ready Pod.
		g.Status.HomeEndpoint = resources.PodEndpoint(home)
	}
	// An idle Ready Home gives back its reservation, and takes it back
	// when traffic returns; it is asked again after a while (idle.go).
	if idleAgain := r.reconcileReservation(ctx, g, cfg, home); idleAgain > 0 && (again == 0 || idleAgain < again) {
		again = idleAgain
	}
	if again > 0 && (renewIn == 0 || again < renewIn) {
		return lookAgain(again, nil)
	}
	return lookAgain(renewIn, nil)
}

// lookAgain is the reconcile's result: err, or a requeue after d (none for
// 0: when something changes).
func lookAgain(d time.Duration, err error) pkgreconciler.Event {
	if err != nil {
		return err
	}
	if d > 0 {
		return controller.NewRequeueAfter(d)
	}
	return nil
}

// nameHome: an admitted grant always names its Home and where it is
// reached (its Service until the Pod is Ready), even when a later step
// fails in this reconcile: the status written on that error must not blank
// them.
func (r *Reconciler) nameHome(g *v1alpha1.CapacityGrant) {
	g.Status.Home = resources.HomeName(g)
	if g.Status.HomeEndpoint == "" {
		g.Status.HomeEndpoint = resources.HomeEndpoint(g, r.homesNamespace)
	}
}
