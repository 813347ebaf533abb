package seal

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// PEM block types of a sealer identity (`ly`'s ~/.config/lampyr/sealer.pem,
// the controller's Secret lampyr-system/lampyr-controller-sealer).
const (
	SealerPrivateKeyPEMType = "LAMPYR SEALER PRIVATE KEY"
	SealerPublicKeyPEMType  = "LAMPYR SEALER PUBLIC KEY"
)

// SealerKey is the Ed25519 key a sealer signs templates with.
type SealerKey struct{ k ed25519.PrivateKey }

// GenerateSealerKey makes a new sealer identity.
func GenerateSealerKey() (*SealerKey, error) {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating sealer key: %w", err)
	}
	return &SealerKey{k: k}, nil
}

// Public returns the sealer's public key.
func (s *SealerKey) Public() ed25519.PublicKey { return s.k.Public().(ed25519.PublicKey) }

// KeyID identifies the sealer: hex SHA-256 of its public key.
func (s *SealerKey) KeyID() string { return SealerKeyID(s.Public()) }

// SealerKeyID is the key id of a sealer public key.
func SealerKeyID(pub ed25519.PublicKey) string { return hex.EncodeToString(sealerID(pub)) }

func sealerID(pub ed25519.PublicKey) []byte { s := sha256.Sum256(pub); return s[:] }

// MarshalPEM encodes the private key (its 32-byte seed).
func (s *SealerKey) MarshalPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: SealerPrivateKeyPEMType, Bytes: s.k.Seed()})
}

// MarshalSealerPublicKey encodes a sealer public key as PEM.
func MarshalSealerPublicKey(pub ed25519.PublicKey) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: SealerPublicKeyPEMType, Bytes: pub})
}

// ParseSealerKeyPEM decodes a sealer private key.
func ParseSealerKeyPEM(data []byte) (*SealerKey, error) {
	b, err := pemBytes(data, SealerPrivateKeyPEMType)
	if err != nil {
		return nil, err
	}
	if len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("sealer private key: %d bytes, want a %d-byte Ed25519 seed", len(b), ed25519.SeedSize)
	}
	return &SealerKey{k: ed25519.NewKeyFromSeed(b)}, nil
}

// ParseSealerPublicKey accepts a sealer public key as PEM or as the base64
// of its 32 bytes (the form `ly sealer show` prints).
func ParseSealerPublicKey(s string) (ed25519.PublicKey, error) {
	s = strings.TrimSpace(s)
	var b []byte
	if strings.HasPrefix(s, "-----BEGIN") {
		var err error
		if b, err = pemBytes([]byte(s), SealerPublicKeyPEMType); err != nil {
			return nil, err
		}
	} else {
		var err error
		if b, err = base64.StdEncoding.DecodeString(s); err != nil {
			return nil, fmt.Errorf("sealer public key: want PEM or base64 of 32 bytes: %w", err)
		}
	}
	if len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("sealer public key: %d bytes, want %d (Ed25519)", len(b), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// AllNamespaces in a TrustedSealer's Namespaces authorizes every namespace.
const AllNamespaces = "*"

// TrustedSealer is one identity allowed to seal templates, and for which
// namespaces.
type TrustedSealer struct {
	Name       string
	Key        ed25519.PublicKey
	Namespaces []string
}

// Authorizes reports whether s may seal templates for namespace.
func (s TrustedSealer) Authorizes(namespace string) bool {
	return slices.Contains(s.Namespaces, AllNamespaces) || slices.Contains(s.Namespaces, namespace)
}

// Trust is the set of sealers an installation accepts, by key id.
type Trust struct{ byID map[string]TrustedSealer }

// NewTrust returns a Trust of sealers; a later one with the same key
// replaces an earlier one.
func NewTrust(sealers ...TrustedSealer) *Trust {
	t := &Trust{byID: map[string]TrustedSealer{}}
	for _, s := range sealers {
		t.byID[SealerKeyID(s.Key)] = s
	}
	return t
}

// Lookup returns the trusted sealer with key id.
func (t *Trust) Lookup(keyID string) (TrustedSealer, bool) {
	if t == nil {
		return TrustedSealer{}, false
	}
	s, ok := t.byID[keyID]
	return s, ok
}

// sealerEntry is one value of the lampyr-template-sealers ConfigMap.
type sealerEntry struct {
	PublicKey  string   `json:"publicKey"`
	Namespaces []string `json:"namespaces"`
}

// ParseSealers decodes the lampyr-template-sealers ConfigMap's data: one key
// per identity, each value
//
//	publicKey: <base64 of the Ed25519 public key, or PEM>
//	namespaces: [team-a, team-b]   # or ["*"]
//
// Every error names the entry and the field.
func ParseSealers(data map[string]string) ([]TrustedSealer, error) {
	names := make([]string, 0, len(data))
	for n := range data {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []TrustedSealer
	var errs []string
	for _, n := range names {
		var e sealerEntry
		if err := yaml.UnmarshalStrict([]byte(data[n]), &e); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v (want publicKey and namespaces)", n, err))
			continue
		}
		key, err := ParseSealerPublicKey(e.PublicKey)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: publicKey: %v", n, err))
			continue
		}
		if len(e.Namespaces) == 0 {
			errs = append(errs, fmt.Sprintf("%s: namespaces: list the namespaces it may seal for, or [\"*\"]", n))
			continue
		}
		bad := false
		for _, ns := range e.Namespaces {
			if ns == AllNamespaces {
				continue
			}
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				errs = append(errs, fmt.Sprintf("%s: namespaces: %q: %s", n, ns, strings.Join(msgs, ", ")))
				bad = true
			}
		}
		if !bad {
			out = append(out, TrustedSealer{Name: n, Key: key, Namespaces: e.Namespaces})
		}
	}
	if len(errs) > 0 {
		return out, errors.New(strings.Join(errs, "; "))
	}
	return out, nil
}

