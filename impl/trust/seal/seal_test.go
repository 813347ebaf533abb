package seal

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func testTemplate() Template {
	return Template{
		Namespace:      "team-a",
		Revision:       "hello-00001",
		SnapshotDigest: "sha256:" + strings.Repeat("ab", 32),
		Execution:      ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: 30, IdleAction: "release"},
		Helper:         HelperFacts{Port: 8080, Protocol: "http1", Runtime: "go"},
	}
}

// fixture is one installation: a fleet key and a sealer trusted for team-a.
type fixture struct {
	fleet  *PrivateKey
	sealer *SealerKey
	trust  *Trust
}

func newFixture(t *testing.T, namespaces ...string) fixture {
	t.Helper()
	k, err := GenerateFleetKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := GenerateSealerKey()
	if err != nil {
		t.Fatal(err)
	}
	if len(namespaces) == 0 {
		namespaces = []string{"team-a"}
	}
	return fixture{fleet: k, sealer: s, trust: NewTrust(TrustedSealer{Name: "alice", Key: s.Public(), Namespaces: namespaces})}
}

func TestSealOpenRoundTrip(t *testing.T) {
	f := newFixture(t)
	// Through PEM, as the Secrets and ConfigMap carry the keys.
	privPEM, _ := f.fleet.MarshalPEM()
	k2, err := ParsePrivateKeyPEM(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKeyPEM(f.fleet.Public().MarshalPEM())
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := ParseSealerKeyPEM(f.sealer.MarshalPEM())
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := Seal(pub, sealer, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), "hello-00001") || strings.Contains(string(sealed), "team-a") {
		t.Fatal("sealed template contains the plaintext")
	}
	got, err := Open([]*PrivateKey{k2}, f.trust, sealed)
	if err != nil {
		t.Fatal(err)
	}
	want := testTemplate()
	want.APIVersion = TemplateAPIVersion
	if got.Template != want || got.Sealer.Name != "alice" || got.FleetKeyID != f.fleet.Public().KeyID() {
		t.Fatalf("opened %+v, want %+v sealed by alice", got, want)
	}
	h, err := Inspect(sealed)
	if err != nil || h.SealerKeyID != f.sealer.KeyID() || h.FleetKeyID != f.fleet.Public().KeyID() {
		t.Fatalf("Inspect = %+v, %v", h, err)
	}
}

func TestOpenWithRetiredFleetKey(t *testing.T) {
	f := newFixture(t)
	sealed, err := Seal(f.fleet.Public(), f.sealer, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	current, _ := GenerateFleetKey()
	// After a rotation the old key is kept as a retired key: still opens.
	if _, err := Open([]*PrivateKey{current, f.fleet}, f.trust, sealed); err != nil {
		t.Fatalf("retired key: %v", err)
	}
	_, err = Open([]*PrivateKey{current}, f.trust, sealed)
	if !errors.Is(err, ErrOtherFleetKey) || !strings.Contains(err.Error(), f.fleet.Public().KeyID()[:16]) || !strings.Contains(err.Error(), "ly deploy") {
		t.Fatalf("open with another fleet key: %v; want ErrOtherFleetKey naming both keys and the fix", err)
	}
}

func TestOpenRefusesEveryAlteredByte(t *testing.T) {
	f := newFixture(t)
	sealed, err := Seal(f.fleet.Public(), f.sealer, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	for i := range sealed {
		altered := append([]byte(nil), sealed...)
		altered[i] ^= 0x01
		if _, err := Open([]*PrivateKey{f.fleet}, f.trust, altered); err == nil {
			t.Fatalf("flipping a bit of byte %d of %d went unnoticed", i, len(sealed))
		}
	}
	altered := append([]byte(nil), sealed...)
	altered[len(altered)-100] ^= 0x80
	if _, err := Open([]*PrivateKey{f.fleet}, f.trust, altered); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("altered ciphertext: %v, want ErrBadSignature", err)
	}
	if _, err := Open([]*PrivateKey{f.fleet}, f.trust, sealed[:len(sealed)-1]); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("truncated: %v, want ErrBadSignature", err)
	}
	if _, err := Open([]*PrivateKey{f.fleet}, f.trust, []byte("{}")); !errors.Is(err, ErrNotSealedTemplate) {
		t.Fatalf("garbage: %v, want ErrNotSealedTemplate", err)
	}
}

