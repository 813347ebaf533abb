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
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"
	pkgreconciler "knative.dev/pkg/reconciler"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	grantreconciler "lampyr.dev/serving/impl/client/injection/reconciler/fiberd/v1alpha1/capacitygrant"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
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
	templates       TemplateFetcher
	blobs           templateBlobs
	// diagnoser asks a running, not-ready Home's fiberd why (nil: not asked).
	diagnoser HomeDiagnoser
	config    func() (*lampyrconfig.Config, error)
	now       func() time.Time
	// grantID names a newly signed grant (newGrantID: random).
	grantID func(*v1alpha1.CapacityGrant) string
	// newHomeKey makes a new Home's TLS key (homekey.go; nil: random).
	newHomeKey func() (resources.HomeKey, error)

	// admission is serialised, and grants admitted here but not yet visible
	// in the informer cache are remembered, so two grants reconciled back to
	// back cannot both take the last capacity.
	admitMu sync.Mutex
	pending map[string]int64
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
	cfg, err := r.config()
	if err != nil {
		return err
	}
	if !r.reconcileAdmission(g, cfg) {
		// A grant that lost its admission is not renewed: its Home stops
		// serving at its grant's expiry (and the Revision stops being
		// routed to at once, since it is no longer Ready).
		return nil
	}
	r.nameHome(g)
	if !reconcileImages(g, cfg) {
		return nil
	}
	helper, run, again, err := r.reconcileTemplate(ctx, g, cfg)
	if err != nil || !run {
		return lookAgain(again, err)
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
	if again := r.diagnoseHome(ctx, g, home); again > 0 && (renewIn == 0 || again < renewIn) {
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

// reconcileAdmission checks what the CRD schema cannot and admits the grant
// against the installation's capacity; false: refused (the condition says
// why).
func (r *Reconciler) reconcileAdmission(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	if msg := validate(g, cfg); msg != "" {
		g.Status.MarkNotAdmitted(contract.ReasonInvalidSpec, "%s", msg)
		return false
	}
	return r.admit(g, cfg)
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

// reconcileImages marks the Home failed when its images cannot be used;
// false: they cannot.
func reconcileImages(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	if reason, msg := checkImages(cfg); reason != "" {
		g.Status.MarkHomeFailed(reason, "%s", msg)
		return false
	}
	return true
}

// checkImages refuses Home images that are not pinned by digest: whoever
// can move a tag would otherwise choose what runs privileged in every Home.
func checkImages(cfg *lampyrconfig.Config) (reason contract.Reason, message string) {
	if cfg.HomeImage == "" {
		return contract.ReasonHomeImageMissing, fmt.Sprintf("no Home image configured: set %s in ConfigMap %s or %s on the grant controller", lampyrconfig.KeyHomeImage, contract.ConfigMapName, config.EnvGrantImage)
	}
	for key, img := range map[string]string{lampyrconfig.KeyHomeImage: cfg.HomeImage, lampyrconfig.KeyHelperImage: cfg.HelperImage} {
		if img == "" {
			continue
		}
		if _, err := artifact.ParseDigestRef(img); err != nil {
			return contract.ReasonHomeImageNotPinned, fmt.Sprintf("%s %q in ConfigMap %s is not pinned by digest (%v); use repository@sha256:<digest>", key, img, contract.ConfigMapName, err)
		}
	}
	return "", ""
}

// reconcileTemplate opens and checks g's sealed template. A template that
// cannot be trusted stops the Home (a revoked sealer, a replayed
// template); one the registry cannot give right now keeps a running Home on
// the facts of the grant it already holds for that template, and is asked
// for again shortly.
//
// run says whether the Home may run; when it may not, again says when to
// look again (0: when something changes).
func (r *Reconciler) reconcileTemplate(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (helper signedgrant.Helper, run bool, again time.Duration, err error) {
	fleetSecret, err := r.fleetSecret()
	if err != nil {
		return helper, false, 0, fmt.Errorf("reading the fleet key Secret %s/%s: %w", r.systemNamespace, contract.FleetKeyName, err)
	}
	fleet, err := r.fleet.keysOf(fleetSecret)
	if err != nil {
		return helper, false, 0, err
	}
	mirrors, err := artifact.ParseMirrors(cfg.HomeRegistryMirrors)
	if err != nil {
		return helper, false, 0, err
	}
	opts := append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, mirrors.RemoteOptions()...)
	helper, refusal := r.openTemplate(ctx, g, fleet, r.trust(ctx), opts)
	if refusal == nil {
		return helper, true, 0, nil
	}
	if refusal.retry {
		if cur := r.currentGrantOf(g); cur != nil && cur.Template == g.Spec.Template {
			logging.FromContext(ctx).Warnw("Keeping the running Home on its current grant", "grant", g.Namespace+"/"+g.Name, "cause", refusal.message)
			return cur.Helper, true, 0, nil
		}
		g.Status.MarkHomeFailed(refusal.reason, "%s", refusal.message)
		return helper, false, templateRetry, nil
	}
	g.Status.MarkHomeFailed(refusal.reason, "%s", refusal.message)
	return helper, false, 0, r.deleteHome(ctx, g.Namespace, g.Name, "")
}

// trust is who may seal templates: the controller (every namespace) and the
// identities in lampyr-template-sealers. An entry that does not parse is
// left out and logged; the others still count.
func (r *Reconciler) trust(ctx context.Context) *seal.Trust {
	var sealers []seal.TrustedSealer
	if cm, err := r.sealersConfig(); err == nil && cm != nil {
		var perr error
		sealers, perr = seal.ParseSealers(cm.Data)
		if perr != nil {
			logging.FromContext(ctx).Errorw("Ignoring unusable entries of ConfigMap "+contract.SealersConfigMap, "error", perr)
		}
	} else if err != nil && !apierrs.IsNotFound(err) {
		logging.FromContext(ctx).Errorw("Reading ConfigMap "+contract.SealersConfigMap, "error", err)
	}
	sealers = append(sealers, seal.TrustedSealer{Name: contract.ControllerName, Key: r.keys.ControllerSealer, Namespaces: []string{seal.AllNamespaces}})
	return seal.NewTrust(sealers...)
}

// deleteHome deletes the Home objects of grant namespace/name (keep: a UID
// whose objects stay, "" for none). Only objects labelled as that grant's
// Home are touched.
func (r *Reconciler) deleteHome(ctx context.Context, namespace, name string, keepUID string) error {
	homeName := resources.HomeNameFor(namespace, name)
	mine := func(o metav1.Object) bool {
		ns, n, ok := resources.GrantKeyOf(o)
		return ok && ns == namespace && n == name && (keepUID == "" || o.GetLabels()[contract.GrantUIDLabel] != keepUID)
	}
	var errs []error
	if p, err := r.pods.Pods(r.homesNamespace).Get(homeName); err == nil && mine(p) && p.DeletionTimestamp == nil {
		errs = append(errs, ignoreNotFound(r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, homeName, metav1.DeleteOptions{})))
	}
	if s, err := r.services.Services(r.homesNamespace).Get(homeName); err == nil && mine(s) {
		errs = append(errs, ignoreNotFound(r.kube.CoreV1().Services(r.homesNamespace).Delete(ctx, homeName, metav1.DeleteOptions{})))
	}
	if s, err := r.secrets.Secrets(r.homesNamespace).Get(homeName); err == nil && mine(s) {
		errs = append(errs, ignoreNotFound(r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, homeName, metav1.DeleteOptions{})))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting the Home of CapacityGrant %s/%s: %w", namespace, name, err)
	}
	return nil
}

func ignoreNotFound(err error) error {
	if apierrs.IsNotFound(err) {
		return nil
	}
	return err
}

// ownership of an existing Home object for g: ours, a leftover of an
// earlier grant of the same name (replaced), or someone else's (refused).
type ownership int

const (
	ownedByGrant ownership = iota
	leftover
	foreign
)

func ownershipOf(obj metav1.Object, g *v1alpha1.CapacityGrant) ownership {
	if resources.IsHomeOf(obj, g) {
		return ownedByGrant
	}
	if ns, name, ok := resources.GrantKeyOf(obj); ok && ns == g.Namespace && name == g.Name {
		return leftover
	}
	return foreign
}

// taken marks the grant's Home name taken by obj and stops the reconcile.
func (r *Reconciler) taken(g *v1alpha1.CapacityGrant, kind string, obj metav1.Object) error {
	g.Status.MarkHomeFailed(contract.ReasonHomeNameTaken, "%s %s/%s exists and was not made for this CapacityGrant; delete it", kind, r.homesNamespace, obj.GetName())
	return errHomeNameTaken
}

// validate checks what the CRD schema cannot: digests that parse, limits
// from the configuration. The message names the field and the fix.
func validate(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) string {
	if _, err := artifact.ParseDigestRef(g.Spec.Template); err != nil {
		return "spec.template: " + err.Error()
	}
	if _, err := artifact.ParseDigestRef(g.Spec.SnapshotArtifact); err != nil {
		return "spec.snapshotArtifact: " + err.Error()
	}
	if g.Spec.MemoryPerFiber.Sign() <= 0 {
		return "spec.memoryPerFiber must be positive (the Revision's memory request)"
	}
	switch g.Spec.Execution.Mode {
	case v1alpha1.ExecutionFresh, "":
	case v1alpha1.ExecutionReuse:
		if g.Spec.Execution.IdleTimeoutSeconds <= 0 {
			return "spec.execution.idleTimeoutSeconds must be > 0 in reuse mode"
		}
	default:
		return fmt.Sprintf("spec.execution.mode %q: want fresh or reuse", g.Spec.Execution.Mode)
	}
	if a := g.Spec.Execution.IdleAction; a != "" && a != v1alpha1.IdleActionRelease {
		return fmt.Sprintf("spec.execution.idleAction %q: only release is supported (park/resume is not)", a)
	}
	return ""
}

func reservedOf(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) int64 {
	if v, ok := g.Status.Annotations[contract.ReservedMemoryAnnotation]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return resources.ReservedMemory(g, cfg)
}

func setReserved(g *v1alpha1.CapacityGrant, n int64) {
	if g.Status.Annotations == nil {
		g.Status.Annotations = map[string]string{}
	}
	g.Status.Annotations[contract.ReservedMemoryAnnotation] = strconv.FormatInt(n, 10)
}

// admit decides admission. An admitted grant keeps its reservation even if
// the configuration later shrinks; only a grant that asks for more than it
// holds is checked again, like a new one.
func (r *Reconciler) admit(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	key := g.Namespace + "/" + g.Name
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	want := resources.ReservedMemory(g, cfg)
	wasAdmitted := g.Status.IsAdmitted()
	if wasAdmitted && want <= reservedOf(g, cfg) {
		delete(r.pending, key)
		setReserved(g, want)
		return true
	}
	if g.Spec.MemoryPerFiber.Cmp(cfg.MaxMemoryPerFiber) > 0 {
		g.Status.MarkNotAdmitted(contract.ReasonMemoryPerFiberTooLarge,
			"memoryPerFiber %s exceeds the per-fiber cap %s; lower the Revision's memory request or raise %s in ConfigMap %s",
			g.Spec.MemoryPerFiber.String(), cfg.MaxMemoryPerFiber.String(), lampyrconfig.KeyMaxMemoryPerFiber, contract.ConfigMapName)
		return false
	}
	if max := resources.EffectiveMaxFibers(g, cfg); max > cfg.MaxFibersPerGrant {
		g.Status.MarkNotAdmitted(contract.ReasonTooManyFibers,
			"maxFibers %d exceeds the per-grant cap %d; lower autoscaling.knative.dev/max-scale or raise %s in ConfigMap %s",
			max, cfg.MaxFibersPerGrant, lampyrconfig.KeyMaxFibersPerGrant, contract.ConfigMapName)
		return false
	}
	used := int64(0)
	all, err := r.grants.List(everything)
	if err != nil {
		g.Status.MarkNotAdmitted(ReasonCapacityUnknown, "cannot list CapacityGrants: %v", err)
		return false
	}
	seen := map[string]bool{}
	for _, o := range all {
		k := o.Namespace + "/" + o.Name
		if k == key || o.DeletionTimestamp != nil || !o.Status.IsAdmitted() {
			continue
		}
		seen[k] = true
		used += reservedOf(o, cfg)
	}
	for k, v := range r.pending {
		if !seen[k] && k != key {
			used += v
		}
	}
	capacity := cfg.FiberMemoryCapacity.Value()
	if used+want > capacity {
		// A grant that grew beyond what is free loses its admission: its
		// signed grant is no longer renewed, so its Home stops serving at
		// expiry rather than run more than was admitted.
		g.Status.MarkNotAdmitted(contract.ReasonInsufficientMemory,
			"needs %s (memoryPerFiber %s × maxFibers %d) but only %s of the installation's %s fiber memory is free; lower max-scale or the memory request, delete unused Revisions, or raise %s in ConfigMap %s",
			bytesQ(want), g.Spec.MemoryPerFiber.String(), resources.EffectiveMaxFibers(g, cfg), bytesQ(max(capacity-used, 0)), cfg.FiberMemoryCapacity.String(), lampyrconfig.KeyFiberMemoryCapacity, contract.ConfigMapName)
		delete(r.pending, key)
		return false
	}
	r.pending[key] = want
	setReserved(g, want)
	g.Status.MarkAdmitted(fmt.Sprintf("Reserved %s of %s fiber memory.", bytesQ(want), cfg.FiberMemoryCapacity.String()))
	return true
}

func bytesQ(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// reconcileSecret issues the signed grant (renewing it when it is past half
// its life or no longer matches the spec or the keys) and returns when to
// renew next.
func (r *Reconciler) reconcileSecret(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, helper signedgrant.Helper) (time.Duration, error) {
	now := r.now()
	existing, err := r.secrets.Secrets(r.homesNamespace).Get(resources.HomeName(g))
	if err != nil && !apierrs.IsNotFound(err) {
		return 0, err
	}
	if existing != nil {
		switch ownershipOf(existing, g) {
		case foreign:
			// Never write a grant into a Secret someone else made.
			return 0, r.taken(g, "Secret", existing)
		case leftover:
			// A Home of an earlier grant of this name (a Revision deleted
			// and made again): delete all of it and start over once the
			// caches no longer show it.
			if err := r.deleteHome(ctx, g.Namespace, g.Name, string(g.UID)); err != nil {
				return 0, err
			}
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "The Home of an earlier CapacityGrant named %s is being deleted.", g.Name)
			return 0, errLeftover
		}
	}
	current := r.currentGrant(existing, now)
	homeKey, err := r.homeKeyFor(existing)
	if err != nil {
		return 0, fmt.Errorf("making the Home key of %s/%s: %w", g.Namespace, g.Name, err)
	}
	want := resources.MakeClaims(g, cfg, helper, homeKey.SHA256, "", metav1.NewTime(now))
	renewAt := time.Time{}
	if current != nil {
		renewAt = current.ExpiresAt.Add(-cfg.RenewBefore())
	}
	if current == nil || !sameTerms(*current, want) || !now.Before(renewAt) {
		want.GrantID = r.grantID(g)
		signed, err := signedgrant.Sign(r.keys.Signing, want)
		if err != nil {
			return 0, fmt.Errorf("signing grant for %s/%s: %w", g.Namespace, g.Name, err)
		}
		desired := resources.MakeHomeSecret(g, r.homesNamespace, signed, r.keys.SigningPubPEM, r.keys.RouterPubPEM, homeKey)
		if existing == nil {
			_, err = r.kube.CoreV1().Secrets(r.homesNamespace).Create(ctx, desired, metav1.CreateOptions{})
		} else {
			upd := existing.DeepCopy()
			upd.Data, upd.Labels = desired.Data, desired.Labels
			_, err = r.kube.CoreV1().Secrets(r.homesNamespace).Update(ctx, upd, metav1.UpdateOptions{})
		}
		if err != nil {
			return 0, fmt.Errorf("writing Secret %s/%s: %w", r.homesNamespace, desired.Name, err)
		}
		current = &want
		renewAt = want.ExpiresAt.Add(-cfg.RenewBefore())
	}
	g.Status.GrantID = current.GrantID
	g.Status.HomeKeySHA256 = current.HomeKeySHA256
	exp := metav1.NewTime(current.ExpiresAt)
	g.Status.ExpiresAt = &exp
	return max(renewAt.Sub(now), time.Second), nil
}

// currentGrantOf is the valid grant g's Home holds now, if any.
func (r *Reconciler) currentGrantOf(g *v1alpha1.CapacityGrant) *signedgrant.Claims {
	s, err := r.secrets.Secrets(r.homesNamespace).Get(resources.HomeName(g))
	if err != nil || !resources.IsHomeOf(s, g) {
		return nil
	}
	return r.currentGrant(s, r.now())
}

// currentGrant returns the valid grant in the Home Secret, if any, as long
// as the Secret also carries today's public keys.
func (r *Reconciler) currentGrant(s *corev1.Secret, now time.Time) *signedgrant.Claims {
	if s == nil {
		return nil
	}
	c, err := signedgrant.Verify(r.keys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
	if err != nil {
		return nil
	}
	if string(s.Data[resources.SecretKeyRouterPubKeys]) != string(r.keys.RouterPubPEM) || string(s.Data[resources.SecretKeyGrantPubKey]) != string(r.keys.SigningPubPEM) || len(s.Data) != 4 || !homeKeyBound(s, c) {
		return nil
	}
	return &c
}

// sameTerms compares everything but identity and validity window.
func sameTerms(a, b signedgrant.Claims) bool {
	a.GrantID, b.GrantID = "", ""
	a.IssuedAt, b.IssuedAt = time.Time{}, time.Time{}
	a.ExpiresAt, b.ExpiresAt = time.Time{}, time.Time{}
	if len(a.Env) == 0 && len(b.Env) == 0 {
		a.Env, b.Env = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

func newGrantID(g *v1alpha1.CapacityGrant) string {
	b := make([]byte, 4)
	rand.Read(b)
	uid := string(g.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return fmt.Sprintf("%s-%s", uid, hex.EncodeToString(b))
}

func (r *Reconciler) reconcileService(ctx context.Context, g *v1alpha1.CapacityGrant) error {
	want := resources.MakeHomeService(g, r.homesNamespace)
	have, err := r.services.Services(r.homesNamespace).Get(want.Name)
	if apierrs.IsNotFound(err) {
		if _, err := r.kube.CoreV1().Services(r.homesNamespace).Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Service %s/%s: %w", r.homesNamespace, want.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if ownershipOf(have, g) == foreign {
		return r.taken(g, "Service", have)
	}
	if equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) && equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Labels, upd.Spec.Selector, upd.Spec.Ports = want.Labels, want.Spec.Selector, want.Spec.Ports
	_, err = r.kube.CoreV1().Services(r.homesNamespace).Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// reconcilePod runs the Home Pod and returns it once it is this grant's
// and current (nil while it is being created or replaced).
func (r *Reconciler) reconcilePod(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (*corev1.Pod, error) {
	want := resources.MakeHomePod(g, cfg, r.homesNamespace)
	have, err := r.pods.Pods(r.homesNamespace).Get(want.Name)
	if apierrs.IsNotFound(err) {
		if _, err := r.kube.CoreV1().Pods(r.homesNamespace).Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating Home Pod %s/%s: %w", r.homesNamespace, want.Name, err)
		}
		g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s created.", r.homesNamespace, want.Name)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	switch ownershipOf(have, g) {
	case foreign:
		return nil, ignoreTaken(r.taken(g, "Pod", have))
	case leftover:
		if have.DeletionTimestamp == nil {
			if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
				return nil, fmt.Errorf("replacing a leftover Home Pod %s/%s: %w", r.homesNamespace, have.Name, err)
			}
		}
		g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s of an earlier grant of this name is being replaced.", r.homesNamespace, have.Name)
		return nil, nil
	}
	// Pods are immutable where it matters, so a Home that failed or runs an
	// outdated image is replaced rather than updated.
	if have.DeletionTimestamp == nil && (have.Status.Phase == corev1.PodFailed || have.Status.Phase == corev1.PodSucceeded || have.Spec.Containers[0].Image != want.Spec.Containers[0].Image) {
		if err := r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
			return nil, fmt.Errorf("replacing Home Pod %s/%s: %w", r.homesNamespace, have.Name, err)
		}
		g.Status.MarkHomeFailed(contract.ReasonHomeFailed, "Home Pod %s/%s %s; replacing it. %s", r.homesNamespace, have.Name, phaseOrImage(have, want), have.Status.Message)
		return nil, nil
	}
	markHome(g, have)
	return have, nil
}

// ignoreTaken: a taken name is reported in the condition, not retried.
func ignoreTaken(err error) error {
	if errors.Is(err, errHomeNameTaken) {
		return nil
	}
	return err
}

func phaseOrImage(have, want *corev1.Pod) string {
	if have.Spec.Containers[0].Image != want.Spec.Containers[0].Image {
		return "runs an outdated image"
	}
	return "is " + string(have.Status.Phase)
}

// markHome translates the Home Pod's status into HomeReady.
func markHome(g *v1alpha1.CapacityGrant, p *corev1.Pod) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			g.Status.MarkHomeReady()
			return
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Home Pod %s/%s is not scheduled: %s", p.Namespace, p.Name, c.Message)
			return
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s container %s: %s %s", p.Name, cs.Name, w.Reason, w.Message)
			return
		}
		if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 {
			g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s container %s restarted %d times, last exit %d (%s); see its logs", p.Name, cs.Name, cs.RestartCount, t.ExitCode, t.Reason)
			return
		}
	}
	g.Status.MarkHomeNotReady(contract.ReasonHomeNotReady, "Home Pod %s is %s and not ready yet (fiberd /readyz: valid grant, template opened, snapshot verified, pool warm).", p.Name, p.Status.Phase)
}
