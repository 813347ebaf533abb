package grant

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	clientgotesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"knative.dev/pkg/apis"
	"knative.dev/pkg/controller"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/routercred"
	"lampyr.dev/serving/impl/fiberd/seal"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

const (
	homesNS  = "lampyr-homes"
	systemNS = "lampyr-system"
)

var (
	now    = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	digest = "sha256:" + strings.Repeat("a", 64)
	// testFleet is the installation's fleet key, testSealer the
	// controller's sealer key (trusted for every namespace).
	testFleet, _  = seal.GenerateFleetKey()
	testSealer, _ = seal.GenerateSealerKey()
	testKeys      = func() *Keys {
		_, priv, _ := signedgrant.GenerateKey()
		pub, _ := signedgrant.MarshalPublicKey(priv.Public().(ed25519.PublicKey))
		rpub, _, _ := routercred.GenerateKey()
		rpem, _ := routercred.MarshalPublicKey(rpub)
		return &Keys{Signing: priv, SigningPubPEM: pub, RouterPubPEM: rpem, ControllerSealer: testSealer.Public()}
	}()
	testHelper = signedgrant.Helper{Port: 8080, Protocol: "http1"}
)

// templateRef is the reference a grant of that name names; templateOf the
// sealed template behind it, sealed by the controller for that grant.
func templateRef(name string) string {
	return "localhost:5002/lampyr/templates@sha256:" + fmt.Sprintf("%064x", sha256.Sum256([]byte(name)))
}

func sealFor(t testing.TB, sealer *seal.SealerKey, namespace, revision string) []byte {
	t.Helper()
	b, err := seal.Seal(testFleet.Public(), sealer, seal.Template{Namespace: namespace, Revision: revision, SnapshotDigest: digest,
		Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080, Protocol: "http1"}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeTemplates is the registry: reference -> sealed bytes (missing:
// an error, as a registry that cannot answer).
type fakeTemplates struct {
	m     map[string][]byte
	calls int
}

func (f *fakeTemplates) Fetch(_ context.Context, ref string, _ ...remote.Option) ([]byte, error) {
	f.calls++
	if b, ok := f.m[ref]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("GET %s: connection refused", ref)
}

func homeName(g *v1alpha1.CapacityGrant) string { return resources.HomeName(g) }

type grantOpt func(*v1alpha1.CapacityGrant)

func grant(name string, opts ...grantOpt) *v1alpha1.CapacityGrant {
	g := &v1alpha1.CapacityGrant{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "CapacityGrant"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Generation: 1},
		Spec: v1alpha1.CapacityGrantSpec{
			RevisionName:      name,
			Template:          templateRef(name),
			SnapshotArtifact:  "localhost:5002/hello@" + digest,
			MemoryPerFiber:    resource.MustParse("128Mi"),
			MaxFibers:         4,
			MaxRequestSeconds: 300,
			Execution:         v1alpha1.ExecutionPolicy{Mode: v1alpha1.ExecutionFresh},
			Port:              8080,
			Protocol:          "http1",
			Env:               map[string]string{"K_REVISION": name},
		},
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

func admitted(g *v1alpha1.CapacityGrant) {
	g.Status.InitializeConditions()
	g.Status.MarkAdmitted("")
}

func withMemory(q string, max int32) grantOpt {
	return func(g *v1alpha1.CapacityGrant) { g.Spec.MemoryPerFiber, g.Spec.MaxFibers = resource.MustParse(q), max }
}

func homePod(g *v1alpha1.CapacityGrant, mut func(*corev1.Pod)) *corev1.Pod {
	p := resources.MakeHomePod(g, testConfig(), homesNS)
	mut(p)
	return p
}

func homeService(g *v1alpha1.CapacityGrant) *corev1.Service {
	return resources.MakeHomeService(g, homesNS)
}

func ready(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func homeSecret(g *v1alpha1.CapacityGrant, issued time.Time) *corev1.Secret {
	c := resources.MakeClaims(g, testConfig(), testHelper, "old-grant", metav1.NewTime(issued))
	b, _ := signedgrant.Sign(testKeys.Signing, c)
	return resources.MakeHomeSecret(g, homesNS, b, testKeys.SigningPubPEM, testKeys.RouterPubPEM)
}

func testConfig() *config.Config {
	c, _ := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{
		config.KeyFiberMemoryCapacity: "1Gi",
		config.KeyMaxMemoryPerFiber:   "512Mi",
		config.KeyMaxFibersPerGrant:   "16",
		config.KeyDefaultMaxFibers:    "2",
		config.KeyGrantTTL:            "10m",
		config.KeyHomeImage:           "kind.local/fiberd@" + digest,
	}})
	return c
}

type harness struct {
	r         *Reconciler
	kube      *kubefake.Clientset
	dyn       *dynamicfake.FakeDynamicClient
	templates *fakeTemplates
	sealers   *corev1.ConfigMap
}

func newHarness(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	v1alpha1.AddToScheme(scheme)
	var kubeObjs, grantObjs []runtime.Object
	grantIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	svcIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	secIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, o := range objs {
		switch o := o.(type) {
		case *v1alpha1.CapacityGrant:
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{Object: m}
			grantObjs = append(grantObjs, u)
			grantIdx.Add(u)
		case *corev1.Pod:
			kubeObjs = append(kubeObjs, o)
			podIdx.Add(o)
		case *corev1.Service:
			kubeObjs = append(kubeObjs, o)
			svcIdx.Add(o)
		case *corev1.Secret:
			kubeObjs = append(kubeObjs, o)
			secIdx.Add(o)
		}
	}
	h := &harness{
		kube: kubefake.NewSimpleClientset(kubeObjs...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
			map[schema.GroupVersionResource]string{GrantGVR: "CapacityGrantList"}, grantObjs...),
		templates: &fakeTemplates{m: map[string][]byte{}},
	}
	// Every grant's template, sealed by the controller for it.
	for _, o := range grantObjs {
		u := o.(*unstructured.Unstructured)
		h.templates.m[templateRef(u.GetName())] = sealFor(t, testSealer, u.GetNamespace(), u.GetName())
	}
	fleetPEM, _ := testFleet.MarshalPEM()
	fleet := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: FleetKeyName, Namespace: systemNS, ResourceVersion: "1"}, Data: map[string][]byte{FleetPrivateKeyKey: fleetPEM}}
	h.r = &Reconciler{
		kube:            h.kube,
		grants:          &dynamicGrants{client: h.dyn, lister: cache.NewGenericLister(grantIdx, GrantGVR.GroupResource())},
		homesNamespace:  homesNS,
		pods:            corev1listers.NewPodLister(podIdx),
		services:        corev1listers.NewServiceLister(svcIdx),
		secrets:         corev1listers.NewSecretLister(secIdx),
		systemNamespace: systemNS,
		fleetSecret:     func() (*corev1.Secret, error) { return fleet, nil },
		sealersConfig: func() (*corev1.ConfigMap, error) {
			if h.sealers == nil {
				return nil, apierrs.NewNotFound(corev1.Resource("configmaps"), SealersConfigMap)
			}
			return h.sealers, nil
		},
		keys:      testKeys,
		templates: h.templates,
		config:    func() (*config.Config, error) { return testConfig(), nil },
		now:       func() time.Time { return now },
		pending:   map[string]int64{},
	}
	return h
}

// actions returns "verb Kind name" for every write to the kube client.
func (h *harness) actions() []string {
	var out []string
	for _, a := range h.kube.Actions() {
		switch a.GetVerb() {
		case "create", "update":
			obj := a.(interface{ GetObject() runtime.Object }).GetObject()
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource+" "+obj.(metav1.Object).GetName())
		case "delete":
			out = append(out, "delete "+a.GetResource().Resource+" "+a.(clientgotesting.DeleteAction).GetName())
		}
	}
	return out
}

