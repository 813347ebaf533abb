// Package routercred is how fiber-router proves to one Home that a call
// comes from it (docs/security.md §3). The router holds the installation's
// router key (Ed25519, Secret lampyr-system/fiber-router-key) and mints, per
// Home, a short-lived credential whose audience is that Home's name; fiberd
// holds only the public key and accepts a credential only for itself. There
// is no shared secret: a credential read anywhere works on one Home for a
// few minutes, and no credential is ever stored.
//
// Wire form: "lyrc1." + base64url(JSON claims) + "." + base64url(signature),
// the signature over "lyrc1." + base64url(JSON claims).
package routercred

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"lampyr.dev/serving/impl/trust/edpem"
)

const prefix = "lyrc1."

// TTL is how long a minted credential is valid; the router re-mints at half
// of it.
const TTL = 10 * time.Minute

// maxLife bounds exp-iat of a credential fiberd accepts, whatever the
// router's clock said: a credential never outlives this.
const maxLife = time.Hour

// clockSkew is tolerated between router and Home clocks.
const clockSkew = time.Minute

// PEM block types (the Secret's private.pem and public.pem, the Home
// Secret's router-keys.pub).
const (
	PrivateKeyPEMType = edpem.PrivateKeyType
	PublicKeyPEMType  = edpem.PublicKeyType
)

// Claims are what a credential says.
type Claims struct {
	// Audience is the one Home the credential is for (its name in
	// lampyr-homes, the signed grant's home).
	Audience string `json:"aud"`
	// KeyID is the first 16 hex digits of the router key's id (diagnostics).
	KeyID     string `json:"kid"`
	IssuedAt  int64  `json:"iat"`
	ExpiresAt int64  `json:"exp"`
}

// KeyID identifies a router public key: hex SHA-256.
func KeyID(pub ed25519.PublicKey) string { s := sha256.Sum256(pub); return hex.EncodeToString(s[:]) }

// Mint makes a credential for home, valid from now for ttl.
func Mint(key ed25519.PrivateKey, home string, now time.Time, ttl time.Duration) (string, error) {
	if home == "" {
		return "", errors.New("router credential: no audience (the Home's name)")
	}
	c := Claims{Audience: home, KeyID: KeyID(key.Public().(ed25519.PublicKey))[:16], IssuedAt: now.Unix(), ExpiresAt: now.Add(ttl).Unix()}
	p, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	signed := prefix + base64.RawURLEncoding.EncodeToString(p)
	return signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(signed))), nil
}

// Errors of Verify, for errors.Is. Their messages never include the
// credential itself.
var (
	ErrMalformed    = errors.New("not a router credential")
	ErrBadSignature = errors.New("router credential signature does not verify")
	ErrWrongHome    = errors.New("router credential is for another Home")
	ErrExpired      = errors.New("router credential expired or not yet valid")
)

// Verify checks a credential against the router's public keys (current and,
// during a rotation, previous), that it names home, and its validity at now.
func Verify(keys []ed25519.PublicKey, cred, home string, now time.Time) (Claims, error) {
	var c Claims
	rest, ok := strings.CutPrefix(cred, prefix)
	if !ok {
		return c, ErrMalformed
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return c, ErrMalformed
	}
	p, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return c, ErrMalformed
	}
	s, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(s) != ed25519.SignatureSize {
		return c, ErrMalformed
	}
	signed := []byte(prefix + payload)
	verified := false
	for _, k := range keys {
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, signed, s) {
			verified = true
			break
		}
	}
	if !verified {
		return c, ErrBadSignature
	}
	if err := json.Unmarshal(p, &c); err != nil {
		return c, ErrMalformed
	}
	if c.Audience != home {
		return c, fmt.Errorf("%w (it names %q)", ErrWrongHome, c.Audience)
	}
	iat, exp := time.Unix(c.IssuedAt, 0), time.Unix(c.ExpiresAt, 0)
	if exp.Sub(iat) > maxLife || now.Add(clockSkew).Before(iat) || !now.Before(exp) {
		return c, ErrExpired
	}
	return c, nil
}

// Minter caches one credential per Home and re-mints it at half its life.
type Minter struct {
	key ed25519.PrivateKey
	now func() time.Time

	mu    sync.Mutex
	cache map[string]minted
}

type minted struct {
	cred    string
	renewAt time.Time
}

// NewMinter returns a Minter signing with key.
func NewMinter(key ed25519.PrivateKey) *Minter {
	return &Minter{key: key, now: time.Now, cache: map[string]minted{}}
}

// For returns a valid credential for home.
func (m *Minter) For(home string) (string, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.cache[home]; ok && now.Before(c.renewAt) {
		return c.cred, nil
	}
	cred, err := Mint(m.key, home, now, TTL)
	if err != nil {
		return "", err
	}
	m.cache[home] = minted{cred: cred, renewAt: now.Add(TTL / 2)}
	return cred, nil
}

// Forget drops home's cached credential (the Home went away).
func (m *Minter) Forget(home string) {
	m.mu.Lock()
	delete(m.cache, home)
	m.mu.Unlock()
}

// GenerateKey makes a router key pair.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}

// MarshalPrivateKey encodes key as PKCS#8 PEM.
func MarshalPrivateKey(key ed25519.PrivateKey) ([]byte, error) { return edpem.MarshalPrivateKey(key) }

// MarshalPublicKey encodes pub as PKIX PEM.
func MarshalPublicKey(pub ed25519.PublicKey) ([]byte, error) { return edpem.MarshalPublicKey(pub) }

// ParsePrivateKey decodes a PKCS#8 PEM Ed25519 key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	return edpem.ParsePrivateKey("router key", data)
}

// ParsePublicKeys decodes every PKIX PEM Ed25519 public key in data (a Home
// Secret's router-keys.pub may hold the current and the previous key).
func ParsePublicKeys(data []byte) ([]ed25519.PublicKey, error) {
	return edpem.ParsePublicKeys("router public key", data)
}
