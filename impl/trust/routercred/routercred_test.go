package routercred

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestMintVerify(t *testing.T) {
	pub, priv, _ := GenerateKey()
	now := time.Unix(1_800_000_000, 0)
	cred, err := Mint(priv, "hello-00001-0123456789", now, TTL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Verify([]ed25519.PublicKey{pub}, cred, "hello-00001-0123456789", now.Add(time.Minute))
	if err != nil || c.Audience != "hello-00001-0123456789" {
		t.Fatalf("Verify = %+v, %v", c, err)
	}
	other, _, _ := GenerateKey()
	// A rotation: previous and current keys both listed.
	if _, err := Verify([]ed25519.PublicKey{other, pub}, cred, "hello-00001-0123456789", now); err != nil {
		t.Fatalf("second key: %v", err)
	}
	for name, tc := range map[string]struct {
		keys []ed25519.PublicKey
		cred string
		home string
		at   time.Time
		want error
	}{
		"another Home":    {[]ed25519.PublicKey{pub}, cred, "bye-00001-9876543210", now, ErrWrongHome},
		"another key":     {[]ed25519.PublicKey{other}, cred, "hello-00001-0123456789", now, ErrBadSignature},
		"expired":         {[]ed25519.PublicKey{pub}, cred, "hello-00001-0123456789", now.Add(TTL), ErrExpired},
		"from the future": {[]ed25519.PublicKey{pub}, cred, "hello-00001-0123456789", now.Add(-2 * time.Minute), ErrExpired},
		"garbage":         {[]ed25519.PublicKey{pub}, "Bearer x", "hello-00001-0123456789", now, ErrMalformed},
		"tampered":        {[]ed25519.PublicKey{pub}, tamper(cred), "hello-00001-0123456789", now, ErrBadSignature},
	} {
		if _, err := Verify(tc.keys, tc.cred, tc.home, tc.at); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// A credential the router minted with a long life is refused anyway.
	long, _ := Mint(priv, "h", now, 48*time.Hour)
	if _, err := Verify([]ed25519.PublicKey{pub}, long, "h", now); !errors.Is(err, ErrExpired) {
		t.Errorf("48h credential: %v", err)
	}
	// The audience cannot be swapped without the signature failing.
	forged := strings.Replace(cred, cred[len(prefix):len(prefix)+8], "AAAAAAAA", 1)
	if _, err := Verify([]ed25519.PublicKey{pub}, forged, "hello-00001-0123456789", now); err == nil {
		t.Error("altered payload verified")
	}
}

func TestMinterCaches(t *testing.T) {
	_, priv, _ := GenerateKey()
	m := NewMinter(priv)
	now := time.Unix(1_800_000_000, 0)
	m.now = func() time.Time { return now }
	a, _ := m.For("a")
	b, _ := m.For("b")
	if a == b {
		t.Fatal("two Homes got the same credential")
	}
	if again, _ := m.For("a"); again != a {
		t.Fatal("not cached")
	}
	now = now.Add(TTL/2 + time.Second)
	if again, _ := m.For("a"); again == a {
		t.Fatal("not re-minted at half-life")
	}
}

func TestKeysRoundTrip(t *testing.T) {
	pub, priv, _ := GenerateKey()
	pp, _ := MarshalPrivateKey(priv)
	back, err := ParsePrivateKey(pp)
	if err != nil || !back.Equal(priv) {
		t.Fatalf("private: %v", err)
	}
	pub2, _, _ := GenerateKey()
	a, _ := MarshalPublicKey(pub)
	b, _ := MarshalPublicKey(pub2)
	keys, err := ParsePublicKeys(bytes.Join([][]byte{a, b}, nil))
	if err != nil || len(keys) != 2 || !keys[0].Equal(pub) || !keys[1].Equal(pub2) {
		t.Fatalf("public keys: %v %v", keys, err)
	}
	if _, err := ParsePublicKeys([]byte("nothing")); err == nil {
		t.Fatal("no PEM accepted")
	}
}

// tamper changes one character in the middle of the signature.
func tamper(cred string) string {
	i := len(cred) - 20
	c := byte('A')
	if cred[i] == 'A' {
		c = 'B'
	}
	return cred[:i] + string(c) + cred[i+1:]
}