// status returns the last status written for the grant, nil if none.
func (h *harness) status(t *testing.T) *v1alpha1.CapacityGrant {
	var last *v1alpha1.CapacityGrant
	for _, a := range h.dyn.Actions() {
		if u, ok := a.(clientgotesting.UpdateAction); ok && a.GetSubresource() == "status" {
			g, err := fromUnstructured(u.GetObject())
			if err != nil {
				t.Fatal(err)
			}
			last = g
		}
	}
	return last
}

type cond struct {
	status corev1.ConditionStatus
	reason contract.Reason
}

func TestReconcile(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	big := grant("big", withMemory("256Mi", 3), admitted) // reserves 768Mi of 1Gi
	for _, tc := range []struct {
		name        string
		objs        []runtime.Object
		key         string
		wantActions []string
		wantConds   map[apis.ConditionType]cond
		wantMsg     []string // substrings of the Admitted message
		wantRequeue time.Duration
		check       func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant)
	}{{
		name: "new grant that fits is admitted and gets a Home",
		objs: []runtime.Object{grant("hello-00001")},
		key:  "default/hello-00001",
		wantActions: []string{
			"create secrets " + hn, "create services " + hn, "create pods " + hn,
		},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionTrue, contract.ReasonAdmitted},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionUnknown, contract.ReasonHomePending},
			v1alpha1.GrantConditionReady:     {corev1.ConditionUnknown, contract.ReasonHomePending},
		},
		wantRequeue: 5 * time.Minute,
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if g.Status.HomeEndpoint != hn+".lampyr-homes.svc:9090" || g.Status.Home != hn {
				t.Errorf("homeEndpoint %q home %q", g.Status.HomeEndpoint, g.Status.Home)
			}
			if !strings.HasPrefix(hn, "hello-00001-") || len(hn) != len("hello-00001-")+10 {
				t.Errorf("Home name %q: want the grant's name and 10 hex digits", hn)
			}
			if g.Status.ExpiresAt == nil || !g.Status.ExpiresAt.Time.Equal(now.Add(10*time.Minute)) || g.Status.GrantID == "" {
				t.Errorf("grant identity/expiry: %q %v", g.Status.GrantID, g.Status.ExpiresAt)
			}
			s, err := h.kube.CoreV1().Secrets(homesNS).Get(context.Background(), hn, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := signedgrant.Verify(testKeys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
			if err != nil {
				t.Fatalf("issued grant does not verify: %v", err)
			}
			if c.GrantID != g.Status.GrantID || c.MaxFibers != 4 || c.MemoryPerFiberBytes != 128<<20 || c.Revision != "hello-00001" || c.Home != hn || c.Helper != testHelper {
				t.Errorf("issued claims %+v", c)
			}
			// Only the grant and two public keys: nothing in a Home's
			// Secret acts on another Home or opens another template.
			if len(s.Data) != 3 || string(s.Data[resources.SecretKeyRouterPubKeys]) != string(testKeys.RouterPubPEM) || string(s.Data[resources.SecretKeyGrantPubKey]) != string(testKeys.SigningPubPEM) {
				t.Errorf("Home Secret keys %v", keysOf(s.Data))
			}
			for k, v := range s.Data {
				if strings.Contains(string(v), "PRIVATE KEY") {
					t.Errorf("Home Secret key %s holds a private key", k)
				}
			}
			p, _ := h.kube.CoreV1().Pods(homesNS).Get(context.Background(), hn, metav1.GetOptions{})
			if *p.Spec.AutomountServiceAccountToken || len(p.OwnerReferences) != 0 || !resources.IsHomeOf(p, g) {
				t.Errorf("Home Pod: no service-account token, no owner reference across namespaces, labelled for its grant: %+v", p.ObjectMeta)
			}
			if _, err := h.kube.CoreV1().Pods("default").Get(context.Background(), hn, metav1.GetOptions{}); err == nil {
				t.Error("a Home Pod runs in the tenant namespace")
			}
			if got := p.Spec.Containers[0].Resources.Limits.Memory().String(); got != "768Mi" { // 4×128Mi + 256Mi
				t.Errorf("Home memory limit %s, want 768Mi", got)
			}
		},
	}, {
		name: "grant beyond the remaining capacity is refused with an actionable reason",
		objs: []runtime.Object{big, grant("hello-00001", withMemory("128Mi", 3))},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionFalse, contract.ReasonInsufficientMemory},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, contract.ReasonNotAdmitted},
			v1alpha1.GrantConditionReady:     {corev1.ConditionFalse, contract.ReasonInsufficientMemory},
		},
		wantMsg: []string{"needs 384Mi", "only 256Mi", "fiber-memory-capacity", "config-lampyr"},
	}, {
		name: "maxFibers 0 takes the installation default",
		objs: []runtime.Object{big, grant("hello-00001", withMemory("128Mi", 0))},
		key:  "default/hello-00001",
		wantActions: []string{
			"create secrets " + hn, "create services " + hn, "create pods " + hn,
		},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionTrue, contract.ReasonAdmitted},
		},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "an admitted grant that grows beyond the free capacity loses its admission",
		objs: func() []runtime.Object {
			g := grant("hello-00001", withMemory("128Mi", 2), admitted) // holds 256Mi
			setReserved(g, 256<<20)
			g.Spec.MaxFibers = 4 // now asks 512Mi; 1Gi - 768Mi (big) = 256Mi free
			return []runtime.Object{big, g}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, contract.ReasonInsufficientMemory},
		},
		wantMsg: []string{"needs 512Mi", "only 256Mi"},
	}, {
		name: "an admitted grant keeps its reservation when the configuration shrinks",
		objs: func() []runtime.Object {
			g := grant("hello-00001", withMemory("128Mi", 0), admitted) // default max was 4 when admitted
			setReserved(g, 512<<20)
			return []runtime.Object{big, g, homeSecret(g, now), homeService(g), homePod(g, ready)}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionTrue, contract.ReasonAdmitted},
		},
		wantRequeue: 5 * time.Minute,
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if got := g.Status.Annotations[ReservedMemoryAnnotation]; got != "268435456" {
				t.Errorf("reservation %s, want the smaller current 256Mi", got)
			}
		},
	}, {
		name: "memory per fiber above the cap",
		objs: []runtime.Object{grant("hello-00001", withMemory("1Gi", 1))},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, contract.ReasonMemoryPerFiberTooLarge},
		},
		wantMsg: []string{"1Gi", "512Mi", "max-memory-per-fiber"},
	}, {
		name: "too many fibers",
		objs: []runtime.Object{grant("hello-00001", withMemory("1Mi", 17))},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, contract.ReasonTooManyFibers},
		},
		wantMsg: []string{"max-scale", "max-fibers-per-grant"},
	}, {
		name: "template not pinned by digest",
		objs: []runtime.Object{grant("hello-00001", func(g *v1alpha1.CapacityGrant) { g.Spec.Template = "localhost:5002/t:hello-00001" })},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, contract.ReasonInvalidSpec},
		},
		wantMsg: []string{"spec.template", "digest-pinned"},
	}, {
		name: "ready Home with a fresh grant: Ready, nothing written to the cluster",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now.Add(-time.Minute)), homeService(g), homePod(g, ready)}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionTrue, contract.ReasonAdmitted},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionTrue, ""},
			v1alpha1.GrantConditionReady:     {corev1.ConditionTrue, ""},
		},
		wantRequeue: 4 * time.Minute,
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if g.Status.GrantID != "old-grant" {
				t.Errorf("grant was reissued although it is fresh: %s", g.Status.GrantID)
			}
		},
	}, {
		name: "grant past half its life is renewed",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now.Add(-6*time.Minute)), homeService(g), homePod(g, ready)}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"update secrets " + hn},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionReady: {corev1.ConditionTrue, ""},
		},
		wantRequeue: 5 * time.Minute,
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if g.Status.GrantID == "old-grant" || !g.Status.ExpiresAt.Time.Equal(now.Add(10*time.Minute)) {
				t.Errorf("renewal: id %s expires %v", g.Status.GrantID, g.Status.ExpiresAt)
			}
		},
	}, {
		name: "grant whose spec changed is reissued with the new terms",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			old := homeSecret(g, now.Add(-time.Minute))
			g.Spec.MaxFibers = 2
			return []runtime.Object{g, old, homeService(g), homePod(g, ready)}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"update secrets " + hn},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "failed Home Pod is replaced",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now), homeService(g), homePod(g, func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodFailed
				p.Status.Message = "Evicted"
			})}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"delete pods " + hn},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, contract.ReasonHomeFailed},
		},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "Home Pod crash-looping reports why",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now), homeService(g), homePod(g, func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodRunning
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "fiberd", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}}}
			})}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionUnknown, contract.ReasonHomeNotReady},
		},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "a foreign Secret with the Home's name is left alone",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			s := homeSecret(g, now)
			s.Labels = map[string]string{"app": "someone-else"}
			return []runtime.Object{g, s}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, contract.ReasonHomeNameTaken},
		},
	}, {
		name: "a leftover Home of an earlier grant of the same name is replaced",
		objs: func() []runtime.Object {
			old := grant("hello-00001", admitted)
			old.UID = "uid-earlier"
			return []runtime.Object{grant("hello-00001", admitted), homeSecret(old, now), homeService(old), homePod(old, ready)}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"delete pods " + hn, "delete services " + hn, "delete secrets " + hn},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionUnknown, contract.ReasonHomePending},
		},
		wantRequeue: time.Second,
	}, {
		name: "deleted grant: its Home (found by its labels) is deleted",
		objs: func() []runtime.Object {
			g := grant("gone", admitted)
			return []runtime.Object{homeSecret(g, now), homeService(g), homePod(g, ready)}
		}(),
		key: "default/gone",
		wantActions: []string{
			"delete pods " + resources.HomeNameFor("default", "gone"), "delete services " + resources.HomeNameFor("default", "gone"), "delete secrets " + resources.HomeNameFor("default", "gone"),
		},
	}, {
		name: "deleted grant without a Home: nothing to do",
		key:  "default/gone",
	}, {
		name: "Home image not pinned by digest",
		objs: []runtime.Object{grant("hello-00001")},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionTrue, contract.ReasonAdmitted},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, contract.ReasonHomeImageNotPinned},
		},
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if msg := g.Status.GetCondition(v1alpha1.GrantConditionHomeReady).Message; !strings.Contains(msg, "home-image") || !strings.Contains(msg, "sha256") {
				t.Errorf("message %q should name home-image and the fix", msg)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.objs...)
			if tc.name == "Home image not pinned by digest" {
				h.r.config = func() (*config.Config, error) {
					c := testConfig()
					c.HomeImage = "kind.local/fiberd:latest"
					return c, nil
				}
			}
			err := h.r.Reconcile(context.Background(), tc.key)
			requeue := time.Duration(0)
			if ok, d := controller.IsRequeueKey(err); ok {
				requeue, err = d, nil
			}
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			if requeue != tc.wantRequeue {
				t.Errorf("requeue after %s, want %s", requeue, tc.wantRequeue)
			}
			if got := h.actions(); strings.Join(got, ",") != strings.Join(tc.wantActions, ",") {
				t.Errorf("actions:\n got  %q\n want %q", got, tc.wantActions)
			}
			g := h.status(t)
			if len(tc.wantConds) > 0 && g == nil {
				t.Fatal("no status update")
			}
			for typ, want := range tc.wantConds {
				c := g.Status.GetCondition(typ)
				if c == nil || c.Status != want.status || (want.reason != "" && c.Reason != want.reason.String()) {
					t.Errorf("condition %s = %+v, want %s/%s", typ, c, want.status, want.reason)
				}
			}
			if len(tc.wantMsg) > 0 {
				msg := g.Status.GetCondition(v1alpha1.GrantConditionAdmitted).Message
				for _, s := range tc.wantMsg {
					if !strings.Contains(msg, s) {
						t.Errorf("Admitted message %q should contain %q", msg, s)
					}
				}
			}
			if tc.check != nil {
				tc.check(t, h, g)
			}
		})
	}
}

