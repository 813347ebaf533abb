package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/signedgrant"
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

func TestMaxRequestSecondsAndMetrics(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{MaxRequestSeconds: 1})
	ctx := context.Background()
	f, err := inst.Client.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	resp, body := get(t, inst.Client, f.ID, "/sleep?ms=5000")
	if resp.StatusCode != http.StatusGatewayTimeout || time.Since(t0) > 3*time.Second {
		t.Fatalf("request beyond maxRequestSeconds 1: %d %s after %s, want 504 after ~1s", resp.StatusCode, body, time.Since(t0))
	}

	req, _ := http.NewRequest(http.MethodGet, "http://"+inst.Endpoint+client.MetricsPath, nil)
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without the token: %v %v, want 401", r, err)
	}
	req.Header.Set("Authorization", "Bearer "+inst.Token)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, m := range []string{`fiberd_acquire_seconds_count{source="warm"}`, "fiberd_fiber_start_seconds", "fiberd_grant_valid 1", "fiberd_proxied_requests_total 1"} {
		if !strings.Contains(string(b), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}