func TestOpenRefusesUntrustedSealers(t *testing.T) {
	f := newFixture(t)
	mallory, _ := GenerateSealerKey()
	sealed, err := Seal(f.fleet.Public(), mallory, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	// Anyone with the fleet public key can seal; only trusted sealers open.
	if _, err := Open([]*PrivateKey{f.fleet}, f.trust, sealed); !errors.Is(err, ErrUnknownSealer) || !strings.Contains(err.Error(), mallory.KeyID()[:16]) {
		t.Fatalf("unknown sealer: %v", err)
	}
	// Re-signing someone else's template with a trusted key: the signature
	// verifies but the sealer id is bound into the HPKE info.
	good, _ := Seal(f.fleet.Public(), f.sealer, testTemplate())
	resigned := append([]byte(nil), good[:len(good)-sigLen]...)
	copy(resigned[len(magic)+keyIDLen:], sealerID(mallory.Public()))
	resigned = append(resigned, ed25519.Sign(mallory.k, append(append([]byte(nil), sigContext...), resigned...))...)
	trustBoth := NewTrust(TrustedSealer{Name: "alice", Key: f.sealer.Public(), Namespaces: []string{"team-a"}}, TrustedSealer{Name: "mallory", Key: mallory.Public(), Namespaces: []string{"*"}})
	if _, err := Open([]*PrivateKey{f.fleet}, trustBoth, resigned); !errors.Is(err, ErrTampered) {
		t.Fatalf("re-signed by another sealer: %v, want ErrTampered", err)
	}
}

func TestOpenRefusesUnauthorizedNamespace(t *testing.T) {
	f := newFixture(t, "team-b")
	sealed, err := Seal(f.fleet.Public(), f.sealer, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open([]*PrivateKey{f.fleet}, f.trust, sealed)
	if !errors.Is(err, ErrNotAuthorized) || !strings.Contains(err.Error(), `"team-a"`) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("sealer for team-b sealing team-a: %v", err)
	}
	all := newFixture(t, AllNamespaces)
	sealed, _ = Seal(all.fleet.Public(), all.sealer, testTemplate())
	if _, err := Open([]*PrivateKey{all.fleet}, all.trust, sealed); err != nil {
		t.Fatalf("sealer for *: %v", err)
	}
}

func TestOpenRefusesV1(t *testing.T) {
	f := newFixture(t)
	v1 := append([]byte("LYTPL1\x00\x00"), make([]byte, 200)...)
	if _, err := Open([]*PrivateKey{f.fleet}, f.trust, v1); !errors.Is(err, ErrUnsigned) || !strings.Contains(err.Error(), "ly deploy") {
		t.Fatalf("v1 template: %v", err)
	}
}

func TestMatches(t *testing.T) {
	tpl := testTemplate()
	d := tpl.SnapshotDigest
	pol := ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: 30}
	if err := tpl.Matches("team-a", "hello-00001", d, pol); err != nil {
		t.Fatal(err)
	}
	for want, err := range map[string]error{
		`namespace "team-a"`:       tpl.Matches("team-b", "hello-00001", d, pol),
		`Revision "hello-00001"`:   tpl.Matches("team-a", "hello-00002", d, pol),
		"sealed for another build": tpl.Matches("team-a", "hello-00001", "sha256:"+strings.Repeat("cd", 32), pol),
		"execution policy":         tpl.Matches("team-a", "hello-00001", d, ExecutionPolicy{Mode: "fresh"}),
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mismatch %q: got %v", want, err)
		}
	}
}

func TestSealValidates(t *testing.T) {
	f := newFixture(t)
	for name, mut := range map[string]func(*Template){
		"execution.idleAction": func(t *Template) { t.Execution.IdleAction = "park" },
		"execution.mode":       func(t *Template) { t.Execution.Mode = "sometimes" },
		"snapshotDigest":       func(t *Template) { t.SnapshotDigest = "latest" },
		"helper.port":          func(t *Template) { t.Helper.Port = 0 },
		"revision":             func(t *Template) { t.Revision = "" },
		"namespace":            func(t *Template) { t.Namespace = "" },
		"idleTimeoutSeconds":   func(t *Template) { t.Execution.IdleTimeoutSeconds = 0 },
	} {
		tpl := testTemplate()
		mut(&tpl)
		if _, err := Seal(f.fleet.Public(), f.sealer, tpl); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Seal error %v should name the field", name, err)
		}
	}
	if _, err := Seal(f.fleet.Public(), nil, testTemplate()); err == nil {
		t.Error("Seal without a sealer key succeeded")
	}
}

func TestParseSealers(t *testing.T) {
	s, _ := GenerateSealerKey()
	v, err := FormatSealer(TrustedSealer{Name: "ci", Key: s.Public(), Namespaces: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSealers(map[string]string{"ci": v, "admin": "publicKey: |\n" + indent(string(MarshalSealerPublicKey(s.Public()))) + "namespaces: ['*']\n"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "admin" || !got[0].Authorizes("x") || got[1].Name != "ci" || !got[1].Authorizes("b") || got[1].Authorizes("c") {
		t.Fatalf("parsed %+v", got)
	}
	for entry, want := range map[string]string{
		"publicKey: abc\nnamespaces: [a]":                            "publicKey",
		"publicKey: " + b64(s.Public()) + "\n":                       "namespaces",
		"publicKey: " + b64(s.Public()) + "\nnamespaces: [Not_A_NS]": "Not_A_NS",
		"pubkey: x": "pubkey",
	} {
		if _, err := ParseSealers(map[string]string{"bad": entry}); err == nil || !strings.Contains(err.Error(), "bad: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("entry %q: error %v should name the entry and %s", entry, err, want)
		}
	}
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func b64(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }
