package signedgrant

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func claims(now time.Time) Claims {
	return Claims{GrantID: "g1", Home: "hello-00001-0123456789", Namespace: "default", Revision: "hello-00001", Helper: Helper{Port: 8080}, MemoryPerFiberBytes: 1 << 27, MaxFibers: 3,
		Execution: Execution{Mode: "fresh"}, IssuedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
}

func TestSignVerify(t *testing.T) {
	pub, priv, _ := GenerateKey()
	now := time.Now()
	b, err := Sign(priv, claims(now))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Verify(pub, b, now)
	if err != nil || got.GrantID != "g1" || got.MaxFibers != 3 {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if _, err := Verify(pub, b, now.Add(11*time.Minute)); !errors.Is(err, ErrExpired) {
		t.Fatalf("after expiry: %v", err)
	}
	other, _, _ := GenerateKey()
	if _, err := Verify(other, b, now); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other key: %v", err)
	}
	// Raising maxFibers in the payload breaks the signature.
	tampered := strings.Replace(string(b), "\"payload\":\"", "\"payload\":\"X", 1)
	if _, err := Verify(pub, []byte(tampered), now); err == nil {
		t.Fatal("tampered grant verified")
	}
	// Keys survive PEM.
	pp, _ := MarshalPrivateKey(priv)
	pk, _ := MarshalPublicKey(pub)
	priv2, err := ParsePrivateKey(pp)
	if err != nil {
		t.Fatal(err)
	}
	pub2, err := ParsePublicKey(pk)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := Sign(priv2, claims(now))
	if _, err := Verify(pub2, b2, now); err != nil {
		t.Fatal(err)
	}
}

func TestSignRejectsInvalidClaims(t *testing.T) {
	_, priv, _ := GenerateKey()
	c := claims(time.Now())
	c.Execution = Execution{Mode: "reuse"}
	if _, err := Sign(priv, c); err == nil || !strings.Contains(err.Error(), "idleTimeoutSeconds") {
		t.Fatalf("reuse without idle timeout: %v", err)
	}
	c = claims(time.Now())
	c.MaxFibers = 0
	if _, err := Sign(priv, c); err == nil || !strings.Contains(err.Error(), "maxFibers") {
		t.Fatalf("maxFibers 0: %v", err)
	}
	c = claims(time.Now())
	c.HomeKeySHA256 = "not-a-fingerprint"
	if _, err := Sign(priv, c); err == nil || !strings.Contains(err.Error(), "homeKeySHA256") {
		t.Fatalf("malformed homeKeySHA256: %v", err)
	}
}
