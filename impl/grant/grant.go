// Package grant is the grant controller (the equivalent of
// fiberd-k8s-controller): it admits or refuses each CapacityGrant against the
// installation's fiber capacity, runs its Home (a Pod with fiberd and
// lampyr-helper), issues the Home a signed, expiring grant and renews it
// before expiry, and reports Admitted / HomeReady / Ready. The Home's
// objects are owned by the grant, so deleting the grant removes them.
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

// errHomeNameTaken stops a reconcile whose Home names are taken by objects
// the grant does not own (the condition says which).
var errHomeNameTaken = errors.New("home name taken")

// Reconciler reconciles CapacityGrants.
type Reconciler struct {
	kube     kubernetes.Interface
	grants   grantStore
	pods     corev1listers.PodLister
	services corev1listers.ServiceLister
	secrets  corev1listers.SecretLister
	keys     *Keys
	// diagnoser asks a running, not-ready Home's fiberd why (nil: not asked).
	diagnoser HomeDiagnoser
	config    func() (*config.Config, error)
	now       func() time.Time

	// admission is serialised, and grants admitted here but not yet visible
	// in the informer cache are remembered, so two grants reconciled back to
	// back cannot both take the last capacity.
	admitMu sync.Mutex
	pending map[string]int64
}

var _ controller.Reconciler = (*Reconciler)(nil)

// Reconcile implements controller.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, key string) error {
	logger := logging.FromContext(ctx)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		logger.Errorw("invalid resource key", "key", key)
		return nil
	}
	orig, err := r.grants.Get(ns, name)
	if apierrs.IsNotFound(err) {
		// Owner references let the garbage collector remove the Home;
		// only our own bookkeeping is left to drop.
		r.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	if orig.DeletionTimestamp != nil {
		r.forget(key)
		return nil
	}
	g := orig.DeepCopy()
	g.Status.InitializeConditions()
	g.Status.ObservedGeneration = g.Generation
	requeue, rerr := r.reconcileGrant(ctx, g)
	if !equality.Semantic.DeepEqual(orig.Status, g.Status) {
		if err := r.grants.UpdateStatus(ctx, g); err != nil {
			return fmt.Errorf("updating status of CapacityGrant %s: %w", key, err)
		}
	}
	if rerr != nil {
		return rerr
	}
	if requeue > 0 {
		return controller.NewRequeueAfter(requeue)
	}
	return nil
}

func (r *Reconciler) forget(key string) {
	r.admitMu.Lock()
	delete(r.pending, key)
	r.admitMu.Unlock()
}

// reconcileGrant is the list of steps; it returns when to look again.
func (r *Reconciler) reconcileGrant(ctx context.Context, g *v1alpha1.CapacityGrant) (time.Duration, error) {
	cfg, err := r.config()
	if err != nil {
		return 0, err
	}
	if msg := validate(g, cfg); msg != "" {
		g.Status.MarkNotAdmitted(v1alpha1.ReasonInvalidSpec, "%s", msg)
		return 0, nil
	}
	if !r.admit(g, cfg) {
		return 0, nil
	}
	// An admitted grant always names where its Home is reached (its
	// Service until the Pod is Ready), even when a later step fails in this
	// reconcile: the status written on that error must not blank it.
	if g.Status.HomeEndpoint == "" {
		g.Status.HomeEndpoint = resources.HomeEndpoint(g)
	}
	renewIn, err := r.reconcileSecret(ctx, g, cfg)
	if errors.Is(err, errHomeNameTaken) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if err := r.reconcileService(ctx, g); err != nil {
		return 0, err
	}
	home, err := r.reconcilePod(ctx, g, cfg)
	if err != nil {
		return 0, err
	}
	g.Status.HomeEndpoint = resources.HomeEndpointOf(g, home)
	if again := r.diagnoseHome(ctx, g, home); again > 0 && (renewIn == 0 || again < renewIn) {
		return again, nil
	}
	return renewIn, nil
}

