// Idle Homes give back their scheduler reservation (issue 32, density).

package grant

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// A Ready Home reserves on its node what its Revision needs at its busiest
// (HomeResources: memoryPerFiber x maxFibers + fiberd's own, 25m CPU),
// also while no request comes. With config-lampyr home-idle-after set
// (default 60s), the grant's reconcile asks the Home's fiberd every
// homeIdleProbeInterval how long its pool has been idle (GET /readyz,
// header Fiberd-Idle-Seconds) and resizes the fiberd container's requests
// in place (pods/resize): down to home-idle-memory / home-idle-cpu once
// idle that long, back to HomeResources' once it is not. Limits are never
// touched: an idle Home serves its next request at once and in full, and
// the node may be overcommitted meanwhile (docs/security.md §1). The
// tenant's quota Pod keeps the full reservation.
const (
	// homeIdleProbeInterval is how often a Ready Home is asked whether
	// it is idle: also the most a returning Home waits for its
	// reservation (plus the resize).
	homeIdleProbeInterval = 15 * time.Second
	// homeResizeRetry is how long a Home whose resize was refused (an
	// older cluster, a runtime that cannot, Infeasible), or whose fiberd
	// does not say it is idle, is left as it is.
	homeResizeRetry = 10 * time.Minute
)

// Event reasons on the grant.
const (
	reasonReservationReleased = "HomeReservationReleased"
	reasonReservationRestored = "HomeReservationRestored"
	reasonResizeRefused       = "HomeResizeRefused"
)

// idleHomes remembers, per Home Pod UID, when it was last asked and until
// when it is left alone.
type idleHomes struct {
	mu     sync.Mutex
	asked  map[types.UID]time.Time
	leftTo map[types.UID]time.Time
}

// due reports whether the Pod may be asked now, and records it; else how
// long until it may.
func (h *idleHomes) due(uid types.UID, now time.Time) (bool, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if until, ok := h.leftTo[uid]; ok {
		if now.Before(until) {
			return false, until.Sub(now)
		}
		delete(h.leftTo, uid)
	}
	if last, ok := h.asked[uid]; ok && now.Sub(last) < homeIdleProbeInterval {
		return false, homeIdleProbeInterval - now.Sub(last)
	}
	if h.asked == nil {
		h.asked = map[types.UID]time.Time{}
	}
	if len(h.asked) > 10000 {
		// Bounded: Pods that went are forgotten here.
		for k, t := range h.asked {
			if now.Sub(t) > homeResizeRetry {
				delete(h.asked, k)
			}
		}
	}
	h.asked[uid] = now
	return true, 0
}

// left reports whether the Pod is being left alone.
func (h *idleHomes) left(uid types.UID, now time.Time) (bool, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.leftTo[uid]
	if ok && now.Before(until) {
		return true, until.Sub(now)
	}
	return false, 0
}

// leave leaves the Pod alone until until.
func (h *idleHomes) leave(uid types.UID, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leftTo == nil {
		h.leftTo = map[types.UID]time.Time{}
	}
	if len(h.leftTo) > 10000 {
		clear(h.leftTo)
	}
	h.leftTo[uid] = until
}

// reconcileReservation gives back or takes back the reservation of g's
// Home Pod home as its fiberd is idle or not, and returns when to look
// again (0: not for this).
func (r *Reconciler) reconcileReservation(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, home *corev1.Pod) time.Duration {
	if r.diagnoser == nil || home == nil || home.DeletionTimestamp != nil || home.Status.Phase != corev1.PodRunning || !podReady(home) || !resources.IsHomeOf(home, g) {
		return 0
	}
	c := resources.FiberdOf(home)
	if c == nil {
		return 0
	}
	full := resources.HomeResources(g, cfg).Requests
	idle := resources.IdleRequests(cfg)
	if resources.SameRequests(full, idle) {
		return 0
	}
	atFull := resources.SameRequests(c.Resources.Requests, full)
	given := !atFull && (resources.SameRequests(c.Resources.Requests, idle) || home.Annotations[resources.ReservationAnnotation] == resources.ReservationIdle)
	// A mark that did not land with its resize is set now.
	switch {
	case given && home.Annotations[resources.ReservationAnnotation] != resources.ReservationIdle && resources.SameRequests(c.Resources.Requests, idle):
		r.markReservation(ctx, g, home, resources.ReservationIdle)
	case atFull && home.Annotations[resources.ReservationAnnotation] == resources.ReservationIdle:
		r.markReservation(ctx, g, home, resources.ReservationFull)
	}
	now := r.now()
	if left, wait := r.idle.left(home.UID, now); left {
		return wait
	}
	if cfg.HomeIdleAfter == 0 {
		// Off: a Home that gave back its reservation takes it back, and
		// fiberd is not asked.
		if given {
			r.resizeHome(ctx, g, home, full, resources.ReservationFull, -1)
		}
		return 0
	}
	if !given && !atFull {
		// Requests neither this configuration's full nor idle ones (a Home
		// of an earlier version): left as they are.
		return 0
	}
	// A Home in its first 30 s (since its fiberd started, or it became
	// Ready: a claimed spare) is looked at by the fast readiness probing
	// (homeprobe.go), and is not idle yet.
	started := fiberdStarted(home)
	if started.IsZero() {
		return 0
	}
	if since := readySince(home); since.After(started) {
		started = since
	}
	if age := now.Sub(started); age < homeStartingFor {
		return homeStartingFor - age
	}
	if refusedResize(home) {
		r.refused(ctx, g, home, fmt.Errorf("the kubelet found the resize %s", corev1.PodReasonInfeasible))
		return homeResizeRetry
	}
	ok, wait := r.idle.due(home.UID, now)
	if !ok {
		return wait
	}
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
	secs, present, asked := r.diagnoser.Idle(ctx2, home, g.Status.HomeKeySHA256)
	cancel()
	switch {
	case !asked:
		return homeIdleProbeInterval
	case !present:
		// A fiberd that does not say: its Home keeps (or takes back)
		// its full reservation, and is asked again much later.
		if given {
			r.resizeHome(ctx, g, home, full, resources.ReservationFull, -1)
		}
		r.idle.leave(home.UID, now.Add(homeResizeRetry))
		return homeResizeRetry
	}
	isIdle := time.Duration(secs)*time.Second >= cfg.HomeIdleAfter
	switch {
	case isIdle && atFull:
		r.resizeHome(ctx, g, home, idle, resources.ReservationIdle, secs)
	case !isIdle && given:
		r.resizeHome(ctx, g, home, full, resources.ReservationFull, secs)
	}
	return homeIdleProbeInterval
}

