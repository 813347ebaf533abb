package grant

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrs "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/trust/edpem"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// legacyRouterToken is the shared token older installations copied into
// every Home; it is deleted at start.
const legacyRouterToken = "fiber-router-token"

// Keys are the keys the grant controller loads once at start. The fleet keys
// are read anew from their Secret (FleetKeys), since a rotation changes them
// while the controller runs.
type Keys struct {
	Signing       ed25519.PrivateKey
	SigningPubPEM []byte
	// RouterPubPEM is fiber-router's public key, given to every Home.
	RouterPubPEM []byte
	// ControllerSealer is the public key the Lampyr controller seals with.
	ControllerSealer ed25519.PublicKey
}

// EnsureKeys loads the installation's keys from the system namespace,
// creating any that are missing: the fleet key pair (Secret + public
// ConfigMap), the grant signing key, fiber-router's key and the controller's
// sealer key. Existing keys are never replaced: templates sealed to the fleet
// key must keep opening.
func EnsureKeys(ctx context.Context, kube kubernetes.Interface, ns string) (*Keys, error) {
	k := &Keys{}
	fleet, err := ensureSecret(ctx, kube, ns, contract.FleetKeyName, func() (map[string][]byte, error) {
		priv, err := seal.GenerateFleetKey()
		if err != nil {
			return nil, err
		}
		pem, err := priv.MarshalPEM()
		if err != nil {
			return nil, err
		}
		return map[string][]byte{contract.FleetPrivateKeyKey: pem, contract.FleetPublicKeyKey: priv.Public().MarshalPEM(), contract.FleetKeyIDKey: []byte(priv.Public().KeyID())}, nil
	})
	if err != nil {
		return nil, err
	}
	keys, err := ParseFleetKeys(ns, fleet)
	if err != nil {
		return nil, err
	}
	if err := publishFleetKey(ctx, kube, ns, keys[0].Public()); err != nil {
		return nil, err
	}

	signing, err := ensureSecret(ctx, kube, ns, contract.GrantSigningKeyName, newEd25519KeyPair)
	if err != nil {
		return nil, err
	}
	if k.Signing, err = signedgrant.ParsePrivateKey(signing[contract.PrivateKeyKey]); err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, contract.GrantSigningKeyName, contract.PrivateKeyKey, err)
	}
	if k.SigningPubPEM, err = signedgrant.MarshalPublicKey(k.Signing.Public().(ed25519.PublicKey)); err != nil {
		return nil, err
	}

	router, err := ensureSecret(ctx, kube, ns, contract.RouterKeyName, newEd25519KeyPair)
	if err != nil {
		return nil, err
	}
	rk, err := routercred.ParsePrivateKey(router[contract.PrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w (delete the Secret to have a new key generated, then restart fiber-router)", ns, contract.RouterKeyName, contract.PrivateKeyKey, err)
	}
	if k.RouterPubPEM, err = routercred.MarshalPublicKey(rk.Public().(ed25519.PublicKey)); err != nil {
		return nil, err
	}

	sealer, err := ensureSecret(ctx, kube, ns, contract.ControllerSealerName, func() (map[string][]byte, error) {
		s, err := seal.GenerateSealerKey()
		if err != nil {
			return nil, err
		}
		return map[string][]byte{contract.PrivateKeyKey: s.MarshalPEM(), contract.PublicKeyKey: seal.MarshalSealerPublicKey(s.Public())}, nil
	})
	if err != nil {
		return nil, err
	}
	sk, err := seal.ParseSealerKeyPEM(sealer[contract.PrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, contract.ControllerSealerName, contract.PrivateKeyKey, err)
	}
	k.ControllerSealer = sk.Public()

	// Older installations kept one token every Home accepted; nothing reads
	// it any more and it must not stay readable.
	if err := kube.CoreV1().Secrets(ns).Delete(ctx, legacyRouterToken, metav1.DeleteOptions{}); err == nil {
		logging.FromContext(ctx).Infof("Deleted the legacy shared router token Secret %s/%s", ns, legacyRouterToken)
	} else if !apierrs.IsNotFound(err) {
		logging.FromContext(ctx).Warnf("Could not delete the legacy router token Secret %s/%s: %v", ns, legacyRouterToken, err)
	}
	return k, nil
}

// newEd25519KeyPair is the data of a key Secret: an Ed25519 pair as PKCS#8
// and PKIX PEM (the grant signing key's and the router key's format).
func newEd25519KeyPair() (map[string][]byte, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	privPEM, err := edpem.MarshalPrivateKey(priv)
	if err != nil {
		return nil, err
	}
	pubPEM, err := edpem.MarshalPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{contract.PrivateKeyKey: privPEM, contract.PublicKeyKey: pubPEM}, nil
}

// ParseFleetKeys reads the fleet key Secret's data: the current private key
// first, then the retired ones (sorted by key name). Every error names the
// Secret and key.
func ParseFleetKeys(ns string, data map[string][]byte) ([]*seal.PrivateKey, error) {
	cur, err := seal.ParsePrivateKeyPEM(data[contract.FleetPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, contract.FleetKeyName, contract.FleetPrivateKeyKey, err)
	}
	out := []*seal.PrivateKey{cur}
	var retired []string
	for k := range data {
		if strings.HasPrefix(k, contract.RetiredFleetKeyPrefix) {
			retired = append(retired, k)
		}
	}
	sort.Strings(retired)
	for _, k := range retired {
		r, err := seal.ParsePrivateKeyPEM(data[k])
		if err != nil {
			return nil, fmt.Errorf("Secret %s/%s key %s: %w", ns, contract.FleetKeyName, k, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// fleetKeyring parses the fleet key Secret once per resourceVersion.
type fleetKeyring struct {
	mu      sync.Mutex
	version string
	keys    []*seal.PrivateKey
}

func (f *fleetKeyring) keysOf(s *corev1.Secret) ([]*seal.PrivateKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.ResourceVersion != "" && s.ResourceVersion == f.version {
		return f.keys, nil
	}
	keys, err := ParseFleetKeys(s.Namespace, s.Data)
	if err != nil {
		return nil, err
	}
	f.version, f.keys = s.ResourceVersion, keys
	return keys, nil
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
	want := map[string]string{contract.FleetPublicKeyKey: string(pub.MarshalPEM()), contract.FleetKeyIDKey: pub.KeyID()}
	cms := kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if apierrs.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.FleetKeyName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "lampyr"}}, Data: want}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s/%s: %w", ns, contract.FleetKeyName, err)
	}
	if cm.Data[contract.FleetPublicKeyKey] == want[contract.FleetPublicKeyKey] && cm.Data[contract.FleetKeyIDKey] == want[contract.FleetKeyIDKey] {
		return nil
	}
	cm = cm.DeepCopy()
	cm.Data = want
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}
