package fibers_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/internal/fakefiberd"
	"lampyr.dev/serving/impl/trust/homekey"
	"lampyr.dev/serving/impl/trust/routercred"
)

func ok(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }

func startHome(t *testing.T, name string, pub ed25519.PublicKey) (*fakefiberd.Server, fibers.Home) {
	t.Helper()
	fd := fakefiberd.Start(name, pub, http.HandlerFunc(ok))
	fd.Tunnels.Store(true)
	t.Cleanup(fd.Close)
	return fd, fibers.Home{Endpoint: fd.Endpoint(), Name: name, KeySHA256: fd.KeySHA256}
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
	rt, err := c.ProxyTransport(f, false)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
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
	if _, err := fibers.NewFiberdClient(routercred.NewMinter(otherKey)).Acquire(context.Background(), fibers.Home{Endpoint: fd.Endpoint(), KeySHA256: fd.KeySHA256}); err == nil || !strings.Contains(err.Error(), "data.home") {
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

// The router accepts only the Home whose key its metadata names (issue 31
// §5): whatever else answers at a Home's address (here: the Home's port
// taken over, after the router leased a fiber there, by a server holding
// another key) completes no TLS handshake and is sent no credential and no
// request, on every path: acquire, proxied request, tunnel, release.
func TestRouterRefusesAHomeWithAnotherKey(t *testing.T) {
	pub, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keyA, _ := homekey.Generate()
	keyB, _ := homekey.Generate()
	c := fibers.NewFiberdClient(routercred.NewMinter(key))
	ctx := context.Background()

	// Metadata naming key B for a Home holding key A: refused at once.
	a := fakefiberd.StartWithKey("h-home", pub, http.HandlerFunc(ok), keyA)
	a.Tunnels.Store(true)
	t.Cleanup(a.Close)
	namesB := fibers.Home{Endpoint: a.Endpoint(), Name: "h-home", KeySHA256: homekey.Fingerprint(keyB.Public().(ed25519.PublicKey))}
	_, err = c.Acquire(ctx, namesB)
	if !errors.Is(err, homekey.ErrWrongKey) || !strings.Contains(err.Error(), "sent no credential") {
		t.Fatalf("acquire from a Home with key A, metadata naming key B: %v", err)
	}
	if n := len(a.Credentials()); n != 0 || a.Refused() != 0 {
		t.Fatalf("the Home with the wrong key was sent %d credentials (%d refused)", n, a.Refused())
	}
	// Matching: works.
	home := fibers.Home{Endpoint: a.Endpoint(), Name: "h-home", KeySHA256: a.KeySHA256}
	f, err := c.Acquire(ctx, home)
	if err != nil {
		t.Fatalf("acquire from the Home its metadata names: %v", err)
	}
	reuse, err := c.Acquire(ctx, home)
	if err != nil {
		t.Fatal(err)
	}

	// The Home's address captured by a server with another key.
	addr := a.Endpoint()
	a.Close()
	impostor := fakefiberd.StartAt(addr, "h-home", pub, http.HandlerFunc(ok), keyB)
	impostor.Tunnels.Store(true)
	t.Cleanup(impostor.Close)

	req, _ := http.NewRequest(http.MethodGet, "http://client.example/", nil)
	req.Header.Set("Authorization", "Bearer the client's own")
	c.PrepareProxy(req, f)
	rt, err := c.ProxyTransport(f, false)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := rt.RoundTrip(req); !errors.Is(err, homekey.ErrWrongKey) {
		if resp != nil {
			resp.Body.Close()
		}
		t.Fatalf("proxied request to the captured address: %v, want ErrWrongKey", err)
	}
	treq, _ := http.NewRequest(http.MethodGet, "http://client.example/", nil)
	c.PrepareTunnel(treq, reuse)
	if resp, err := c.TunnelTransport().RoundTrip(treq); !errors.Is(err, homekey.ErrWrongKey) {
		if resp != nil {
			resp.Body.Close()
		}
		t.Fatalf("tunnel to the captured address: %v, want ErrWrongKey", err)
	}
	if err := c.Release(ctx, f); !errors.Is(err, homekey.ErrWrongKey) {
		t.Fatalf("release at the captured address: %v, want ErrWrongKey", err)
	}
	if _, err := c.Acquire(ctx, home); !errors.Is(err, homekey.ErrWrongKey) {
		t.Fatalf("acquire at the captured address: %v, want ErrWrongKey", err)
	}
	if n := len(impostor.Credentials()); n != 0 || impostor.Refused() != 0 || impostor.LastProxied() != nil {
		t.Fatalf("the captured address got %d credentials, %d refused, a request %v", n, impostor.Refused(), impostor.LastProxied())
	}
}

// A Home whose metadata names no key (a Home of a version before Home
// keys) is refused and sent nothing, unless the router is told to dial it
// in clear (--allow-unauthenticated-homes, during an upgrade).
func TestUnauthenticatedHomesOnlyWhenAllowed(t *testing.T) {
	pub, key, err := routercred.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	old := fakefiberd.StartPlain("h-home", pub, http.HandlerFunc(ok))
	t.Cleanup(old.Close)
	home := fibers.Home{Endpoint: old.Endpoint(), Name: "h-home"}
	ctx := context.Background()

	c := fibers.NewFiberdClient(routercred.NewMinter(key))
	_, err = c.Acquire(ctx, home)
	var ue *fibers.UnavailableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--allow-unauthenticated-homes") {
		t.Fatalf("acquire from a Home without a key: %v, want 503-kind refusal naming the flag", err)
	}
	if acquired, _ := old.Counts(); acquired != 0 || len(old.Credentials()) != 0 || old.Refused() != 0 {
		t.Fatalf("the unauthenticated Home was called (acquired %d, %d credentials)", acquired, len(old.Credentials()))
	}

	c = fibers.NewFiberdClient(routercred.NewMinter(key))
	c.AllowUnauthenticatedHomes = true
	f, err := c.Acquire(ctx, home)
	if err != nil {
		t.Fatalf("acquire in clear when allowed: %v", err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://client.example/", nil)
	c.PrepareProxy(req, f)
	rt, err := c.ProxyTransport(f, false)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	expectOK(t, "proxied request in clear", resp, err)
	if err := c.Release(ctx, f); err != nil {
		t.Fatal(err)
	}
}