// Two grants reconciled back to back, before the informer has seen the
// first one's admission, must not both take the last capacity.
func TestAdmissionDoesNotDoubleBook(t *testing.T) {
	h := newHarness(t, grant("a", withMemory("512Mi", 2)), grant("b", withMemory("512Mi", 2)))
	for _, k := range []string{"default/a", "default/b"} {
		if err := h.r.Reconcile(context.Background(), k); err != nil {
			if ok, _ := controller.IsRequeueKey(err); !ok {
				t.Fatal(err)
			}
		}
	}
	var admittedNames []string
	for _, a := range h.dyn.Actions() {
		if u, ok := a.(clientgotesting.UpdateAction); ok && a.GetSubresource() == "status" {
			g, _ := fromUnstructured(u.GetObject())
			if g.Status.IsAdmitted() {
				admittedNames = append(admittedNames, g.Name)
			}
		}
	}
	if len(admittedNames) != 1 || admittedNames[0] != "a" {
		t.Fatalf("admitted %v of two 1Gi grants in 1Gi capacity, want only a", admittedNames)
	}
}

// fakeDiagnoser answers as fiberd's /readyz would, and counts the calls.
type fakeDiagnoser struct {
	reason  contract.Reason
	msg     string
	handler *fiberdclient.HandlerFailure
	ok      bool
	calls   int
}

