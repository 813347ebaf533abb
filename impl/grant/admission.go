// Admission: what the CRD schema cannot check, then the grant against its
// namespace's quota (the quota Pod), its namespace's share and the
// installation's capacity (docs/security.md, "What a tenant's Kubernetes
// objects still mean").

package grant

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

// reconcileValidity checks what the CRD schema cannot; false: refused (the
// condition says why).
func reconcileValidity(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	if msg := validate(g, cfg); msg != "" {
		g.Status.MarkNotAdmitted(contract.ReasonInvalidSpec, "%s", msg)
		return false
	}
	return true
}

// reconcileAdmission admits the grant, once its template and snapshot have
// been checked: first its quota Pod in its own namespace (that namespace's
// ResourceQuota and LimitRange decide), then its namespace's share and the
// installation's capacity. false: refused, or not yet decided (the
// condition says which); a non-nil error is retried.
func (r *Reconciler) reconcileAdmission(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (bool, error) {
	if ok, err := r.reconcileQuotaPod(ctx, g, cfg); !ok || err != nil {
		return false, err
	}
	return r.admit(g, cfg), nil
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

// errQuotaPodGone: the quota Pod was deleted (or is being replaced) and
// cannot be made again until the deletion is through; looked at again
// shortly.
var errQuotaPodGone = errors.New("quota Pod being replaced")

// reconcileQuotaPod keeps g's quota Pod in g's namespace: created if
// missing, replaced if it no longer counts (it ran, or lost its scheduling
// gate: Succeeded and Failed Pods leave the quota). false: the namespace
// refused it (the grant is not admitted; the message is the API server's,
// as stock Knative shows a ReplicaSet's), or a Pod not ours holds its name.
func (r *Reconciler) reconcileQuotaPod(ctx context.Context, g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) (bool, error) {
	want := resources.MakeQuotaPod(g, cfg)
	have, err := r.quotaPods.Pods(g.Namespace).Get(want.Name)
	if err != nil && !apierrs.IsNotFound(err) {
		return false, err
	}
	if have != nil {
		switch {
		case !isQuotaPodOf(have, g):
			g.Status.MarkNotAdmitted(contract.ReasonQuotaPodNameTaken, "Pod %s/%s exists and was not made for this Revision; delete it (Lampyr counts the Revision against this namespace's ResourceQuota with a Pod of that name)", g.Namespace, have.Name)
			return false, nil
		case have.DeletionTimestamp != nil:
			return false, errQuotaPodGone
		case quotaPodCounts(have, want):
			return true, nil
		}
		// It ran (someone removed its gate), ended, belongs to an earlier
		// grant of this name, or carries other resources: it is replaced,
		// and the replacement is counted as a new one.
		if err := r.kube.CoreV1().Pods(g.Namespace).Delete(ctx, have.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &have.UID}}); err != nil && !apierrs.IsNotFound(err) {
			return false, fmt.Errorf("replacing quota Pod %s/%s: %w", g.Namespace, have.Name, err)
		}
		return false, errQuotaPodGone
	}
	_, err = r.kube.CoreV1().Pods(g.Namespace).Create(ctx, want, metav1.CreateOptions{})
	switch {
	case err == nil, apierrs.IsAlreadyExists(err):
		return err == nil, nil
	case apierrs.IsForbidden(err) || apierrs.IsInvalid(err):
		// ResourceQuota ("exceeded quota: ..."), LimitRange ("maximum
		// memory usage per Container is ..."), or the namespace's Pod
		// Security: the tenant's own guard rails, in the API server's
		// words. Its reservation, if it held one, is given back.
		r.forget(g.Namespace + "/" + g.Name)
		setReserved(g, 0)
		g.Status.MarkNotAdmitted(contract.ReasonFailedCreate, "%s", err.Error())
		return false, nil
	}
	return false, fmt.Errorf("creating quota Pod %s/%s: %w", g.Namespace, want.Name, err)
}

// isQuotaPodOf says whether a Pod is a quota Pod made for a grant of g's
// name (its UID may be an earlier grant's: then it is replaced).
func isQuotaPodOf(p *corev1.Pod, g *v1alpha1.CapacityGrant) bool {
	l := p.Labels
	return l[resources.ComponentKey] == contract.QuotaPodComponent && l[contract.GrantNamespaceLabel] == g.Namespace && l[contract.GrantLabel] == g.Name
}

