package server_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"strings"
	"testing"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/homekey"
)

// TestHomeKeyTLS: with a Home key, fiberd serves its API (calls, proxied
// requests, tunnels) over TLS with that key only, and a caller that wants
// another key completes no handshake, so it sends no credential
// (docs/security.md §3, "Home authentication").
func TestHomeKeyTLS(t *testing.T) {
	keyA, _ := homekey.Generate()
	keyB, _ := homekey.Generate()
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "tls-00001", Mode: "reuse", HomeKey: keyA})
	ctx := context.Background()

	f, err := inst.Client.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire over TLS with the Home's key: %v", err)
	}
	if resp, body := get(t, inst.Client, f.ID, "/"); resp.StatusCode != 200 {
		t.Fatalf("proxied request over TLS: %d %s", resp.StatusCode, body)
	}
	conn, err := inst.Client.Tunnel(ctx, f.ID)
	if err != nil {
		t.Fatalf("tunnel over TLS: %v", err)
	}
	conn.Close()

	wrong, err := client.NewTLS(inst.Endpoint, inst.Token, homekey.Fingerprint(keyB.Public().(ed25519.PublicKey)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Acquire(ctx); !errors.Is(err, homekey.ErrWrongKey) {
		t.Fatalf("acquire wanting key B from a Home with key A: %v, want ErrWrongKey", err)
	}
	if _, err := wrong.Tunnel(ctx, f.ID); !errors.Is(err, homekey.ErrWrongKey) {
		t.Fatalf("tunnel wanting key B: %v, want ErrWrongKey", err)
	}
	if plain, _ := client.New(inst.Endpoint, inst.Token); plain.Ready(ctx) == nil {
		t.Fatal("fiberd with a Home key answered plain HTTP")
	}
	// Nothing reached fiberd's HTTP layer from the refused callers.
	if n := inst.Metric(t, "fiberd_refused_credentials_total"); n != 0 {
		t.Fatalf("fiberd refused %v credentials: a caller that wanted another key sent one", n)
	}

	// A grant naming another key than fiberd serves with is not used:
	// fiberd never reports ready under a key its grant does not bind.
	c := inst.Claims
	c.HomeKeySHA256 = homekey.Fingerprint(keyB.Public().(ed25519.PublicKey))
	inst.WriteGrant(t, c)
	err = inst.Client.Ready(ctx)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "home key") {
		t.Fatalf("readyz with a grant for key B: %v, want 503 naming the home key", err)
	}
}
