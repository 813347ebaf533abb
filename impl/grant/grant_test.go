package grant

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
)

var (
	now      = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	digest   = "sha256:" + strings.Repeat("a", 64)
	testKeys = func() *Keys {
		_, priv, _ := signedgrant.GenerateKey()
		pub, _ := signedgrant.MarshalPublicKey(priv.Public().(ed25519.PublicKey))
		return &Keys{FleetPrivatePEM: []byte("fleet"), Signing: priv, SigningPubPEM: pub, RouterToken: "tok"}
	}()
)

type grantOpt func(*v1alpha1.CapacityGrant)

func grant(name string, opts ...grantOpt) *v1alpha1.CapacityGrant {
	g := &v1alpha1.CapacityGrant{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "CapacityGrant"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Generation: 1},
		Spec: v1alpha1.CapacityGrantSpec{
			RevisionName:      name,
			Template:          "localhost:5002/lampyr/templates@" + digest,
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
	p := resources.MakeHomePod(g, testConfig())
	mut(p)
	return p
}

func ready(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func homeSecret(g *v1alpha1.CapacityGrant, issued time.Time) *corev1.Secret {
	c := resources.MakeClaims(g, testConfig(), "old-grant", metav1.NewTime(issued))
	b, _ := signedgrant.Sign(testKeys.Signing, c)
	return resources.MakeHomeSecret(g, b, testKeys.SigningPubPEM, testKeys.FleetPrivatePEM, testKeys.RouterToken)
}

func testConfig() *config.Config {
	c, _ := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{
		config.KeyFiberMemoryCapacity: "1Gi",
		config.KeyMaxMemoryPerFiber:   "512Mi",
		config.KeyMaxFibersPerGrant:   "16",
		config.KeyDefaultMaxFibers:    "2",
		config.KeyGrantTTL:            "10m",
		config.KeyHomeImage:           "kind.local/fiberd:test",
	}})
	return c
}

type harness struct {
	r    *Reconciler
	kube *kubefake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
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
	}
	h.r = &Reconciler{
		kube:     h.kube,
		grants:   &dynamicGrants{client: h.dyn, lister: cache.NewGenericLister(grantIdx, GrantGVR.GroupResource())},
		pods:     corev1listers.NewPodLister(podIdx),
		services: corev1listers.NewServiceLister(svcIdx),
		secrets:  corev1listers.NewSecretLister(secIdx),
		keys:     testKeys,
		config:   func() (*config.Config, error) { return testConfig(), nil },
		now:      func() time.Time { return now },
		pending:  map[string]int64{},
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
	reason string
}

