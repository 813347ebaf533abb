package resources

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	netapi "knative.dev/networking/pkg/apis/networking"
	"knative.dev/pkg/ptr"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/contract/routermeta"
)

// Router ports (docs/contracts.md §3): fiber-router listens on 80 for
// HTTP/1 and 81 for h2c, so both are port and targetPort in either strategy.
const (
	RouterHTTPPort int32 = 80
	RouterH2CPort  int32 = 81
)

// ServicePort is the single port the Route reconciler expects on a Revision
// Service: 80 `http`, or 81 `http2` with appProtocol kubernetes.io/h2c for
// an h2c template (route/resources/ingress.go, revision_helpers.go).
func ServicePort(t *Template) corev1.ServicePort {
	if t.Protocol == routermeta.ProtocolH2C {
		return corev1.ServicePort{
			Name:        netapi.ServicePortNameH2C,
			Protocol:    corev1.ProtocolTCP,
			AppProtocol: ptr.String(netapi.AppProtocolH2C),
			Port:        RouterH2CPort,
			TargetPort:  intstr.FromInt32(RouterH2CPort),
		}
	}
	return corev1.ServicePort{
		Name:       netapi.ServicePortNameHTTP1,
		Protocol:   corev1.ProtocolTCP,
		Port:       RouterHTTPPort,
		TargetPort: intstr.FromInt32(RouterHTTPPort),
	}
}

// MakeService builds the Revision's backend Service, named exactly after
// the Revision because that is the name the Route reconciler routes to.
func MakeService(rev *v1.Revision, t *Template, cfg *lampyrconfig.Config) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:            rev.Name,
			Namespace:       rev.Namespace,
			Labels:          Labels(rev),
			OwnerReferences: OwnerReferences(rev),
		},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{ServicePort(t)},
		},
	}
	switch cfg.BackendStrategy {
	case lampyrconfig.BackendEndpointSlice:
		// No selector: the EndpointSlice we write is the only source of
		// endpoints, and kube's EndpointSlice controller leaves it alone.
		// Not headless: gateways such as Traefik dial the ClusterIP.
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	default:
		svc.Spec.Type = corev1.ServiceTypeExternalName
		svc.Spec.ExternalName = cfg.RouterHost()
	}
	return svc
}
