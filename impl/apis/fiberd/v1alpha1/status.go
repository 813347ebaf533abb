package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"

	"lampyr.dev/serving/impl/contract"
)

// grantConditions: Ready is true when the grant is admitted and its Home is
// ready.
var grantConditions = apis.NewLivingConditionSet(GrantConditionAdmitted, GrantConditionHomeReady)

// The reasons of a grant's conditions are contract.Reason values
// (impl/contract: ReasonAdmitted, ReasonInsufficientMemory, ...,
// ReasonHandlerExited), shared with fiberd and the Revision reconciler.

// MaxHandlerOutput bounds HandlerFailure.Output (kubelet's bound on a
// container's termination message taken from its logs).
const MaxHandlerOutput = 2048

// GetConditionSet implements apis.ConditionsAccessor's companion interface.
func (*CapacityGrant) GetConditionSet() apis.ConditionSet { return grantConditions }

// GetStatus returns the grant's duck status: with GetConditionSet it makes a
// CapacityGrant duckv1.KRShaped, so the generated reconciler initializes its
// conditions and sets status.observedGeneration around ReconcileKind.
func (g *CapacityGrant) GetStatus() *duckv1.Status { return &g.Status.Status }

// GetGroupVersionKind returns the GVK of a CapacityGrant.
func (*CapacityGrant) GetGroupVersionKind() schema.GroupVersionKind {
	return SchemeGroupVersion.WithKind("CapacityGrant")
}

// InitializeConditions sets every condition the grant controller owns to
// Unknown if it is not set yet.
func (s *CapacityGrantStatus) InitializeConditions() {
	grantConditions.Manage(s).InitializeConditions()
}

// MarkAdmitted records that the grant fits the installation's capacity.
func (s *CapacityGrantStatus) MarkAdmitted(message string) {
	m := grantConditions.Manage(s)
	m.MarkTrue(GrantConditionAdmitted)
	if c := m.GetCondition(GrantConditionAdmitted); c != nil {
		c.Reason, c.Message = contract.ReasonAdmitted.String(), message
		m.SetCondition(*c)
	}
}

// MarkNotAdmitted refuses the grant with a reason and an actionable message.
func (s *CapacityGrantStatus) MarkNotAdmitted(reason contract.Reason, messageFormat string, args ...any) {
	m := grantConditions.Manage(s)
	// HomeReady first: Ready takes the reason of the last condition marked
	// false, and the refusal is what a Revision's owner must see.
	m.MarkFalse(GrantConditionHomeReady, contract.ReasonNotAdmitted.String(), "No Home runs for a grant that is not admitted.")
	m.MarkFalse(GrantConditionAdmitted, reason.String(), messageFormat, args...)
}

// MarkHomeReady records that the Home holds a valid grant and loaded the template.
func (s *CapacityGrantStatus) MarkHomeReady() {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkTrue(GrantConditionHomeReady)
}

// MarkHomeNotReady records why the Home is not ready yet (Unknown: it may
// still become ready).
func (s *CapacityGrantStatus) MarkHomeNotReady(reason contract.Reason, messageFormat string, args ...any) {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkUnknown(GrantConditionHomeReady, reason.String(), messageFormat, args...)
}

// MarkHomeFailed records that the Home failed.
func (s *CapacityGrantStatus) MarkHomeFailed(reason contract.Reason, messageFormat string, args ...any) {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkFalse(GrantConditionHomeReady, reason.String(), messageFormat, args...)
}

// MarkHandlerFailed records that the Home runs but the Revision's handler
// fails its fiber starts: HomeReady False with f's reason and message (the
// handler's last output included), and f itself in HandlerFailure.
func (s *CapacityGrantStatus) MarkHandlerFailed(f HandlerFailure, message string) {
	if f.Output != "" {
		message += "; last output:\n" + f.Output
	}
	grantConditions.Manage(s).MarkFalse(GrantConditionHomeReady, f.Reason.String(), "%s", message)
	s.HandlerFailure = &f
}

// MarkFibersPreinitialized records that the Home Pod podUID restores the
// Revision's fibers from a checkpoint of the initialized handler.
func (s *CapacityGrantStatus) MarkFibersPreinitialized(podUID string) {
	s.PreinitObservedPod = podUID
	grantConditions.Manage(s).MarkTrue(GrantConditionFibersPreinitialized)
}

// MarkFibersStartCold records that the Home Pod podUID starts the
// Revision's fibers cold, and why (severity Info: the Revision serves).
func (s *CapacityGrantStatus) MarkFibersStartCold(podUID string, messageFormat string, args ...any) {
	s.PreinitObservedPod = podUID
	grantConditions.Manage(s).MarkFalse(GrantConditionFibersPreinitialized, contract.ReasonCheckpointFailed.String(), messageFormat, args...)
}

// MarkFibersPreinitPending records that no checkpoint is made yet: the
// Revision's first fiber start makes it (PreinitObservedPod is left, so
// the Home is asked again).
func (s *CapacityGrantStatus) MarkFibersPreinitPending(messageFormat string, args ...any) {
	grantConditions.Manage(s).MarkUnknown(GrantConditionFibersPreinitialized, contract.ReasonCheckpointPending.String(), messageFormat, args...)
}

// ClearFibersPreinitialized removes the condition (a backend that does not
// pre-initialize fibers).
func (s *CapacityGrantStatus) ClearFibersPreinitialized(podUID string) {
	s.PreinitObservedPod = podUID
	grantConditions.Manage(s).ClearCondition(GrantConditionFibersPreinitialized)
}

// IsAdmitted reports whether the grant is admitted.
func (s *CapacityGrantStatus) IsAdmitted() bool {
	return s.GetCondition(GrantConditionAdmitted).IsTrue()
}

// IsReady reports whether the grant is admitted and its Home ready.
func (s *CapacityGrantStatus) IsReady() bool {
	return grantConditions.Manage(s).IsHappy()
}
