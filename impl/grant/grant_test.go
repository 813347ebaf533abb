package grant

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgotesting "k8s.io/client-go/testing"
	"knative.dev/pkg/controller"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	fiberdclient "lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/grant/config"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
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
	// testHomeKey is the key every new Home gets in these tests (the
	// reconciler's newHomeKey), so expected Secrets are exact.
	testHomeKey, _ = resources.NewHomeKey()
	// otherHomeKey is a key some Home already holds.
	otherHomeKey, _ = resources.NewHomeKey()
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
	p := resources.MakeHomePod(g, testConfig(), homesNS, 0)
	mut(p)
	return p
}

// homePodN is g's Home Pod number n (a replacement), as created.
func homePodN(g *v1alpha1.CapacityGrant, n int) *corev1.Pod {
	return resources.MakeHomePod(g, testConfig(), homesNS, n)
}

func homeService(g *v1alpha1.CapacityGrant) *corev1.Service {
	return resources.MakeHomeService(g, homesNS)
}

func ready(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func homeSecret(g *v1alpha1.CapacityGrant, issued time.Time) *corev1.Secret {
	c := resources.MakeClaims(g, testConfig(), testHelper, testHomeKey.SHA256, "old-grant", metav1.NewTime(issued))
	b, _ := signedgrant.Sign(testKeys.Signing, c)
	return resources.MakeHomeSecret(g, homesNS, b, testKeys.SigningPubPEM, testKeys.RouterPubPEM, testHomeKey)
}

func testConfig() *lampyrconfig.Config {
	c, _ := config.FromConfigMap(&corev1.ConfigMap{Data: map[string]string{
		lampyrconfig.KeyFiberMemoryCapacity: "1Gi",
		lampyrconfig.KeyMaxMemoryPerFiber:   "512Mi",
		lampyrconfig.KeyMaxFibersPerGrant:   "16",
		lampyrconfig.KeyDefaultMaxFibers:    "2",
		lampyrconfig.KeyGrantTTL:            "10m",
		lampyrconfig.KeyHomeImage:           "kind.local/fiberd@" + digest,
		// Rows about installation capacity take the whole of it for one
		// namespace; the share has rows of its own.
		lampyrconfig.KeyNamespaceFiberMemoryShare: "100%",
	}})
	return c
}

// TestReconcile is in reconcile_test.go.

// Two grants reconciled back to back, before the informer has seen the
// first one's admission, must not both take the last capacity.
func TestAdmissionDoesNotDoubleBook(t *testing.T) {
	h := newHarness(t, []runtime.Object{grant("a", withMemory("512Mi", 2)), grant("b", withMemory("512Mi", 2))})
	for _, k := range []string{"default/a", "default/b"} {
		if err := h.reconcile(k); err != nil {
			if ok, _ := controller.IsRequeueKey(err); !ok {
				t.Fatal(err)
			}
		}
	}
	var admittedNames []string
	for _, a := range h.fiberd.Actions() {
		if u, ok := a.(clientgotesting.UpdateAction); ok && a.GetSubresource() == "status" {
			g := u.GetObject().(*v1alpha1.CapacityGrant)
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
	// readiness is a ready Home's /readyz answer in JSON.
	readiness   fiberdclient.Readiness
	readinessOK bool
	// ready: fiberd answers ready to Diagnose (the kubelet has not yet).
	ready bool
	// idle is what Idle answers (a ready Home's Fiberd-Idle-Seconds),
	// counted in idleCalls (not calls).
	idle      idleAnswer
	idleCalls int
}

// idleAnswer is fiberd's idle time: seconds, whether the header was
// there, whether fiberd answered.
type idleAnswer struct {
	seconds     int64
	present, ok bool
}

// Idle answers idle, counted in idleCalls.
func (f *fakeDiagnoser) Idle(context.Context, *corev1.Pod, string) (int64, bool, bool) {
	f.idleCalls++
	return f.idle.seconds, f.idle.present, f.idle.ok
}

// Readiness answers readiness (ok: readinessOK), counted in calls too.
func (f *fakeDiagnoser) Readiness(context.Context, *corev1.Pod, string) (fiberdclient.Readiness, bool) {
	f.calls++
	return f.readiness, f.readinessOK
}

func (f *fakeDiagnoser) Diagnose(context.Context, *corev1.Pod, string) (fiberdclient.Error, bool, bool) {
	f.calls++
	if f.ready {
		return fiberdclient.Error{}, true, true
	}
	e := fiberdclient.Error{Reason: f.reason, Message: f.msg, Handler: f.handler}
	if f.reason == "" {
		e.Reason = contract.ReasonNotReady
	}
	return e, false, f.ok
}

// TestHTTPHomeDiagnoser reads fiberd's /readyz error body, from a Home
// holding the key the grant names only.
func TestHTTPHomeDiagnoser(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(fiberdclient.Error{Reason: "NotReady", Message: "TemplateMismatch: no"})
	}))
	// The diagnoser dials the Pod IP on fiberd's port; lead it here.
	target := startFiberdTLS(t, srv)
	d := HTTPHomeDiagnoser{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "10.244.0.7:9090" {
			return nil, fmt.Errorf("dialled %s, want the Pod IP on fiberd's port", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.244.0.7"}}
	e, ready, ok := d.Diagnose(context.Background(), pod, testHomeKey.SHA256)
	if !ok || ready || e.Reason != "NotReady" || e.Message != "TemplateMismatch: no" || e.Handler != nil {
		t.Fatalf("Diagnose = %+v %v", e, ok)
	}
	if _, _, ok := d.Diagnose(context.Background(), &corev1.Pod{}, testHomeKey.SHA256); ok {
		t.Error("a Pod without an IP was diagnosed")
	}
	// Whoever answers at the Pod's address without the Home's key does not
	// write the Revision's status.
	if e, _, ok := d.Diagnose(context.Background(), pod, otherHomeKey.SHA256); ok {
		t.Errorf("a peer without the Home's key was believed: %+v", e)
	}
	if _, _, ok := d.Diagnose(context.Background(), pod, ""); ok {
		t.Error("a Home whose grant names no key was asked")
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// okSnapshots accepts every snapshot (the registry side has its own test).
type okSnapshots struct{}

func (okSnapshots) Check(context.Context, string, ...remote.Option) error { return nil }

// openWhenRead opens g's template through the off-worker reads: the first
// call finds the read under way (Pending, the grant to be enqueued again),
// and once notified the template is opened from the cache.
func openWhenRead(t *testing.T, h *harness, g *v1alpha1.CapacityGrant, notified <-chan types.NamespacedName, trust *seal.Trust) signedgrant.Helper {
	t.Helper()
	for range 2 {
		helper, refusal := h.r.openTemplate(g, []*seal.PrivateKey{testFleet}, trust)
		if refusal == nil {
			return helper
		}
		if !refusal.pending {
			t.Fatalf("open: %+v", refusal)
		}
		select {
		case k := <-notified:
			if k.Name != g.Name {
				t.Fatalf("notified %v, want %s", k, g.Name)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the read never ended")
		}
	}
	t.Fatal("still pending after the read ended")
	return signedgrant.Helper{}
}

// TestTemplatesAreFetchedOnce: a template (immutable behind its digest) is
// read once, off the worker, not at every renewal.
func TestTemplatesAreFetchedOnce(t *testing.T) {
	g := grant("hello-00001")
	h := newHarness(t, []runtime.Object{g})
	notified := make(chan types.NamespacedName, 4)
	h.r.fetches = NewFetches(context.Background(), h.templates, okSnapshots{}, func() []remote.Option { return nil }, func(k types.NamespacedName) { notified <- k })
	trust := seal.NewTrust(seal.TrustedSealer{Name: "c", Key: testSealer.Public(), Namespaces: []string{"*"}})
	for range 3 {
		if helper := openWhenRead(t, h, g, notified, trust); helper != testHelper {
			t.Fatalf("open: %+v", helper)
		}
	}
	if h.templates.calls != 1 {
		t.Fatalf("template fetched %d times, want once", h.templates.calls)
	}
}

// tarpitTemplates never answers for one template reference (a registry
// that accepts the connection and says nothing) until released.
type tarpitTemplates struct {
	inner   TemplateFetcher
	tarpit  string
	release chan struct{}
}

func (f tarpitTemplates) Fetch(ctx context.Context, ref string, opts ...remote.Option) ([]byte, error) {
	if ref == f.tarpit {
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return f.inner.Fetch(ctx, ref, opts...)
}

// TestATarpitRegistryDelaysOnlyItsNamespace: a tenant naming a registry
// that never answers holds one read of its own namespace, not the
// controller's workers nor another namespace's reads (issue 31).
func TestATarpitRegistryDelaysOnlyItsNamespace(t *testing.T) {
	slow := grant("slow-00001", func(g *v1alpha1.CapacityGrant) { g.Namespace = "tarpit"; g.Spec.Template = templateRef("slow-00001") })
	fast := grant("fast-00001")
	h := newHarness(t, []runtime.Object{fast})
	h.templates.m[templateRef("slow-00001")] = sealFor(t, testSealer, "tarpit", "slow-00001")
	release := make(chan struct{})
	defer close(release)
	notified := make(chan types.NamespacedName, 8)
	h.r.fetches = NewFetches(context.Background(), tarpitTemplates{h.templates, templateRef("slow-00001"), release}, okSnapshots{}, func() []remote.Option { return nil }, func(k types.NamespacedName) {
		if k.Name == "fast-00001" {
			notified <- k
		}
	})
	trust := seal.NewTrust(seal.TrustedSealer{Name: "c", Key: testSealer.Public(), Namespaces: []string{"*"}})
	if _, refusal := h.r.openTemplate(slow, []*seal.PrivateKey{testFleet}, trust); refusal == nil || !refusal.pending || refusal.reason != contract.ReasonTemplatePending {
		t.Fatalf("the tarpit's grant: %+v, want TemplatePending", refusal)
	}
	t0 := time.Now()
	if helper := openWhenRead(t, h, fast, notified, trust); helper != testHelper {
		t.Fatalf("open: %+v", helper)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("another namespace's template took %s behind the tarpit", d)
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
		h := newHarness(t, []runtime.Object{g})
		if helper, refusal := h.r.openTemplate(g, []*seal.PrivateKey{testFleet}, trust); refusal != nil || helper != c.want {
			t.Fatalf("grant port %d protocol %q: %+v %+v, want %+v", c.port, c.proto, helper, refusal, c.want)
		}
	}
}

// startFiberdTLS starts srv as fiberd serves its API (TLS with the test
// home key; httptest's StartTLS would add its own certificate, which a
// client without SNI is given first), and returns its host:port.
func startFiberdTLS(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	key, _ := homekey.ParsePrivateKey(testHomeKey.PEM)
	cert, err := homekey.Certificate(key, "h")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = tls.NewListener(srv.Listener, homekey.ServerConfig(func() (*tls.Certificate, error) { return &cert, nil }))
	srv.Start()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