func (f *fakeDiagnoser) Diagnose(context.Context, *corev1.Pod) (fiberdclient.Error, bool) {
	f.calls++
	e := fiberdclient.Error{Reason: f.reason, Message: f.msg, Handler: f.handler}
	if f.reason == "" {
		e.Reason = "NotReady"
	}
	return e, f.ok
}

// TestHomeDiagnosis: a running, not-ready Home says why through its grant:
// a load failure fiberd reports is HomeReady False with fiberd's reason, a
// slow start stays Unknown with fiberd's words, and a ready Home is not asked.
func TestHomeDiagnosis(t *testing.T) {
	running := func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = "10.244.0.7"
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	}
	for _, tc := range []struct {
		name        string
		pod         func(*corev1.Pod)
		diag        *fakeDiagnoser
		want        cond
		wantInMsg   string
		wantCalls   int
		wantFailure *v1alpha1.HandlerFailure
	}{{
		name: "handler exits at start-up",
		pod:  running,
		diag: &fakeDiagnoser{reason: "HandlerExited", msg: "the handler exited with code 5 before it listened on $PORT (8080)", ok: true,
			handler: &fiberdclient.HandlerFailure{ExitCode: 5, Output: "Started...\nCrashed...\x1b[0m", ConsecutiveFailures: 3}},
		want:        cond{corev1.ConditionFalse, contract.ReasonHandlerExited},
		wantInMsg:   "the handler exited with code 5 before it listened on $PORT (8080); last output:\nStarted...\nCrashed...\ufffd[0m",
		wantCalls:   1,
		wantFailure: &v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 5, Output: "Started...\nCrashed...\ufffd[0m"},
	}, {
		name: "handler killed by a signal",
		pod:  running,
		diag: &fakeDiagnoser{reason: "HandlerExited", msg: "the handler was killed by signal SIGKILL (exit code 137) before it listened on $PORT (8080)", ok: true,
			handler: &fiberdclient.HandlerFailure{ExitCode: 137, Signal: "SIGKILL"}},
		want:        cond{corev1.ConditionFalse, contract.ReasonHandlerExited},
		wantInMsg:   "killed by signal SIGKILL",
		wantCalls:   1,
		wantFailure: &v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerExited, ExitCode: 137, Signal: "SIGKILL"},
	}, {
		name: "handler never listens",
		pod:  running,
		diag: &fakeDiagnoser{reason: "HandlerNotListening", msg: "the handler did not listen on $PORT (8080) within the start-up timeout of 10s", ok: true,
			handler: &fiberdclient.HandlerFailure{Output: strings.Repeat("y", 5000)}},
		want:        cond{corev1.ConditionFalse, contract.ReasonHandlerNotListening},
		wantInMsg:   "within the start-up timeout of 10s; last output:\n" + strings.Repeat("y", v1alpha1.MaxHandlerOutput),
		wantCalls:   1,
		wantFailure: &v1alpha1.HandlerFailure{Reason: contract.ReasonHandlerNotListening, Output: strings.Repeat("y", v1alpha1.MaxHandlerOutput)},
	}, {
		name:      "a handler reason without details is not a handler failure",
		pod:       running,
		diag:      &fakeDiagnoser{reason: "HandlerExited", msg: "the handler exited", ok: true},
		want:      cond{corev1.ConditionUnknown, contract.ReasonHomeNotReady},
		wantCalls: 1,
	}, {
		name:      "template port differs from the snapshot's",
		pod:       running,
		diag:      &fakeDiagnoser{reason: "TemplateMismatch", msg: `TemplateMismatch: template helper.port 8080 differs from the snapshot's port 9000`, ok: true},
		want:      cond{corev1.ConditionFalse, "TemplateMismatch"},
		wantInMsg: `snapshot's port 9000`,
		wantCalls: 1,
	}, {
		name:      "snapshot over fiberd's limits",
		pod:       running,
		diag:      &fakeDiagnoser{reason: contract.ReasonSnapshotTooLarge, msg: "SnapshotTooLarge: unpacked size limit of 1073741824 bytes exceeded", ok: true},
		want:      cond{corev1.ConditionFalse, contract.ReasonSnapshotTooLarge},
		wantInMsg: "unpacked size limit",
		wantCalls: 1,
	}, {
		name:      "a load reason in the message only is not a load failure",
		pod:       running,
		diag:      &fakeDiagnoser{reason: contract.ReasonNotReady, msg: "SnapshotUnavailable: not really", ok: true},
		want:      cond{corev1.ConditionUnknown, contract.ReasonHomeNotReady},
		wantInMsg: "SnapshotUnavailable: not really",
		wantCalls: 1,
	}, {
		name:      "still warming",
		pod:       running,
		diag:      &fakeDiagnoser{msg: "warm pool not filled yet", ok: true},
		want:      cond{corev1.ConditionUnknown, contract.ReasonHomeNotReady},
		wantInMsg: "warm pool not filled yet",
		wantCalls: 1,
	}, {
		name:      "fiberd does not answer: the Pod's own view stays",
		pod:       running,
		diag:      &fakeDiagnoser{},
		want:      cond{corev1.ConditionUnknown, contract.ReasonHomeNotReady},
		wantCalls: 1,
	}, {
		name:      "ready Home: not asked",
		pod:       ready,
		diag:      &fakeDiagnoser{reason: "TemplateMismatch", msg: "TemplateMismatch: never", ok: true},
		want:      cond{corev1.ConditionTrue, ""},
		wantCalls: 0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := grant("hello-00001", admitted)
			h := newHarness(t, g, homeSecret(g, now), homeService(g), homePod(g, tc.pod))
			h.r.diagnoser = tc.diag
			err := h.r.Reconcile(context.Background(), "default/hello-00001")
			if ok, _ := controller.IsRequeueKey(err); !ok && err != nil {
				t.Fatal(err)
			}
			st := h.status(t)
			if st == nil {
				t.Fatal("no status written")
			}
			c := st.Status.GetCondition(v1alpha1.GrantConditionHomeReady)
			if c == nil || c.Status != tc.want.status || c.Reason != tc.want.reason.String() {
				t.Fatalf("HomeReady = %+v, want %+v", c, tc.want)
			}
			if !strings.Contains(c.Message, tc.wantInMsg) {
				t.Errorf("message %q, want it to contain %q", c.Message, tc.wantInMsg)
			}
			if tc.diag.calls != tc.wantCalls {
				t.Errorf("fiberd asked %d times, want %d", tc.diag.calls, tc.wantCalls)
			}
			if diff := cmp.Diff(tc.wantFailure, st.Status.HandlerFailure); diff != "" {
				t.Errorf("handlerFailure (-want +got):\n%s", diff)
			}
			if strings.Contains(c.Message, "10.244.0.7") || (tc.wantFailure != nil && strings.Contains(c.Message, resources.HomeName(g))) {
				t.Errorf("message names the Home: %q", c.Message)
			}
		})
	}
}

