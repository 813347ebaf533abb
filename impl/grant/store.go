package grant

import (
	"k8s.io/apimachinery/pkg/labels"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
)

// GrantGVR is the CapacityGrant resource.
var GrantGVR = v1alpha1.SchemeGroupVersion.WithResource("capacitygrants")

var everything = labels.Everything()
