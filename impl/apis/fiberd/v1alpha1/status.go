package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
)

// grantConditions: Ready is true when the grant is admitted and its Home is
// ready.
var grantConditions = apis.NewLivingConditionSet(GrantConditionAdmitted, GrantConditionHomeReady)

// Reasons the grant controller sets. They are copied verbatim into the
// Revision's ResourcesAvailable condition when the grant is refused, so each
// says what to change.
const (
	// ReasonAdmitted: the grant fits the installation's capacity.
	ReasonAdmitted = "Admitted"
	// ReasonInsufficientMemory: memoryPerFiber × maxFibers does not fit in
	// what is left of the installation's fiber memory.
	ReasonInsufficientMemory = "InsufficientMemory"
	// ReasonMemoryPerFiberTooLarge: one fiber asks more than the per-fiber cap.
	ReasonMemoryPerFiberTooLarge = "MemoryPerFiberTooLarge"
	// ReasonTooManyFibers: maxFibers is above the per-grant cap.
	ReasonTooManyFibers = "TooManyFibers"
	// ReasonInvalidSpec: the spec breaks a rule the CRD schema cannot express.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonHomePending: the Home Pod is being created or scheduled.
	ReasonHomePending = "HomePending"
	// ReasonHomeNotReady: fiberd runs but is not ready (no grant yet,
	// template or snapshot not loaded, pool not warm); message from the Pod.
	ReasonHomeNotReady = "HomeNotReady"
	// ReasonHomeFailed: the Home Pod failed and is being replaced.
	ReasonHomeFailed = "HomeFailed"
	// ReasonNotAdmitted: HomeReady cannot become true before admission.
	ReasonNotAdmitted = "NotAdmitted"
	// ReasonHomeImageMissing: no Home image is configured.
	ReasonHomeImageMissing = "HomeImageMissing"
	// ReasonHomeImageNotPinned: home-image or helper-image is not a
	// repository@sha256 reference.
	ReasonHomeImageNotPinned = "HomeImageNotPinned"
	// ReasonHomeNameTaken: an object the grant controller did not make holds
	// the Home's name.
	ReasonHomeNameTaken = "HomeNameTaken"

	// Why the grant's sealed template cannot run (docs/security.md §2); the
	// grant controller opens templates, so these never come from fiberd.

	// ReasonTemplateUnavailable: the registry does not give the template.
	ReasonTemplateUnavailable = "TemplateUnavailable"
	// ReasonTemplateUnsealable: no fleet key of the installation opens it, or
	// it was altered.
	ReasonTemplateUnsealable = "TemplateUnsealable"
	// ReasonTemplateUnauthenticated: it is not signed (format v1), or not by
	// a sealer the installation trusts, or the signature does not verify.
	ReasonTemplateUnauthenticated = "TemplateUnauthenticated"
	// ReasonTemplateNotAuthorized: its sealer may not seal for its namespace.
	ReasonTemplateNotAuthorized = "TemplateNotAuthorized"
	// ReasonTemplateMismatch: it was sealed for another namespace, Revision,
	// snapshot or execution policy (or, from fiberd, another port than the
	// snapshot's).
	ReasonTemplateMismatch = "TemplateMismatch"

	// Why the Revision's handler does not start (from fiberd's /readyz;
	// HandlerFailure carries the details).

	// ReasonHandlerExited: it exited, or a signal killed it, before it
	// listened on $PORT.
	ReasonHandlerExited = "HandlerExited"
	// ReasonHandlerNotListening: it did not listen on $PORT within the
	// snapshot's startupTimeoutSeconds.
	ReasonHandlerNotListening = "HandlerNotListening"
	// ReasonHandlerNotReady: it did not answer the snapshot's readinessPath
	// with 2xx within the start-up timeout.
	ReasonHandlerNotReady = "HandlerNotReady"
)

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
		c.Reason, c.Message = ReasonAdmitted, message
		m.SetCondition(*c)
	}
}

// MarkNotAdmitted refuses the grant with a reason and an actionable message.
func (s *CapacityGrantStatus) MarkNotAdmitted(reason, messageFormat string, args ...any) {
	m := grantConditions.Manage(s)
	// HomeReady first: Ready takes the reason of the last condition marked
	// false, and the refusal is what a Revision's owner must see.
	m.MarkFalse(GrantConditionHomeReady, ReasonNotAdmitted, "No Home runs for a grant that is not admitted.")
	m.MarkFalse(GrantConditionAdmitted, reason, messageFormat, args...)
}

// MarkHomeReady records that the Home holds a valid grant and loaded the template.
func (s *CapacityGrantStatus) MarkHomeReady() {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkTrue(GrantConditionHomeReady)
}

// MarkHomeNotReady records why the Home is not ready yet (Unknown: it may
// still become ready).
func (s *CapacityGrantStatus) MarkHomeNotReady(reason, messageFormat string, args ...any) {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkUnknown(GrantConditionHomeReady, reason, messageFormat, args...)
}

// MarkHomeFailed records that the Home failed.
func (s *CapacityGrantStatus) MarkHomeFailed(reason, messageFormat string, args ...any) {
	s.HandlerFailure = nil
	grantConditions.Manage(s).MarkFalse(GrantConditionHomeReady, reason, messageFormat, args...)
}

// MarkHandlerFailed records that the Home runs but the Revision's handler
// fails its fiber starts: HomeReady False with f's reason and message (the
// handler's last output included), and f itself in HandlerFailure.
func (s *CapacityGrantStatus) MarkHandlerFailed(f HandlerFailure, message string) {
	if f.Output != "" {
		message += "; last output:\n" + f.Output
	}
	grantConditions.Manage(s).MarkFalse(GrantConditionHomeReady, f.Reason, "%s", message)
	s.HandlerFailure = &f
}

// IsAdmitted reports whether the grant is admitted.
func (s *CapacityGrantStatus) IsAdmitted() bool {
	return s.GetCondition(GrantConditionAdmitted).IsTrue()
}

// IsReady reports whether the grant is admitted and its Home ready.
func (s *CapacityGrantStatus) IsReady() bool {
	return grantConditions.Manage(s).IsHappy()
}
