package resources

import (
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
)

// The egress Pod of a tenant namespace (docs/networking.md "Service
// bindings"): a small unprivileged Pod running `fiberd egress-proxy`, made
// on the first outbound connection of one of the namespace's fibers, so
// their connections come from a Pod of the tenant's namespace, counted in
// its quota and subject to its NetworkPolicies. Unlike a Home it lives in
// the tenant's namespace: it holds nothing secret (the grant controller's
// public key) and runs under Pod Security `restricted`.

// EgressUID is the egress proxy's uid and gid (distroless "nonroot").
const EgressUID = 65532

// The egress Pod's resources: a proxy that splices in the kernel needs
// little; the CPU limit bounds what one namespace's fibers push through it.
var (
	EgressCPURequest    = resource.MustParse("10m")
	EgressMemoryRequest = resource.MustParse("32Mi")
	EgressCPULimit      = resource.MustParse("500m")
	EgressMemoryLimit   = resource.MustParse("64Mi")
)

// egressDialArgs are fiberd's flags for how fibers' connections leave:
// through the namespace's egress Pod (fiber-egress "cluster"), or from
// the Home ("direct").
func egressDialArgs(cfg *lampyrconfig.Config) []string {
	if cfg.Egress == lampyrconfig.EgressCluster && cfg.EgressAPI != "" {
		return []string{"--egress-dial=proxy", "--egress-api=" + cfg.EgressAPI}
	}
	return []string{"--egress-dial=direct"}
}

// EgressLabels are the labels of a namespace's egress objects; the Pod's
// also select it for its Service and NetworkPolicy.
func EgressLabels() map[string]string {
	return map[string]string{
		ComponentKey:            contract.EgressComponent,
		contract.ManagedByLabel: contract.GrantControllerName,
	}
}

// IsEgressObject says whether obj is one the grant controller made (by its
// labels); another object under the same name is the tenant's and is never
// changed.
func IsEgressObject(obj metav1.Object) bool {
	l := obj.GetLabels()
	return l[ComponentKey] == contract.EgressComponent && l[contract.ManagedByLabel] == contract.GrantControllerName
}

// EgressOwnerRefs names every grant in owners as an owner (sorted by
// name): the garbage collector removes the egress objects once the
// namespace's last of them is gone.
func EgressOwnerRefs(owners []*v1alpha1.CapacityGrant) []metav1.OwnerReference {
	gs := append([]*v1alpha1.CapacityGrant(nil), owners...)
	sort.Slice(gs, func(i, j int) bool { return gs[i].Name < gs[j].Name })
	refs := make([]metav1.OwnerReference, 0, len(gs))
	for _, g := range gs {
		refs = append(refs, metav1.OwnerReference{
			APIVersion: v1alpha1.SchemeGroupVersion.String(),
			Kind:       "CapacityGrant",
			Name:       g.Name,
			UID:        g.UID,
		})
	}
	return refs
}

func egressMeta(namespace string, owners []*v1alpha1.CapacityGrant) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            contract.EgressName,
		Namespace:       namespace,
		Labels:          EgressLabels(),
		OwnerReferences: EgressOwnerRefs(owners),
	}
}

// MakeEgressPod is the namespace's egress proxy: the Home image (digest
// pinned; the grant controller refuses others) running `fiberd
// egress-proxy` as 65532, within Pod Security `restricted`, with no
// service-account token, no volume and no service links. grantPubPEM is
// the grant controller's public key, which verifies the grants Homes
// present. Fields the API server would default are written out (the
// grant controller replaces a Pod whose container differs).
func MakeEgressPod(namespace string, owners []*v1alpha1.CapacityGrant, cfg *lampyrconfig.Config, grantPubPEM []byte) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: egressMeta(namespace, owners),
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			RestartPolicy:                 corev1.RestartPolicyAlways,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](EgressUID),
				RunAsGroup:     ptr.To[int64](EgressUID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:    "egress-proxy",
				Image:   cfg.HomeImage,
				Command: []string{"/fiberd", "egress-proxy"},
				Args:    []string{"--listen=:" + strconv.Itoa(contract.EgressProxyPort)},
				Env: []corev1.EnvVar{
					{Name: contract.EgressNamespaceEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}},
					{Name: contract.EgressGrantKeyEnv, Value: string(grantPubPEM)},
				},
				Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: contract.EgressProxyPort, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(contract.EgressProxyPort)}},
					PeriodSeconds: 2,
				},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					RunAsNonRoot:             ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: EgressCPURequest, corev1.ResourceMemory: EgressMemoryRequest},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: EgressCPULimit, corev1.ResourceMemory: EgressMemoryLimit},
				},
			}},
		},
	}
}

// MakeEgressService names the egress Pod in its namespace (for people and
// tools: fiberd is given the Pod's own address, which a tenant cannot
// re-point as it can a Service's endpoints).
func MakeEgressService(namespace string, owners []*v1alpha1.CapacityGrant) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: egressMeta(namespace, owners),
		Spec: corev1.ServiceSpec{
			Selector: EgressLabels(),
			Ports: []corev1.ServicePort{{
				Name:       "proxy",
				Port:       contract.EgressProxyPort,
				TargetPort: intstr.FromInt32(contract.EgressProxyPort),
				Protocol:   corev1.ProtocolTCP,
			}},
		},
	}
}

// MakeEgressNetworkPolicy admits the namespace's Homes (Pods of
// homesNamespace labelled as Homes of this namespace's grants) to the
// proxy port. NetworkPolicies are additive: a tenant's default-deny
// ingress does not cut its own fibers' way out, and no other namespace's
// Home is admitted.
func MakeEgressNetworkPolicy(namespace, homesNamespace string, owners []*v1alpha1.CapacityGrant) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(contract.EgressProxyPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: egressMeta(namespace, owners),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: EgressLabels()},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: homesNamespace}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
						ComponentKey:                 Component,
						contract.GrantNamespaceLabel: namespace,
					}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
}
