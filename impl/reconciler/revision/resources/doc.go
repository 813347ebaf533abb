// Package resources holds pure builders (Make*) for the objects the Lampyr
// Revision reconciler owns: the CapacityGrant, the backend Service, its
// mirrored EndpointSlice and the router metadata ConfigMap. Nothing here
// talks to a cluster.
package resources
