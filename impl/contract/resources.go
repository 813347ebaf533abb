package contract

import "k8s.io/apimachinery/pkg/runtime/schema"

// FiberdGroup is the API group of CapacityGrants (impl/apis/fiberd).
const FiberdGroup = "fiberd.io"

// CapacityGrants is fiberd.io/v1alpha1 capacitygrants: written by the
// Revision controller (spec) and the grant controller (status), read by ly
// and the suites.
var CapacityGrants = schema.GroupVersionResource{Group: FiberdGroup, Version: "v1alpha1", Resource: "capacitygrants"}

// CapacityGrantKind is the Kind of CapacityGrants.
const CapacityGrantKind = "CapacityGrant"
