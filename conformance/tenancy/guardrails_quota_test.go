package tenancy

// G1: ResourceQuota and LimitRange act on what a Lampyr Revision takes as
// on a stock Revision's Pod (docs/security.md, "What a tenant's Kubernetes
// objects still mean"): the grant controller creates, per admitted grant,
// a never-scheduled quota Pod in the tenant's namespace carrying the Home's
// requests and limits, so the API server's own quota and LimitRange
// admission refuse it, and the Revision shows stock's words.

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"lampyr.dev/serving/clusters/e2eutil"
)

// quotaComponentLabel marks the grant controller's quota Pods (one per
// admitted CapacityGrant, in the grant's namespace; issue 31 design §1).
const quotaComponentLabel = "app.kubernetes.io/component=lampyr-quota"

// reasonFailedCreate is stock's reason when a Revision's Pods are refused
// (the Deployment's ReplicaFailure, propagated by the Revision reconciler),
// which Lampyr must show too.
const reasonFailedCreate = "FailedCreate"

const quotaServices = 6

func quotaSix(ctx context.Context, s *side) (string, string, bool) {
	t := rowTenant(ctx, s, nsQuota)
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: nsQuota},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}},
	}
	// The platform team's object: `edit` cannot write quotas.
	_, err := s.admin.Kube.CoreV1().ResourceQuotas(nsQuota).Create(ctx, q, metav1.CreateOptions{})
	must(err, "administrator creating ResourceQuota pods=2")
	// Admission counts against status.used, which the quota controller
	// fills in a moment after creation.
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := s.admin.Kube.CoreV1().ResourceQuotas(nsQuota).Get(ctx, "pods", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, ok := got.Status.Hard[corev1.ResourcePods]
		return ok, nil
	})
	must(err, "waiting for the quota controller to take ResourceQuota pods")

	// One after another: each Service is applied once the previous one's
	// Revision is charged to the quota (a Pod of it exists) or refused, so
	// both clusters see the same order. Stock scales idle Revisions to
	// zero within a minute or two, which would free the quota: the verdicts
	// are taken as soon as all six have settled.
	names := make([]string, quotaServices)
	for i := range names {
		names[i] = fmt.Sprintf("quota-%d", i+1)
		applyAs(ctx, t, handlerService(s, nsQuota, names[i], "64Mi", 1))
		must(chargedOrSettled(ctx, s, t, names[i], i+1, 3*time.Minute), "quota row")
	}
	states := make([]revisionState, len(names))
	for i, n := range names {
		states[i] = settle(ctx, t, n, 5*time.Minute)
	}
	ready := readyNames(states)

	got, err := s.admin.Kube.CoreV1().ResourceQuotas(nsQuota).Get(ctx, "pods", metav1.GetOptions{})
	must(err, "reading ResourceQuota pods")
	used := got.Status.Used[corev1.ResourcePods]
	counted := "Pods"
	quotaPods := -1
	if s == the().lampyr {
		l, err := s.admin.Kube.CoreV1().Pods(nsQuota).List(ctx, metav1.ListOptions{LabelSelector: quotaComponentLabel})
		must(err, "listing the quota Pods")
		quotaPods = len(l.Items)
		var pods []string
		for _, p := range l.Items {
			pods = append(pods, p.Name)
		}
		counted = fmt.Sprintf("%d Lampyr quota Pods %v", quotaPods, pods)
	}
	answered := 0
	var tallies []string
	for _, n := range ready {
		h, tally := serviceTally(ctx, s, t, nsQuota, n)
		answered += h
		tallies = append(tallies, n+": "+tally)
	}
	var refused []string
	allQuota := true
	for _, st := range states {
		if st.ready.status == "True" {
			continue
		}
		refused = append(refused, st.String())
		ra := st.resourcesAvailable
		if ra.status != "False" || ra.reason != reasonFailedCreate || !strings.Contains(ra.message, "exceeded quota") {
			allQuota = false
		}
	}
	verdict := "Ready: " + strings.Join(ready, ", ")
	obs := fmt.Sprintf("%s (%d/%d answered: %s); not Ready: %s; ResourceQuota status.used pods=%s (%s)",
		verdict, answered, len(ready), strings.Join(tallies, "; "), strings.Join(refused, " | "), used.String(), counted)
	ok := strings.Join(ready, ",") == "quota-1,quota-2" && answered == len(ready) && allQuota && used.Value() == 2
	if s == the().lampyr {
		ok = ok && quotaPods == 2
	}
	if ok {
		defer dropRow(s, nsQuota)
	}
	return obs, verdict, ok
}

