package seal

import (
	"errors"
	"strings"
	"testing"
)

func testTemplate() Template {
	return Template{
		Revision:       "hello-00001",
		SnapshotDigest: "sha256:" + strings.Repeat("ab", 32),
		Execution:      ExecutionPolicy{Mode: "reuse", IdleTimeoutSeconds: 30, IdleAction: "release"},
		Helper:         HelperFacts{Port: 8080, Protocol: "http1", Runtime: "go"},
	}
}

func TestSealOpenRoundTrip(t *testing.T) {
	k, err := GenerateFleetKey()
	if err != nil {
		t.Fatal(err)
	}
	// Through PEM, as the Secret and ConfigMap carry the keys.
	privPEM, _ := k.MarshalPEM()
	k2, err := ParsePrivateKeyPEM(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKeyPEM(k.Public().MarshalPEM())
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := Seal(pub, testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), "hello-00001") {
		t.Fatal("sealed template contains the plaintext")
	}
	got, err := Open(k2, sealed)
	if err != nil {
		t.Fatal(err)
	}
	want := testTemplate()
	want.APIVersion = TemplateAPIVersion
	if got != want {
		t.Fatalf("opened %+v, want %+v", got, want)
	}
}

func TestOpenRefusesOtherFleetKey(t *testing.T) {
	ours, _ := GenerateFleetKey()
	theirs, _ := GenerateFleetKey()
	sealed, err := Seal(theirs.Public(), testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(ours, sealed)
	if !errors.Is(err, ErrOtherFleetKey) || !strings.Contains(err.Error(), theirs.Public().KeyID()[:16]) || !strings.Contains(err.Error(), "ly deploy") {
		t.Fatalf("open with another fleet key: %v; want ErrOtherFleetKey naming both keys and the fix", err)
	}
}

func TestOpenRefusesEveryAlteredByte(t *testing.T) {
	k, _ := GenerateFleetKey()
	sealed, err := Seal(k.Public(), testTemplate())
	if err != nil {
		t.Fatal(err)
	}
	for i := range sealed {
		altered := append([]byte(nil), sealed...)
		altered[i] ^= 0x01
		if _, err := Open(k, altered); err == nil {
			t.Fatalf("flipping a bit of byte %d of %d went unnoticed", i, len(sealed))
		}
	}
	// The payload bytes specifically fail authentication.
	altered := append([]byte(nil), sealed...)
	altered[len(altered)-20] ^= 0x80
	if _, err := Open(k, altered); !errors.Is(err, ErrTampered) {
		t.Fatalf("altered ciphertext: %v, want ErrTampered", err)
	}
	if _, err := Open(k, sealed[:len(sealed)-1]); !errors.Is(err, ErrTampered) {
		t.Fatalf("truncated: %v, want ErrTampered", err)
	}
	if _, err := Open(k, []byte("{}")); !errors.Is(err, ErrNotSealedTemplate) {
		t.Fatalf("garbage: %v, want ErrNotSealedTemplate", err)
	}
}

func TestSealValidates(t *testing.T) {
	k, _ := GenerateFleetKey()
	for name, mut := range map[string]func(*Template){
		"execution.idleAction": func(t *Template) { t.Execution.IdleAction = "park" },
		"execution.mode":       func(t *Template) { t.Execution.Mode = "sometimes" },
		"snapshotDigest":       func(t *Template) { t.SnapshotDigest = "latest" },
		"helper.port":          func(t *Template) { t.Helper.Port = 0 },
		"revision":             func(t *Template) { t.Revision = "" },
		"idleTimeoutSeconds":   func(t *Template) { t.Execution.IdleTimeoutSeconds = 0 },
	} {
		tpl := testTemplate()
		mut(&tpl)
		if _, err := Seal(k.Public(), tpl); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Seal error %v should name the field", name, err)
		}
	}
}