// readySince is when the Pod last became Ready (zero: not known).
func readySince(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// refusedResize reports whether the kubelet refused the Pod's last resize.
func refusedResize(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizePending && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonInfeasible {
			return true
		}
	}
	return false
}

// resizeHome resizes home's fiberd requests to requests (pods/resize; its
// limits are not changed) and marks the Pod with to.
func (r *Reconciler) resizeHome(ctx context.Context, g *v1alpha1.CapacityGrant, home *corev1.Pod, requests corev1.ResourceList, to string, idleSeconds int64) {
	logger := logging.FromContext(ctx)
	pods := r.kube.CoreV1().Pods(r.homesNamespace)
	start := time.Now()
	resized, err := pods.UpdateResize(ctx, home.Name, resources.WithRequests(home, requests), metav1.UpdateOptions{})
	switch {
	case apierrs.IsConflict(err) || apierrs.IsNotFound(err):
		// Changed or gone meanwhile: its next reconcile looks again.
		return
	case err != nil:
		r.refused(ctx, g, home, err)
		return
	}
	took := time.Since(start)
	// The annotation says which reservation the grant controller gave
	// (also across a change of home-idle-memory or home-idle-cpu).
	r.markReservation(ctx, g, resized, to)
	mem, cpu := requests[corev1.ResourceMemory], requests[corev1.ResourceCPU]
	msg, reason := "Home gave back its scheduler reservation while idle", reasonReservationReleased
	if to == resources.ReservationFull {
		msg, reason = "Home took back its scheduler reservation", reasonReservationRestored
	}
	logger.Infow(msg, "home", g.Status.Home, "pod", home.Name, "idleSeconds", idleSeconds,
		"memoryRequest", mem.String(), "cpuRequest", cpu.String(), "took", took.String())
	if rec := controller.GetEventRecorder(ctx); rec != nil {
		rec.Eventf(g, corev1.EventTypeNormal, reason, "%s: Home Pod %s/%s requests memory %s, CPU %s (limits unchanged)", msg, r.homesNamespace, home.Name, mem.String(), cpu.String())
	}
}

// markReservation sets home's reservation annotation to to, by a merge
// patch: an Update carrying the resize's resourceVersion lost to the
// kubelet's status write after the resize nearly every time (9 of 20 Homes
// of the first cluster run were resized and never marked).
func (r *Reconciler) markReservation(ctx context.Context, g *v1alpha1.CapacityGrant, home *corev1.Pod, to string) {
	if home.Annotations[resources.ReservationAnnotation] == to {
		return
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, resources.ReservationAnnotation, to)
	if _, err := r.kube.CoreV1().Pods(r.homesNamespace).Patch(ctx, home.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrs.IsNotFound(err) {
		logging.FromContext(ctx).Warnw("Marking a Home's reservation", "home", g.Status.Home, "pod", home.Name, "error", err)
	}
}

// refused: the Home is left as it is (it serves: its limits never
// change) and not resized again for homeResizeRetry.
func (r *Reconciler) refused(ctx context.Context, g *v1alpha1.CapacityGrant, home *corev1.Pod, err error) {
	r.idle.leave(home.UID, r.now().Add(homeResizeRetry))
	logging.FromContext(ctx).Warnw("Resizing a Home's reservation was refused; leaving it as it is", "home", g.Status.Home, "pod", home.Name, "retryIn", homeResizeRetry.String(), "error", err)
	if rec := controller.GetEventRecorder(ctx); rec != nil {
		rec.Eventf(g, corev1.EventTypeWarning, reasonResizeRefused, "Resizing Home Pod %s/%s's requests was refused (%v); it keeps its reservation as it is, tried again in %s", r.homesNamespace, home.Name, err, homeResizeRetry)
	}
}
