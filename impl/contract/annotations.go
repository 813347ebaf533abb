package contract

// Revision annotations `ly deploy` writes and the Revision controller reads
// (docs/contracts.md §1). Stock Knative ignores all of them, so one Service
// YAML runs on both.
const (
	// SnapshotArtifactAnnotation: the digest-pinned snapshot artifact.
	SnapshotArtifactAnnotation = "lampyr.dev/snapshot-artifact"
	// FiberdTemplateAnnotation: the digest-pinned sealed fiberd template.
	FiberdTemplateAnnotation = "lampyr.dev/fiberd-template"
	// ExecutionModeAnnotation: lampyr.yaml execution.mode, fresh (default)
	// or reuse.
	ExecutionModeAnnotation = "lampyr.dev/execution-mode"
	// IdleTimeoutAnnotation: lampyr.yaml execution.idleTimeout, how long a
	// reuse fiber may stay idle (a Go duration such as 30s); required with
	// reuse.
	IdleTimeoutAnnotation = "lampyr.dev/idle-timeout"
	// IdleActionAnnotation: lampyr.yaml execution.idleAction, what happens
	// to an idle reuse fiber; only release.
	IdleActionAnnotation = "lampyr.dev/idle-action"
)

// Labels and annotations on CapacityGrants and Homes.
const (
	// ReservedMemoryAnnotation: the memory an admitted grant holds, as the
	// grant controller recorded it in status.annotations. Capacity is
	// counted from it rather than from specs, so a configuration change
	// (default-max-fibers) or a spec change cannot silently move other
	// grants' reservations.
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

// RevisionLabel names the Revision an object belongs to, on router metadata
// ConfigMaps and on every object of a Home. It is upstream's
// serving.RevisionLabelKey, spelled here so fiber-router and the grant
// controller need not import Knative Serving; a test in
// impl/reconciler/revision/resources checks the two stay equal.
const RevisionLabel = "serving.knative.dev/revision"

// ManagedByLabel marks every object the Revision controller creates
// (value ControllerName), so a person (or `kubectl get -l`) can find them.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// Objects the grant controller keeps in a tenant's own namespace, where the
// tenant's guard rails act on them (docs/security.md, "What a tenant's
// Kubernetes objects still mean").
const (
	// ComponentLabel is app.kubernetes.io/component; QuotaPodComponent its
	// value on quota Pods.
	ComponentLabel    = "app.kubernetes.io/component"
	QuotaPodComponent = "lampyr-quota"
	// QuotaPodGate keeps a quota Pod from ever being scheduled: it exists
	// to be counted by the namespace's ResourceQuota and checked by its
	// LimitRange, as the Revision's Home, not to run.
	QuotaPodGate = "lampyr.dev/quota-only"
	// FiberMemoryShareAnnotation on a Namespace gives its grants another
	// share of the installation's fiber memory than config-lampyr's
	// namespace-fiber-memory-share ("4Gi", "25%"). Namespace objects are not
	// writable with the namespace edit role, so only an administrator sets it.
	FiberMemoryShareAnnotation = "lampyr.dev/fiber-memory-share"
)
