package revision

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	clientgotesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"knative.dev/pkg/apis"
	fakekubeclient "knative.dev/pkg/client/injection/kube/client/fake"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/logging"
	logtesting "knative.dev/pkg/logging/testing"
	"knative.dev/pkg/ptr"
	pkgreconciler "knative.dev/pkg/reconciler"
	rtesting "knative.dev/pkg/reconciler/testing"
	apisconfig "knative.dev/serving/pkg/apis/config"
	"knative.dev/serving/pkg/apis/serving"
	v1 "knative.dev/serving/pkg/apis/serving/v1"
	asconfig "knative.dev/serving/pkg/autoscaler/config"
	fakeservingclient "knative.dev/serving/pkg/client/injection/client/fake"
	revisionreconciler "knative.dev/serving/pkg/client/injection/reconciler/serving/v1/revision"
	servinglisters "knative.dev/serving/pkg/client/listers/serving/v1"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fakefiberdclient "lampyr.dev/serving/impl/client/injection/client/fake"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/reconciler/revision/config"
	"lampyr.dev/serving/impl/reconciler/revision/resources"
)

const (
	testNS       = "default"
	testRevName  = "hello-00001"
	testUID      = "7d1a2b3c-0000-4000-8000-000000000001"
	testImage    = "registry.example/hello@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	testArtifact = "registry.example/hello-snapshot@sha256:2222222222222222222222222222222222222222222222222222222222222222"
	testTemplate = "registry.example/lampyr/templates@sha256:3333333333333333333333333333333333333333333333333333333333333333"
	testHome     = "10.244.0.9:9090"
	// testHomeKey is the fingerprint of the Home's TLS key in the grant's
	// status, which the router metadata must carry.
	testHomeKey   = "5e2d1c7a0b9f8e6d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a2918070605f"
	testHomeName  = "hello-00001-0123456789"
	finalizerName = "revisions.serving.knative.dev"
)

// Keys in TableRow.OtherTestData.
const (
	lampyrConfigKey = "lampyr"
	verifierKey     = "verifier"
	sealerKey       = "sealer"
	proberKey       = "prober"
)

type revOption func(*v1.Revision)