// validate checks what the CRD schema cannot: digests that parse, limits
// from the configuration. The message names the field and the fix.
func validate(g *v1alpha1.CapacityGrant, cfg *config.Config) string {
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

// ReservedMemoryAnnotation records, in status.annotations, the memory an
// admitted grant holds. Capacity is counted from it rather than from specs,
// so a configuration change (default-max-fibers) or a spec change cannot
// silently move other grants' reservations.
const ReservedMemoryAnnotation = "fiberd.io/reserved-memory-bytes"

func reservedOf(g *v1alpha1.CapacityGrant, cfg *config.Config) int64 {
	if v, ok := g.Status.Annotations[ReservedMemoryAnnotation]; ok {
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
	g.Status.Annotations[ReservedMemoryAnnotation] = strconv.FormatInt(n, 10)
}

// admit decides admission. An admitted grant keeps its reservation even if
// the configuration later shrinks; only a grant that asks for more than it
// holds is checked again, like a new one.
func (r *Reconciler) admit(g *v1alpha1.CapacityGrant, cfg *config.Config) bool {
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
		g.Status.MarkNotAdmitted(v1alpha1.ReasonMemoryPerFiberTooLarge,
			"memoryPerFiber %s exceeds the per-fiber cap %s; lower the Revision's memory request or raise %s in ConfigMap %s",
			g.Spec.MemoryPerFiber.String(), cfg.MaxMemoryPerFiber.String(), config.KeyMaxMemoryPerFiber, config.ConfigMapName)
		return false
	}
	if max := resources.EffectiveMaxFibers(g, cfg); max > cfg.MaxFibersPerGrant {
		g.Status.MarkNotAdmitted(v1alpha1.ReasonTooManyFibers,
			"maxFibers %d exceeds the per-grant cap %d; lower autoscaling.knative.dev/max-scale or raise %s in ConfigMap %s",
			max, cfg.MaxFibersPerGrant, config.KeyMaxFibersPerGrant, config.ConfigMapName)
		return false
	}
	used := int64(0)
	all, err := r.grants.List()
	if err != nil {
		g.Status.MarkNotAdmitted("CapacityUnknown", "cannot list CapacityGrants: %v", err)
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
		g.Status.MarkNotAdmitted(v1alpha1.ReasonInsufficientMemory,
			"needs %s (memoryPerFiber %s × maxFibers %d) but only %s of the installation's %s fiber memory is free; lower max-scale or the memory request, delete unused Revisions, or raise %s in ConfigMap %s",
			bytesQ(want), g.Spec.MemoryPerFiber.String(), resources.EffectiveMaxFibers(g, cfg), bytesQ(max(capacity-used, 0)), cfg.FiberMemoryCapacity.String(), config.KeyFiberMemoryCapacity, config.ConfigMapName)
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
// its life or no longer matches the spec) and returns when to renew next.
func (r *Reconciler) reconcileSecret(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *config.Config) (time.Duration, error) {
	now := r.now()
	existing, err := r.secrets.Secrets(g.Namespace).Get(resources.HomeName(g))
	if err != nil && !apierrs.IsNotFound(err) {
		return 0, err
	}
	if existing != nil && !metav1.IsControlledBy(existing, g) {
		// Never write keys into a Secret someone else owns.
		g.Status.MarkHomeFailed("HomeNameTaken", "Secret %s/%s exists and is not owned by this CapacityGrant; delete it", g.Namespace, existing.Name)
		return 0, errHomeNameTaken
	}
	current := r.currentGrant(existing, now)
	want := resources.MakeClaims(g, cfg, "", metav1.NewTime(now))
	renewAt := time.Time{}
	if current != nil {
		renewAt = current.ExpiresAt.Add(-cfg.RenewBefore())
	}
	if current == nil || !sameTerms(*current, want) || !now.Before(renewAt) {
		want.GrantID = newGrantID(g)
		signed, err := signedgrant.Sign(r.keys.Signing, want)
		if err != nil {
			return 0, fmt.Errorf("signing grant for %s/%s: %w", g.Namespace, g.Name, err)
		}
		desired := resources.MakeHomeSecret(g, signed, r.keys.SigningPubPEM, r.keys.FleetPrivatePEM, r.keys.RouterToken)
		if existing == nil {
			_, err = r.kube.CoreV1().Secrets(g.Namespace).Create(ctx, desired, metav1.CreateOptions{})
		} else {
			upd := existing.DeepCopy()
			upd.Data, upd.Labels = desired.Data, desired.Labels
			_, err = r.kube.CoreV1().Secrets(g.Namespace).Update(ctx, upd, metav1.UpdateOptions{})
		}
		if err != nil {
			return 0, fmt.Errorf("writing Secret %s/%s: %w", g.Namespace, desired.Name, err)
		}
		current = &want
		renewAt = want.ExpiresAt.Add(-cfg.RenewBefore())
	}
	g.Status.GrantID = current.GrantID
	exp := metav1.NewTime(current.ExpiresAt)
	g.Status.ExpiresAt = &exp
	return max(renewAt.Sub(now), time.Second), nil
}

// currentGrant returns the valid grant in the Home Secret, if any.
func (r *Reconciler) currentGrant(s *corev1.Secret, now time.Time) *signedgrant.Claims {
	if s == nil {
		return nil
	}
	c, err := signedgrant.Verify(r.keys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
	if err != nil {
		return nil
	}
	if string(s.Data[resources.SecretKeyRouterToken]) != r.keys.RouterToken || string(s.Data[resources.SecretKeyFleetKey]) != string(r.keys.FleetPrivatePEM) {
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
	want := resources.MakeHomeService(g)
	have, err := r.services.Services(g.Namespace).Get(want.Name)
	if apierrs.IsNotFound(err) {
		_, err = r.kube.CoreV1().Services(g.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating Service %s/%s: %w", g.Namespace, want.Name, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if !metav1.IsControlledBy(have, g) {
		g.Status.MarkHomeFailed("HomeNameTaken", "Service %s/%s exists and is not owned by this CapacityGrant; delete it", g.Namespace, want.Name)
		return nil
	}
	if equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) && equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Spec.Selector, upd.Spec.Ports = want.Spec.Selector, want.Spec.Ports
	_, err = r.kube.CoreV1().Services(g.Namespace).Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// reconcilePod runs the Home Pod and returns it once it is this grant's
// and current (nil while it is being created or replaced).
func (r *Reconciler) reconcilePod(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *config.Config) (*corev1.Pod, error) {
	want := resources.MakeHomePod(g, cfg)
	if want.Spec.Containers[0].Image == "" {
		g.Status.MarkHomeFailed("HomeImageMissing", "no Home image configured: set %s in ConfigMap %s or %s on the grant controller", config.KeyHomeImage, config.ConfigMapName, config.EnvGrantImage)
		return nil, nil
	}
	have, err := r.pods.Pods(g.Namespace).Get(want.Name)
	if apierrs.IsNotFound(err) {
		if _, err := r.kube.CoreV1().Pods(g.Namespace).Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating Home Pod %s/%s: %w", g.Namespace, want.Name, err)
		}
		g.Status.MarkHomeNotReady(v1alpha1.ReasonHomePending, "Home Pod %s created.", want.Name)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !metav1.IsControlledBy(have, g) {
		g.Status.MarkHomeFailed("HomeNameTaken", "Pod %s/%s exists and is not owned by this CapacityGrant; delete it", g.Namespace, want.Name)
		return nil, nil
	}
	// Pods are immutable where it matters, so a Home that failed or runs an
	// outdated image is replaced rather than updated.
	if have.DeletionTimestamp == nil && (have.Status.Phase == corev1.PodFailed || have.Status.Phase == corev1.PodSucceeded || have.Spec.Containers[0].Image != want.Spec.Containers[0].Image) {
		if err := r.kube.CoreV1().Pods(g.Namespace).Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrs.IsNotFound(err) {
			return nil, fmt.Errorf("replacing Home Pod %s/%s: %w", g.Namespace, have.Name, err)
		}
		g.Status.MarkHomeFailed(v1alpha1.ReasonHomeFailed, "Home Pod %s %s; replacing it. %s", have.Name, phaseOrImage(have, want), have.Status.Message)
		return nil, nil
	}
	markHome(g, have)
	return have, nil
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
			g.Status.MarkHomeNotReady(v1alpha1.ReasonHomePending, "Home Pod %s is not scheduled: %s", p.Name, c.Message)
			return
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			g.Status.MarkHomeNotReady(v1alpha1.ReasonHomeNotReady, "Home Pod %s container %s: %s %s", p.Name, cs.Name, w.Reason, w.Message)
			return
		}
		if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 {
			g.Status.MarkHomeNotReady(v1alpha1.ReasonHomeNotReady, "Home Pod %s container %s restarted %d times, last exit %d (%s); see its logs", p.Name, cs.Name, cs.RestartCount, t.ExitCode, t.Reason)
			return
		}
	}
	g.Status.MarkHomeNotReady(v1alpha1.ReasonHomeNotReady, "Home Pod %s is %s and not ready yet (fiberd /readyz: valid grant, template opened, snapshot verified, pool warm).", p.Name, p.Status.Phase)
}
