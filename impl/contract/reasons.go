package contract

// Reason is a CamelCase, machine-readable reason shared between components:
// in fiberd's JSON answers (the "reason" field), in a CapacityGrant's
// conditions and status.handlerFailure, and in the Revision conditions set
// from them. Components compare reasons, never messages; messages are for
// people.
type Reason string

// String returns the reason as conditions and JSON carry it.
func (r Reason) String() string { return string(r) }

// Reasons of fiberd's API answers (impl/fiberd/server, impl/fiberd/client;
// docs/contracts.md §4).
const (
	ReasonMaxFibersReached Reason = "MaxFibersReached"
	ReasonNoValidGrant     Reason = "NoValidGrant"
	ReasonNotReady         Reason = "NotReady"
	ReasonUnknownFiber     Reason = "UnknownFiber"
	ReasonFiberBusy        Reason = "FiberBusy"
	ReasonFiberSpent       Reason = "FiberSpent"
	ReasonUnauthorized     Reason = "Unauthorized"
	ReasonFiberFailed      Reason = "FiberFailed"
	ReasonTunnelRefused    Reason = "TunnelRefused"
	ReasonRequestTimeout   Reason = "RequestTimeout"
)

// Why fiberd cannot run a grant's Revision (its load error, the reason of
// /readyz's 503 and of GET /v1/grant's loadReason). They do not heal by
// waiting: the grant or its snapshot must change, so the grant controller
// makes HomeReady False with them (LoadFailure).
const (
	ReasonSnapshotUnavailable Reason = "SnapshotUnavailable"
	ReasonSnapshotTooLarge    Reason = "SnapshotTooLarge"
	ReasonInvalidGrant        Reason = "InvalidGrant"
	// ReasonTemplateMismatch is also a grant reason (see below): from
	// fiberd it means a template port other than the snapshot's.
)

// LoadFailure reports whether r is a reason for which fiberd refuses to run
// a Revision until the grant or its snapshot changes.
func LoadFailure(r Reason) bool {
	switch r {
	case ReasonTemplateMismatch, ReasonSnapshotUnavailable, ReasonSnapshotTooLarge, ReasonInvalidGrant:
		return true
	}
	return false
}

// Why a Revision's handler does not start in a fiber: fiberd's /readyz
// reason with the details in its "handler" field, then HomeReady's reason
// and status.handlerFailure.reason, then the Revision's ContainerHealthy.
const (
	// ReasonHandlerExited: it exited, or a signal killed it, before it
	// listened on $PORT.
	ReasonHandlerExited Reason = "HandlerExited"
	// ReasonHandlerNotListening: it did not listen on $PORT within the
	// snapshot's startupTimeoutSeconds.
	ReasonHandlerNotListening Reason = "HandlerNotListening"
	// ReasonHandlerNotReady: it did not answer the snapshot's readinessPath
	// with 2xx within the start-up timeout.
	ReasonHandlerNotReady Reason = "HandlerNotReady"
)

// HandlerFailure reports whether r says the Revision's handler fails its
// fiber starts.
func HandlerFailure(r Reason) bool {
	switch r {
	case ReasonHandlerExited, ReasonHandlerNotListening, ReasonHandlerNotReady:
		return true
	}
	return false
}

