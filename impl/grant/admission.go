// Admission: what the CRD schema cannot check, and the grant against the
// installation's capacity (docs/security.md §8).

package grant

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
)

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
