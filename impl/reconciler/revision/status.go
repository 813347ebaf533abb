package revision

import (
	"fmt"
	"strings"
	"time"

	"knative.dev/pkg/apis"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

// Condition reasons Lampyr adds to the stock ones (v1.ReasonDeploying,
// v1.ReasonNotOwned, v1.ReasonContainerMissing) are contract.Reason values:
// contract.ReasonWaitingForGrant, ReasonWaitingForHome,
// ReasonInvalidCapacityGrant, ReasonGrantRefused, and the grant's own
// reasons passed through.

// Condition messages; messages that come from elsewhere (grant refusals)
// are passed through "%s" so a '%' in them survives.
const (
	MessageWaitingForHome    = "Waiting for the CapacityGrant's Home to load the sealed template."
	MessageWaitingForGrant   = "Waiting for the grant controller to admit the CapacityGrant."
	MessageWaitingForBackend = "Waiting for the backend Service."
	MessageWaitingForRouting = "Waiting for the Home before routing to the Revision."
	MessageRejected          = "The Revision cannot run on Lampyr."
	MessageNotAdmitted       = "No Home runs for a CapacityGrant that is not admitted."
)

// revisionConditions is the stock Revision condition set (Ready =
// ResourcesAvailable AND ContainerHealthy; Active outside it).
var revisionConditions = (&v1.Revision{}).GetConditionSet()

// progress collects what the reconcile steps observed; markConditions turns
// it into conditions in one place, so the reader finds every rule here.
type progress struct {
	tmpl *resources.Template
	cfg  *lampyrconfig.Config

	// artifactMissing is set when the registry says the artifact is absent.
	artifactMissing string
	// artifactUnverified says why the artifact is not verified yet (its
	// check is queued, running, or failed and waits to run again).
	artifactUnverified string
	// grantInvalid is the API server's refusal of the grant we built.
	grantInvalid string
	// notOwned names objects that exist under our names but are not ours.
	notOwned []string
	// grant is the CapacityGrant as last read (status from the grant controller).
	grant *fiberdv1alpha1.CapacityGrant
	// grantSpecWritten: we just created or changed the grant spec, so its
	// status does not describe it yet.
	grantSpecWritten bool
	serviceReady     bool
	sliceReady       bool
	// clusterIP and servicePort of the backend Service, as last read.
	clusterIP   string
	servicePort int32
	// backendUnreachable is the backend address that did not accept a
	// connection yet (BackendProber); requeueAfter asks to look again.
	backendUnreachable string
	requeueAfter       time.Duration
	// routerReady: everything but the metadata is ready (its ready flag).
	routerReady bool
	// published: the metadata ConfigMap matches what we want.
	published bool
}

// grantCondition is nil unless the grant's status describes its current
// spec: not in the reconcile that wrote the spec, and only once the grant
// controller has observed the grant's generation.
func (p *progress) grantCondition(t apis.ConditionType) *apis.Condition {
	if p.grant == nil || p.grantSpecWritten || p.grant.Status.ObservedGeneration != p.grant.Generation {
		return nil
	}
	return p.grant.Status.GetCondition(t)
}

// home is what router metadata says of the Home: set only while the grant
// is Ready, since fiber-router must not be pointed at a Home that has not
// loaded the Revision.
func (p *progress) home() resources.Home {
	if !p.grantCondition(fiberdv1alpha1.GrantConditionReady).IsTrue() {
		return resources.Home{}
	}
	return resources.Home{Name: p.grant.Status.Home, Endpoint: p.grant.Status.HomeEndpoint, KeySHA256: p.grant.Status.HomeKeySHA256}
}

// backendReady is the backend Service plus, in the endpointslice strategy,
// its mirrored EndpointSlice.
func (p *progress) backendReady() bool {
	if p.cfg.BackendStrategy == lampyrconfig.BackendEndpointSlice {
		return p.serviceReady && p.sliceReady && p.backendUnreachable == ""
	}
	return p.serviceReady
}

// readyForRouting: verified artifact, admitted grant, ready Home with an
// endpoint, ready backend. Router metadata says ready exactly then.
func (p *progress) readyForRouting() bool {
	return p.artifactMissing == "" && p.artifactUnverified == "" && len(p.notOwned) == 0 && p.grantInvalid == "" &&
		p.grantCondition(fiberdv1alpha1.GrantConditionAdmitted).IsTrue() &&
		p.grantCondition(fiberdv1alpha1.GrantConditionHomeReady).IsTrue() &&
		p.home().Endpoint != "" && p.home().Name != "" && p.backendReady()
}

// markConditions maps what was observed onto the stock Revision conditions:
//
//	ContainerHealthy  = artifact verified AND the Home is ready (fiberd has
//	                    opened the sealed template and warmed its pool: the
//	                    fiber analogue of a container passing readiness).
//	ResourcesAvailable = grant admitted AND backend Service ready AND router
//	                    metadata published with ready=true.
//	Ready             = both (the stock living condition set).
//	Active            = True once Ready: fibers start per request, so a
//	                    ready Revision is always able to serve.
func (p *progress) markConditions(st *v1.RevisionStatus) {
	admitted := p.grantCondition(fiberdv1alpha1.GrantConditionAdmitted)
	home := p.grantCondition(fiberdv1alpha1.GrantConditionHomeReady)

	m := revisionConditions.Manage(st)
	switch {
	case p.artifactMissing != "":
		m.MarkFalse(v1.RevisionConditionContainerHealthy, v1.ReasonContainerMissing, "%s", p.artifactMissing)
	case p.artifactUnverified != "":
		m.MarkUnknown(v1.RevisionConditionContainerHealthy, contract.ReasonVerifyingArtifact.String(), "%s", p.artifactUnverified)
	case admitted.IsFalse():
		// The grant controller marks HomeReady False (NotAdmitted) on a
		// refusal; nothing ran, so health is unknown, and the refusal is
		// reported once, on ResourcesAvailable.
		m.MarkUnknown(v1.RevisionConditionContainerHealthy, contract.ReasonNotAdmitted.String(), "%s", MessageNotAdmitted)
	case home.IsFalse() && p.handlerFailure(home) != nil:
		reason, msg := containerFailed(p.handlerFailure(home), home.Message)
		m.MarkFalse(v1.RevisionConditionContainerHealthy, reason, "%s", msg)
	case home.IsFalse():
		m.MarkFalse(v1.RevisionConditionContainerHealthy, reasonOr(home.Reason, contract.ReasonWaitingForHome), "%s", home.Message)
	case home.IsTrue():
		m.MarkTrue(v1.RevisionConditionContainerHealthy)
	default:
		m.MarkUnknown(v1.RevisionConditionContainerHealthy, contract.ReasonWaitingForHome.String(), "%s", MessageWaitingForHome)
	}

	switch {
	case p.grantInvalid != "":
		m.MarkFalse(v1.RevisionConditionResourcesAvailable, contract.ReasonInvalidCapacityGrant.String(), "%s", p.grantInvalid)
	case len(p.notOwned) > 0:
		m.MarkFalse(v1.RevisionConditionResourcesAvailable, v1.ReasonNotOwned, "%s", strings.Join(p.notOwned, " "))
	case admitted.IsFalse():
		// The grant controller's refusal, verbatim (docs/contracts.md §1).
		m.MarkFalse(v1.RevisionConditionResourcesAvailable, reasonOr(admitted.Reason, contract.ReasonGrantRefused), "%s", admitted.Message)
	case !admitted.IsTrue():
		m.MarkUnknown(v1.RevisionConditionResourcesAvailable, contract.ReasonWaitingForGrant.String(), "%s", MessageWaitingForGrant)
	case !p.backendReady():
		m.MarkUnknown(v1.RevisionConditionResourcesAvailable, v1.ReasonDeploying, "%s", MessageWaitingForBackend)
	case !p.published || !p.routerReady:
		m.MarkUnknown(v1.RevisionConditionResourcesAvailable, v1.ReasonDeploying, "%s", MessageWaitingForRouting)
	default:
		m.MarkTrue(v1.RevisionConditionResourcesAvailable)
	}

	if p.artifactUnverified != "" {
		// Nothing routes the Revision before its artifact is verified, so
		// that is what Ready (and kubectl's REASON) waits for, not the
		// Home or the backend it waits for meanwhile.
		m.MarkUnknown(v1.RevisionConditionContainerHealthy, contract.ReasonVerifyingArtifact.String(), "%s", p.artifactUnverified)
	}

	p.markPreinit(m)

	ready := st.GetCondition(v1.RevisionConditionReady)
	switch {
	case ready.IsTrue():
		m.MarkTrue(v1.RevisionConditionActive)
	case ready != nil:
		m.MarkUnknown(v1.RevisionConditionActive, reasonOr(ready.Reason, contract.Reason(v1.ReasonDeploying)), "%s", ready.Message)
	}
}

// ConditionFibersPreinitialized is the grant's condition of the same name,
// passed on to the Revision (a Lampyr addition, severity Info: Ready does
// not depend on it): on a backend that pre-initializes fibers (gvisor with
// fiber-gvisor-preinit), True when the Revision's fibers are restored from
// a checkpoint of the initialized handler, False (CheckpointFailed) when
// they start cold, and why. Absent on any other backend.
const ConditionFibersPreinitialized = fiberdv1alpha1.GrantConditionFibersPreinitialized

// markPreinit passes the grant's FibersPreinitialized on. It runs after
// the dependents are marked: MarkTrue of a condition outside them
// recomputes Ready from them, unchanged.
func (p *progress) markPreinit(m apis.ConditionManager) {
	if p.grant == nil {
		return
	}
	c := p.grant.Status.GetCondition(fiberdv1alpha1.GrantConditionFibersPreinitialized)
	switch {
	case c == nil:
		m.ClearCondition(ConditionFibersPreinitialized)
	case c.IsTrue():
		m.MarkTrue(ConditionFibersPreinitialized)
	case c.IsFalse():
		m.MarkFalse(ConditionFibersPreinitialized, c.Reason, "%s", c.Message)
	default:
		m.MarkUnknown(ConditionFibersPreinitialized, c.Reason, "%s", c.Message)
	}
}

// handlerFailure is the grant's typed report of a handler that fails its
// fiber starts, when that is what HomeReady says.
func (p *progress) handlerFailure(home *apis.Condition) *fiberdv1alpha1.HandlerFailure {
	f := p.grant.Status.HandlerFailure
	if f == nil || home == nil || f.Reason.String() != home.Reason {
		return nil
	}
	return f
}

// containerFailed says what stock Knative says of a container that exits
// before it is ready (ContainerHealthy=False, reason ExitCode<N>, message
// "Container failed with: " and the container's last output), for a
// handler that exits; a handler that never listens or never answers its
// readiness path keeps fiberd's reason (stock would wait out the progress
// deadline instead) and the grant's message (what it did not do, on which
// port, within which timeout; then its output), which names nothing of the
// Home.
func containerFailed(f *fiberdv1alpha1.HandlerFailure, homeMessage string) (reason, message string) {
	if f.Reason == contract.ReasonHandlerExited {
		out := f.Output
		switch {
		case out != "":
		case f.Signal != "":
			out = "container was killed by signal " + f.Signal + " and wrote no output"
		case f.ExitCode == 0:
			out = "container exited with no error"
		default:
			out = fmt.Sprintf("container exited with code %d and wrote no output", f.ExitCode)
		}
		return v1.ExitCodeReason(f.ExitCode), v1.RevisionContainerExitingMessage(out)
	}
	return f.Reason.String(), v1.RevisionContainerExitingMessage(homeMessage)
}

// markRejected reports a template outside the subset: ResourcesAvailable
// (hence Ready) False with the reason naming the first offending field.
// ContainerHealthy stays Unknown: nothing was started.
func markRejected(st *v1.RevisionStatus, r Rejection) {
	m := revisionConditions.Manage(st)
	m.MarkFalse(v1.RevisionConditionResourcesAvailable, r.Reason(), "%s", r.Message())
	m.MarkFalse(v1.RevisionConditionActive, r.Reason(), "%s", MessageRejected)
	// No container status: nothing was accepted to record.
	st.ContainerStatuses = nil
}

// recordContainerStatus records the independently supplied runnable image.
// It is already digest-pinned (validation requires it), so it is its own
// resolved digest, like stock's resolved imageDigest.
func recordContainerStatus(st *v1.RevisionStatus, t *resources.Template) {
	st.ContainerStatuses = []v1.ContainerStatus{{Name: t.ContainerName, ImageDigest: t.Image}}
}

// reasonOr is reason, a condition's, or fallback when it has none.
func reasonOr(reason string, fallback contract.Reason) string {
	if reason == "" {
		return fallback.String()
	}
	return reason
}