// FormatSealer is the ConfigMap value of s (ParseSealers reads it back).
func FormatSealer(s TrustedSealer) (string, error) {
	b, err := yaml.Marshal(sealerEntry{PublicKey: base64.StdEncoding.EncodeToString(s.Key), Namespaces: s.Namespaces})
	return string(b), err
}

// Header is the clear part of a sealed template.
type Header struct {
	// FleetKeyID is the fleet key the template is sealed to.
	FleetKeyID string
	// SealerKeyID is the key that signed it.
	SealerKeyID string
}

const sigLen = ed25519.SignatureSize

// sigContext separates template signatures from anything else the same key
// could sign.
var sigContext = []byte("lampyr.dev/fiberd-template/v2 signature\x00")

func info(fleetID, sealerID []byte) []byte {
	b := append([]byte(TemplateAPIVersion+"\x00"), fleetID...)
	return append(b, sealerID...)
}

// Seal validates t, seals it to the fleet public key and signs it with the
// sealer's key.
func Seal(fleet *PublicKey, sealer *SealerKey, t Template) ([]byte, error) {
	if sealer == nil {
		return nil, errors.New("sealing a template needs a sealer identity (ly: ~/.config/lampyr/sealer.pem)")
	}
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
	fid, sid := fleet.id(), sealerID(sealer.Public())
	ct, err := hpke.Seal(fleet.k, kdf, aead, info(fid, sid), plain)
	if err != nil {
		return nil, fmt.Errorf("sealing template: %w", err)
	}
	out := make([]byte, 0, len(magic)+2*keyIDLen+len(ct)+sigLen)
	out = append(out, magic...)
	out = append(out, fid...)
	out = append(out, sid...)
	out = append(out, ct...)
	sig := ed25519.Sign(sealer.k, append(append([]byte(nil), sigContext...), out...))
	return append(out, sig...), nil
}

// Errors Open returns, for errors.Is.
var (
	ErrNotSealedTemplate = errors.New("not a sealed fiberd template")
	ErrUnsigned          = errors.New("template is not signed")
	ErrUnknownSealer     = errors.New("template sealed by an identity this installation does not trust")
	ErrBadSignature      = errors.New("template signature does not verify")
	ErrOtherFleetKey     = errors.New("template sealed to another fleet key")
	ErrTampered          = errors.New("sealed template failed authentication")
	ErrNotAuthorized     = errors.New("sealer not authorized for the template's namespace")
)

// Inspect reads the clear header of a sealed template (unauthenticated; for
// choosing keys and for diagnostics such as `fiberctl template`).
func Inspect(sealed []byte) (Header, error) {
	if len(sealed) >= len(magicV1) && bytes.Equal(sealed[:len(magicV1)], magicV1) {
		return Header{}, fmt.Errorf("%w: it is a format v1 template (no sealer signature, not bound to a namespace), made by an older ly; redeploy with `ly deploy` to reseal it", ErrUnsigned)
	}
	if len(sealed) < len(magic)+2*keyIDLen+sigLen || !bytes.Equal(sealed[:len(magic)], magic) {
		return Header{}, fmt.Errorf("%w: the blob does not start with the Lampyr template header; was it produced by `ly deploy`?", ErrNotSealedTemplate)
	}
	h := sealed[len(magic):]
	return Header{FleetKeyID: hex.EncodeToString(h[:keyIDLen]), SealerKeyID: hex.EncodeToString(h[keyIDLen : 2*keyIDLen])}, nil
}