// TestHTTPHomeDiagnoser reads fiberd's /readyz error body.
func TestHTTPHomeDiagnoser(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(fiberdclient.Error{Reason: "NotReady", Message: "TemplateMismatch: no"})
	}))
	defer srv.Close()
	// The diagnoser dials the Pod IP on fiberd's port; lead it here.
	target := strings.TrimPrefix(srv.URL, "http://")
	d := HTTPHomeDiagnoser{Client: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr != "10.244.0.7:9090" {
				return nil, fmt.Errorf("dialled %s, want the Pod IP on fiberd's port", addr)
			}
			return (&net.Dialer{}).DialContext(ctx, network, target)
		},
	}}}
	e, ok := d.Diagnose(context.Background(), &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7"}})
	if !ok || e.Reason != "NotReady" || e.Message != "TemplateMismatch: no" || e.Handler != nil {
		t.Fatalf("Diagnose = %+v %v", e, ok)
	}
	if _, ok := d.Diagnose(context.Background(), &corev1.Pod{}); ok {
		t.Error("a Pod without an IP was diagnosed")
	}
}

// TestHomeEndpointSurvivesAFailedStep: the status written when a later step
// fails still names the Home Service (CI once saw it blanked when the
// Service create raced the informer cache).
func TestHomeEndpointSurvivesAFailedStep(t *testing.T) {
	g := grant("hello-00001")
	h := newHarness(t, g)
	h.kube.PrependReactor("create", "services", func(clientgotesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("services %q already exists", homeName(g))
	})
	if err := h.r.Reconcile(context.Background(), "default/hello-00001"); err == nil {
		t.Fatal("want the Service create error")
	}
	st := h.status(t)
	if st == nil || !st.Status.IsAdmitted() {
		t.Fatalf("status %+v, want admitted", st)
	}
	if st.Status.HomeEndpoint != resources.HomeEndpoint(g, homesNS) {
		t.Errorf("homeEndpoint %q, want %q", st.Status.HomeEndpoint, resources.HomeEndpoint(g, homesNS))
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTemplateChecks: the grant controller opens every template itself and
// runs a Revision only from one a trusted sealer sealed for exactly this
// namespace, Revision and snapshot (docs/security.md §2). A refused template
// stops a running Home; a registry that does not answer does not.
func TestTemplateChecks(t *testing.T) {
	hn := resources.HomeNameFor("default", "hello-00001")
	mallory, _ := seal.GenerateSealerKey()
	alice, _ := seal.GenerateSealerKey()
	otherFleet, _ := seal.GenerateFleetKey()
	sealers := func(namespaces ...string) *corev1.ConfigMap {
		v, _ := seal.FormatSealer(seal.TrustedSealer{Key: alice.Public(), Namespaces: namespaces})
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: SealersConfigMap, Namespace: systemNS}, Data: map[string]string{"alice": v}}
	}
	running := func() []runtime.Object {
		g := grant("hello-00001", admitted)
		return []runtime.Object{g, homeSecret(g, now.Add(-time.Minute)), homeService(g), homePod(g, ready)}
	}
	stopped := []string{"delete pods " + hn, "delete services " + hn, "delete secrets " + hn}
	for _, tc := range []struct {
		name        string
		objs        []runtime.Object
		template    func(t *testing.T) []byte // nil: the registry cannot answer
		sealers     *corev1.ConfigMap
		want        cond
		wantInMsg   string
		wantActions []string
		wantRequeue time.Duration
	}{{
		name:        "replayed from another namespace, with a Home running",
		objs:        running(),
		template:    func(t *testing.T) []byte { return sealFor(t, testSealer, "victim", "hello-00001") },
		want:        cond{corev1.ConditionFalse, contract.ReasonTemplateMismatch},
		wantInMsg:   `sealed for namespace "victim"`,
		wantActions: stopped,
	}, {
		name:      "sealed by an identity nobody trusts",
		objs:      []runtime.Object{grant("hello-00001")},
		template:  func(t *testing.T) []byte { return sealFor(t, mallory, "default", "hello-00001") },
		want:      cond{corev1.ConditionFalse, contract.ReasonTemplateUnauthenticated},
		wantInMsg: mallory.KeyID()[:16],
	}, {
		name:      "sealed by a ly identity authorized for other namespaces",
		objs:      []runtime.Object{grant("hello-00001")},
		template:  func(t *testing.T) []byte { return sealFor(t, alice, "default", "hello-00001") },
		sealers:   sealers("team-b"),
		want:      cond{corev1.ConditionFalse, contract.ReasonTemplateNotAuthorized},
		wantInMsg: `"alice"`,
	}, {
		name:        "sealed by a ly identity authorized for this namespace",
		objs:        []runtime.Object{grant("hello-00001")},
		template:    func(t *testing.T) []byte { return sealFor(t, alice, "default", "hello-00001") },
		sealers:     sealers("team-b", "default"),
		want:        cond{corev1.ConditionUnknown, contract.ReasonHomePending},
		wantActions: []string{"create secrets " + hn, "create services " + hn, "create pods " + hn},
		wantRequeue: 5 * time.Minute,
	}, {
		name:      "a format v1 template (unsigned)",
		objs:      []runtime.Object{grant("hello-00001")},
		template:  func(t *testing.T) []byte { return append([]byte("LYTPL1\x00\x00"), make([]byte, 100)...) },
		want:      cond{corev1.ConditionFalse, contract.ReasonTemplateUnauthenticated},
		wantInMsg: "ly deploy",
	}, {
		name: "sealed to another installation's fleet key",
		objs: []runtime.Object{grant("hello-00001")},
		template: func(t *testing.T) []byte {
			b, _ := seal.Seal(otherFleet.Public(), testSealer, seal.Template{Namespace: "default", Revision: "hello-00001", SnapshotDigest: digest, Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080}})
			return b
		},
		want:      cond{corev1.ConditionFalse, contract.ReasonTemplateUnsealable},
		wantInMsg: "another fleet key",
	}, {
		name:        "registry does not answer, nothing running yet",
		objs:        []runtime.Object{grant("hello-00001")},
		want:        cond{corev1.ConditionFalse, contract.ReasonTemplateUnavailable},
		wantInMsg:   "connection refused",
		wantRequeue: 10 * time.Second,
	}, {
		name:        "registry does not answer, Home running on its grant",
		objs:        running(),
		want:        cond{corev1.ConditionTrue, ""},
		wantRequeue: 4 * time.Minute,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.objs...)
			delete(h.templates.m, templateRef("hello-00001"))
			if tc.template != nil {
				h.templates.m[templateRef("hello-00001")] = tc.template(t)
			}
			h.sealers = tc.sealers
			err := h.r.Reconcile(context.Background(), "default/hello-00001")
			requeue := time.Duration(0)
			if ok, d := controller.IsRequeueKey(err); ok {
				requeue, err = d, nil
			}
			if err != nil {
				t.Fatal(err)
			}
			if requeue != tc.wantRequeue {
				t.Errorf("requeue after %s, want %s", requeue, tc.wantRequeue)
			}
			if got := h.actions(); strings.Join(got, ",") != strings.Join(tc.wantActions, ",") {
				t.Errorf("actions:\n got  %q\n want %q", got, tc.wantActions)
			}
			st := h.status(t)
			if st == nil {
				t.Fatal("no status written")
			}
			c := st.Status.GetCondition(v1alpha1.GrantConditionHomeReady)
			if c == nil || c.Status != tc.want.status || c.Reason != tc.want.reason.String() || !strings.Contains(c.Message, tc.wantInMsg) {
				t.Fatalf("HomeReady = %+v, want %s/%s saying %q", c, tc.want.status, tc.want.reason, tc.wantInMsg)
			}
		})
	}
}

