// Package seal seals fiberd templates to a cluster's fleet key and opens
// them again (docs/contracts.md §6).
//
// A template is sealed with HPKE (RFC 9180, Go's crypto/hpke) in base mode,
// suite DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305, to the
// fleet public key. Only the holder of the fleet private key can open it, and
// the AEAD authenticates every byte: a changed byte, a template for another
// fleet key or a truncated blob is refused. The fleet key id (SHA-256 of the
// public key) travels in the clear so the refusal can say *which* key a
// template was sealed to; it is also bound into the HPKE info, so it cannot be
// swapped without the open failing.
package seal

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"lampyr.dev/serving/impl/artifact"
)

// TemplateAPIVersion is the version of the Template JSON inside a seal.
const TemplateAPIVersion = "lampyr.dev/fiberd-template/v1"

// magic starts every sealed template (format version 1).
var magic = []byte("LYTPL1\x00\x00")

const keyIDLen = sha256.Size

// PEM block types of the fleet key as kept in the Secret and the public
// ConfigMap (lampyr-system/lampyr-fleet-key).
const (
	PrivateKeyPEMType = "LAMPYR FLEET PRIVATE KEY"
	PublicKeyPEMType  = "LAMPYR FLEET PUBLIC KEY"
)

func suite() (hpke.KEM, hpke.KDF, hpke.AEAD) {
	return hpke.DHKEM(ecdh.X25519()), hpke.HKDFSHA256(), hpke.ChaCha20Poly1305()
}

// Template is what fiberd needs to run a Revision besides the grant: which
// snapshot, under which execution policy, with which helper facts.
type Template struct {
	APIVersion string `json:"apiVersion"`
	// Revision is the Knative Revision the template was sealed for.
	Revision string `json:"revision"`
	// SnapshotDigest is the sha256:... digest of the snapshot artifact's
	// manifest. fiberd refuses a grant naming another digest.
	SnapshotDigest string          `json:"snapshotDigest"`
	Execution      ExecutionPolicy `json:"execution"`
	Helper         HelperFacts     `json:"helper"`
}

// ExecutionPolicy mirrors lampyr.yaml's execution block.
type ExecutionPolicy struct {
	Mode               string `json:"mode"`
	IdleTimeoutSeconds int64  `json:"idleTimeoutSeconds,omitempty"`
	IdleAction         string `json:"idleAction,omitempty"`
}

// HelperFacts are what `ly build` recorded about the handler and the helper it
// was built for.
type HelperFacts struct {
	Port           int32  `json:"port"`
	Protocol       string `json:"protocol,omitempty"`
	Runtime        string `json:"runtime,omitempty"`
	AdapterVersion string `json:"adapterVersion,omitempty"`
	HelperVersion  string `json:"helperVersion,omitempty"`
}

// NewTemplate is the template of revision for a snapshot artifact (its
// manifest digest and config) under policy: what `ly deploy` seals, and the
// controller for image-mapped Revisions.
func NewTemplate(revision, snapshotDigest string, policy ExecutionPolicy, cfg artifact.Config) Template {
	return Template{
		APIVersion:     TemplateAPIVersion,
		Revision:       revision,
		SnapshotDigest: snapshotDigest,
		Execution:      policy,
		Helper: HelperFacts{
			Port:           cfg.Port,
			Protocol:       cfg.Protocol,
			Runtime:        cfg.Runtime.Name,
			AdapterVersion: cfg.AdapterVersion,
			HelperVersion:  cfg.HelperVersion,
		},
	}
}

// Validate checks the template's own consistency; every error names the
// field and what would be accepted.
func (t *Template) Validate() error {
	var errs []string
	if t.APIVersion != TemplateAPIVersion {
		errs = append(errs, fmt.Sprintf("apiVersion %q: want %q", t.APIVersion, TemplateAPIVersion))
	}
	if t.Revision == "" {
		errs = append(errs, "revision: must name the Revision the template is for")
	}
	if !strings.HasPrefix(t.SnapshotDigest, "sha256:") || len(t.SnapshotDigest) != len("sha256:")+64 {
		errs = append(errs, fmt.Sprintf("snapshotDigest %q: want sha256:<64 hex digits>", t.SnapshotDigest))
	}
	switch t.Execution.Mode {
	case "fresh", "":
		if t.Execution.IdleTimeoutSeconds != 0 {
			errs = append(errs, "execution.idleTimeoutSeconds: only valid with mode reuse")
		}
	case "reuse":
		if t.Execution.IdleTimeoutSeconds <= 0 {
			errs = append(errs, "execution.idleTimeoutSeconds: must be > 0 with mode reuse")
		}
	default:
		errs = append(errs, fmt.Sprintf("execution.mode %q: want fresh or reuse", t.Execution.Mode))
	}
	switch t.Execution.IdleAction {
	case "", "release":
	default:
		errs = append(errs, fmt.Sprintf("execution.idleAction %q: only release is supported (park/resume is not)", t.Execution.IdleAction))
	}
	if t.Helper.Port <= 0 || t.Helper.Port > 65535 {
		errs = append(errs, fmt.Sprintf("helper.port %d: want 1-65535", t.Helper.Port))
	}
	switch t.Helper.Protocol {
	case "", "http1", "h2c":
	default:
		errs = append(errs, fmt.Sprintf("helper.protocol %q: want http1 or h2c", t.Helper.Protocol))
	}
	if len(errs) > 0 {
		return errors.New("invalid fiberd template: " + strings.Join(errs, "; "))
	}
	return nil
}

