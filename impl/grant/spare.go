// Spare Homes: kept ready for new Revisions, claimed by admitted grants.

package grant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/grant/resources"
)

// SparesKeyName is the work-queue key (in the Homes namespace) whose
// reconcile keeps the spare Homes: no CapacityGrant has it, so the
// generated reconciler hands it to ObserveDeletion, on the leader only.
const SparesKeyName = "lampyr-spare-homes"

// spareRecheck is how often the spares are looked at without an event.
const spareRecheck = 30 * time.Second

var spareSelector = labels.SelectorFromSet(labels.Set{resources.ComponentKey: resources.Component, resources.SpareLabel: resources.SpareUnclaimed})

// claims remembers, per grant UID, the spare a reconcile claimed, until
// the informer caches show it under the grant's labels; and which grant
// was pushed to which fiberd.
type claims struct {
	mu     sync.Mutex
	byUID  map[types.UID]string
	pushed map[string]bool
	// made are spares started here that the informer cache may not show
	// yet (name -> when), so that a reconcile on a stale cache neither
	// starts a second spare for the same gap nor counts a claimed spare
	// as unclaimed.
	made map[string]time.Time
	// lastClaim is when a spare was last claimed here.
	lastClaim time.Time
}

// spareRefillDelay is how long after a claim the claimed spare's
// replacement waits. Starting a Pod is the heaviest thing a small node
// does in that second (sandbox, network, fiberd's start), and it fell
// exactly on the claiming Revision's own start: fiberd loading the
// snapshot, then the Route's gateway programming and probes (issue 32:
// on a 2-vCPU node the replacement's fiberd started 1.2-1.3 s after the
// claim, inside the new Revision's Route wait). A Revision that comes in
// the meantime, with no spare left, gets a Home Pod of its own, as it
// would with no spares configured.
const spareRefillDelay = 3 * time.Second

func (c *claims) claimedAt(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastClaim = at
}

// refillAt is when a missing spare may be started.
func (c *claims) refillAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastClaim.IsZero() {
		return time.Time{}
	}
	return c.lastClaim.Add(spareRefillDelay)
}

// spareCacheGrace is how long a spare started here is counted before the
// informer cache shows it.
const spareCacheGrace = 30 * time.Second

func (c *claims) started(name string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.made == nil {
		c.made = map[string]time.Time{}
	}
	c.made[name] = at
}

// unseen are the spares started here in the last spareCacheGrace that
// are not in seen; the ones seen are forgotten.
func (c *claims) unseen(seen map[string]bool, now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for name, at := range c.made {
		switch {
		case seen[name] || now.Sub(at) > spareCacheGrace:
			delete(c.made, name)
		default:
			n++
		}
	}
	return n
}

// isClaimed reports whether a claim made here took the Pod name (the
// cache may still show it unclaimed).
func (c *claims) isClaimed(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.byUID {
		if n == name {
			return true
		}
	}
	return false
}

func (c *claims) claimed(uid types.UID) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.byUID[uid]
	return n, ok
}

func (c *claims) set(uid types.UID, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byUID == nil {
		c.byUID = map[types.UID]string{}
	}
	c.byUID[uid] = name
}

func (c *claims) forgetUID(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byUID, uid)
}

// firstPush reports whether key (pod UID, restarts, grant ID) was not
// pushed yet, and records it.
func (c *claims) firstPush(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pushed == nil {
		c.pushed = map[string]bool{}
	}
	if c.pushed[key] {
		return false
	}
	// (Bounded: one entry per claimed spare and grant issued to it.)
	if len(c.pushed) > 10000 {
		clear(c.pushed)
	}
	c.pushed[key] = true
	return true
}