// chargedOrSettled waits until Service svc's Revision is charged to the
// quota (on stock a Pod of it exists; on Lampyr the namespace holds n
// quota Pods), Ready, or ResourcesAvailable=False.
func chargedOrSettled(ctx context.Context, s *side, t *tenant, svc string, n int, timeout time.Duration) error {
	rev := svc + "-00001"
	sel := quotaComponentLabel
	if s == the().stock {
		sel = "serving.knative.dev/revision=" + rev
		n = 1
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		if l, err := s.admin.Kube.CoreV1().Pods(t.ns).List(ctx, metav1.ListOptions{LabelSelector: sel}); err == nil && len(l.Items) >= n {
			return true, nil
		}
		u, err := t.c.Dynamic.Resource(e2eutil.Revisions).Namespace(t.ns).Get(ctx, rev, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		r, ra := revisionCond(u, "Ready"), revisionCond(u, "ResourcesAvailable")
		last = r.String() + ", " + ra.String()
		return r.status == "True" || ra.status == "False", nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for Revision %s/%s to be charged to the quota (Pods %s), Ready or refused (last %s): %w", timeout, t.ns, rev, sel, last, err)
	}
	return nil
}

// limitRangeMax is the LimitRange's max memory per container: above what
// the 64Mi Service's Home takes (64Mi + the Home's overhead, 256Mi), below
// what the 768Mi one asks on either platform.
const limitRangeMax = "512Mi"

func limitRangeRow(ctx context.Context, s *side) (string, string, bool) {
	t := rowTenant(ctx, s, nsLimits)
	lr := &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: nsLimits},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type: corev1.LimitTypeContainer,
			Max:  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limitRangeMax)},
			// Explicit defaults: without them the API server defaults a
			// container's request to max, and stock's queue-proxy would
			// reserve 512Mi for nothing.
			Default:        corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limitRangeMax)},
			DefaultRequest: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
		}}},
	}
	_, err := s.admin.Kube.CoreV1().LimitRanges(nsLimits).Create(ctx, lr, metav1.CreateOptions{})
	must(err, "administrator creating LimitRange memory")
	applyAs(ctx, t, handlerService(s, nsLimits, "small", "64Mi", 1))
	applyAs(ctx, t, handlerService(s, nsLimits, "big", "768Mi", 1))
	small := settle(ctx, t, "small", 5*time.Minute)
	big := settle(ctx, t, "big", 5*time.Minute)
	answered, tally := 0, "not asked"
	if small.ready.status == "True" {
		answered, tally = serviceTally(ctx, s, t, nsLimits, "small")
	}
	verdict := fmt.Sprintf("small Ready=%s, big Ready=%s", small.ready.status, big.ready.status)
	obs := fmt.Sprintf("%s (answered %d/1: %s); %s", small, answered, tally, big)
	ok := small.ready.status == "True" && answered == 1 && big.ready.status == "False"
	if s == the().lampyr {
		// Lampyr shows stock's reason with the API server's words (stock's
		// own message may instead be the Pod's validation: its request is
		// above the limit the LimitRange defaulted).
		ra := big.resourcesAvailable
		ok = ok && ra.status == "False" && ra.reason == reasonFailedCreate && strings.Contains(ra.message, "maximum memory usage")
	}
	if ok {
		defer dropRow(s, nsLimits)
	}
	return obs, verdict, ok
}

// serviceTally sends one request to Service ns/svc once the Service is
// Ready. settle saw its Revision Ready; the request waits for the Service
// (its Route programmed on the gateway), as a client would.
func serviceTally(ctx context.Context, s *side, t *tenant, ns, svc string) (int, string) {
	if _, err := t.c.WaitReady(ctx, e2eutil.KServices, ns, svc, 2*time.Minute); err != nil {
		return 0, "Service not Ready: " + err.Error()
	}
	return gatewayTally(ctx, s, svc, ns, 1, helloBody)
}
