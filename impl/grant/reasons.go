package grant

import "lampyr.dev/serving/impl/contract"

// Reasons the grant controller sets that impl/contract does not name: they
// stay inside the grant controller (no other component compares them).
const (
	// ReasonCapacityUnknown: the grants holding capacity could not be
	// listed, so admission cannot be decided.
	ReasonCapacityUnknown contract.Reason = "CapacityUnknown"
)
