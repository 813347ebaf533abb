package grant

import (
	"k8s.io/apimachinery/pkg/labels"

	"lampyr.dev/serving/impl/contract"
)

// GrantGVR is the CapacityGrant resource.
var GrantGVR = contract.CapacityGrants

var everything = labels.Everything()
