package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
)

func TestGrantExpiryRenewalAndForgery(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{MaxFibers: 4})
	ctx := context.Background()

	// Renewal lowering maxFibers applies without a reload.
	c := inst.Claims
	c.GrantID, c.MaxFibers, c.IssuedAt, c.ExpiresAt = "grant-2", 1, time.Now(), time.Now().Add(time.Hour)
	inst.WriteGrant(t, c)
	g, err := inst.Client.Grant(ctx)
	if err != nil || g.GrantID != "grant-2" || g.MaxFibers != 1 {
		t.Fatalf("renewed grant: %+v %v", g, err)
	}
	if _, err := inst.Client.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := inst.Client.Acquire(ctx); !client.IsMaxFibers(err) {
		t.Fatalf("second acquire under maxFibers 1: %v, want 429", err)
	}

	// An expired grant stops acquisition.
	c.GrantID, c.IssuedAt, c.ExpiresAt = "grant-3", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Second)
	inst.WriteGrant(t, c)
	if _, err := inst.Client.Acquire(ctx); !client.IsUnavailable(err) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("acquire under an expired grant: %v, want 503 naming the expiry", err)
	}

	// A grant signed by anyone but the grant controller is refused.
	_, forger, _ := signedgrant.GenerateKey()
	c.GrantID, c.IssuedAt, c.ExpiresAt = "forged", time.Now(), time.Now().Add(time.Hour)
	b, _ := signedgrant.Sign(forger, c)
	inst.WriteRawGrant(t, b)
	if _, err := inst.Client.Acquire(ctx); !client.IsUnavailable(err) || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("acquire under a forged grant: %v, want 503 naming the signature", err)
	}
}
