// Package homekey is how fiber-router knows the Home it dials is the Home
// (docs/security.md §3, "Home authentication"). The grant controller makes
// one key pair per Home and keeps the private key in the Home's Secret in
// lampyr-homes; it binds the public key's fingerprint (SHA-256 of its
// SubjectPublicKeyInfo) into the signed grant and the CapacityGrant's
// status, and the Revision reconciler publishes it in the router metadata.
// fiberd serves its API over TLS with a self-signed certificate of that key;
// fiber-router accepts only a peer whose key has the published fingerprint.
// There is no CA: the certificate is only the TLS wrapping of the key, and
// the TLS handshake proves the peer holds the private half.
//
// So whoever captures a Home's address (a Service's spec.externalIPs,
// CVE-2020-8554, or a reused Pod IP) completes no handshake: the router
// sends it no credential and no request.
package homekey

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"time"

	"lampyr.dev/serving/impl/trust/edpem"
)

// FingerprintLen is the length of a fingerprint: hex SHA-256.
const FingerprintLen = 2 * sha256.Size

// Generate makes a Home key pair.
func Generate() (ed25519.PrivateKey, error) {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	return k, err
}

// MarshalPrivateKey encodes a Home key as PKCS#8 PEM (the Home Secret's
// home-key.pem).
func MarshalPrivateKey(k ed25519.PrivateKey) ([]byte, error) { return edpem.MarshalPrivateKey(k) }

// ParsePrivateKey decodes a PKCS#8 PEM Ed25519 Home key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	return edpem.ParsePrivateKey("home key", data)
}

// Fingerprint is the hex SHA-256 of pub's SubjectPublicKeyInfo (DER), the
// value of the grant claim homeKeySHA256, status.homeKeySHA256 and router
// metadata data.homeKeySHA256.
func Fingerprint(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		// Only a key of the wrong length fails; an Ed25519 key never does.
		panic(fmt.Sprintf("homekey: marshal public key: %v", err))
	}
	return fingerprintDER(der)
}

func fingerprintDER(spki []byte) string {
	s := sha256.Sum256(spki)
	return hex.EncodeToString(s[:])
}

// CheckFingerprint says whether fp looks like a fingerprint (64 lowercase
// hex digits), naming what is wrong.
func CheckFingerprint(fp string) error {
	if len(fp) != FingerprintLen {
		return fmt.Errorf("home key fingerprint %q: want %d hex digits (SHA-256 of the key's SubjectPublicKeyInfo)", fp, FingerprintLen)
	}
	for _, c := range fp {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("home key fingerprint %q: want lowercase hex", fp)
		}
	}
	return nil
}

// Certificate wraps key in a self-signed certificate for fiberd's TLS
// listener. Nothing checks its names, issuer or validity (the router
// checks the key alone), so it is long-lived and names the Home only for
// whoever looks at it.
func Certificate(key ed25519.PrivateKey, home string) (tls.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: home},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(100 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("home key certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// ErrWrongKey: the peer's key is not the one the router metadata names.
var ErrWrongKey = errors.New("the Home's TLS key is not the key its router metadata names (data.homeKeySHA256)")

// ClientConfig is the TLS configuration that accepts only a peer holding
// the key whose fingerprint is want. TLS 1.3 only (fiberd and fiber-router
// ship together); no session resumption, so every connection proves the
// key afresh. nextProtos is the ALPN offer ("h2", "http/1.1").
func ClientConfig(want string, nextProtos ...string) (*tls.Config, error) {
	if err := CheckFingerprint(want); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: nextProtos,
		// No CA and no names: the certificate is checked by its key's
		// fingerprint in VerifyConnection instead (InsecureSkipVerify only
		// turns off the chain and name checks, which would fail for a
		// self-signed certificate). VerifyConnection, unlike
		// VerifyPeerCertificate, also runs on resumed sessions, should a
		// session cache ever be added.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return Verify(cs.PeerCertificates, want)
		},
	}, nil
}

// Verify checks that the leaf of a peer's chain carries the key whose
// fingerprint is want.
func Verify(chain []*x509.Certificate, want string) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: the peer sent no certificate", ErrWrongKey)
	}
	got := fingerprintDER(chain[0].RawSubjectPublicKeyInfo)
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return fmt.Errorf("%w: the peer's key is %s…, want %s…", ErrWrongKey, got[:16], want[:min(16, len(want))])
	}
	return nil
}

// ServerConfig is fiberd's TLS configuration around cert (GetCertificate,
// so a key rotated in the mounted Secret is picked up without a restart).
func ServerConfig(cert func() (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert()
		},
		// The router keeps no session cache; tickets would be work and
		// bytes on every new connection (and unsolicited bytes on an idle
		// tunnel) for nothing.
		SessionTicketsDisabled: true,
	}
}
