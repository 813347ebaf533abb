package grant

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
)

func TestEnsureKeysCreatesOnceAndPublishesTheFleetKey(t *testing.T) {
	ctx := context.Background()
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fiber-router-token", Namespace: "lampyr-system"}, Data: map[string][]byte{"token": []byte("shared")}}
	kube := kubefake.NewSimpleClientset(legacy)
	k1, err := EnsureKeys(ctx, kube, "lampyr-system")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := EnsureKeys(ctx, kube, "lampyr-system")
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Signing.Equal(k2.Signing) || string(k1.RouterPubPEM) != string(k2.RouterPubPEM) || !k1.ControllerSealer.Equal(k2.ControllerSealer) {
		t.Fatal("a second start replaced the installation's keys")
	}
	if _, err := kube.CoreV1().Secrets("lampyr-system").Get(ctx, "fiber-router-token", metav1.GetOptions{}); err == nil {
		t.Fatal("the legacy shared router token survived")
	}
	// The router's Secret holds the private half of what Homes are given.
	rs, _ := kube.CoreV1().Secrets("lampyr-system").Get(ctx, contract.RouterKeyName, metav1.GetOptions{})
	rk, err := routercred.ParsePrivateKey(rs.Data[contract.PrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := routercred.ParsePublicKeys(k1.RouterPubPEM)
	if err != nil || !pubs[0].Equal(rk.Public()) {
		t.Fatalf("Homes' router key does not match the router's: %v", err)
	}
	// What `ly` reads (the public ConfigMap) seals templates the fleet key
	// (the Secret, read by the grant controller only) opens.
	cm, err := kube.CoreV1().ConfigMaps("lampyr-system").Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := seal.ParsePublicKeyPEM([]byte(cm.Data[contract.FleetPublicKeyKey]))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data[contract.FleetKeyIDKey] != pub.KeyID() {
		t.Fatalf("published keyID %s, key's id %s", cm.Data[contract.FleetKeyIDKey], pub.KeyID())
	}
	ss, _ := kube.CoreV1().Secrets("lampyr-system").Get(ctx, contract.ControllerSealerName, metav1.GetOptions{})
	sealer, err := seal.ParseSealerKeyPEM(ss.Data[contract.PrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := seal.Seal(pub, sealer, seal.Template{Namespace: "n", Revision: "r", SnapshotDigest: "sha256:" + strings.Repeat("0", 64), Execution: seal.ExecutionPolicy{Mode: "fresh"}, Helper: seal.HelperFacts{Port: 8080}})
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := kube.CoreV1().Secrets("lampyr-system").Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	fleet, err := ParseFleetKeys("lampyr-system", fs.Data)
	if err != nil {
		t.Fatal(err)
	}
	trust := seal.NewTrust(seal.TrustedSealer{Name: contract.ControllerName, Key: k1.ControllerSealer, Namespaces: []string{seal.AllNamespaces}})
	if _, err := seal.Open(fleet, trust, sealed); err != nil {
		t.Fatalf("the fleet key cannot open a template the controller sealed to the published key: %v", err)
	}
}

func TestParseFleetKeysKeepsRetiredKeys(t *testing.T) {
	cur, _ := seal.GenerateFleetKey()
	old, _ := seal.GenerateFleetKey()
	cp, _ := cur.MarshalPEM()
	op, _ := old.MarshalPEM()
	keys, err := ParseFleetKeys("lampyr-system", map[string][]byte{contract.FleetPrivateKeyKey: cp, contract.RetiredFleetKeyPrefix + old.Public().KeyID()[:16] + ".pem": op, contract.FleetPublicKeyKey: cur.Public().MarshalPEM()})
	if err != nil || len(keys) != 2 || keys[0].Public().KeyID() != cur.Public().KeyID() || keys[1].Public().KeyID() != old.Public().KeyID() {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if _, err := ParseFleetKeys("lampyr-system", map[string][]byte{contract.FleetPrivateKeyKey: cp, contract.RetiredFleetKeyPrefix + "x.pem": []byte("junk")}); err == nil || !strings.Contains(err.Error(), "retired-x.pem") {
		t.Fatalf("a bad retired key: %v, want an error naming it", err)
	}
}
