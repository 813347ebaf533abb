// Package signedgrant is the signed, expiring grant the grant controller
// issues to a Home's fiberd. fiberd serves fibers only while it holds one that
// verifies against the controller's public key and has not expired; the
// controller renews it before expiry. The grant carries the CapacityGrant's
// policy, so a Home cannot run more, bigger or longer fibers than admitted.
package signedgrant

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"lampyr.dev/serving/impl/trust/edpem"
	"lampyr.dev/serving/impl/trust/homekey"
)

// Claims is the grant's content.
type Claims struct {
	GrantID string `json:"grantID"`
	// Home is the name of the Home the grant is issued to (its Pod, Service
	// and Secret in the Homes namespace): the only audience of router
	// credentials this fiberd accepts (impl/fiberd/routercred).
	Home string `json:"home"`
	// HomeKeySHA256 is the fingerprint (impl/trust/homekey) of the Home's
	// TLS key, kept in its Secret: fiberd serves its API with that key
	// only, and fiber-router accepts no other (docs/security.md §3).
	// Empty in grants of controllers that predate Home keys.
	HomeKeySHA256 string `json:"homeKeySHA256,omitempty"`
	Namespace     string `json:"namespace"`
	Revision      string `json:"revision"`
	// Template and SnapshotArtifact are digest-pinned references. The grant
	// controller opened the template (fiberd never holds the fleet key) and
	// checked it against the Revision; what fiberd needs of it is Helper.
	Template            string            `json:"template"`
	Helper              Helper            `json:"helper"`
	SnapshotArtifact    string            `json:"snapshotArtifact"`
	MemoryPerFiberBytes int64             `json:"memoryPerFiberBytes"`
	MaxFibers           int32             `json:"maxFibers"`
	MaxRequestSeconds   int64             `json:"maxRequestSeconds"`
	Execution           Execution         `json:"execution"`
	Env                 map[string]string `json:"env,omitempty"`
	IssuedAt            time.Time         `json:"issuedAt"`
	ExpiresAt           time.Time         `json:"expiresAt"`
}

// Helper is what the opened template says about the handler
// (seal.HelperFacts): fiberd checks it against the snapshot it pulls.
type Helper struct {
	Port     int32  `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// Execution is the grant's execution policy.
type Execution struct {
	Mode               string `json:"mode"`
	IdleTimeoutSeconds int64  `json:"idleTimeoutSeconds,omitempty"`
}

// envelope is the wire form: the exact signed bytes travel, so verification
// never depends on re-encoding.
type envelope struct {
	Payload   []byte `json:"payload"`
	Signature []byte `json:"signature"`
}

// Sign signs c.
func Sign(key ed25519.PrivateKey, c Claims) ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	p, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{Payload: p, Signature: ed25519.Sign(key, p)})
}

// Errors of Verify, for errors.Is.
var (
	ErrBadSignature = errors.New("grant signature does not verify")
	ErrExpired      = errors.New("grant expired")
)

// Verify checks the signature and the validity window at now.
func Verify(pub ed25519.PublicKey, data []byte, now time.Time) (Claims, error) {
	var c Claims
	var e envelope
	if err := json.Unmarshal(data, &e); err != nil {
		return c, fmt.Errorf("grant is not a signed grant envelope: %w", err)
	}
	if !ed25519.Verify(pub, e.Payload, e.Signature) {
		return c, fmt.Errorf("%w with the grant controller's public key; the grant was altered or issued by another controller", ErrBadSignature)
	}
	if err := json.Unmarshal(e.Payload, &c); err != nil {
		return c, fmt.Errorf("grant payload: %w", err)
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	if !now.Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w at %s (now %s); the grant controller has not renewed it", ErrExpired, c.ExpiresAt.Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if now.Add(time.Minute).Before(c.IssuedAt) {
		return c, fmt.Errorf("grant issued in the future (%s); check the clocks", c.IssuedAt.Format(time.RFC3339))
	}
	return c, nil
}

func (c *Claims) validate() error {
	var errs []string
	if c.GrantID == "" {
		errs = append(errs, "grantID is empty")
	}
	if c.Revision == "" {
		errs = append(errs, "revision is empty")
	}
	if c.Home == "" {
		errs = append(errs, "home is empty")
	}
	if c.HomeKeySHA256 != "" {
		if err := homekey.CheckFingerprint(c.HomeKeySHA256); err != nil {
			errs = append(errs, "homeKeySHA256: "+err.Error())
		}
	}
	if c.Helper.Port <= 0 || c.Helper.Port > 65535 {
		errs = append(errs, fmt.Sprintf("helper.port %d: want 1-65535", c.Helper.Port))
	}
	if c.MaxFibers <= 0 {
		errs = append(errs, "maxFibers must be > 0")
	}
	if c.MemoryPerFiberBytes <= 0 {
		errs = append(errs, "memoryPerFiberBytes must be > 0")
	}
	if c.ExpiresAt.IsZero() {
		errs = append(errs, "expiresAt is unset")
	}
	switch c.Execution.Mode {
	case "fresh":
	case "reuse":
		if c.Execution.IdleTimeoutSeconds <= 0 {
			errs = append(errs, "execution.idleTimeoutSeconds must be > 0 in reuse mode")
		}
	default:
		errs = append(errs, fmt.Sprintf("execution.mode %q: want fresh or reuse", c.Execution.Mode))
	}
	if len(errs) > 0 {
		return errors.New("invalid grant: " + strings.Join(errs, "; "))
	}
	return nil
}

// GenerateKey makes a grant signing key pair.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}

// MarshalPrivateKey encodes a signing key as PKCS#8 PEM.
func MarshalPrivateKey(k ed25519.PrivateKey) ([]byte, error) { return edpem.MarshalPrivateKey(k) }

// MarshalPublicKey encodes a verification key as PKIX PEM.
func MarshalPublicKey(k ed25519.PublicKey) ([]byte, error) { return edpem.MarshalPublicKey(k) }

// ParsePrivateKey decodes a PKCS#8 PEM Ed25519 key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	return edpem.ParsePrivateKey("grant signing key", data)
}

// ParsePublicKey decodes a PKIX PEM Ed25519 key.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	keys, err := edpem.ParsePublicKeys("grant verification key", data)
	if err != nil {
		return nil, err
	}
	return keys[0], nil
}
