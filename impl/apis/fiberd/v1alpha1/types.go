package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"

	"lampyr.dev/serving/impl/contract"
)

// CapacityGrant asks fiberd for the right to run one Revision's fibers. The
// Lampyr Revision reconciler creates exactly one per Revision, named after it
// and owned by it; the grant controller admits or refuses it and runs its Home.
//
// +genclient
// +genreconciler
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CapacityGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CapacityGrantSpec   `json:"spec"`
	Status CapacityGrantStatus `json:"status,omitempty"`
}

// CapacityGrantSpec is the policy translated from the Revision's template.
type CapacityGrantSpec struct {
	// RevisionName is the Knative Revision (same namespace) this grant serves.
	RevisionName string `json:"revisionName"`
	// Template is the digest-pinned reference of the sealed fiberd template
	// (lampyr.dev/fiberd-template on the Revision).
	Template string `json:"template"`
	// SnapshotArtifact is the digest-pinned reference of the Lampyr snapshot
	// artifact (lampyr.dev/snapshot-artifact on the Revision).
	SnapshotArtifact string `json:"snapshotArtifact"`
	// MemoryPerFiber is the Revision's memory request: the memory limit of
	// each fiber.
	MemoryPerFiber resource.Quantity `json:"memoryPerFiber"`
	// MaxFibers is autoscaling.knative.dev/max-scale: the most fibers of this
	// Revision alive at once. 0 means the installation's default cap.
	MaxFibers int32 `json:"maxFibers"`
	// MaxRequestSeconds is timeoutSeconds: the longest life of one request,
	// stream or WebSocket.
	MaxRequestSeconds int64 `json:"maxRequestSeconds"`
	// Execution is the immutable execution policy from lampyr.yaml.
	Execution ExecutionPolicy `json:"execution"`
	// Port is the port the handler listens on inside the fiber (PORT).
	Port int32 `json:"port"`
	// Protocol is "http1" or "h2c" (a named h2c container port).
	Protocol string `json:"protocol"`
	// Env is the Knative runtime contract environment every fiber receives
	// (K_SERVICE, K_CONFIGURATION, K_REVISION). It is set by Lampyr, never
	// taken from the user's template (env overrides are rejected).
	Env map[string]string `json:"env,omitempty"`
}

// ExecutionMode says whether a fiber serves one request or many.
type ExecutionMode string

const (
	// ExecutionFresh gives every request a never-used fiber, released when the
	// response, stream or WebSocket ends.
	ExecutionFresh ExecutionMode = "fresh"
	// ExecutionReuse lets live fibers of the same Revision serve later
	// requests until they have been idle for IdleTimeoutSeconds.
	ExecutionReuse ExecutionMode = "reuse"
)

// IdleActionRelease is the only idle action supported: the fiber is released
// and the next request starts from the original snapshot.
const IdleActionRelease = "release"

// ExecutionPolicy is lampyr.yaml's `execution` block.
type ExecutionPolicy struct {
	Mode               ExecutionMode `json:"mode"`
	IdleTimeoutSeconds int64         `json:"idleTimeoutSeconds,omitempty"`
	IdleAction         string        `json:"idleAction,omitempty"`
}

// Condition types a CapacityGrant reports.
const (
	// GrantConditionReady is Admitted AND HomeReady.
	GrantConditionReady = apis.ConditionReady
	// GrantConditionAdmitted: the grant controller accepted the request
	// against the installation's capacity.
	GrantConditionAdmitted apis.ConditionType = "Admitted"
	// GrantConditionHomeReady: the template opened and fits the Revision, and
	// the Home runs, holds a valid signed grant and has loaded the snapshot.
	GrantConditionHomeReady apis.ConditionType = "HomeReady"
	// GrantConditionFibersPreinitialized, on a backend that pre-initializes
	// fibers (gvisor with fiber-gvisor-preinit) only: True when the
	// Revision's fibers are restored from a checkpoint of the initialized
	// handler, False (ReasonCheckpointFailed) when they start cold. Severity
	// Info: Ready does not depend on it.
	GrantConditionFibersPreinitialized apis.ConditionType = "FibersPreinitialized"
)

// CapacityGrantStatus is written by the grant controller only.
type CapacityGrantStatus struct {
	duckv1.Status `json:",inline"`

	// GrantID identifies the signed grant currently issued to the Home.
	GrantID string `json:"grantID,omitempty"`
	// ExpiresAt is when the current signed grant expires unless renewed.
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`
	// HomeEndpoint is host:port of fiberd's API in the Home, for fiber-router.
	HomeEndpoint string `json:"homeEndpoint,omitempty"`
	// Home names the Home's Pod, Service and Secret in the Homes namespace
	// (lampyr-homes): the audience of the credentials fiber-router presents.
	Home string `json:"home,omitempty"`
	// HomeKeySHA256 is the fingerprint (hex SHA-256 of the
	// SubjectPublicKeyInfo, impl/trust/homekey) of the Home's TLS key, also
	// bound into its signed grant: fiber-router dials the Home over TLS and
	// accepts only this key (docs/security.md §3). Set with status.home.
	HomeKeySHA256 string `json:"homeKeySHA256,omitempty"`
	// HandlerFailure is set while HomeReady is False because the Revision's
	// handler fails its fiber starts (MarkHandlerFailed): the typed facts
	// the Revision reconciler turns into ContainerHealthy=False.
	HandlerFailure *HandlerFailure `json:"handlerFailure,omitempty"`
	// PreinitObservedPod is the UID of the Home Pod whose fiberd said how
	// fibers start (GrantConditionFibersPreinitialized): each Home Pod is
	// asked once.
	PreinitObservedPod string `json:"preinitObservedPod,omitempty"`
}

// HandlerFailure is why the Revision's handler did not start in a fiber,
// as fiberd reported it (docs/contracts.md §4).
type HandlerFailure struct {
	// Reason is contract.ReasonHandlerExited, ReasonHandlerNotListening or
	// ReasonHandlerNotReady (also HomeReady's reason).
	Reason contract.Reason `json:"reason"`
	// ExitCode is the handler's exit status, 128+N when signal N killed it
	// (as kubelet reports a container's); meaningful for HandlerExited.
	ExitCode int32 `json:"exitCode"`
	// Signal names the signal that killed the handler, if one did.
	Signal string `json:"signal,omitempty"`
	// Output is the end of the handler's stdout and stderr (at most
	// MaxHandlerOutput bytes).
	Output string `json:"output,omitempty"`
}

// CapacityGrantList is a list of CapacityGrants.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CapacityGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CapacityGrant `json:"items"`
}
