package e2eutil

import (
	"context"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/routermeta"
)

// CapacityGrants is fiberd.io/v1alpha1 capacitygrants.
var CapacityGrants = fiberdv1alpha1.SchemeGroupVersion.WithResource("capacitygrants")

// Leftovers lists, sorted as "Kind/name", what Knative or Lampyr made for a
// Revision in ns: Revisions, CapacityGrants, Services, EndpointSlices, router
// metadata ConfigMaps, Pods and Secrets (service-account tokens aside). An
// empty list after deleting every Service means nothing was orphaned.
func Leftovers(ctx context.Context, c *Clients, ns string) []string {
	var out []string
	add := func(kind, n string) { out = append(out, kind+"/"+n) }
	if l, err := c.Dynamic.Resource(Revisions).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("Revision", i.GetName())
		}
	}
	if l, err := c.Dynamic.Resource(CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("CapacityGrant", i.GetName())
		}
	}
	if l, err := c.Kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("Service", i.Name)
		}
	}
	if l, err := c.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("EndpointSlice", i.Name)
		}
	}
	if l, err := c.Kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: routermeta.LabelKey}); err == nil {
		for _, i := range l.Items {
			add("ConfigMap", i.Name)
		}
	}
	if l, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("Pod", i.Name)
		}
	}
	if l, err := c.Kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			if i.Type != corev1.SecretTypeServiceAccountToken {
				add("Secret", i.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}