// quotaPodCounts says whether have still counts in its namespace's quota
// as want would: this grant's (its UID), gated, not ended, the same
// resources.
func quotaPodCounts(have, want *corev1.Pod) bool {
	if have.Labels[contract.GrantUIDLabel] != want.Labels[contract.GrantUIDLabel] {
		return false
	}
	gated := false
	for _, sg := range have.Spec.SchedulingGates {
		gated = gated || sg.Name == contract.QuotaPodGate
	}
	if !gated || have.Status.Phase == corev1.PodSucceeded || have.Status.Phase == corev1.PodFailed || len(have.Spec.Containers) != 1 {
		return false
	}
	h, w := have.Spec.Containers[0].Resources, want.Spec.Containers[0].Resources
	return h.Requests.Memory().Cmp(*w.Requests.Memory()) == 0 && h.Limits.Memory().Cmp(*w.Limits.Memory()) == 0 &&
		h.Requests.Cpu().Cmp(*w.Requests.Cpu()) == 0 && h.Limits.Cpu().Cmp(*w.Limits.Cpu()) == 0
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

// released says whether an admitted grant gave its reservation back: its
// Home failed for good (its handler fails its starts, or its template was
// refused), so the memory it booked serves no one. Its reservation is
// counted again only once it is admitted again, like a new grant.
func released(g *v1alpha1.CapacityGrant) bool {
	if g.Status.HandlerFailure != nil {
		return true
	}
	c := g.Status.GetCondition(v1alpha1.GrantConditionHomeReady)
	if c == nil || !c.IsFalse() {
		return false
	}
	switch contract.Reason(c.Reason) {
	case contract.ReasonTemplateUnsealable, contract.ReasonTemplateUnauthenticated, contract.ReasonTemplateNotAuthorized,
		contract.ReasonTemplateMismatch, contract.ReasonSnapshotUnavailable, contract.ReasonSnapshotTooLarge:
		return true
	}
	return false
}

// shareOf is namespace ns's share of capacity: its Namespace's annotation
// if an administrator set one, else the installation's default.
func (r *Reconciler) shareOf(ns string, cfg *lampyrconfig.Config) (lampyrconfig.Share, string) {
	if r.namespaces != nil {
		if n, err := r.namespaces.Get(ns); err == nil {
			if v, ok := n.Annotations[contract.FiberMemoryShareAnnotation]; ok {
				if sh, err := lampyrconfig.ParseShare("Namespace annotation "+contract.FiberMemoryShareAnnotation, v); err == nil {
					return sh, "its Namespace's " + contract.FiberMemoryShareAnnotation
				}
			}
		}
	}
	return cfg.NamespaceShare, lampyrconfig.KeyNamespaceFiberMemoryShare + " in ConfigMap " + contract.ConfigMapName
}

// admit decides admission against the namespace's share and the
// installation's capacity. An admitted grant keeps its reservation even if
// the configuration later shrinks; only a grant that asks for more than it
// holds, or that gave its reservation back, is checked again, like a new
// one. Refusals speak of this namespace only: never of what the
// installation has free or what other namespaces hold.
func (r *Reconciler) admit(g *v1alpha1.CapacityGrant, cfg *lampyrconfig.Config) bool {
	key := g.Namespace + "/" + g.Name
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	want := resources.ReservedMemory(g, cfg)
	wasAdmitted := g.Status.IsAdmitted()
	if released(g) {
		// Its Home failed: it holds nothing while it stays so.
		delete(r.pending, key)
		setReserved(g, 0)
		return true
	}
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
	all, err := r.grants.List(everything)
	if err != nil {
		g.Status.MarkNotAdmitted(ReasonCapacityUnknown, "cannot list CapacityGrants: %v", err)
		return false
	}
	var used, nsUsed int64
	seen := map[string]bool{}
	for _, o := range all {
		k := o.Namespace + "/" + o.Name
		if k == key || o.DeletionTimestamp != nil || !o.Status.IsAdmitted() || released(o) {
			continue
		}
		seen[k] = true
		n := reservedOf(o, cfg)
		used += n
		if o.Namespace == g.Namespace {
			nsUsed += n
		}
	}
	for k, v := range r.pending {
		if !seen[k] && k != key {
			used += v
			if ns, _, _ := cutKey(k); ns == g.Namespace {
				nsUsed += v
			}
		}
	}
	capacity := cfg.FiberMemoryCapacity.Value()
	share, shareFrom := r.shareOf(g.Namespace, cfg)
	fits := func() string {
		return fmt.Sprintf("(memoryPerFiber %s × maxFibers %d)", g.Spec.MemoryPerFiber.String(), resources.EffectiveMaxFibers(g, cfg))
	}
	if limit := share.Of(capacity); nsUsed+want > limit {
		delete(r.pending, key)
		g.Status.MarkNotAdmitted(contract.ReasonNamespaceShareExceeded,
			"needs %s %s, but this namespace's share of fiber memory is %s (%s) and its other Revisions hold %s; lower max-scale or the memory request, delete unused Revisions, or ask an administrator for a larger share",
			bytesQ(want), fits(), bytesQ(limit), shareFrom, bytesQ(nsUsed))
		return false
	}
	if used+want > capacity {
		// A grant that grew beyond what is free loses its admission: its
		// signed grant is no longer renewed, so its Home stops serving at
		// expiry rather than run more than was admitted.
		delete(r.pending, key)
		g.Status.MarkNotAdmitted(contract.ReasonInsufficientMemory,
			"needs %s %s, and the installation's fiber memory is fully reserved (this namespace holds %s of its share of %s); lower max-scale or the memory request, delete unused Revisions, or ask an administrator to raise %s in ConfigMap %s",
			bytesQ(want), fits(), bytesQ(nsUsed), bytesQ(share.Of(capacity)), lampyrconfig.KeyFiberMemoryCapacity, contract.ConfigMapName)
		return false
	}
	r.pending[key] = want
	setReserved(g, want)
	g.Status.MarkAdmitted(fmt.Sprintf("Reserved %s of fiber memory; this namespace holds %s of its share of %s.", bytesQ(want), bytesQ(nsUsed+want), bytesQ(share.Of(capacity))))
	return true
}

// cutKey splits "namespace/name".
func cutKey(k string) (namespace, name string, ok bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:], true
		}
	}
	return "", k, false
}

func bytesQ(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
