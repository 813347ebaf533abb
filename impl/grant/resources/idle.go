package resources

import (
	corev1 "k8s.io/api/core/v1"

	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// Idle Homes (config-lampyr home-idle-after): a Home whose fiberd has had
// no fiber leased for home-idle-after gives back its scheduler reservation
// (its fiberd container's requests are resized in place to IdleRequests)
// and takes it back (HomeResources' requests) when traffic returns. Its
// limits never change, so an idle Home still serves its first request at
// once; the tenant's quota Pod keeps counting the full reservation.
const (
	// ReservationAnnotation on a Home Pod says which requests the grant
	// controller last gave its fiberd container: ReservationIdle or
	// ReservationFull. Absent: as created (full).
	ReservationAnnotation = "lampyr.dev/home-reservation"
	ReservationIdle       = "idle"
	ReservationFull       = "full"
)

// IdleRequests are an idle Home's fiberd requests.
func IdleRequests(cfg *lampyrconfig.Config) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceMemory: cfg.HomeIdleMemory, corev1.ResourceCPU: cfg.HomeIdleCPU}
}

// FiberdOf is the Home Pod's fiberd container (nil: none).
func FiberdOf(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == FiberdContainer {
			return &p.Spec.Containers[i]
		}
	}
	return nil
}

// SameRequests reports whether have requests exactly want's memory and CPU.
func SameRequests(have, want corev1.ResourceList) bool {
	for _, n := range []corev1.ResourceName{corev1.ResourceMemory, corev1.ResourceCPU} {
		h, okh := have[n]
		w, okw := want[n]
		if okh != okw || h.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

// WithRequests is a copy of p whose fiberd container requests memory and
// CPU as requests say; its limits and every other request are kept.
func WithRequests(p *corev1.Pod, requests corev1.ResourceList) *corev1.Pod {
	upd := p.DeepCopy()
	c := FiberdOf(upd)
	if c == nil {
		return upd
	}
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	for n, q := range requests {
		c.Resources.Requests[n] = q
	}
	return upd
}
