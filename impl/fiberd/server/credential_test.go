package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/routercred"
)

// TestCredentialsAreForOneHome: a Home accepts only credentials fiber-router
// minted for it (docs/security.md §3). A credential of another Home, one
// signed by another key and an expired one are refused with 401 on the API
// and on proxied requests, and counted.
func TestCredentialsAreForOneHome(t *testing.T) {
	a := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "a-00001"})
	// One installation: both Homes trust the same router key.
	b := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "b-00001", RouterKey: a.RouterKey})
	ctx := context.Background()

	// B's own credential, which a tenant who somehow read it would hold.
	if _, err := b.Client.Acquire(ctx); err != nil {
		t.Fatalf("B with its own credential: %v", err)
	}
	_, otherKey, _ := routercred.GenerateKey()
	forged, _ := routercred.Mint(otherKey, a.Home, time.Now(), time.Minute)
	expired, _ := routercred.Mint(a.RouterKey, a.Home, time.Now().Add(-time.Hour), 10*time.Minute)
	f, err := a.Client.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ cred, want string }{
		"B's credential on A":       {b.Token, "another Home"},
		"signed by another key":     {forged, "signature"},
		"expired":                   {expired, "expired"},
		"a shared token (old kind)": {"0123456789abcdef", "not a router credential"},
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := client.New(a.Endpoint, tc.cred)
			_, err := c.Acquire(ctx)
			var e *client.Error
			if !errors.As(err, &e) || e.Status != http.StatusUnauthorized || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("acquire: %v, want 401 saying %q", err, tc.want)
			}
			if _, err := c.List(ctx); !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
				t.Fatalf("list: %v, want 401", err)
			}
			resp, err := c.Do(mustReq(t, "/"), f.ID)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("proxied request into A's fiber: %d, want 401", resp.StatusCode)
			}
			if _, err := c.Tunnel(ctx, f.ID); !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
				t.Fatalf("tunnel: %v, want 401", err)
			}
		})
	}
	if n := a.Metric(t, "fiberd_refused_credentials_total"); n < 16 {
		t.Fatalf("fiberd_refused_credentials_total = %v, want >= 16", n)
	}
	// The fiber the refused calls aimed at still serves its one request.
	if resp, body := get(t, a.Client, f.ID, "/"); resp.StatusCode != 200 {
		t.Fatalf("A's fiber after refused calls: %d %s", resp.StatusCode, body)
	}
}

// TestGrantPortIsThePORT: the port the grant names (the Revision's
// containerPort) is the handler's PORT and the one fiberd dials, whatever
// port the snapshot's build declared (Knative's runtime contract).
func TestGrantPortIsThePORT(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	ctx := context.Background()
	c := inst.Claims
	c.Helper.Port = 8801
	c.GrantID = "grant-port"
	c.IssuedAt = time.Now()
	inst.WriteGrant(t, c)
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err := inst.Client.Acquire(ctx)
		if err == nil {
			resp, body := get(t, inst.Client, f.ID, "/")
			inst.Client.Release(ctx, f.ID)
			var h struct{ Port string }
			if resp.StatusCode != 200 || json.Unmarshal(body, &h) != nil || h.Port != "8801" {
				t.Fatalf("handler under a grant naming port 8801: %d %s; want PORT=8801", resp.StatusCode, body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire under a grant naming port 8801: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