// CapacityGrant condition reasons the grant controller sets (Admitted,
// HomeReady). They are copied verbatim into the Revision's conditions, so
// each says what to change.
const (
	// ReasonAdmitted: the grant fits the installation's capacity.
	ReasonAdmitted Reason = "Admitted"
	// ReasonInsufficientMemory: memoryPerFiber × maxFibers does not fit in
	// what is left of the installation's fiber memory.
	ReasonInsufficientMemory Reason = "InsufficientMemory"
	// ReasonNamespaceShareExceeded: the grant does not fit its namespace's
	// share of the installation's fiber memory.
	ReasonNamespaceShareExceeded Reason = "NamespaceShareExceeded"
	// ReasonFailedCreate: the Revision's quota Pod could not be created in
	// its namespace (ResourceQuota or LimitRange refused it); the message is
	// the API server's, as stock Knative shows a Deployment's ReplicaFailure
	// (reason FailedCreate) on the Revision.
	ReasonFailedCreate Reason = "FailedCreate"
	// ReasonQuotaPodNameTaken: a Pod the grant controller did not make holds
	// the quota Pod's name.
	ReasonQuotaPodNameTaken Reason = "QuotaPodNameTaken"
	// ReasonMemoryPerFiberTooLarge: one fiber asks more than the per-fiber cap.
	ReasonMemoryPerFiberTooLarge Reason = "MemoryPerFiberTooLarge"
	// ReasonTooManyFibers: maxFibers is above the per-grant cap.
	ReasonTooManyFibers Reason = "TooManyFibers"
	// ReasonInvalidSpec: the spec breaks a rule the CRD schema cannot express.
	ReasonInvalidSpec Reason = "InvalidSpec"
	// ReasonHomePending: the Home Pod is being created or scheduled.
	ReasonHomePending Reason = "HomePending"
	// ReasonHomeNotReady: fiberd runs but is not ready (no grant yet,
	// template or snapshot not loaded, pool not warm); message from the Pod.
	ReasonHomeNotReady Reason = "HomeNotReady"
	// ReasonHomeFailed: the Home Pod failed and is being replaced.
	ReasonHomeFailed Reason = "HomeFailed"
	// ReasonNotAdmitted: HomeReady cannot become true before admission.
	ReasonNotAdmitted Reason = "NotAdmitted"
	// ReasonHomeImageMissing: no Home image is configured.
	ReasonHomeImageMissing Reason = "HomeImageMissing"
	// ReasonHomeImageNotPinned: home-image or helper-image is not a
	// repository@sha256 reference.
	ReasonHomeImageNotPinned Reason = "HomeImageNotPinned"
	// ReasonHomeNameTaken: an object the grant controller did not make holds
	// the Home's name.
	ReasonHomeNameTaken Reason = "HomeNameTaken"

	// Why the grant's sealed template cannot run (docs/security.md §2); the
	// grant controller opens templates, so these come from it, except
	// TemplateMismatch, which fiberd also reports.

	// ReasonTemplateUnavailable: the registry does not give the template.
	ReasonTemplateUnavailable Reason = "TemplateUnavailable"
	// ReasonTemplatePending: the sealed template and the snapshot artifact
	// are being fetched and checked (off the reconcile workers, one at a
	// time per namespace).
	ReasonTemplatePending Reason = "TemplatePending"
	// ReasonTemplateUnsealable: no fleet key of the installation opens it, or
	// it was altered.
	ReasonTemplateUnsealable Reason = "TemplateUnsealable"
	// ReasonTemplateUnauthenticated: it is not signed (format v1), or not by
	// a sealer the installation trusts, or the signature does not verify.
	ReasonTemplateUnauthenticated Reason = "TemplateUnauthenticated"
	// ReasonTemplateNotAuthorized: its sealer may not seal for its namespace.
	ReasonTemplateNotAuthorized Reason = "TemplateNotAuthorized"
	// ReasonTemplateMismatch: it was sealed for another namespace, Revision,
	// snapshot or execution policy (or, from fiberd, another port than the
	// snapshot's).
	ReasonTemplateMismatch Reason = "TemplateMismatch"
)

// Revision condition reasons the Revision reconciler adds to the stock ones
// (v1.ReasonDeploying, v1.ReasonNotOwned, v1.ReasonContainerMissing), from
// the grant's and the Home's state.
const (
	// ReasonWaitingForGrant: the grant controller has not decided yet.
	ReasonWaitingForGrant Reason = "WaitingForCapacityGrant"
	// ReasonWaitingForHome: admitted, the Home is not ready yet.
	ReasonWaitingForHome Reason = "WaitingForHome"
	// ReasonVerifyingArtifact: the snapshot artifact's check in its registry
	// (config-lampyr verify-artifacts) is queued or running, or failed and
	// waits to run again; the message says which.
	ReasonVerifyingArtifact Reason = "VerifyingArtifact"
	// ReasonInvalidCapacityGrant: the API server refused the CapacityGrant
	// built from the Revision (its CRD validation is stricter than ours).
	ReasonInvalidCapacityGrant Reason = "InvalidCapacityGrant"
	// ReasonGrantRefused is used when a refusal carries no reason of its own.
	ReasonGrantRefused Reason = "CapacityGrantRefused"
)

// Reasons of the FibersPreinitialized condition (grant and Revision; on a
// backend that pre-initializes fibers only, severity Info: Ready does not
// depend on it).
const (
	// ReasonCheckpointFailed: no checkpoint of the initialized handler
	// could be made; the Revision's fibers start cold (the message says
	// why).
	ReasonCheckpointFailed Reason = "CheckpointFailed"
	// ReasonCheckpointPending: the checkpoint is made by the Revision's
	// first fiber start, which has not happened yet.
	ReasonCheckpointPending Reason = "CheckpointPending"
)