func TestReconcile(t *testing.T) {
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
			"create secrets hello-00001-home", "create services hello-00001-home", "create pods hello-00001-home",
		},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionTrue, v1alpha1.ReasonAdmitted},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionUnknown, v1alpha1.ReasonHomePending},
			v1alpha1.GrantConditionReady:     {corev1.ConditionUnknown, v1alpha1.ReasonHomePending},
		},
		wantRequeue: 5 * time.Minute,
		check: func(t *testing.T, h *harness, g *v1alpha1.CapacityGrant) {
			if g.Status.HomeEndpoint != "hello-00001-home.default.svc:9090" {
				t.Errorf("homeEndpoint %q", g.Status.HomeEndpoint)
			}
			if g.Status.ExpiresAt == nil || !g.Status.ExpiresAt.Time.Equal(now.Add(10*time.Minute)) || g.Status.GrantID == "" {
				t.Errorf("grant identity/expiry: %q %v", g.Status.GrantID, g.Status.ExpiresAt)
			}
			s, err := h.kube.CoreV1().Secrets("default").Get(context.Background(), "hello-00001-home", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := signedgrant.Verify(testKeys.Signing.Public().(ed25519.PublicKey), s.Data[resources.SecretKeyGrant], now)
			if err != nil {
				t.Fatalf("issued grant does not verify: %v", err)
			}
			if c.GrantID != g.Status.GrantID || c.MaxFibers != 4 || c.MemoryPerFiberBytes != 128<<20 || c.Revision != "hello-00001" {
				t.Errorf("issued claims %+v", c)
			}
			if string(s.Data[resources.SecretKeyRouterToken]) != "tok" || string(s.Data[resources.SecretKeyFleetKey]) != "fleet" {
				t.Error("Home Secret lacks the router token or fleet key")
			}
			p, _ := h.kube.CoreV1().Pods("default").Get(context.Background(), "hello-00001-home", metav1.GetOptions{})
			if *p.Spec.AutomountServiceAccountToken || !metav1.IsControlledBy(p, g) {
				t.Error("Home Pod must not mount a service-account token and must be owned by the grant")
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
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionFalse, v1alpha1.ReasonInsufficientMemory},
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, v1alpha1.ReasonNotAdmitted},
			v1alpha1.GrantConditionReady:     {corev1.ConditionFalse, v1alpha1.ReasonInsufficientMemory},
		},
		wantMsg: []string{"needs 384Mi", "only 256Mi", "fiber-memory-capacity", "config-lampyr"},
	}, {
		name: "maxFibers 0 takes the installation default",
		objs: []runtime.Object{big, grant("hello-00001", withMemory("128Mi", 0))},
		key:  "default/hello-00001",
		wantActions: []string{
			"create secrets hello-00001-home", "create services hello-00001-home", "create pods hello-00001-home",
		},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionTrue, v1alpha1.ReasonAdmitted},
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
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, v1alpha1.ReasonInsufficientMemory},
		},
		wantMsg: []string{"needs 512Mi", "only 256Mi"},
	}, {
		name: "an admitted grant keeps its reservation when the configuration shrinks",
		objs: func() []runtime.Object {
			g := grant("hello-00001", withMemory("128Mi", 0), admitted) // default max was 4 when admitted
			setReserved(g, 512<<20)
			return []runtime.Object{big, g, homeSecret(g, now), resources.MakeHomeService(g), homePod(g, ready)}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionTrue, v1alpha1.ReasonAdmitted},
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
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, v1alpha1.ReasonMemoryPerFiberTooLarge},
		},
		wantMsg: []string{"1Gi", "512Mi", "max-memory-per-fiber"},
	}, {
		name: "too many fibers",
		objs: []runtime.Object{grant("hello-00001", withMemory("1Mi", 17))},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, v1alpha1.ReasonTooManyFibers},
		},
		wantMsg: []string{"max-scale", "max-fibers-per-grant"},
	}, {
		name: "template not pinned by digest",
		objs: []runtime.Object{grant("hello-00001", func(g *v1alpha1.CapacityGrant) { g.Spec.Template = "localhost:5002/t:hello-00001" })},
		key:  "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted: {corev1.ConditionFalse, v1alpha1.ReasonInvalidSpec},
		},
		wantMsg: []string{"spec.template", "digest-pinned"},
	}, {
		name: "ready Home with a fresh grant: Ready, nothing written to the cluster",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now.Add(-time.Minute)), resources.MakeHomeService(g), homePod(g, ready)}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionAdmitted:  {corev1.ConditionTrue, v1alpha1.ReasonAdmitted},
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
			return []runtime.Object{g, homeSecret(g, now.Add(-6*time.Minute)), resources.MakeHomeService(g), homePod(g, ready)}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"update secrets hello-00001-home"},
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
			return []runtime.Object{g, old, resources.MakeHomeService(g), homePod(g, ready)}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"update secrets hello-00001-home"},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "failed Home Pod is replaced",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now), resources.MakeHomeService(g), homePod(g, func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodFailed
				p.Status.Message = "Evicted"
			})}
		}(),
		key:         "default/hello-00001",
		wantActions: []string{"delete pods hello-00001-home"},
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, v1alpha1.ReasonHomeFailed},
		},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "Home Pod crash-looping reports why",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			return []runtime.Object{g, homeSecret(g, now), resources.MakeHomeService(g), homePod(g, func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodRunning
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "fiberd", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}}}
			})}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionUnknown, v1alpha1.ReasonHomeNotReady},
		},
		wantRequeue: 5 * time.Minute,
	}, {
		name: "a foreign Secret with the Home's name is left alone",
		objs: func() []runtime.Object {
			g := grant("hello-00001", admitted)
			s := homeSecret(g, now)
			s.OwnerReferences = nil
			return []runtime.Object{g, s}
		}(),
		key: "default/hello-00001",
		wantConds: map[apis.ConditionType]cond{
			v1alpha1.GrantConditionHomeReady: {corev1.ConditionFalse, "HomeNameTaken"},
		},
	}, {
		name: "deleted grant: nothing to do (owner references clean up)",
		key:  "default/gone",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.objs...)
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
				if c == nil || c.Status != want.status || (want.reason != "" && c.Reason != want.reason) {
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
	msg   string
	ok    bool
	calls int
}

