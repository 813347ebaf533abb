package contract

// Revision annotations `ly deploy` writes and the Revision controller reads
// (docs/contracts.md §1).
const (
	// SnapshotArtifactAnnotation: the digest-pinned snapshot artifact.
	SnapshotArtifactAnnotation = "lampyr.dev/snapshot-artifact"
	// FiberdTemplateAnnotation: the digest-pinned sealed fiberd template.
	FiberdTemplateAnnotation = "lampyr.dev/fiberd-template"
	// ExecutionModeAnnotation: fresh (default) or reuse.
	ExecutionModeAnnotation = "lampyr.dev/execution-mode"
	// IdleTimeoutAnnotation: how long a reuse fiber may stay idle (e.g. 30s).
	IdleTimeoutAnnotation = "lampyr.dev/idle-timeout"
	// IdleActionAnnotation: what happens to an idle reuse fiber (release).
	IdleActionAnnotation = "lampyr.dev/idle-action"
)

// Labels and annotations on CapacityGrants and Homes.
const (
	// ReservedMemoryAnnotation: the memory an admitted grant holds, as the
	// grant controller recorded it; capacity is counted from it.
	ReservedMemoryAnnotation = "fiberd.io/reserved-memory-bytes"
	// GrantLabel, GrantNamespaceLabel and GrantUIDLabel name the grant a
	// Home object belongs to.
	GrantLabel          = "fiberd.io/grant"
	GrantNamespaceLabel = "fiberd.io/grant-namespace"
	GrantUIDLabel       = "fiberd.io/grant-uid"
)

// Labels on router metadata ConfigMaps (impl/contract/routermeta).
const (
	// RouterMetadataLabel marks a ConfigMap as router metadata; fiber-router
	// selects on it.
	RouterMetadataLabel = "lampyr.dev/router-metadata"
	// RevisionNamespaceLabel names the Revision's namespace.
	RevisionNamespaceLabel = "lampyr.dev/revision-namespace"
)

// ManagedByLabel marks every object the Revision controller creates
// (value ControllerName).
const ManagedByLabel = "app.kubernetes.io/managed-by"
