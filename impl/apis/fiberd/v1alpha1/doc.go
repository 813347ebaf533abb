// Package v1alpha1 holds the fiberd.io/v1alpha1 API: the CapacityGrant a
// Lampyr Revision receives, which the grant controller admits or refuses and
// for which it runs a Home (a grant Pod with fiberd and the helper).
//
// +k8s:deepcopy-gen=package
// +groupName=fiberd.io
package v1alpha1
