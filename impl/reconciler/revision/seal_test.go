package revision

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakekube "k8s.io/client-go/kubernetes/fake"

	"github.com/google/go-containerregistry/pkg/registry"

	fiberdv1alpha1 "lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/seal"
)

// TestRegistrySealer seals for real: the snapshot is read from an
// in-process registry through a mirror (references name a host that does
// not exist, as localhost:5002 does not inside a Pod), the template is
// sealed to the published fleet key and signed with the controller's sealer
// key, pushed, and then fetched and opened as the grant controller does
// (trusting the controller's key), and fits the Revision.
func TestRegistrySealer(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "handler"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := artifact.Config{APIVersion: artifact.ConfigAPIVersion, Entrypoint: []string{"/handler"}, Port: 8080, Protocol: "http1",
		Runtime: artifact.Runtime{Name: "go"}, HelperVersion: artifact.HelperProtocolVersion}
	img, err := artifact.Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := artifact.Push(ctx, img, host+"/snapshots/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	// What the cluster writes: the host's name for the registry.
	const seen = "localhost:1" // nothing listens there; only the mirror leads to the registry
	snapshot := seen + "/snapshots/hello@" + pushed.DigestStr()

	priv, err := seal.GenerateFleetKey()
	if err != nil {
		t.Fatal(err)
	}
	sealer, _ := seal.GenerateSealerKey()
	kube := fakekube.NewSimpleClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lampyr-system", Name: contract.FleetKeyName},
		Data:       map[string]string{contract.FleetPublicKeyKey: string(priv.Public().MarshalPEM())},
	}, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lampyr-system", Name: contract.ControllerSealerName},
		Data:       map[string][]byte{contract.PrivateKeyKey: sealer.MarshalPEM()},
	})
	s := &RegistrySealer{Kube: kube}
	req := SealRequest{
		Namespace: "lampyr-system", RevisionNamespace: "apps", Revision: "hello-00001", Snapshot: snapshot,
		Execution:  fiberdv1alpha1.ExecutionPolicy{Mode: fiberdv1alpha1.ExecutionReuse, IdleTimeoutSeconds: 30, IdleAction: fiberdv1alpha1.IdleActionRelease},
		Repository: seen + "/lampyr/templates",
		Mirrors:    []string{seen + "=" + host},
	}
	ref, err := s.Seal(ctx, req)
	if err != nil {
		t.Fatalf("Seal: %v", err)
	}
	if !strings.HasPrefix(ref, seen+"/lampyr/templates@sha256:") {
		t.Fatalf("template ref %q: want it in the template repository, digest-pinned", ref)
	}

	sealed, tc, err := artifact.FetchTemplate(ctx, strings.Replace(ref, seen, host, 1))
	if err != nil {
		t.Fatal(err)
	}
	if tc.Revision != "hello-00001" || tc.Namespace != "apps" || tc.FleetKeyID != priv.Public().KeyID() {
		t.Errorf("template config %+v", tc)
	}
	trust := seal.NewTrust(seal.TrustedSealer{Name: "lampyr-controller", Key: sealer.Public(), Namespaces: []string{seal.AllNamespaces}})
	opened, err := seal.Open([]*seal.PrivateKey{priv}, trust, sealed)
	if err != nil {
		t.Fatalf("the grant controller could not open it: %v", err)
	}
	if err := opened.Matches("apps", "hello-00001", pushed.DigestStr(), seal.ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: 30}); err != nil {
		t.Errorf("it does not fit the Revision it was sealed for: %v", err)
	}
	if opened.Helper.Port != 8080 || opened.Helper.HelperVersion != artifact.HelperProtocolVersion {
		t.Errorf("helper facts %+v, want the snapshot's", opened.Helper)
	}

	// A snapshot the registry does not hold is missing, not an error to retry.
	req.Snapshot = seen + "/snapshots/hello@sha256:" + strings.Repeat("0", 64)
	var missing *ArtifactMissingError
	if _, err := s.Seal(ctx, req); !errors.As(err, &missing) {
		t.Errorf("Seal(absent snapshot) = %v, want ArtifactMissingError", err)
	}

	// No fleet key or sealer key yet: a retryable error that says where it
	// should be.
	req.Snapshot = snapshot
	s = &RegistrySealer{Kube: fakekube.NewSimpleClientset()}
	if _, err := s.Seal(ctx, req); err == nil || !strings.Contains(err.Error(), "lampyr-system/lampyr-fleet-key") {
		t.Errorf("Seal without a fleet key = %v", err)
	}
	s = &RegistrySealer{Kube: fakekube.NewSimpleClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lampyr-system", Name: contract.FleetKeyName},
		Data:       map[string]string{contract.FleetPublicKeyKey: string(priv.Public().MarshalPEM())},
	})}
	if _, err := s.Seal(ctx, req); err == nil || !strings.Contains(err.Error(), "lampyr-system/lampyr-controller-sealer") {
		t.Errorf("Seal without the controller's sealer key = %v", err)
	}
}
