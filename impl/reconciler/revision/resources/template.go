package resources

import (
	"k8s.io/apimachinery/pkg/api/resource"
	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
)

// Template is a Revision template that passed validation, reduced to what
// Lampyr acts on. Validation (package revision) is the only producer.
type Template struct {
	// ContainerName and Image are the single container's, recorded in
	// status.containerStatuses.
	ContainerName string
	// Image is the digest-pinned runnable image (stock Knative runs it;
	// Lampyr records it and runs the snapshot artifact instead).
	Image string
	// SnapshotArtifact is lampyr.dev/snapshot-artifact, digest-pinned.
	SnapshotArtifact string
	// FiberdTemplate is lampyr.dev/fiberd-template, digest-pinned; empty
	// when SealByController until the controller has sealed it.
	FiberdTemplate string
	// SealByController: the Revision carries no Lampyr annotations and its
	// image is mapped to SnapshotArtifact in config-lampyr image-snapshots,
	// so the controller seals and pushes its template.
	SealByController bool
	// Memory is the container's memory request; nil means the
	// installation's default-memory-per-fiber.
	Memory *resource.Quantity
	// MaxFibers is max-scale; 0 means the installation's default cap.
	MaxFibers int32
	// TimeoutSeconds is the longest request, stream or WebSocket life.
	TimeoutSeconds int64
	// Execution is the lampyr.yaml execution policy.
	Execution fiberdv1alpha1.ExecutionPolicy
	// Port is the handler's listening port inside the fiber (PORT).
	Port int32
	// Protocol is routermeta.ProtocolHTTP1 or routermeta.ProtocolH2C.
	Protocol string
}