// rev is a Revision as the Configuration reconciler creates it from a plain
// Service with containerConcurrency: 1 and Lampyr's two annotations. It is
// deliberately not webhook-defaulted: the generated reconciler defaults it
// in memory (PreProcessReconcile) before ReconcileKind, as in a cluster.
func rev(opts ...revOption) *v1.Revision {
	r := &v1.Revision{
		ObjectMeta: metav1.ObjectMeta{
			Name:       testRevName,
			Namespace:  testNS,
			UID:        testUID,
			Generation: 1,
			Labels: map[string]string{
				serving.ConfigurationLabelKey: "hello",
				serving.ServiceLabelKey:       "hello",
			},
			Annotations: map[string]string{
				contract.SnapshotArtifactAnnotation: testArtifact,
				contract.FiberdTemplateAnnotation:   testTemplate,
			},
			Finalizers: []string{finalizerName},
		},
		Spec: v1.RevisionSpec{
			PodSpec: corev1.PodSpec{
				Containers: []corev1.Container{{Image: testImage}},
			},
			ContainerConcurrency: ptr.Int64(1),
		},
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

func container(f func(*corev1.Container)) revOption {
	return func(r *v1.Revision) { f(&r.Spec.Containers[0]) }
}

func podSpec(f func(*corev1.PodSpec)) revOption {
	return func(r *v1.Revision) { f(&r.Spec.PodSpec) }
}

func annotation(k, v string) revOption {
	return func(r *v1.Revision) { r.Annotations[k] = v }
}

func withoutAnnotation(k string) revOption {
	return func(r *v1.Revision) { delete(r.Annotations, k) }
}

func withoutFinalizer(r *v1.Revision) { r.Finalizers = nil }

func deleted(r *v1.Revision) {
	t := metav1.Now()
	r.DeletionTimestamp = &t
}

// status helpers: they apply the stock condition set's transitions, in the
// same order as a reconcile (ContainerHealthy, ResourcesAvailable, Active).

type condition struct {
	t              apis.ConditionType
	status         corev1.ConditionStatus
	reason, detail string
}

func healthy(status corev1.ConditionStatus, reason, msg string) condition {
	return condition{v1.RevisionConditionContainerHealthy, status, reason, msg}
}

func available(status corev1.ConditionStatus, reason, msg string) condition {
	return condition{v1.RevisionConditionResourcesAvailable, status, reason, msg}
}

func active(status corev1.ConditionStatus, reason, msg string) condition {
	return condition{v1.RevisionConditionActive, status, reason, msg}
}

// withConditions initializes the status as PreProcessReconcile does and
// applies cs in order, then sets observedGeneration.
func withConditions(cs ...condition) revOption {
	return func(r *v1.Revision) {
		st := &r.Status
		m := revisionConditions.Manage(st)
		m.InitializeConditions()
		for _, c := range cs {
			switch c.status {
			case corev1.ConditionTrue:
				m.MarkTrue(c.t)
			case corev1.ConditionFalse:
				m.MarkFalse(c.t, c.reason, "%s", c.detail)
			default:
				m.MarkUnknown(c.t, c.reason, "%s", c.detail)
			}
		}
		st.ObservedGeneration = r.Generation
	}
}

func withContainerStatus(name, image string) revOption {
	return func(r *v1.Revision) {
		r.Status.ContainerStatuses = []v1.ContainerStatus{{Name: name, ImageDigest: image}}
	}
}

// waitingForGrant is the status after the first reconcile of an accepted
// Revision: everything created, the grant controller not yet heard from.
func waitingForGrant() revOption {
	return func(r *v1.Revision) {
		withConditions(
			healthy(corev1.ConditionUnknown, contract.ReasonWaitingForHome.String(), MessageWaitingForHome),
			available(corev1.ConditionUnknown, contract.ReasonWaitingForGrant.String(), MessageWaitingForGrant),
			active(corev1.ConditionUnknown, contract.ReasonWaitingForGrant.String(), MessageWaitingForGrant),
		)(r)
		withContainerStatus("user-container", testImage)(r)
	}
}

func ready() revOption {
	return func(r *v1.Revision) {
		withConditions(
			healthy(corev1.ConditionTrue, "", ""),
			available(corev1.ConditionTrue, "", ""),
			active(corev1.ConditionTrue, "", ""),
		)(r)
		withContainerStatus("user-container", testImage)(r)
	}
}

// rejected is the status of a Revision outside the subset with one
// offending field.
func rejected(reason, field, detail string) revOption {
	return func(r *v1.Revision) {
		msg := Rejection{{Reason: reason, Field: field, Detail: detail}}.Message()
		withConditions(
			available(corev1.ConditionFalse, reason, msg),
			active(corev1.ConditionFalse, reason, MessageRejected),
		)(r)
	}
}

// accepted is the Template ValidateTemplate derives from rev() after
// defaulting with the test config.
func accepted(opts ...func(*resources.Template)) *resources.Template {
	t := &resources.Template{
		ContainerName:    "user-container",
		Image:            testImage,
		SnapshotArtifact: testArtifact,
		FiberdTemplate:   testTemplate,
		TimeoutSeconds:   apisconfig.DefaultRevisionTimeoutSeconds,
		Execution:        fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionFresh},
		Port:             v1.DefaultUserPort,
		Protocol:         "http1",
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

func h2c(t *resources.Template) { t.Protocol = "h2c"; t.Port = 50051 }

func testLampyr(strategy lampyrconfig.BackendStrategy) *lampyrconfig.Config {
	l := config.DefaultLampyr()
	l.BackendStrategy = strategy
	l.RouterNamespace = "lampyr-system"
	l.DefaultMemoryPerFiber = resource.MustParse("256Mi")
	return l
}

func testServingConfig(t testing.TB) *apisconfig.Config {
	defaults, err := apisconfig.NewDefaultsConfigFromMap(nil)
	if err != nil {
		t.Fatal(err)
	}
	features, err := apisconfig.NewFeaturesConfigFromMap(nil)
	if err != nil {
		t.Fatal(err)
	}
	as, err := asconfig.NewConfigFromMap(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &apisconfig.Config{Defaults: defaults, Features: features, Autoscaler: as}
}

// Objects the reconciler owns, as it builds them (the builders have their
// own tests; here they state what the reconciler is expected to write).

func grant(t *resources.Template, opts ...func(*fiberdv1alpha1.CapacityGrant)) *fiberdv1alpha1.CapacityGrant {
	g := resources.MakeCapacityGrant(rev(), t, testLampyr(lampyrconfig.BackendExternalName))
	for _, o := range opts {
		o(g)
	}
	return g
}

// Grant statuses, written with the grant controller's own status helpers so
// the fixtures match what it really reports.

func grantAdmitted(g *fiberdv1alpha1.CapacityGrant) {
	g.Status.InitializeConditions()
	g.Status.MarkAdmitted("256Mi x 10 fibers fit")
	// status.homeEndpoint is set once admitted (docs/contracts.md §1).
	g.Status.HomeEndpoint = testHome
	g.Status.Home = testHomeName
	g.Status.HomeKeySHA256 = testHomeKey
}

func grantReady(g *fiberdv1alpha1.CapacityGrant) {
	grantAdmitted(g)
	g.Status.MarkHomeReady()
}

func grantHomeNotReady(reason contract.Reason, msg string) func(*fiberdv1alpha1.CapacityGrant) {
	return func(g *fiberdv1alpha1.CapacityGrant) {
		grantAdmitted(g)
		g.Status.MarkHomeNotReady(reason, "%s", msg)
	}
}

func grantHomeFailed(reason contract.Reason, msg string) func(*fiberdv1alpha1.CapacityGrant) {
	return func(g *fiberdv1alpha1.CapacityGrant) {
		grantAdmitted(g)
		g.Status.MarkHomeFailed(reason, "%s", msg)
	}
}

func grantHandlerFailed(f fiberdv1alpha1.HandlerFailure, msg string) func(*fiberdv1alpha1.CapacityGrant) {
	return func(g *fiberdv1alpha1.CapacityGrant) {
		grantAdmitted(g)
		g.Status.MarkHandlerFailed(f, msg)
	}
}

func grantRefused(reason contract.Reason, msg string) func(*fiberdv1alpha1.CapacityGrant) {
	return func(g *fiberdv1alpha1.CapacityGrant) {
		g.Status.InitializeConditions()
		g.Status.MarkNotAdmitted(reason, "%s", msg)
	}
}

func service(t *resources.Template, strategy lampyrconfig.BackendStrategy) *corev1.Service {
	return resources.MakeService(rev(), t, testLampyr(strategy))
}

// apiServerDefaults is what the API server adds to a ClusterIP Service; the
// reconciler must not fight over them.
func apiServerDefaults(s *corev1.Service) *corev1.Service {
	s.Spec.ClusterIP = "10.96.0.42"
	s.Spec.ClusterIPs = []string{"10.96.0.42"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	return s
}

// metadata is the router metadata the reconciler publishes, in the Lampyr
// namespace; endpoint "" means not pointed at a Home yet.
func metadata(t *resources.Template, endpoint string, isReady bool) *corev1.ConfigMap {
	var home resources.Home
	if endpoint != "" {
		home = resources.Home{Name: testHomeName, Endpoint: endpoint, KeySHA256: testHomeKey}
	}
	return resources.MakeRouterMetadata(rev(), t, "lampyr-system", home, isReady)
}

func routerSlice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "lampyr-system",
			Labels:    map[string]string{discoveryv1.LabelServiceName: "fiber-router"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.String("http"), Port: ptr.Int32(80)},
			{Name: ptr.String("h2c"), Port: ptr.Int32(81)},
		},
	}
}

func endpoint(ip string, isReady *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: isReady}}
}

