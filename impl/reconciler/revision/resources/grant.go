package resources

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/serving/pkg/apis/serving"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// Runtime contract environment names (Knative runtime contract).
const (
	EnvService       = "K_SERVICE"
	EnvConfiguration = "K_CONFIGURATION"
	EnvRevision      = "K_REVISION"
)

// MakeCapacityGrant translates the accepted template into the Revision's
// grant, named after the Revision (docs/contracts.md §1).
func MakeCapacityGrant(rev *v1.Revision, t *Template, cfg *lampyrconfig.Config) *fiberdv1alpha1.CapacityGrant {
	mem := cfg.DefaultMemoryPerFiber.DeepCopy()
	if t.Memory != nil {
		mem = t.Memory.DeepCopy()
	}
	return &fiberdv1alpha1.CapacityGrant{
		TypeMeta: metav1.TypeMeta{
			APIVersion: fiberdv1alpha1.SchemeGroupVersion.String(),
			Kind:       "CapacityGrant",
		},
		ObjectMeta: metav1.ObjectMeta{
			Name:            rev.Name,
			Namespace:       rev.Namespace,
			Labels:          Labels(rev),
			OwnerReferences: OwnerReferences(rev),
		},
		Spec: fiberdv1alpha1.CapacityGrantSpec{
			RevisionName:      rev.Name,
			Template:          t.FiberdTemplate,
			SnapshotArtifact:  t.SnapshotArtifact,
			MemoryPerFiber:    mem,
			MaxFibers:         t.MaxFibers,
			MaxRequestSeconds: t.TimeoutSeconds,
			Execution:         t.Execution,
			Port:              t.Port,
			Protocol:          t.Protocol,
			// The same values stock Knative gives the user container, so a
			// handler observes the same runtime contract on both.
			Env: map[string]string{
				EnvRevision:      rev.Name,
				EnvConfiguration: rev.Labels[serving.ConfigurationLabelKey],
				EnvService:       rev.Labels[serving.ServiceLabelKey],
			},
		},
	}
}
