package grant

// Reason is a condition reason the grant controller sets that the API
// package (impl/apis/fiberd/v1alpha1) does not name. It moves to the shared
// contract package (impl/contract) when that lands.
type Reason string

const (
	// ReasonCapacityUnknown: the grants holding capacity could not be
	// listed, so admission cannot be decided.
	ReasonCapacityUnknown Reason = "CapacityUnknown"
)
