package resources

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/ptr"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
)

// EndpointSliceManagedBy is the endpointslice.kubernetes.io/managed-by value
// of mirrored slices. Any value other than kube's own controllers' keeps the
// EndpointSlice and mirroring controllers from touching them.
const EndpointSliceManagedBy = "revision-controller.lampyr.dev"

// EndpointSliceName names a Revision's mirrored slice: the Revision's name,
// like its Service, so the finalizer and people can find it without a list.
func EndpointSliceName(rev *v1.Revision) string { return rev.Name }

// ReadyRouterEndpoints returns the ready endpoints of fiber-router's slices
// of one address type, de-duplicated and sorted so that building the mirror
// twice from the same state gives an identical object (no update churn).
func ReadyRouterEndpoints(routerSlices []*discoveryv1.EndpointSlice, addressType discoveryv1.AddressType) []discoveryv1.Endpoint {
	seen := map[string]bool{}
	var out []discoveryv1.Endpoint
	for _, s := range routerSlices {
		if s.AddressType != addressType {
			continue
		}
		for _, ep := range s.Endpoints {
			// Per the EndpointSlice API, a nil ready condition means ready.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if len(ep.Addresses) == 0 || seen[ep.Addresses[0]] {
				continue
			}
			seen[ep.Addresses[0]] = true
			out = append(out, discoveryv1.Endpoint{
				Addresses:  slices.Clone(ep.Addresses),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.Bool(true)},
				NodeName:   ep.NodeName,
				Zone:       ep.Zone,
			})
		}
	}
	slices.SortFunc(out, func(a, b discoveryv1.Endpoint) int { return strings.Compare(a.Addresses[0], b.Addresses[0]) })
	return out
}

// MakeEndpointSlice builds the mirror of fiber-router's ready IPv4 endpoints
// for the Revision's selectorless Service. The single port carries the
// Service port's name, which is how kube-proxy and gateways pair them, and
// fiber-router's port for that protocol (80 or 81).
func MakeEndpointSlice(rev *v1.Revision, t *Template, routerSlices []*discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	sp := ServicePort(t)
	proto := corev1.ProtocolTCP
	labels := Labels(rev)
	labels[discoveryv1.LabelServiceName] = rev.Name
	labels[discoveryv1.LabelManagedBy] = EndpointSliceManagedBy
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:            EndpointSliceName(rev),
			Namespace:       rev.Namespace,
			Labels:          labels,
			OwnerReferences: OwnerReferences(rev),
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   ReadyRouterEndpoints(routerSlices, discoveryv1.AddressTypeIPv4),
		Ports: []discoveryv1.EndpointPort{{
			Name:        ptr.String(sp.Name),
			Protocol:    &proto,
			Port:        ptr.Int32(sp.TargetPort.IntVal),
			AppProtocol: sp.AppProtocol,
		}},
	}
}
