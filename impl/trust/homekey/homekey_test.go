package homekey_test

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/trust/homekey"
)

// handshake runs a TLS handshake between a server holding key and a client
// that wants fingerprint want; it returns the client's error.
func handshake(t *testing.T, key ed25519.PrivateKey, want string) error {
	t.Helper()
	cert, err := homekey.Certificate(key, "h-home")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := homekey.ClientConfig(want, "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, homekey.ServerConfig(func() (*tls.Certificate, error) { return &cert, nil }))
	go srv.Handshake()
	return tls.Client(b, cc).Handshake()
}

func TestOnlyTheNamedKeyCompletesAHandshake(t *testing.T) {
	a, err := homekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, err := homekey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	fpA := homekey.Fingerprint(a.Public().(ed25519.PublicKey))
	if err := homekey.CheckFingerprint(fpA); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, a, fpA); err != nil {
		t.Fatalf("key A, fingerprint A: %v", err)
	}
	err = handshake(t, b, fpA)
	if !errors.Is(err, homekey.ErrWrongKey) {
		t.Fatalf("key B, fingerprint A: %v, want ErrWrongKey", err)
	}
}

func TestFingerprintIsOfTheSPKIAndChecked(t *testing.T) {
	k, _ := homekey.Generate()
	pemKey, err := homekey.MarshalPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	back, err := homekey.ParsePrivateKey(pemKey)
	if err != nil || !back.Equal(k) {
		t.Fatalf("PEM round trip: %v", err)
	}
	cert, _ := homekey.Certificate(k, "h")
	fp := homekey.Fingerprint(k.Public().(ed25519.PublicKey))
	if err := homekey.Verify([]*x509.Certificate{cert.Leaf}, fp); err != nil {
		t.Fatalf("the certificate of key K does not carry K: %v", err)
	}
	if err := homekey.Verify(nil, fp); err == nil {
		t.Fatal("an empty chain verified")
	}
	for _, bad := range []string{"", "abc", strings.Repeat("A", 64), strings.Repeat("g", 64)} {
		if _, err := homekey.ClientConfig(bad); err == nil {
			t.Errorf("ClientConfig(%q) accepted a malformed fingerprint", bad)
		}
	}
}

// BenchmarkHandshake is the cost of one TLS 1.3 handshake with a Home key
// (both sides, over an in-memory pipe): what a new connection from
// fiber-router to a Home costs in CPU.
func BenchmarkHandshake(b *testing.B) {
	key, _ := homekey.Generate()
	fp := homekey.Fingerprint(key.Public().(ed25519.PublicKey))
	cert, _ := homekey.Certificate(key, "h")
	sc := homekey.ServerConfig(func() (*tls.Certificate, error) { return &cert, nil })
	cc, _ := homekey.ClientConfig(fp, "http/1.1")
	for b.Loop() {
		a, c := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- tls.Server(a, sc).Handshake() }()
		if err := tls.Client(c, cc).Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		a.Close()
		c.Close()
	}
}
