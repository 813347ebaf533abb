package grant

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"lampyr.dev/serving/impl/fiberd/seal"
)

func TestEnsureKeysCreatesOnceAndPublishesTheFleetKey(t *testing.T) {
	ctx := context.Background()
	kube := kubefake.NewSimpleClientset()
	k1, err := EnsureKeys(ctx, kube, "lampyr-system")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := EnsureKeys(ctx, kube, "lampyr-system")
	if err != nil {
		t.Fatal(err)
	}
	if string(k1.FleetPrivatePEM) != string(k2.FleetPrivatePEM) || !k1.Signing.Equal(k2.Signing) || k1.RouterToken != k2.RouterToken || k1.RouterToken == "" {
		t.Fatal("a second start replaced the installation's keys; sealed templates would stop opening")
	}
	// What `ly` reads (the public ConfigMap) seals templates the Homes'
	// key (the Secret) opens.
	cm, err := kube.CoreV1().ConfigMaps("lampyr-system").Get(ctx, FleetKeyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := seal.ParsePublicKeyPEM([]byte(cm.Data[FleetPublicKeyKey]))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data[FleetKeyIDKey] != pub.KeyID() {
		t.Fatalf("published keyID %s, key's id %s", cm.Data[FleetKeyIDKey], pub.KeyID())
	}
	sealed, err := seal.Seal(pub, seal.Template{Revision: "r", SnapshotDigest: "sha256:" + string(make64('0')), Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080}})
	if err != nil {
		t.Fatal(err)
	}
	priv, err := seal.ParsePrivateKeyPEM(k1.FleetPrivatePEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seal.Open(priv, sealed); err != nil {
		t.Fatalf("the Homes' fleet key cannot open a template sealed to the published key: %v", err)
	}
}

func make64(c byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return b
}