// TestTemplatesAreFetchedOnce: a template (immutable behind its digest) is
// fetched once, not at every renewal.
func TestTemplatesAreFetchedOnce(t *testing.T) {
	g := grant("hello-00001")
	h := newHarness(t, g)
	trust := seal.NewTrust(seal.TrustedSealer{Name: "c", Key: testSealer.Public(), Namespaces: []string{"*"}})
	for range 3 {
		if helper, refusal := h.r.openTemplate(context.Background(), g, []*seal.PrivateKey{testFleet}, trust, nil); refusal != nil || helper != testHelper {
			t.Fatalf("open: %+v %+v", helper, refusal)
		}
	}
	if h.templates.calls != 1 {
		t.Fatalf("template fetched %d times, want once", h.templates.calls)
	}
}

// TestRevisionPortAndProtocolWin: the Revision's containerPort and port
// name (copied into the grant) decide PORT and the protocol, as on stock
// Knative; the template's, what the build declared, only fill a gap.
func TestRevisionPortAndProtocolWin(t *testing.T) {
	trust := seal.NewTrust(seal.TrustedSealer{Name: "c", Key: testSealer.Public(), Namespaces: []string{"*"}})
	for _, c := range []struct {
		port  int32
		proto string
		want  signedgrant.Helper
	}{
		{8801, "h2c", signedgrant.Helper{Port: 8801, Protocol: "h2c"}},
		{0, "", testHelper},
	} {
		g := grant("hello-00001", func(g *v1alpha1.CapacityGrant) { g.Spec.Port, g.Spec.Protocol = c.port, c.proto })
		h := newHarness(t, g)
		if helper, refusal := h.r.openTemplate(context.Background(), g, []*seal.PrivateKey{testFleet}, trust, nil); refusal != nil || helper != c.want {
			t.Fatalf("grant port %d protocol %q: %+v %+v, want %+v", c.port, c.proto, helper, refusal, c.want)
		}
	}
}
