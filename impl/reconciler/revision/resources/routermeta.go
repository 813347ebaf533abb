package resources

import (
	corev1 "k8s.io/api/core/v1"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	"lampyr.dev/serving/impl/routermeta"
)

// MakeRouterMetadata renders the Revision's router metadata through the
// routermeta codec (docs/contracts.md §2). ready must be true only when
// every other part of the Revision is ready: fiber-router routes on it.
func MakeRouterMetadata(rev *v1.Revision, t *Template, homeEndpoint string, ready bool) *corev1.ConfigMap {
	cm := routermeta.MakeConfigMap(routermeta.Metadata{
		Revision:           rev.Name,
		Namespace:          rev.Namespace,
		Ready:              ready,
		HomeEndpoint:       homeEndpoint,
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
	cm.OwnerReferences = OwnerReferences(rev)
	return cm
}
