package resources

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/kmeta"
	"knative.dev/serving/pkg/apis/serving"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	"lampyr.dev/serving/impl/contract"
)

// Labels are put on every owned object. They deliberately never include
// serving.knative.dev/route: the Route reconciler deletes Services carrying
// it that it did not create (knative.dev/serving pkg/reconciler/route
// deleteOrphanedServices deletes every Service labelled with the Route
// that is not one of its own).
func Labels(rev *v1.Revision) map[string]string {
	l := map[string]string{
		serving.RevisionLabelKey: rev.Name,
		serving.RevisionUID:      string(rev.UID),
		contract.ManagedByLabel:  contract.ControllerName,
	}
	for _, k := range []string{serving.ConfigurationLabelKey, serving.ServiceLabelKey} {
		if v := rev.Labels[k]; v != "" {
			l[k] = v
		}
	}
	return l
}

// OwnerReferences makes rev the controlling owner, so garbage collection
// cleans up even if the finalizer never ran.
func OwnerReferences(rev *v1.Revision) []metav1.OwnerReference {
	return []metav1.OwnerReference{*kmeta.NewControllerRef(rev)}
}
