package fibers_test

import (
	"context"
	"crypto/ed25519"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/trust/routercred"
)

func ok(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }

func startHome(t *testing.T, name string, pub ed25519.PublicKey) (*fakefiberd.Server, fibers.Home) {
	t.Helper()
	fd := fakefiberd.Start(name, pub, http.HandlerFunc(ok))
	fd.Tunnels.Store(true)
	t.Cleanup(fd.Close)
	return fd, fibers.Home{Endpoint: fd.Endpoint(), Name: name}
}

// everyCall mints a new credential on every call, as a Minter does once per
// half-life: each differs from the last (another validity).
type everyCall struct {
	key ed25519.PrivateKey
	n   atomic.Int64
}

func (e *everyCall) For(home string) (string, error) {
	return routercred.Mint(e.key, home, time.Now(), routercred.TTL+time.Duration(e.n.Add(1))*time.Second)
}

func (e *everyCall) Forget(string) {}

// Every call takes the credential current at that moment (client.Client
// keeps the token it was made with, so FiberdClient must not keep a client
// past its credential): acquire, proxied request, tunnel and release.
func TestEveryCallCarriesTheCurrentCredential(t *testing.T) {
	pub, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	fd, home := startHome(t, "h-home", pub)
	c := fibers.NewFiberdClient(&everyCall{key: key})
	ctx := context.Background()
	f, err := c.Acquire(ctx, home)
	if err != nil {
		t.Fatal(err)
	}
	if f.Home != home {
		t.Fatalf("fiber of %v, want %v", f.Home, home)
	}

	req, _ := http.NewRequest(http.MethodGet, "http://client.example/", nil)
	c.PrepareProxy(req, f)
	resp, err := http.DefaultClient.Do(req)
	expectOK(t, "proxied request", resp, err)

	req, _ = http.NewRequest(http.MethodGet, "http://client.example/", nil)
	c.PrepareTunnel(req, f)
	resp, err = c.TunnelTransport().RoundTrip(req)
	expectOK(t, "tunneled request", resp, err)

	if err := c.Release(ctx, f); err != nil {
		t.Fatal(err)
	}
	if n := len(fd.Credentials()); n != 4 || fd.Refused() != 0 {
		t.Fatalf("fiberd let in %d distinct credentials and refused %d, want a new one for each of 4 calls", n, fd.Refused())
	}
}

func expectOK(t *testing.T, what string, resp *http.Response, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("%s: %d %q", what, resp.StatusCode, b)
	}
}

// A Home that refuses the router's credential says what to check.
func TestRefusedCredentialNamesTheFix(t *testing.T) {
	pub, _, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	fd, home := startHome(t, "h-home", pub)
	_, err = fibers.NewFiberdClient(routercred.NewMinter(otherKey)).Acquire(context.Background(), home)
	if err == nil || !strings.Contains(err.Error(), "--router-key-file") || fd.Refused() != 1 {
		t.Fatalf("acquire with another installation's key: %v (refused %d)", err, fd.Refused())
	}
	if _, err := fibers.NewFiberdClient(routercred.NewMinter(otherKey)).Acquire(context.Background(), fibers.Home{Endpoint: fd.Endpoint()}); err == nil || !strings.Contains(err.Error(), "data.home") {
		t.Fatalf("acquire from a nameless Home: %v", err)
	}
}

// A Home's credential is forgotten with the last endpoint of that name (a
// Home Pod that moved keeps its name), and a forgotten Home can still have
// the fibers it holds released.
func TestForgetKeepsACredentialWhileItsNameIsInUse(t *testing.T) {
	pub, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	creds := &fakefiberd.RecordingCreds{Minter: routercred.NewMinter(key)}
	c := fibers.NewFiberdClient(creds)
	_, old := startHome(t, "h-home", pub)
	_, moved := startHome(t, "h-home", pub)
	ctx := context.Background()
	held, err := c.Acquire(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, moved); err != nil {
		t.Fatal(err)
	}
	c.Forget(old)
	if got := creds.Forgotten(); len(got) != 0 {
		t.Fatalf("forgot %v while another endpoint of h-home is in use", got)
	}
	c.Forget(moved)
	if got := creds.Forgotten(); !slices.Equal(got, []string{"h-home"}) {
		t.Fatalf("forgot %v, want h-home once its last endpoint went", got)
	}
	if err := c.Release(ctx, held); err != nil {
		t.Fatalf("releasing a fiber of a forgotten Home: %v", err)
	}
	// The release minted a credential but keeps nothing for the Home.
	if got := creds.Forgotten(); !slices.Equal(got, []string{"h-home", "h-home"}) {
		t.Fatalf("forgot %v: the release left the forgotten Home's credential cached", got)
	}
}
