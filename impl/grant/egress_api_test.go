package grant

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clientgotesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	logtesting "knative.dev/pkg/logging/testing"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/fiberd/egress/proxy"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// egressAPI is the egress API over fake clients: grants for the lister,
// objs for the kube client. A created Pod is Ready at once with address
// 10.244.1.7 unless neverReady.
func egressAPI(t *testing.T, grants []*v1alpha1.CapacityGrant, objs []runtime.Object, cfg *lampyrconfig.Config, neverReady bool, reactors ...clientgotesting.ReactionFunc) (*EgressAPI, *kubefake.Clientset) {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, g := range grants {
		idx.Add(g)
	}
	kube := kubefake.NewSimpleClientset(objs...)
	kube.PrependReactor("create", "pods", func(a clientgotesting.Action) (bool, runtime.Object, error) {
		if !neverReady {
			p := a.(clientgotesting.CreateAction).GetObject().(*corev1.Pod)
			p.Status.PodIP = "10.244.1.7"
			ready(p)
		}
		return false, nil, nil
	})
	for _, r := range reactors {
		kube.PrependReactor("*", "*", r)
	}
	r := &Reconciler{
		kube: kube, grants: fiberdlisters.NewCapacityGrantLister(idx), keys: testKeys, homesNamespace: homesNS,
		config: func(context.Context) (*lampyrconfig.Config, error) { return cfg, nil }, now: func() time.Time { return now },
	}
	a := newEgressAPI(r)
	a.readyTimeout, a.pollEvery = 200*time.Millisecond, 10*time.Millisecond
	return a, kube
}

// bearer is the signed grant g's Home holds, issued at issued.
func bearer(t *testing.T, g *v1alpha1.CapacityGrant, issued time.Time) string {
	t.Helper()
	b, err := signedgrant.Sign(testKeys.Signing, resources.MakeClaims(g, testConfig(), testHelper, testHomeKey.SHA256, "gid", metav1.NewTime(issued)))
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + base64.StdEncoding.EncodeToString(b)
}

func postEgress(t *testing.T, a *EgressAPI, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, contract.EgressAPIPath, nil)
	req = req.WithContext(logtesting.TestContextWithLogger(t))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, req)
	return w
}

func TestEgressAPIRefuses(t *testing.T) {
	g := grant("hello-00001")
	admitted(g)
	refused := grant("refused-00001")
	refused.Status.InitializeConditions()
	refused.Status.MarkNotAdmitted(contract.ReasonInsufficientMemory, "no")
	other := grant("other-00001") // not in the lister: deleted, or another installation's
	_, otherKey, _ := signedgrant.GenerateKey()
	forged, _ := signedgrant.Sign(otherKey, resources.MakeClaims(g, testConfig(), testHelper, testHomeKey.SHA256, "gid", metav1.NewTime(now)))
	off := testConfig()
	off.Egress = lampyrconfig.EgressDirect
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: contract.EgressName, Namespace: "default", Labels: map[string]string{"app": "mine"}}}

	for _, tc := range []struct {
		name string
		auth string
		cfg  *lampyrconfig.Config
		objs []runtime.Object
		code int
		says string
	}{
		{name: "no bearer", code: http.StatusUnauthorized, says: "required"},
		{name: "not base64", auth: "Bearer %%%", code: http.StatusUnauthorized, says: "base64"},
		{name: "signed by another key", auth: "Bearer " + base64.StdEncoding.EncodeToString(forged), code: http.StatusUnauthorized, says: "does not verify"},
		{name: "expired", auth: bearer(t, g, now.Add(-11*time.Minute)), code: http.StatusUnauthorized, says: "expired"},
		{name: "grant not admitted", auth: bearer(t, refused, now), code: http.StatusForbidden, says: "not admitted"},
		{name: "no such grant", auth: bearer(t, other, now), code: http.StatusForbidden, says: "no CapacityGrant"},
		{name: "egress direct", auth: bearer(t, g, now), cfg: off, code: http.StatusConflict, says: `"direct"`},
		{name: "a tenant's Pod under the name", auth: bearer(t, g, now), objs: []runtime.Object{foreign}, code: http.StatusConflict, says: "not Lampyr's egress Pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == nil {
				cfg = testConfig()
			}
			a, kube := egressAPI(t, []*v1alpha1.CapacityGrant{g, refused}, tc.objs, cfg, false)
			w := postEgress(t, a, tc.auth)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.says) {
				t.Errorf("%d %q, want %d saying %q", w.Code, w.Body.String(), tc.code, tc.says)
			}
			if tc.code == http.StatusUnauthorized || tc.code == http.StatusForbidden {
				for _, act := range kube.Actions() {
					if act.GetVerb() == "create" {
						t.Errorf("refused, yet %s %s", act.GetVerb(), act.GetResource().Resource)
					}
				}
			}
			if p, err := kube.CoreV1().Pods("default").Get(context.Background(), contract.EgressName, metav1.GetOptions{}); err == nil && resources.IsEgressObject(p) {
				t.Error("an egress Pod was made")
			}
		})
	}
}

