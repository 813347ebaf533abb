// Package seal seals fiberd templates to a cluster's fleet key and opens
// them again (docs/contracts.md §6, docs/security.md §2).
//
// A template (format v2) is sealed with HPKE (RFC 9180, Go's crypto/hpke) in
// base mode, suite DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
// ChaCha20-Poly1305, to the fleet public key, and signed with its sealer's
// Ed25519 key. Only the holder of the fleet private key can open it; the
// AEAD authenticates the plaintext and the signature says who sealed it
// (base-mode HPKE alone lets anyone holding the public key seal). The
// plaintext binds the namespace, the Revision and the snapshot digest, so a
// template cannot be replayed into another namespace or Revision. The fleet
// key id and the sealer key id travel in the clear, so a refusal can say
// which keys were involved; both are bound into the HPKE info and covered by
// the signature.
package seal

import (
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"lampyr.dev/serving/impl/artifact"
)

// TemplateAPIVersion is the version of the Template JSON inside a seal.
const TemplateAPIVersion = "lampyr.dev/fiberd-template/v2"

// Headers of sealed templates: v2 (signed, namespace-bound) is the only
// format opened; v1 is recognized to say why it is refused.
var (
	magicV1 = []byte("LYTPL1\x00\x00")
	magic   = []byte("LYTPL2\x00\x00")
)

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
	// Namespace and Revision name the Knative Revision the template was
	// sealed for; the grant controller runs it for no other.
	Namespace string `json:"namespace"`
	Revision  string `json:"revision"`
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

// NewTemplate is the template of namespace/revision for a snapshot artifact
// (its manifest digest and config) under policy: what `ly deploy` seals, and
// the controller for image-mapped Revisions.
func NewTemplate(namespace, revision, snapshotDigest string, policy ExecutionPolicy, cfg artifact.Config) Template {
	return Template{
		APIVersion:     TemplateAPIVersion,
		Namespace:      namespace,
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
	if msgs := validation.IsDNS1123Label(t.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Sprintf("namespace %q: must name the Revision's namespace (%s)", t.Namespace, strings.Join(msgs, ", ")))
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