// reconcileSpares keeps cfg.HomeSpares unclaimed spares of the current
// configuration: it deletes spares of another configuration or that
// ended, and the extra ones, and starts the missing ones.
func (r *Reconciler) reconcileSpares(ctx context.Context) error {
	cfg, err := r.config(ctx)
	if err != nil {
		return err
	}
	defer r.enqueueSpares(spareRecheck)
	pods, err := r.pods.Pods(r.homesNamespace).List(spareSelector)
	if err != nil {
		return err
	}
	oldestFirst(pods)
	var keep []*corev1.Pod
	var errs []error
	// Every Pod of the Homes namespace the cache shows (claimed spares
	// too): a spare started here and not among them yet is counted.
	seen := map[string]bool{}
	if all, err := r.pods.Pods(r.homesNamespace).List(labels.Everything()); err == nil {
		for _, p := range all {
			seen[p.Name] = true
		}
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil || r.claims.isClaimed(p.Name) {
			continue
		}
		ended := p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
		if ended || !resources.SpareIsCurrent(p, cfg, r.homesNamespace) || checkImagesOK(cfg) != nil || len(keep) >= cfg.HomeSpares {
			errs = append(errs, r.deleteSpare(ctx, p.Name))
			continue
		}
		keep = append(keep, p)
	}
	if checkImagesOK(cfg) != nil {
		return errors.Join(errs...)
	}
	missing := cfg.HomeSpares - len(keep) - r.claims.unseen(seen, r.now())
	if wait := r.claims.refillAt().Sub(r.now()); missing > 0 && wait > 0 {
		// Started once the claiming Revision's own start is through.
		r.enqueueSpares(wait)
		missing = 0
	}
	for ; missing > 0; missing-- {
		errs = append(errs, r.startSpare(ctx, cfg))
	}
	// A spare's Secret whose Pod never came (its create failed) goes too.
	if secrets, err := r.secrets.Secrets(r.homesNamespace).List(spareSelector); err == nil {
		for _, s := range secrets {
			if _, err := r.pods.Pods(r.homesNamespace).Get(s.Name); apierrs.IsNotFound(err) && r.now().Sub(s.CreationTimestamp.Time) > time.Minute {
				errs = append(errs, ignoreNotFound(r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, s.Name, metav1.DeleteOptions{})))
			}
		}
	}
	return errors.Join(errs...)
}

func checkImagesOK(cfg *lampyrconfig.Config) error {
	if reason, msg := checkImages(cfg); reason != "" {
		return errors.New(msg)
	}
	return nil
}

// startSpare makes one spare: its Secret (a Home key of its own and the
// installation's public keys) and its Pod.
func (r *Reconciler) startSpare(ctx context.Context, cfg *lampyrconfig.Config) error {
	name := resources.NewSpareName()
	key, err := r.homeKeyFor(nil)
	if err != nil {
		return err
	}
	secret := resources.MakeSpareSecret(r.homesNamespace, name, r.keys.SigningPubPEM, r.keys.RouterPubPEM, key)
	if _, err := r.kube.CoreV1().Secrets(r.homesNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating spare Home Secret %s/%s: %w", r.homesNamespace, name, err)
	}
	if _, err := r.kube.CoreV1().Pods(r.homesNamespace).Create(ctx, resources.MakeSparePod(cfg, r.homesNamespace, name), metav1.CreateOptions{}); err != nil {
		r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, name, metav1.DeleteOptions{})
		return fmt.Errorf("creating spare Home Pod %s/%s: %w", r.homesNamespace, name, err)
	}
	r.claims.started(name, r.now())
	return nil
}

func (r *Reconciler) deleteSpare(ctx context.Context, name string) error {
	return errors.Join(
		ignoreNotFound(r.kube.CoreV1().Pods(r.homesNamespace).Delete(ctx, name, metav1.DeleteOptions{})),
		ignoreNotFound(r.kube.CoreV1().Secrets(r.homesNamespace).Delete(ctx, name, metav1.DeleteOptions{})))
}

// spareReady reports whether a spare can be claimed now: running, its
// fiberd started and never restarted.
func spareReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == resources.FiberdContainer {
			return cs.State.Running != nil && cs.RestartCount == 0
		}
	}
	return false
}

