package grant

import (
	"context"
	"crypto/ed25519"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"knative.dev/pkg/controller"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/server"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// TestHomeSecretRunsInFiberd checks the two halves agree: what the grant
// controller writes into a Home Secret (after opening the template itself)
// is exactly what a real fiberd needs to serve the Revision, and the router
// credential for that Home is accepted (key formats, grant claims, home).
func TestHomeSecretRunsInFiberd(t *testing.T) {
	// A registry with a snapshot, from fiberdtest; the template is sealed
	// here by the controller's sealer to the test fleet key.
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "e2e-00001", WarmFibers: -1})
	_, signing, _ := signedgrant.GenerateKey()
	pubPEM, _ := signedgrant.MarshalPublicKey(signing.Public().(ed25519.PublicKey))
	routerPub, routerKey, _ := routercred.GenerateKey()
	routerPEM, _ := routercred.MarshalPublicKey(routerPub)
	keys := &Keys{Signing: signing, SigningPubPEM: pubPEM, RouterPubPEM: routerPEM, ControllerSealer: testSealer.Public()}

	snapDigest := inst.SnapshotRef[strings.LastIndex(inst.SnapshotRef, "@")+1:]
	sealed, err := seal.Seal(testFleet.Public(), testSealer, seal.Template{Namespace: "default", Revision: "e2e-00001", SnapshotDigest: snapDigest,
		Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080, Protocol: "http1"}})
	if err != nil {
		t.Fatal(err)
	}
	g := grant("e2e-00001", func(g *v1alpha1.CapacityGrant) {
		g.Spec.SnapshotArtifact = inst.SnapshotRef
		g.Spec.MemoryPerFiber, g.Spec.MaxFibers = resource.MustParse("64Mi"), 2
		g.Spec.Env = map[string]string{"K_SERVICE": "e2e", "K_CONFIGURATION": "e2e", "K_REVISION": "e2e-00001"}
	})
	h := newHarness(t, []runtime.Object{g})
	h.templates.m[g.Spec.Template] = sealed
	h.r.keys = keys
	h.r.now = time.Now
	if err := h.reconcile("default/e2e-00001"); err != nil {
		if ok, _ := controller.IsRequeueKey(err); !ok {
			t.Fatal(err)
		}
	}
	sec, err := h.kube.CoreV1().Secrets(homesNS).Get(context.Background(), resources.HomeName(g), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Mount the Secret as the Home Pod would and start fiberd on it.
	dir, _ := os.MkdirTemp("/tmp", "home")
	t.Cleanup(func() { os.RemoveAll(dir) })
	for k, v := range sec.Data {
		os.WriteFile(filepath.Join(dir, k), v, 0o400)
	}
	grantKey, err := signedgrant.ParsePublicKey(sec.Data[resources.SecretKeyGrantPubKey])
	if err != nil {
		t.Fatal(err)
	}
	be, err := process.New(fiberdtest.BackendConfig(t, fiberdtest.Build(t, fiberdtest.HelperPackage), dir))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		RouterKeyFile: filepath.Join(dir, resources.SecretKeyRouterPubKeys), GrantFile: filepath.Join(dir, resources.SecretKeyGrant),
		TLSKeyFile: filepath.Join(dir, resources.SecretKeyHomeKey),
		GrantKey:   grantKey, StateDir: filepath.Join(dir, "s"), Backend: be, WarmFibers: 1,
		GrantPollInterval: 100 * time.Millisecond, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); be.Close() })

	cred, _ := routercred.Mint(routerKey, resources.HomeName(g), time.Now(), time.Minute)
	// As fiber-router does: TLS accepting only the key the grant's status
	// names.
	c, err := client.NewTLS(ln.Addr().String(), cred, h.status().Status.HomeKeySHA256)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for c.Ready(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("fiberd on the grant controller's Home Secret is not ready: %v", c.Ready(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := c.Grant(ctx)
	if err != nil || info.MaxFibers != 2 || info.MemoryPerFiber != 64<<20 {
		t.Fatalf("grant seen by fiberd: %+v %v", info, err)
	}
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://e2e/", nil)
	resp, err := c.Do(req, f.ID)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request: %v %v", resp, err)
	}
	resp.Body.Close()
}