func TestEgressAPIMakesTheEgressPod(t *testing.T) {
	g, g2, refused := grant("hello-00001"), grant("bye-00001"), grant("refused-00001")
	admitted(g)
	admitted(g2)
	refused.Status.InitializeConditions()
	a, kube := egressAPI(t, []*v1alpha1.CapacityGrant{g, g2, refused}, nil, testConfig(), false)
	w := postEgress(t, a, bearer(t, g, now))
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	var ans egressAnswer
	if err := json.Unmarshal(w.Body.Bytes(), &ans); err != nil || ans.Endpoint != "10.244.1.7:3128" {
		t.Fatalf("answer %s %v", w.Body, err)
	}
	ctx := context.Background()
	p, err := kube.CoreV1().Pods("default").Get(ctx, contract.EgressName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Containers[0].Image != testConfig().HomeImage || string(p.Spec.Containers[0].Env[1].Value) != string(testKeys.SigningPubPEM) {
		t.Errorf("pod image %s env %+v", p.Spec.Containers[0].Image, p.Spec.Containers[0].Env)
	}
	// Owned by the namespace's admitted grants only.
	if refs := p.OwnerReferences; len(refs) != 2 || refs[0].Name != "bye-00001" || refs[1].Name != "hello-00001" {
		t.Errorf("owners %+v", refs)
	}
	np, err := kube.NetworkingV1().NetworkPolicies("default").Get(ctx, contract.EgressName, metav1.GetOptions{})
	if err != nil || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels[contract.GrantNamespaceLabel] != "default" || len(np.OwnerReferences) != 2 {
		t.Errorf("network policy %+v %v", np, err)
	}
	if svc, err := kube.CoreV1().Services("default").Get(ctx, contract.EgressName, metav1.GetOptions{}); err != nil || len(svc.OwnerReferences) != 2 {
		t.Errorf("service %+v %v", svc, err)
	}

	// Asked again (another Home, or after a failure): the same Pod, no
	// write.
	kube.ClearActions()
	if w := postEgress(t, a, bearer(t, g2, now)); w.Code != 200 || !strings.Contains(w.Body.String(), "10.244.1.7:3128") {
		t.Errorf("again: %d %s", w.Code, w.Body)
	}
	for _, act := range kube.Actions() {
		if act.GetVerb() != "get" {
			t.Errorf("asked again: %s %s", act.GetVerb(), act.GetResource().Resource)
		}
	}
}

// A Pod the grant controller did not make what it is (an older Home image,
// or its image edited by the tenant) is replaced, as is one that ended.
func TestEgressAPIReplaces(t *testing.T) {
	g := grant("hello-00001")
	admitted(g)
	for name, mut := range map[string]func(*corev1.Pod){
		"older image": func(p *corev1.Pod) {
			p.Spec.Containers[0].Image = "kind.local/fiberd@sha256:" + strings.Repeat("0", 64)
		},
		"failed": func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed },
		"runs as root": func(p *corev1.Pod) {
			p.Spec.SecurityContext = nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			old := resources.MakeEgressPod("default", []*v1alpha1.CapacityGrant{g}, testConfig(), testKeys.SigningPubPEM)
			ready(old)
			old.Status.PodIP = "10.244.9.9"
			mut(old)
			a, kube := egressAPI(t, []*v1alpha1.CapacityGrant{g}, []runtime.Object{old}, testConfig(), false)
			w := postEgress(t, a, bearer(t, g, now))
			if w.Code != 200 || !strings.Contains(w.Body.String(), "10.244.1.7") {
				t.Fatalf("%d %s, want the new Pod's address", w.Code, w.Body)
			}
			var deleted bool
			for _, act := range kube.Actions() {
				deleted = deleted || (act.GetVerb() == "delete" && act.GetResource().Resource == "pods")
			}
			if !deleted {
				t.Error("the old Pod was not deleted")
			}
		})
	}
}

func TestEgressAPIFailures(t *testing.T) {
	g := grant("hello-00001")
	admitted(g)
	// The tenant's ResourceQuota refuses the Pod: the Home hears the API
	// server's own words.
	quota := func(a clientgotesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "create" && a.GetResource().Resource == "pods" {
			return true, nil, apierrs.NewForbidden(schema.GroupResource{Resource: "pods"}, contract.EgressName, errQuota)
		}
		return false, nil, nil
	}
	a, _ := egressAPI(t, []*v1alpha1.CapacityGrant{g}, nil, testConfig(), false, quota)
	if w := postEgress(t, a, bearer(t, g, now)); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "exceeded quota: q, requested: pods=1") {
		t.Errorf("quota: %d %s", w.Code, w.Body)
	}
	// A Pod that never becomes Ready: the wait is bounded and says why.
	a, _ = egressAPI(t, []*v1alpha1.CapacityGrant{g}, nil, testConfig(), true)
	start := time.Now()
	if w := postEgress(t, a, bearer(t, g, now)); w.Code != http.StatusGatewayTimeout || !strings.Contains(w.Body.String(), "not Ready after") {
		t.Errorf("never ready: %d %s", w.Code, w.Body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the wait took %s (bound 200ms)", d)
	}
}

var errQuota = quotaError("exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2")

type quotaError string

func (e quotaError) Error() string { return string(e) }

// fiberd's client of the egress API (package proxy) and this server agree
// on the path, the bearer and the answer.
func TestEgressAPIWithFiberdClient(t *testing.T) {
	g := grant("hello-00001")
	admitted(g)
	a, _ := egressAPI(t, []*v1alpha1.CapacityGrant{g}, nil, testConfig(), false)
	a.now = time.Now
	srv := httptest.NewServer(a)
	defer srv.Close()
	signed, err := signedgrant.Sign(testKeys.Signing, resources.MakeClaims(g, testConfig(), testHelper, testHomeKey.SHA256, "gid", metav1.Now()))
	if err != nil {
		t.Fatal(err)
	}
	e := &proxy.Endpoints{API: srv.URL, Grant: func() ([]byte, error) { return signed, nil }}
	if ep, err := e.Endpoint(context.Background()); err != nil || ep != "10.244.1.7:3128" {
		t.Errorf("fiberd asked: %q %v", ep, err)
	}
}
