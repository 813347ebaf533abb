package resources

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"knative.dev/pkg/ptr"
	"knative.dev/serving/pkg/apis/serving"
	v1 "knative.dev/serving/pkg/apis/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/reconciler/revision/config"
)

func testRev() *v1.Revision {
	return &v1.Revision{
		ObjectMeta: metav1.ObjectMeta{
			Name: "hello-00002", Namespace: "apps", UID: "uid-2", Generation: 3,
			Labels: map[string]string{
				serving.ConfigurationLabelKey: "hello",
				serving.ServiceLabelKey:       "hello",
				serving.RouteLabelKey:         "hello",
				"team":                        "payments",
			},
		},
	}
}

func testTemplate(protocol string) *Template {
	return &Template{
		SnapshotArtifact: "r/snap@sha256:aa", FiberdTemplate: "r/tmpl@sha256:bb",
		MaxFibers: 4, TimeoutSeconds: 60, Port: 8080, Protocol: protocol,
		Execution: fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionReuse, IdleTimeoutSeconds: 30, IdleAction: "release"},
	}
}

func TestLabelsNeverCarryTheRouteLabel(t *testing.T) {
	l := Labels(testRev())
	if _, ok := l[serving.RouteLabelKey]; ok {
		t.Errorf("labels %v carry %s: the Route reconciler would delete the Service", l, serving.RouteLabelKey)
	}
	want := map[string]string{
		serving.RevisionLabelKey: "hello-00002", serving.RevisionUID: "uid-2", contract.ManagedByLabel: contract.ControllerName,
		serving.ConfigurationLabelKey: "hello", serving.ServiceLabelKey: "hello",
	}
	if diff := cmp.Diff(want, l); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestMakeService(t *testing.T) {
	ext := config.DefaultLampyr()
	slice := config.DefaultLampyr()
	slice.BackendStrategy = lampyrconfig.BackendEndpointSlice

	tests := []struct {
		name     string
		protocol string
		cfg      *lampyrconfig.Config
		wantSpec corev1.ServiceSpec
	}{{
		name: "externalname, http1", protocol: routermeta.ProtocolHTTP1, cfg: ext,
		wantSpec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "fiber-router.lampyr-system.svc.cluster.local",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}, {
		name: "endpointslice, h2c", protocol: routermeta.ProtocolH2C, cfg: slice,
		wantSpec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http2", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.String("kubernetes.io/h2c"), Port: 81, TargetPort: intstr.FromInt32(81)}},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := MakeService(testRev(), testTemplate(tc.protocol), tc.cfg)
			if s.Name != "hello-00002" || s.Namespace != "apps" {
				t.Errorf("named %s/%s, want apps/hello-00002", s.Namespace, s.Name)
			}
			if diff := cmp.Diff(tc.wantSpec, s.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if len(s.OwnerReferences) != 1 || !*s.OwnerReferences[0].Controller || s.OwnerReferences[0].UID != "uid-2" {
				t.Errorf("owner references %+v", s.OwnerReferences)
			}
		})
	}
}

func TestMakeEndpointSlice(t *testing.T) {
	router := func(addressType discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{AddressType: addressType, Endpoints: eps}
	}
	ep := func(ip string, isReady *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: isReady}, NodeName: ptr.String("kind-control-plane")}
	}
	got := MakeEndpointSlice(testRev(), testTemplate(routermeta.ProtocolH2C), []*discoveryv1.EndpointSlice{
		router(discoveryv1.AddressTypeIPv4, ep("10.0.0.9", nil), ep("10.0.0.3", ptr.Bool(true)), ep("10.0.0.5", ptr.Bool(false))),
		// The same Pod in a second slice (slices overlap during updates).
		router(discoveryv1.AddressTypeIPv4, ep("10.0.0.3", ptr.Bool(true))),
		router(discoveryv1.AddressTypeIPv6, ep("fd00::1", ptr.Bool(true))),
	})
	wantEndpoints := []discoveryv1.Endpoint{
		{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.Bool(true)}, NodeName: ptr.String("kind-control-plane")},
		{Addresses: []string{"10.0.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.Bool(true)}, NodeName: ptr.String("kind-control-plane")},
	}
	if diff := cmp.Diff(wantEndpoints, got.Endpoints); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	tcp := corev1.ProtocolTCP
	wantPorts := []discoveryv1.EndpointPort{{Name: ptr.String("http2"), Protocol: &tcp, Port: ptr.Int32(81), AppProtocol: ptr.String("kubernetes.io/h2c")}}
	if diff := cmp.Diff(wantPorts, got.Ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	if got.Labels[discoveryv1.LabelServiceName] != "hello-00002" || got.Labels[discoveryv1.LabelManagedBy] != EndpointSliceManagedBy {
		t.Errorf("labels %v: want the Service name and our managed-by", got.Labels)
	}
	if got.AddressType != discoveryv1.AddressTypeIPv4 {
		t.Errorf("address type %s", got.AddressType)
	}
}

func TestMakeCapacityGrant(t *testing.T) {
	cfg := config.DefaultLampyr()
	tmpl := testTemplate(routermeta.ProtocolHTTP1)
	g := MakeCapacityGrant(testRev(), tmpl, cfg)
	want := fiberdv1alpha1.CapacityGrantSpec{
		RevisionName: "hello-00002", Template: "r/tmpl@sha256:bb", SnapshotArtifact: "r/snap@sha256:aa",
		MemoryPerFiber: resource.MustParse("256Mi"), MaxFibers: 4, MaxRequestSeconds: 60,
		Execution: tmpl.Execution, Port: 8080, Protocol: "http1",
		Env: map[string]string{"K_REVISION": "hello-00002", "K_CONFIGURATION": "hello", "K_SERVICE": "hello"},
	}
	if diff := cmp.Diff(want, g.Spec, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	if g.Name != "hello-00002" || g.Namespace != "apps" || g.Kind != "CapacityGrant" || g.APIVersion != "fiberd.io/v1alpha1" {
		t.Errorf("identity %s %s %s/%s", g.APIVersion, g.Kind, g.Namespace, g.Name)
	}

	tmpl.Memory = ptr64Quantity("1Gi")
	if got := MakeCapacityGrant(testRev(), tmpl, cfg).Spec.MemoryPerFiber; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("memory request not used: %s", got.String())
	}
}

func ptr64Quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func TestMakeRouterMetadataRoundTrips(t *testing.T) {
	cm := MakeRouterMetadata(testRev(), testTemplate(routermeta.ProtocolH2C), "lampyr-system",
		Home{Name: "hello-00002-0123456789", Endpoint: "10.244.0.7:9090", KeySHA256: strings.Repeat("ab", 32)}, true)
	got, err := routermeta.FromConfigMap(cm)
	if err != nil {
		t.Fatal(err)
	}
	want := routermeta.Metadata{
		Revision: "hello-00002", Namespace: "apps", Ready: true, HomeEndpoint: "10.244.0.7:9090", Home: "hello-00002-0123456789",
		HomeKeySHA256: strings.Repeat("ab", 32), MaxFibers: 4, TimeoutSeconds: 60, Mode: "reuse", IdleTimeoutSeconds: 30, Protocol: "h2c", Generation: 3,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if cm.Name != "route.apps.hello-00002" || cm.Namespace != "lampyr-system" || cm.Labels[contract.RouterMetadataLabel] != "true" || cm.Labels[contract.RevisionLabel] != "hello-00002" {
		t.Errorf("name %s/%s labels %v", cm.Namespace, cm.Name, cm.Labels)
	}
	if len(cm.OwnerReferences) != 0 || !IsRouterMetadataOf(cm, testRev()) {
		t.Errorf("owner references %+v (none can cross namespaces), labels %v", cm.OwnerReferences, cm.Labels)
	}
	other := testRev()
	other.Namespace = "intruder"
	if IsRouterMetadataOf(cm, other) {
		t.Error("another namespace's Revision of the same name claims the metadata")
	}
}

// Every label we write must be one the API server accepts (the fake
// clients used by the table tests do not check).
func TestLabelsAreValid(t *testing.T) {
	rev, tmpl := testRev(), testTemplate(routermeta.ProtocolHTTP1)
	cfg := config.DefaultLampyr()
	for name, l := range map[string]map[string]string{
		"grant":         MakeCapacityGrant(rev, tmpl, cfg).Labels,
		"service":       MakeService(rev, tmpl, cfg).Labels,
		"endpointslice": MakeEndpointSlice(rev, tmpl, nil).Labels,
		"metadata":      MakeRouterMetadata(rev, tmpl, "lampyr-system", Home{}, false).Labels,
	} {
		for k, v := range l {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("%s: label key %q: %v", name, k, errs)
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("%s: label %s value %q: %v", name, k, v, errs)
			}
		}
	}
}

// contract.RevisionLabel is spelled out so fiber-router and the grant
// controller need not import Knative Serving; it must stay upstream's key.
func TestRevisionLabelIsUpstreams(t *testing.T) {
	if contract.RevisionLabel != serving.RevisionLabelKey {
		t.Fatalf("contract.RevisionLabel = %q, upstream serving.RevisionLabelKey = %q", contract.RevisionLabel, serving.RevisionLabelKey)
	}
}