// claimSpare makes a running spare g's Home, when g has no Home yet: the
// Pod and Secret take g's labels (the Pod's update, with its resource
// version, is what makes the claim exclusive), and the Pod's memory grows
// to g's Home's. It returns the claimed Pod (nil: no spare fitted, and
// the grant's own Home Pod is made as before). The grant is written into
// the Secret and pushed to fiberd by the reconcile's later steps.
func (r *Reconciler) claimSpare(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (*corev1.Pod, error) {
	if cfg.HomeSpares == 0 {
		return nil, nil
	}
	if _, ok := r.claims.claimed(g.UID); ok {
		return nil, nil
	}
	// Only a grant without any Home object yet claims: a Home that exists
	// (starting, serving, draining) is reconciled as it is.
	if pods, err := r.pods.Pods(r.homesNamespace).List(homePodsOf(g.Namespace, g.Name)); err != nil || len(pods) > 0 {
		return nil, err
	}
	if _, err := r.secrets.Secrets(r.homesNamespace).Get(resources.HomeName(g)); !apierrs.IsNotFound(err) {
		return nil, nil
	}
	if s, err := r.secrets.Secrets(r.homesNamespace).List(homePodsOf(g.Namespace, g.Name)); err != nil || len(s) > 0 {
		return nil, err
	}
	spares, err := r.pods.Pods(r.homesNamespace).List(spareSelector)
	if err != nil {
		return nil, err
	}
	oldestFirst(spares)
	for _, p := range spares {
		if !spareReady(p) || r.claims.isClaimed(p.Name) {
			continue
		}
		if ok, _ := resources.SpareFits(p, g, cfg, r.homesNamespace); !ok {
			continue
		}
		claimed, err := r.claim(ctx, g, cfg, p)
		if apierrs.IsConflict(err) || apierrs.IsNotFound(err) {
			continue // another grant took it, or it went
		}
		if err != nil {
			return nil, err
		}
		// The claimed Pod's update event brings the spares' key (its
		// label filter), with a cache that shows the claim.
		return claimed, nil
	}
	return nil, nil
}

func (r *Reconciler) claim(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, spare *corev1.Pod) (*corev1.Pod, error) {
	start := time.Now()
	pods := r.kube.CoreV1().Pods(r.homesNamespace)
	upd := spare.DeepCopy()
	upd.Labels = resources.ClaimedLabels(g)
	claimed, err := pods.Update(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	r.claims.set(g.UID, claimed.Name)
	r.claims.claimedAt(r.now())
	secret, err := r.kube.CoreV1().Secrets(r.homesNamespace).Get(ctx, claimed.Name, metav1.GetOptions{})
	if err == nil {
		secret.Labels = resources.Labels(g)
		_, err = r.kube.CoreV1().Secrets(r.homesNamespace).Update(ctx, secret, metav1.UpdateOptions{})
	}
	if err == nil {
		resized := claimed.DeepCopy()
		for i := range resized.Spec.Containers {
			if resized.Spec.Containers[i].Name == resources.FiberdContainer {
				resized.Spec.Containers[i].Resources = resources.HomeResources(g, cfg)
			}
		}
		claimed, err = pods.UpdateResize(ctx, claimed.Name, resized, metav1.UpdateOptions{})
	}
	if err != nil {
		// The spare is g's now but cannot serve it (its Secret or its
		// resize refused): it goes, and g gets a Home Pod of its own.
		r.claims.forgetUID(g.UID)
		derr := r.deleteSpare(ctx, spare.Name)
		return nil, errors.Join(fmt.Errorf("claiming spare Home %s/%s: %w", r.homesNamespace, spare.Name, err), derr)
	}
	g.Status.MarkHomeNotReady(contract.ReasonHomePending, "Spare Home %s/%s claimed; fiberd is loading the Revision.", r.homesNamespace, claimed.Name)
	logging.FromContext(ctx).Infow("Claimed a spare Home", "pod", claimed.Name, "took", time.Since(start).String())
	return claimed, nil
}

// homeSecret is g's Home Secret: the one of its Home's name, else a
// claimed spare's (the informer cache may not show a claim made a moment
// ago: it is read from the API server then). nil: none yet.
func (r *Reconciler) homeSecret(ctx context.Context, g *v1alpha1.CapacityGrant) (*corev1.Secret, error) {
	s, err := r.secrets.Secrets(r.homesNamespace).Get(resources.HomeName(g))
	if err == nil {
		return s, nil
	}
	if !apierrs.IsNotFound(err) {
		return nil, err
	}
	list, err := r.secrets.Secrets(r.homesNamespace).List(homePodsOf(g.Namespace, g.Name))
	if err != nil {
		return nil, err
	}
	for _, s := range list {
		if resources.IsHomeOf(s, g) {
			return s, nil
		}
	}
	if name, ok := r.claims.claimed(g.UID); ok {
		s, err := r.kube.CoreV1().Secrets(r.homesNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && resources.IsHomeOf(s, g) {
			return s, nil
		}
		if err != nil && !apierrs.IsNotFound(err) {
			return nil, err
		}
	}
	return nil, nil
}

// claimedPod adds g's claimed spare to pods when the informer cache does
// not show it yet.
func (r *Reconciler) claimedPod(ctx context.Context, g *v1alpha1.CapacityGrant, pods []*corev1.Pod) ([]*corev1.Pod, error) {
	name, ok := r.claims.claimed(g.UID)
	if !ok {
		return pods, nil
	}
	for _, p := range pods {
		if p.Name == name {
			// The cache shows the claim: its labels say it from now on.
			r.claims.forgetUID(g.UID)
			return pods, nil
		}
	}
	p, err := r.kube.CoreV1().Pods(r.homesNamespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrs.IsNotFound(err):
		return pods, nil
	case err != nil:
		return nil, err
	case resources.IsHomeOf(p, g):
		return append(pods, p), nil
	}
	return pods, nil
}

func (c *claims) unpush(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pushed, key)
}

// GrantPusher hands a claimed spare's fiberd its signed grant.
type GrantPusher interface {
	// Push PUTs the signed grant to fiberd in pod, over TLS with the Home
	// key homeKeySHA256 only, and returns whether fiberd answered ready.
	Push(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string, signedGrant []byte) (ready bool, err error)
}

// HTTPGrantPusher is GrantPusher over fiberd's API.
type HTTPGrantPusher struct{}

// Push implements GrantPusher.
func (HTTPGrantPusher) Push(ctx context.Context, pod *corev1.Pod, homeKeySHA256 string, signedGrant []byte) (bool, error) {
	c, err := client.NewTLS(resources.PodEndpoint(pod), "", homeKeySHA256)
	if err != nil {
		return false, err
	}
	a, err := c.PushGrant(ctx, signedGrant)
	if client.IsUnavailable(err) {
		return false, nil
	}
	return err == nil && a.Ready, err
}

// pushTimeout bounds a push: fiberd answers once it loaded the Revision
// and its pool is warm (or after its own 20 s).
const pushTimeout = 25 * time.Second

// pushGrant hands a claimed spare that is not Ready yet its grant, once
// per fiberd start and grant: fiberd loads the Revision at once instead of
// when the kubelet refreshes the spare's Secret volume (up to a minute).
// fiberd's answer (ready) makes the Home ready now, at the Pod's address
// (true).
func (r *Reconciler) pushGrant(ctx context.Context, g *v1alpha1.CapacityGrant, home *corev1.Pod) bool {
	if r.pusher == nil || home == nil || !resources.IsClaimedSpare(home) || podReady(home) || home.Status.PodIP == "" || g.Status.HomeKeySHA256 == "" {
		return false
	}
	s, err := r.homeSecret(ctx, g)
	if err != nil || s == nil || len(s.Data[resources.SecretKeyGrant]) == 0 {
		return false
	}
	restarts := int32(0)
	for _, cs := range home.Status.ContainerStatuses {
		restarts += cs.RestartCount
	}
	key := fmt.Sprintf("%s/%d/%s", home.UID, restarts, g.Status.GrantID)
	if !r.claims.firstPush(key) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	start := time.Now()
	ready, err := r.pusher.Push(ctx, home, g.Status.HomeKeySHA256, s.Data[resources.SecretKeyGrant])
	logging.FromContext(ctx).Infow("Pushed the grant to a claimed spare Home", "pod", home.Name, "ready", ready, "took", time.Since(start).String())
	if err != nil {
		// Pushed again by the next reconcile; the Secret volume brings
		// the grant in any case.
		r.claims.unpush(key)
		logging.FromContext(ctx).Warnw("Pushing the grant to a claimed spare Home", "pod", home.Name, "error", err)
		return false
	}
	if ready {
		g.Status.MarkHomeReady()
	}
	return ready
}
