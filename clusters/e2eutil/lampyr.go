package e2eutil

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/ly"
)

// HomeSelector selects the Home objects (Pod, Service, Secret, all in
// LampyrHomesNamespace) of Revision ns/rev, or of every Revision of ns when
// rev is empty.
func HomeSelector(ns, rev string) string {
	set := labels.Set{resources.ComponentKey: resources.Component, contract.GrantNamespaceLabel: ns}
	if rev != "" {
		set[contract.RevisionLabel] = rev
	}
	return set.String()
}

// HomePods lists the Home Pods of Revision ns/rev (every Revision of ns if
// rev is empty).
func HomePods(ctx context.Context, c *Clients, ns, rev string) (*corev1.PodList, error) {
	return c.Kube.CoreV1().Pods(contract.HomesNamespace).List(ctx, metav1.ListOptions{LabelSelector: HomeSelector(ns, rev)})
}

// RouterMetadataName is the router metadata ConfigMap of Revision ns/rev,
// in contract.SystemNamespace.
func RouterMetadataName(ns, rev string) string { return routermeta.Name(ns, rev) }

// Leftovers lists, sorted as "Kind/name", what Knative or Lampyr made for a
// Revision in ns: Revisions, CapacityGrants, Services, EndpointSlices, Pods
// and Secrets (service-account tokens aside) in ns, and the router metadata
// and Home objects Lampyr keeps for ns's Revisions in its own namespaces. An
// empty list after deleting every Service means nothing was orphaned.
func Leftovers(ctx context.Context, c *Clients, ns string) []string {
	var out []string
	add := func(kind, n string) { out = append(out, kind+"/"+n) }
	if l, err := c.Dynamic.Resource(Revisions).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, i := range l.Items {
			add("Revision", i.GetName())
		}
	}
	if l, err := c.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil {
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
	meta := labels.Set{contract.RouterMetadataLabel: "true", contract.RevisionNamespaceLabel: ns}.String()
	if l, err := c.Kube.CoreV1().ConfigMaps(contract.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: meta}); err == nil {
		for _, i := range l.Items {
			add("ConfigMap", contract.SystemNamespace+"/"+i.Name)
		}
	}
	homes := metav1.ListOptions{LabelSelector: HomeSelector(ns, "")}
	if l, err := c.Kube.CoreV1().Pods(contract.HomesNamespace).List(ctx, homes); err == nil {
		for _, i := range l.Items {
			add("Pod", contract.HomesNamespace+"/"+i.Name)
		}
	}
	if l, err := c.Kube.CoreV1().Services(contract.HomesNamespace).List(ctx, homes); err == nil {
		for _, i := range l.Items {
			add("Service", contract.HomesNamespace+"/"+i.Name)
		}
	}
	if l, err := c.Kube.CoreV1().Secrets(contract.HomesNamespace).List(ctx, homes); err == nil {
		for _, i := range l.Items {
			add("Secret", contract.HomesNamespace+"/"+i.Name)
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

// RestrictedPodSecurity are the labels of a tenant namespace that enforces
// Pod Security "restricted": on Lampyr nothing of a Revision runs in its
// namespace (Homes are in LampyrHomesNamespace), so tenant namespaces can.
var RestrictedPodSecurity = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
	"pod-security.kubernetes.io/audit":   "restricted",
}

// RestrictPodSecurity labels namespace ns with RestrictedPodSecurity.
func RestrictPodSecurity(ctx context.Context, c *Clients, ns string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": RestrictedPodSecurity}})
	if _, err := c.Kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling namespace %s for Pod Security restricted: %w", ns, err)
	}
	return nil
}

// Sealer is this machine's `ly` sealer identity (created on first use),
// the one `ly deploy` signs templates with and the lampyr install profile
// authorizes for every namespace (clusters.Env.Install).
func Sealer() (*ly.Sealer, error) {
	path, err := ly.SealerKeyPath("")
	if err != nil {
		return nil, err
	}
	return ly.LoadSealer(path, true)
}
