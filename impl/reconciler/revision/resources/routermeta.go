package resources

import (
	corev1 "k8s.io/api/core/v1"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
)

// MakeRouterMetadata renders the Revision's router metadata through the
// routermeta codec (docs/contracts.md §2) as a ConfigMap in the Lampyr
// namespace, where tenants cannot write (docs/security.md §4). ready must be
// true only when every other part of the Revision is ready: fiber-router
// routes on it. No owner reference can reach across namespaces: the
// Revision's finalizer deletes it, and a sweep removes any whose Revision is
// gone.
//
// home names the Home to fiber-router; homeKeySHA256 is its TLS key's
// fingerprint (the grant's status.homeKeySHA256), the only key fiber-router
// accepts from whatever answers at homeEndpoint (docs/security.md §3).
func MakeRouterMetadata(rev *v1.Revision, t *Template, systemNamespace string, home Home, ready bool) *corev1.ConfigMap {
	cm := routermeta.MakeConfigMap(systemNamespace, routermeta.Metadata{
		Revision:           rev.Name,
		Namespace:          rev.Namespace,
		Ready:              ready,
		HomeEndpoint:       home.Endpoint,
		Home:               home.Name,
		HomeKeySHA256:      home.KeySHA256,
		MaxFibers:          t.MaxFibers,
		TimeoutSeconds:     t.TimeoutSeconds,
		Mode:               string(t.Execution.Mode),
		IdleTimeoutSeconds: t.Execution.IdleTimeoutSeconds,
		Protocol:           t.Protocol,
		Generation:         rev.Generation,
	})
	for k, v := range Labels(rev) {
		if _, ok := cm.Labels[k]; !ok {
			cm.Labels[k] = v
		}
	}
	return cm
}

// Home is what router metadata says of a Revision's Home: all from the
// grant's status, and all empty until the grant is Ready.
type Home struct {
	// Name is status.home, Endpoint status.homeEndpoint, KeySHA256
	// status.homeKeySHA256.
	Name, Endpoint, KeySHA256 string
}

// IsRouterMetadataOf reports whether a router metadata ConfigMap (by its
// labels) was written for rev: same namespace, name and UID.
func IsRouterMetadataOf(cm *corev1.ConfigMap, rev *v1.Revision) bool {
	l := cm.Labels
	return l[contract.RouterMetadataLabel] == "true" && l[contract.RevisionNamespaceLabel] == rev.Namespace &&
		l[contract.RevisionLabel] == rev.Name && l[contract.ManagedByLabel] == contract.ControllerName
}