// Opened is a template that verified and opened, with who sealed it.
type Opened struct {
	Template
	Sealer     TrustedSealer
	FleetKeyID string
}

// Open checks that a trusted sealer signed the template, opens it with the
// fleet private key it names (any of fleet: the current key and retired
// ones), validates it and checks the sealer is authorized for the
// template's namespace. Whether the template fits a particular Revision is
// the caller's check (Matches).
func Open(fleet []*PrivateKey, trust *Trust, sealed []byte) (Opened, error) {
	var o Opened
	h, err := Inspect(sealed)
	if err != nil {
		return o, err
	}
	s, ok := trust.Lookup(h.SealerKeyID)
	if !ok {
		return o, fmt.Errorf("%w: it was signed by sealer key %s; an administrator authorizes a `ly` identity with `ly cluster authorize-sealer` (ConfigMap lampyr-system/lampyr-template-sealers)", ErrUnknownSealer, short(h.SealerKeyID))
	}
	body, sig := sealed[:len(sealed)-sigLen], sealed[len(sealed)-sigLen:]
	if !ed25519.Verify(s.Key, append(append([]byte(nil), sigContext...), body...), sig) {
		return o, fmt.Errorf("%w with the key of sealer %q: it was altered after sealing; re-seal it with `ly deploy`", ErrBadSignature, s.Name)
	}
	var priv *PrivateKey
	var ids []string
	for _, k := range fleet {
		if k == nil {
			continue
		}
		id := k.Public().KeyID()
		ids = append(ids, short(id))
		if id == h.FleetKeyID {
			priv = k
		}
	}
	if priv == nil {
		return o, fmt.Errorf("%w: it names fleet key %s but this cluster holds %s; re-run `ly deploy` against this cluster so the template is sealed to its key (ConfigMap lampyr-system/lampyr-fleet-key)", ErrOtherFleetKey, short(h.FleetKeyID), strings.Join(ids, ", "))
	}
	_, kdf, aead := suite()
	pub := priv.Public()
	plain, err := hpke.Open(priv.k, kdf, aead, info(pub.id(), sealerID(s.Key)), body[len(magic)+2*keyIDLen:])
	if err != nil {
		return o, fmt.Errorf("%w: it was altered or corrupted after sealing (%v); re-seal it with `ly deploy`", ErrTampered, err)
	}
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o.Template); err != nil {
		return o, fmt.Errorf("sealed template opened but its JSON is invalid: %w", err)
	}
	if err := o.Template.Validate(); err != nil {
		return o, err
	}
	if !s.Authorizes(o.Namespace) {
		return o, fmt.Errorf("%w: sealer %q (key %s) may seal for %s, not for namespace %q; an administrator extends it with `ly cluster authorize-sealer`", ErrNotAuthorized, s.Name, short(h.SealerKeyID), strings.Join(s.Namespaces, ", "), o.Namespace)
	}
	o.Sealer, o.FleetKeyID = s, h.FleetKeyID
	return o, nil
}

// Matches is the rule "a template runs only the Revision it was sealed for":
// same namespace, Revision, snapshot digest and execution policy. The error
// names the first difference and the fix.
func (t Template) Matches(namespace, revision, snapshotDigest string, policy ExecutionPolicy) error {
	if t.Namespace != namespace {
		return fmt.Errorf("template was sealed for namespace %q but the Revision is in %q: a template cannot be replayed into another namespace; deploy the Service with `ly deploy` in this namespace", t.Namespace, namespace)
	}
	if t.Revision != revision {
		return fmt.Errorf("template was sealed for Revision %q but the grant is for %q", t.Revision, revision)
	}
	if t.SnapshotDigest != snapshotDigest {
		return fmt.Errorf("template names snapshot %s but the Revision names %s; the template was sealed for another build: redeploy with `ly deploy` so template and Revision agree", t.SnapshotDigest, snapshotDigest)
	}
	mode, want := t.Execution.Mode, policy.Mode
	if mode == "" {
		mode = "fresh"
	}
	if want == "" {
		want = "fresh"
	}
	if mode != want || (mode == "reuse" && t.Execution.IdleTimeoutSeconds != policy.IdleTimeoutSeconds) {
		return fmt.Errorf("template execution policy (%s, idle %ds) differs from the Revision's (%s, idle %ds)", mode, t.Execution.IdleTimeoutSeconds, want, policy.IdleTimeoutSeconds)
	}
	return nil
}

func short(id string) string {
	if len(id) > 16 {
		return id[:16]
	}
	return id
}
