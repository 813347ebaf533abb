package proxy_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract/routermeta"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/trust/routercred"
)

// twoHomes is one installation (one router key) with two Homes and a router
// in front of them.
type twoHomes struct {
	pub    ed25519.PublicKey
	a, b   *fakefiberd.Server
	router *proxy.Router
	table  *revision.Table
	front  *httptest.Server
}

func startTwoHomes(t *testing.T, creds fibers.Credentials, pub ed25519.PublicKey) *twoHomes {
	t.Helper()
	h := &twoHomes{pub: pub}
	h.a = fakefiberd.Start("a-home", pub, http.HandlerFunc(ok))
	h.b = fakefiberd.Start("b-home", pub, http.HandlerFunc(ok))
	for _, fd := range []*fakefiberd.Server{h.a, h.b} {
		fd.Tunnels.Store(true)
		t.Cleanup(fd.Close)
	}
	h.router = proxy.New(proxy.DefaultConfig(), fibers.NewFiberdClient(creds), metrics.New(), nil)
	h.table = revision.NewTable(h.router)
	h.front = httptest.NewServer(h.router)
	t.Cleanup(h.front.Close)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.router.Drain(ctx)
	})
	return h
}

// revisionAt is the metadata of Revision demo/rev served by the Home at
// at's endpoint (and with its key), named home.
func revisionAt(rev, mode string, at *fakefiberd.Server, home string) routermeta.Metadata {
	return routermeta.Metadata{
		Revision: rev, Namespace: "demo", Ready: true, HomeEndpoint: at.Endpoint(), HomeKeySHA256: at.KeySHA256, Home: home,
		MaxFibers: 5, TimeoutSeconds: 30, Mode: mode, IdleTimeoutSeconds: 30, Protocol: routermeta.ProtocolHTTP1, Generation: 1,
	}
}

func (h *twoHomes) get(t *testing.T, rev string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.front.URL+"/", nil)
	req.Header.Set(proxy.NamespaceHeader, "demo")
	req.Header.Set(proxy.RevisionHeader, rev)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Each Home lets in only credentials minted for it (as fiberd does), so
// every answer here proves the router sent that Home's own credential: on
// acquire and release, on proxied requests (fresh) and tunnels (reuse). And
// nothing either Home saw would let it into the other.
func TestEachHomeGetsOnlyItsOwnCredential(t *testing.T) {
	for _, mode := range []string{"fresh", "reuse"} {
		t.Run(mode, func(t *testing.T) {
			pub, minter := routerKey(t)
			h := startTwoHomes(t, minter, pub)
			h.table.Upsert(revisionAt("a-00001", mode, h.a, h.a.Home))
			h.table.Upsert(revisionAt("b-00001", mode, h.b, h.b.Home))
			for i := 0; i < 3; i++ {
				for _, rev := range []string{"a-00001", "b-00001"} {
					if code, body := h.get(t, rev); code != 200 || body != "ok" {
						t.Fatalf("request %d to %s: %d %q", i, rev, code, body)
					}
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := h.router.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct{ fd, other *fakefiberd.Server }{{h.a, h.b}, {h.b, h.a}} {
				acquired, released := c.fd.Counts()
				if c.fd.Refused() != 0 || acquired == 0 || released != acquired || c.fd.Live() != 0 {
					t.Errorf("%s: %d refused, %d acquired, %d released, %d live", c.fd.Home, c.fd.Refused(), acquired, released, c.fd.Live())
				}
				if mode == "reuse" && c.fd.TunnelsOpened() == 0 {
					t.Errorf("%s: no tunnel opened in reuse mode", c.fd.Home)
				}
				for _, cred := range c.fd.Credentials() {
					if _, err := routercred.Verify([]ed25519.PublicKey{pub}, cred, c.other.Home, time.Now()); !errors.Is(err, routercred.ErrWrongHome) {
						t.Errorf("a credential %s saw works on %s: %v", c.fd.Home, c.other.Home, err)
					}
				}
			}
		})
	}
}

// Metadata that pairs one Home's endpoint with another Home's name earns a
// credential the Home refuses: the router sends what the metadata names, and
// a Home takes only its own.
func TestCredentialForAnotherHomeIsRefused(t *testing.T) {
	pub, minter := routerKey(t)
	h := startTwoHomes(t, minter, pub)
	h.table.Upsert(revisionAt("x-00001", "fresh", h.a, h.b.Home))
	if code, body := h.get(t, "x-00001"); code != http.StatusBadGateway {
		t.Fatalf("%d %q, want 502", code, body)
	}
	if h.a.Refused() == 0 {
		t.Fatal("the Home was not even asked")
	}
	if acquired, _ := h.a.Counts(); acquired != 0 {
		t.Fatalf("%d fibers acquired with another Home's credential", acquired)
	}
}

// The router keeps a Home's client and credential while some Revision names
// the Home, and drops them when the last one stops naming it.
func TestRouterForgetsHomesNoRevisionUses(t *testing.T) {
	pub, minter := routerKey(t)
	creds := &fakefiberd.RecordingCreds{Minter: minter}
	h := startTwoHomes(t, creds, pub)
	r1 := revisionAt("r1-00001", "fresh", h.a, h.a.Home)
	r2 := revisionAt("r2-00001", "fresh", h.a, h.a.Home)
	h.table.Upsert(r1)
	h.table.Upsert(r2)
	for _, rev := range []string{"r1-00001", "r2-00001"} {
		if code, _ := h.get(t, rev); code != 200 {
			t.Fatalf("%s: %d", rev, code)
		}
	}
	expect := func(when string, want ...string) {
		t.Helper()
		if got := creds.Forgotten(); !slices.Equal(got, want) {
			t.Fatalf("%s: forgot %v, want %v", when, got, want)
		}
	}
	// r1's Home is replaced; r2 still uses the old one.
	r1.HomeEndpoint, r1.HomeKeySHA256, r1.Home = h.b.Endpoint(), h.b.KeySHA256, h.b.Home
	h.table.Upsert(r1)
	if code, _ := h.get(t, "r1-00001"); code != 200 {
		t.Fatalf("r1 on its new Home: %d", code)
	}
	expect("a Home still named by r2")
	h.table.Delete(revision.Key{Namespace: "demo", Name: "r2-00001"})
	expect("the last Revision on a-home deleted", h.a.Home)
	// Not ready, but still naming its Home: kept.
	r1.Ready = false
	h.table.Upsert(r1)
	expect("r1 not ready", h.a.Home)
	h.table.Delete(revision.Key{Namespace: "demo", Name: "r1-00001"})
	expect("every Revision deleted", h.a.Home, h.b.Home)
	if h.a.Refused()+h.b.Refused() != 0 {
		t.Fatal("a credential was refused")
	}
}
