package server_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// TestSpareHomeTakesAPushedGrant: a spare Home (fiberd started with no
// grant) takes the grant the grant controller pushes and answers ready
// once its pool is warm, so a claimed spare serves without waiting for its
// Secret volume. It takes only a grant signed with the grant key and
// naming its own key, never a second Revision's, and never goes back to an
// older grant; a newer grant file wins over the pushed grant.
func TestSpareHomeTakesAPushedGrant(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "spare-00001", HomeKey: key, Spare: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var e *client.Error
	if err := inst.Client.Ready(ctx); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("a spare before its grant: %v, want 503", err)
	}
	sign := func(k ed25519.PrivateKey, c signedgrant.Claims) []byte {
		b, err := signedgrant.Sign(k, c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	refused := func(name string, raw []byte, status int) {
		t.Helper()
		_, err := inst.Client.PushGrant(ctx, raw)
		if !errors.As(err, &e) || e.Status != status {
			t.Fatalf("%s: %v, want %d", name, err, status)
		}
	}
	// Signed by anyone but the grant key: refused.
	_, otherGrantKey, _ := signedgrant.GenerateKey()
	refused("a grant signed by another key", sign(otherGrantKey, inst.Claims), http.StatusForbidden)
	// Issued to another Home's key: refused.
	_, otherHome, _ := ed25519.GenerateKey(nil)
	c := inst.Claims
	c.HomeKeySHA256 = homekey.Fingerprint(otherHome.Public().(ed25519.PublicKey))
	refused("a grant for another Home's key", sign(inst.GrantKey, c), http.StatusForbidden)
	if err := inst.Client.Ready(ctx); err == nil {
		t.Fatal("ready after refused grants")
	}

	start := time.Now()
	r, err := inst.Client.PushGrant(ctx, sign(inst.GrantKey, inst.Claims))
	if err != nil || !r.Ready {
		t.Fatalf("pushing the Home's grant: %+v, %v", r, err)
	}
	t.Logf("spare ready %s after the push", time.Since(start).Round(time.Millisecond))
	f, err := inst.Client.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := get(t, inst.Client, f.ID, "/"); resp.StatusCode != 200 {
		t.Fatalf("a claimed spare's fiber: %d %s", resp.StatusCode, body)
	}

	// Another Revision (of this namespace or any other): refused, the
	// Home keeps serving its own.
	other := inst.Claims
	other.Revision, other.GrantID = "other-00001", "grant-other"
	refused("a second Revision's grant", sign(inst.GrantKey, other), http.StatusConflict)

	// An older grant of the same Revision arrives late: the newer stays.
	newer := inst.Claims
	newer.GrantID, newer.IssuedAt = "grant-newer", time.Now()
	if _, err := inst.Client.PushGrant(ctx, sign(inst.GrantKey, newer)); err != nil {
		t.Fatal(err)
	}
	older := inst.Claims
	older.GrantID, older.IssuedAt = "grant-older", time.Now().Add(-time.Minute)
	if _, err := inst.Client.PushGrant(ctx, sign(inst.GrantKey, older)); err != nil {
		t.Fatal(err)
	}
	if g, err := inst.Client.Grant(ctx); err != nil || g.GrantID != "grant-newer" {
		t.Fatalf("after a late older push: %+v %v, want grant-newer", g, err)
	}
	// The Secret volume catches up with a renewal: the newer file wins.
	renewed := inst.Claims
	renewed.GrantID, renewed.IssuedAt = "grant-renewed", time.Now().Add(time.Second)
	inst.WriteGrant(t, renewed)
	if g, err := inst.Client.Grant(ctx); err != nil || g.GrantID != "grant-renewed" {
		t.Fatalf("after a newer grant file: %+v %v, want grant-renewed", g, err)
	}
	if err := inst.Client.Ready(ctx); err != nil {
		t.Fatalf("ready after the renewal: %v", err)
	}
}
