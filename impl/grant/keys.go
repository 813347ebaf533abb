package grant

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"lampyr.dev/serving/impl/fiberd/seal"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
)

// Installation-wide objects in the system namespace (docs/contracts.md §1, §4, §6).
const (
	// FleetKeyName is the Secret with the fleet private key (key "private.pem")
	// and the ConfigMap publishing its public half (key "public.pem") for `ly`.
	FleetKeyName = "lampyr-fleet-key"
	// SigningKeyName is the Secret with the grant controller's signing key.
	SigningKeyName = "lampyr-grant-signing-key"
	// RouterTokenName is the Secret with fiber-router's token (key "token").
	RouterTokenName = "fiber-router-token"

	FleetPrivateKeyKey = "private.pem"
	FleetPublicKeyKey  = "public.pem"
	FleetKeyIDKey      = "keyID"
	SigningPrivateKey  = "private.pem"
	SigningPublicKey   = "public.pem"
	RouterTokenKey     = "token"
)

// Keys are the secrets the grant controller hands to Homes.
type Keys struct {
	FleetPrivatePEM []byte
	Signing         ed25519.PrivateKey
	SigningPubPEM   []byte
	RouterToken     string
}

// EnsureKeys loads the installation's keys from the system namespace,
// creating any that are missing: the fleet key pair (Secret + public
// ConfigMap), the grant signing key and the router token. Existing keys are
// never replaced: templates sealed to the fleet key must keep opening.
func EnsureKeys(ctx context.Context, kube kubernetes.Interface, ns string) (*Keys, error) {
	k := &Keys{}
	fleet, err := ensureSecret(ctx, kube, ns, FleetKeyName, func() (map[string][]byte, error) {
		priv, err := seal.GenerateFleetKey()
		if err != nil {
			return nil, err
		}
		pem, err := priv.MarshalPEM()
		if err != nil {
			return nil, err
		}
		return map[string][]byte{FleetPrivateKeyKey: pem, FleetPublicKeyKey: priv.Public().MarshalPEM(), FleetKeyIDKey: []byte(priv.Public().KeyID())}, nil
	})
	if err != nil {
		return nil, err
	}
	priv, err := seal.ParsePrivateKeyPEM(fleet[FleetPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, FleetKeyName, FleetPrivateKeyKey, err)
	}
	k.FleetPrivatePEM = fleet[FleetPrivateKeyKey]
	if err := publishFleetKey(ctx, kube, ns, priv.Public()); err != nil {
		return nil, err
	}

	signing, err := ensureSecret(ctx, kube, ns, SigningKeyName, func() (map[string][]byte, error) {
		pub, priv, err := signedgrant.GenerateKey()
		if err != nil {
			return nil, err
		}
		privPEM, err := signedgrant.MarshalPrivateKey(priv)
		if err != nil {
			return nil, err
		}
		pubPEM, err := signedgrant.MarshalPublicKey(pub)
		if err != nil {
			return nil, err
		}
		return map[string][]byte{SigningPrivateKey: privPEM, SigningPublicKey: pubPEM}, nil
	})
	if err != nil {
		return nil, err
	}
	if k.Signing, err = signedgrant.ParsePrivateKey(signing[SigningPrivateKey]); err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, SigningKeyName, SigningPrivateKey, err)
	}
	if k.SigningPubPEM, err = signedgrant.MarshalPublicKey(k.Signing.Public().(ed25519.PublicKey)); err != nil {
		return nil, err
	}

	tok, err := ensureSecret(ctx, kube, ns, RouterTokenName, func() (map[string][]byte, error) {
		b := make([]byte, 32)
		rand.Read(b)
		return map[string][]byte{RouterTokenKey: []byte(hex.EncodeToString(b))}, nil
	})
	if err != nil {
		return nil, err
	}
	if len(tok[RouterTokenKey]) == 0 {
		return nil, fmt.Errorf("Secret %s/%s has no %q key; delete it to have a token generated", ns, RouterTokenName, RouterTokenKey)
	}
	k.RouterToken = string(tok[RouterTokenKey])
	return k, nil
}

func ensureSecret(ctx context.Context, kube kubernetes.Interface, ns, name string, gen func() (map[string][]byte, error)) (map[string][]byte, error) {
	s, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return s.Data, nil
	}
	if !apierrs.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
	}
	data, err := gen()
	if err != nil {
		return nil, err
	}
	s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "lampyr"}}, Data: data}
	created, err := kube.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
	if apierrs.IsAlreadyExists(err) {
		// Another replica won the race: use its key, never ours.
		return ensureSecret(ctx, kube, ns, name, gen)
	}
	if err != nil {
		return nil, fmt.Errorf("creating Secret %s/%s: %w", ns, name, err)
	}
	return created.Data, nil
}

// publishFleetKey keeps the public ConfigMap `ly` reads in step with the Secret.
func publishFleetKey(ctx context.Context, kube kubernetes.Interface, ns string, pub *seal.PublicKey) error {
	want := map[string]string{FleetPublicKeyKey: string(pub.MarshalPEM()), FleetKeyIDKey: pub.KeyID()}
	cms := kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, FleetKeyName, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: FleetKeyName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "lampyr"}}, Data: want}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s/%s: %w", ns, FleetKeyName, err)
	}
	if cm.Data[FleetPublicKeyKey] == want[FleetPublicKeyKey] && cm.Data[FleetKeyIDKey] == want[FleetKeyIDKey] {
		return nil
	}
	cm = cm.DeepCopy()
	cm.Data = want
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}