func notOwned[T metav1.Object](obj T) T {
	obj.SetOwnerReferences(nil)
	return obj
}

// Action helpers.

func patchFinalizers(finalizers ...string) clientgotesting.PatchActionImpl {
	fs, _ := json.Marshal(finalizers)
	if finalizers == nil {
		fs = []byte("[]")
	}
	return clientgotesting.PatchActionImpl{
		ActionImpl: clientgotesting.ActionImpl{Namespace: testNS},
		Name:       testRevName,
		Patch:      []byte(`{"metadata":{"finalizers":` + string(fs) + `,"resourceVersion":""}}`),
	}
}

func finalizerEvent() string {
	return rtesting.Eventf(corev1.EventTypeNormal, "FinalizerUpdate", "Updated %q finalizers", testRevName)
}

func deleteAction(resource schema.GroupVersionResource, name string) clientgotesting.DeleteActionImpl {
	return deleteActionIn(testNS, resource, name)
}

func deleteActionIn(ns string, resource schema.GroupVersionResource, name string) clientgotesting.DeleteActionImpl {
	return clientgotesting.DeleteActionImpl{
		ActionImpl: clientgotesting.ActionImpl{Namespace: ns, Verb: "delete", Resource: resource},
		Name:       name,
	}
}

func statusUpdate(r *v1.Revision) clientgotesting.UpdateActionImpl {
	return clientgotesting.UpdateActionImpl{Object: r}
}

func update(obj runtime.Object) clientgotesting.UpdateActionImpl {
	return clientgotesting.UpdateActionImpl{Object: obj}
}

// The factory: Knative fake clients plus listers over indexers filled with
// the row's objects, wired into the generated reconciler exactly as
// NewController does.

type testConfigStore struct{ cfg *config.Config }

func (s *testConfigStore) ToContext(ctx context.Context) context.Context {
	return config.ToContext(ctx, s.cfg)
}

var _ pkgreconciler.ConfigStore = (*testConfigStore)(nil)

func newIndexer() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

