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
func MakeRouterMetadata(rev *v1.Revision, t *Template, systemNamespace, home, homeEndpoint string, ready bool) *corev1.ConfigMap {
	cm := routermeta.MakeConfigMap(systemNamespace, routermeta.Metadata{
		Revision:           rev.Name,
		Namespace:          rev.Namespace,
		Ready:              ready,
		HomeEndpoint:       homeEndpoint,
		Home:               home,
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

// IsRouterMetadataOf reports whether a router metadata ConfigMap (by its
// labels) was written for rev: same namespace, name and UID.
func IsRouterMetadataOf(cm *corev1.ConfigMap, rev *v1.Revision) bool {
	l := cm.Labels
	return l[contract.RouterMetadataLabel] == "true" && l[contract.RevisionNamespaceLabel] == rev.Namespace &&
		l[contract.RevisionLabel] == rev.Name && l[contract.ManagedByLabel] == contract.ControllerName
}