func (f *fakeDiagnoser) Diagnose(context.Context, *corev1.Pod) (string, string, bool) {
	f.calls++
	return "NotReady", f.msg, f.ok
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
		name      string
		pod       func(*corev1.Pod)
		diag      *fakeDiagnoser
		want      cond
		wantInMsg string
		wantCalls int
	}{{
		name:      "template sealed for another Revision",
		pod:       running,
		diag:      &fakeDiagnoser{msg: `TemplateMismatch: template was sealed for Revision "x-00001" but the grant is for "hello-00001"`, ok: true},
		want:      cond{corev1.ConditionFalse, "TemplateMismatch"},
		wantInMsg: `sealed for Revision "x-00001"`,
		wantCalls: 1,
	}, {
		name:      "still warming",
		pod:       running,
		diag:      &fakeDiagnoser{msg: "warm pool not filled yet", ok: true},
		want:      cond{corev1.ConditionUnknown, v1alpha1.ReasonHomeNotReady},
		wantInMsg: "warm pool not filled yet",
		wantCalls: 1,
	}, {
		name:      "fiberd does not answer: the Pod's own view stays",
		pod:       running,
		diag:      &fakeDiagnoser{},
		want:      cond{corev1.ConditionUnknown, v1alpha1.ReasonHomeNotReady},
		wantCalls: 1,
	}, {
		name:      "ready Home: not asked",
		pod:       ready,
		diag:      &fakeDiagnoser{msg: "TemplateMismatch: never", ok: true},
		want:      cond{corev1.ConditionTrue, ""},
		wantCalls: 0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := grant("hello-00001", admitted)
			h := newHarness(t, g, homeSecret(g, now), resources.MakeHomeService(g), homePod(g, tc.pod))
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
			if c == nil || c.Status != tc.want.status || c.Reason != tc.want.reason {
				t.Fatalf("HomeReady = %+v, want %+v", c, tc.want)
			}
			if !strings.Contains(c.Message, tc.wantInMsg) {
				t.Errorf("message %q, want it to contain %q", c.Message, tc.wantInMsg)
			}
			if tc.diag.calls != tc.wantCalls {
				t.Errorf("fiberd asked %d times, want %d", tc.diag.calls, tc.wantCalls)
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
	reason, msg, ok := d.Diagnose(context.Background(), &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7"}})
	if !ok || reason != "NotReady" || msg != "TemplateMismatch: no" {
		t.Fatalf("Diagnose = %q %q %v", reason, msg, ok)
	}
	if _, _, ok := d.Diagnose(context.Background(), &corev1.Pod{}); ok {
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
		return true, nil, fmt.Errorf("services %q already exists", "hello-00001-home")
	})
	if err := h.r.Reconcile(context.Background(), "default/hello-00001"); err == nil {
		t.Fatal("want the Service create error")
	}
	st := h.status(t)
	if st == nil || !st.Status.IsAdmitted() {
		t.Fatalf("status %+v, want admitted", st)
	}
	if st.Status.HomeEndpoint != resources.HomeEndpoint(g) {
		t.Errorf("homeEndpoint %q, want %q", st.Status.HomeEndpoint, resources.HomeEndpoint(g))
	}
}