func makeFactory() rtesting.Factory {
	return func(t *testing.T, row *rtesting.TableRow) (controller.Reconciler, rtesting.ActionRecorderList, rtesting.EventList) {
		ctx := row.Ctx
		if ctx == nil {
			ctx = context.Background()
		}
		logger := logtesting.TestLogger(t)
		ctx = logging.WithLogger(ctx, logger)

		revisions, services, configMaps, slices, grants := newIndexer(), newIndexer(), newIndexer(), newIndexer(), newIndexer()
		var kubeObjs, servingObjs, fiberdObjs []runtime.Object
		for _, o := range row.Objects {
			switch o := o.(type) {
			case *v1.Revision:
				servingObjs = append(servingObjs, o)
				revisions.Add(o)
			case *corev1.Service:
				kubeObjs = append(kubeObjs, o)
				services.Add(o)
			case *corev1.ConfigMap:
				kubeObjs = append(kubeObjs, o)
				configMaps.Add(o)
			case *discoveryv1.EndpointSlice:
				kubeObjs = append(kubeObjs, o)
				slices.Add(o)
			case *fiberdv1alpha1.CapacityGrant:
				fiberdObjs = append(fiberdObjs, o)
				grants.Add(o)
			default:
				t.Fatalf("unexpected test object %T", o)
			}
		}

		ctx, kubeClient := fakekubeclient.With(ctx, kubeObjs...)
		ctx, servingClient := fakeservingclient.With(ctx, servingObjs...)
		ctx, fiberdClient := fakefiberdclient.With(ctx, fiberdObjs...)
		recorder := record.NewFakeRecorder(20)
		ctx = controller.WithEventRecorder(ctx, recorder)

		lampyr, _ := row.OtherTestData[lampyrConfigKey].(*lampyrconfig.Config)
		if lampyr == nil {
			lampyr = testLampyr(lampyrconfig.BackendExternalName)
		}
		verifier, _ := row.OtherTestData[verifierKey].(ArtifactChecks)
		sealer, _ := row.OtherTestData[sealerKey].(TemplateSealer)
		prober, _ := row.OtherTestData[proberKey].(BackendProber)

		r := &Reconciler{
			kubeclient:           kubeClient,
			grants:               &typedGrants{client: fiberdClient.FiberdV1alpha1(), lister: fiberdlisters.NewCapacityGrantLister(grants)},
			serviceLister:        corev1listers.NewServiceLister(services),
			routerMetadataLister: corev1listers.NewConfigMapLister(configMaps),
			mirrorSliceLister:    discoverylisters.NewEndpointSliceLister(slices),
			routerSliceLister:    discoverylisters.NewEndpointSliceLister(slices),
			artifacts:            verifier,
			sealer:               sealer,
			prober:               prober,
		}
		c := revisionreconciler.NewReconciler(ctx, logger, servingClient, servinglisters.NewRevisionLister(revisions), recorder, r,
			controller.Options{ConfigStore: &testConfigStore{cfg: &config.Config{Lampyr: lampyr, Serving: testServingConfig(t)}}})
		row.Ctx = ctx

		// The generated reconciler does nothing until it leads.
		if la, ok := c.(pkgreconciler.LeaderAware); ok {
			la.Promote(pkgreconciler.UniversalBucket(), func(pkgreconciler.Bucket, types.NamespacedName) {})
		}
		for _, reactor := range row.WithReactors {
			kubeClient.PrependReactor("*", "*", reactor)
			servingClient.PrependReactor("*", "*", reactor)
			fiberdClient.PrependReactor("*", "*", reactor)
		}
		return c, rtesting.ActionRecorderList{fiberdClient, servingClient, kubeClient}, rtesting.EventList{Recorder: recorder}
	}
}

func key() string { return testNS + "/" + testRevName }

// Events the reconciler emits on the Revision (events.go).

func grantCreatedEvent() string {
	return rtesting.Eventf(corev1.EventTypeNormal, "CapacityGrantCreated", "Created CapacityGrant %s", testRevName)
}

func grantUpdatedEvent() string {
	return rtesting.Eventf(corev1.EventTypeNormal, "CapacityGrantUpdated", "Updated the spec of CapacityGrant %s to the Revision's", testRevName)
}

func serviceCreatedEvent(t corev1.ServiceType) string {
	return rtesting.Eventf(corev1.EventTypeNormal, "BackendServiceCreated", "Created backend Service %s (%s)", testRevName, t)
}

func notOwnedEvent(kind, name string) string {
	return rtesting.Eventf(corev1.EventTypeWarning, v1.ReasonNotOwned, "%s", v1.ResourceNotOwnedMessage(kind, name))
}

// refusalEvent is the Warning for condition t of want, which is False.
func refusalEvent(want *v1.Revision, t apis.ConditionType) string {
	c := want.Status.GetCondition(t)
	return rtesting.Eventf(corev1.EventTypeWarning, c.Reason, "%s: %s", t, c.Message)
}