// PrivateKey is a fleet private key.
type PrivateKey struct{ k hpke.PrivateKey }

// PublicKey is a fleet public key.
type PublicKey struct{ k hpke.PublicKey }

// GenerateFleetKey makes a new fleet key pair (done once, at install time).
func GenerateFleetKey() (*PrivateKey, error) {
	kem, _, _ := suite()
	k, err := kem.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("generating fleet key: %w", err)
	}
	return &PrivateKey{k: k}, nil
}

// Public returns the public half.
func (p *PrivateKey) Public() *PublicKey { return &PublicKey{k: p.k.PublicKey()} }

// KeyID identifies the key pair: hex SHA-256 of the public key.
func (p *PublicKey) KeyID() string { return hex.EncodeToString(p.id()) }

func (p *PublicKey) id() []byte { s := sha256.Sum256(p.k.Bytes()); return s[:] }

// MarshalPEM encodes the private key for the fleet key Secret.
func (p *PrivateKey) MarshalPEM() ([]byte, error) {
	b, err := p.k.Bytes()
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: PrivateKeyPEMType, Bytes: b}), nil
}

// MarshalPEM encodes the public key for the published ConfigMap.
func (p *PublicKey) MarshalPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PublicKeyPEMType, Bytes: p.k.Bytes()})
}

// ParsePrivateKeyPEM decodes a fleet private key.
func ParsePrivateKeyPEM(data []byte) (*PrivateKey, error) {
	b, err := pemBytes(data, PrivateKeyPEMType)
	if err != nil {
		return nil, err
	}
	kem, _, _ := suite()
	k, err := kem.NewPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("fleet private key: %w", err)
	}
	return &PrivateKey{k: k}, nil
}

// ParsePublicKeyPEM decodes a fleet public key.
func ParsePublicKeyPEM(data []byte) (*PublicKey, error) {
	b, err := pemBytes(data, PublicKeyPEMType)
	if err != nil {
		return nil, err
	}
	kem, _, _ := suite()
	k, err := kem.NewPublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("fleet public key: %w", err)
	}
	return &PublicKey{k: k}, nil
}

func pemBytes(data []byte, typ string) ([]byte, error) {
	blk, _ := pem.Decode(data)
	if blk == nil {
		return nil, fmt.Errorf("fleet key: no PEM block found; want a %q block", typ)
	}
	if blk.Type != typ {
		return nil, fmt.Errorf("fleet key: PEM block is %q; want %q", blk.Type, typ)
	}
	return blk.Bytes, nil
}

func info(keyID []byte) []byte {
	return append([]byte(TemplateAPIVersion+"\x00"), keyID...)
}

// Seal validates t and seals it to the fleet public key.
func Seal(pub *PublicKey, t Template) ([]byte, error) {
	if t.APIVersion == "" {
		t.APIVersion = TemplateAPIVersion
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	plain, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	_, kdf, aead := suite()
	id := pub.id()
	ct, err := hpke.Seal(pub.k, kdf, aead, info(id), plain)
	if err != nil {
		return nil, fmt.Errorf("sealing template: %w", err)
	}
	out := make([]byte, 0, len(magic)+len(id)+len(ct))
	out = append(out, magic...)
	out = append(out, id...)
	return append(out, ct...), nil
}

// Errors Open returns, for errors.Is.
var (
	ErrNotSealedTemplate = errors.New("not a sealed fiberd template")
	ErrOtherFleetKey     = errors.New("template sealed to another fleet key")
	ErrTampered          = errors.New("sealed template failed authentication")
)

// SealedKeyID returns the fleet key id a sealed template names (unauthenticated;
// for diagnostics such as `fiberctl template`).
func SealedKeyID(sealed []byte) (string, error) {
	if len(sealed) < len(magic)+keyIDLen || !bytes.Equal(sealed[:len(magic)], magic) {
		return "", fmt.Errorf("%w: the blob does not start with the Lampyr template header; was it produced by `ly deploy`?", ErrNotSealedTemplate)
	}
	return hex.EncodeToString(sealed[len(magic) : len(magic)+keyIDLen]), nil
}

// Open authenticates and decrypts a sealed template with the fleet private
// key and validates it.
func Open(priv *PrivateKey, sealed []byte) (Template, error) {
	var t Template
	keyID, err := SealedKeyID(sealed)
	if err != nil {
		return t, err
	}
	pub := priv.Public()
	if keyID != pub.KeyID() {
		return t, fmt.Errorf("%w: it names fleet key %s but this cluster's fleet key is %s; re-run `ly deploy` against this cluster so the template is sealed to its key (ConfigMap lampyr-system/lampyr-fleet-key)", ErrOtherFleetKey, short(keyID), short(pub.KeyID()))
	}
	_, kdf, aead := suite()
	plain, err := hpke.Open(priv.k, kdf, aead, info(pub.id()), sealed[len(magic)+keyIDLen:])
	if err != nil {
		return t, fmt.Errorf("%w: it was altered or corrupted after sealing (%v); re-seal it with `ly deploy`", ErrTampered, err)
	}
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return t, fmt.Errorf("sealed template opened but its JSON is invalid: %w", err)
	}
	if err := t.Validate(); err != nil {
		return t, err
	}
	return t, nil
}

func short(id string) string {
	if len(id) > 16 {
		return id[:16]
	}
	return id
}
