package proxy

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lampyr.dev/serving/impl/trust/signedgrant"
)

func signed(t *testing.T, key ed25519.PrivateKey, namespace string, expires time.Time) []byte {
	t.Helper()
	b, err := signedgrant.Sign(key, signedgrant.Claims{
		GrantID: "g-1", Home: "hello-00001-0123456789", Namespace: namespace, Revision: "hello-00001",
		Helper: signedgrant.Helper{Port: 8080}, MemoryPerFiberBytes: 64 << 20, MaxFibers: 1,
		Execution: signedgrant.Execution{Mode: "fresh"},
		IssuedAt:  expires.Add(-10 * time.Minute), ExpiresAt: expires,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// echo is a destination: it greets first (a server-speaks-first protocol,
// so bytes arrive right behind the CONNECT answer), then echoes.
func echo(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hello\n"))
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// startProxy runs a Server for namespace "tenant". The destination is on
// loopback, which the proxy refuses; dialled is the address the test's
// Dial maps every destination to.
func startProxy(t *testing.T, pub ed25519.PublicKey, dialled netip.AddrPort, maxTunnels int) string {
	t.Helper()
	s := &Server{
		Key: pub, Namespace: "tenant", MaxTunnels: maxTunnels,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == "10.96.9.9:1" {
				return nil, errors.New("dial tcp 10.96.9.9:1: connection refused")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, dialled.String())
		},
		Logf: t.Logf,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close(); s.Close() })
	return ln.Addr().String()
}

func TestProxy(t *testing.T) {
	pub, key, _ := signedgrant.GenerateKey()
	_, otherKey, _ := signedgrant.GenerateKey()
	dst := echo(t)
	proxy := startProxy(t, pub, dst, 1)
	svc := netip.MustParseAddrPort("10.96.12.7:80")
	now := time.Now()

	good := signed(t, key, "tenant", now.Add(5*time.Minute))
	for _, tc := range []struct {
		name   string
		grant  []byte
		target netip.AddrPort
		status int
	}{
		{"another namespace's grant", signed(t, key, "other", now.Add(5*time.Minute)), svc, http.StatusForbidden},
		{"expired grant", signed(t, key, "tenant", now.Add(-time.Second)), svc, http.StatusProxyAuthRequired},
		{"grant signed by another key", signed(t, otherKey, "tenant", now.Add(5*time.Minute)), svc, http.StatusProxyAuthRequired},
		{"no grant", nil, svc, http.StatusProxyAuthRequired},
		{"loopback target", good, netip.MustParseAddrPort("127.0.0.1:9090"), http.StatusForbidden},
		{"link-local target", good, netip.MustParseAddrPort("169.254.169.254:80"), http.StatusForbidden},
		{"refused destination", good, netip.MustParseAddrPort("10.96.9.9:1"), http.StatusBadGateway},
	} {
		_, err := Dial(context.Background(), proxy, tc.target, tc.grant)
		var pe *Error
		if !errors.As(err, &pe) || pe.Status != tc.status {
			t.Errorf("%s: %v, want status %d", tc.name, err, tc.status)
			continue
		}
		if strings.Contains(pe.Message, "10.96.9.9") || strings.Contains(pe.Message, dst.String()) {
			t.Errorf("%s: the refusal names an address: %q", tc.name, pe.Message)
		}
	}

	// The good grant tunnels, greeting first and then echoing; read the
	// way fiberd's splice does (io.Copy), which must not skip a greeting
	// that arrived with the CONNECT answer.
	c, err := Dial(context.Background(), proxy, svc, good)
	if err != nil {
		t.Fatal(err)
	}
	// One tunnel at most (MaxTunnels 1): the second is refused, not queued.
	if _, err := Dial(context.Background(), proxy, svc, good); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("a tunnel past the bound: %v, want 503", err)
	}
	c.Write([]byte("ping"))
	c.(interface{ CloseWrite() error }).CloseWrite()
	var got strings.Builder
	if _, err := io.Copy(&got, c); err != nil || got.String() != "hello\nping" {
		t.Fatalf("through the tunnel: %q %v", got.String(), err)
	}
	c.Close()

	// Anything but CONNECT and the health check is refused.
	resp, err := http.Get("http://" + proxy + HealthPath)
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("health: %v %v", resp, err)
	}
	resp, err = http.Get("http://" + proxy + "/http://10.96.12.7/")
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET through the proxy: %v %v", resp, err)
	}
	// A name is not a target: fiberd resolves and checks names.
	conn, _ := net.Dial("tcp", proxy)
	io.WriteString(conn, "CONNECT kube-dns.kube-system.svc.cluster.local:53 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer "+base64.StdEncoding.EncodeToString(good)+"\r\n\r\n")
	line := make([]byte, 12)
	io.ReadFull(conn, line)
	conn.Close()
	if string(line) != "HTTP/1.1 400" {
		t.Errorf("CONNECT by name: %q, want 400", line)
	}
}

func TestEndpoints(t *testing.T) {
	var asks, fail atomic.Int32
	var gotAuth atomic.Value
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asks.Add(1)
		gotAuth.Store(r.Header.Get("Authorization"))
		if r.Method != http.MethodPost || r.URL.Path != EgressPath {
			http.Error(w, "wrong", 400)
			return
		}
		if fail.Load() > 0 {
			http.Error(w, "egress Pod not ready", http.StatusServiceUnavailable)
			return
		}
		time.Sleep(50 * time.Millisecond) // concurrent callers share this ask
		json.NewEncoder(w).Encode(EgressResponse{Endpoint: "10.244.1.7:3128"})
	}))
	defer api.Close()
	e := &Endpoints{API: api.URL, Grant: func() ([]byte, error) { return []byte("grant"), nil }}

	done := make(chan string, 8)
	for range 8 {
		go func() {
			ep, err := e.Endpoint(context.Background())
			if err != nil {
				t.Error(err)
			}
			done <- ep
		}()
	}
	for range 8 {
		if ep := <-done; ep != "10.244.1.7:3128" {
			t.Errorf("endpoint %q", ep)
		}
	}
	if asks.Load() != 1 || gotAuth.Load() != "Bearer "+base64.StdEncoding.EncodeToString([]byte("grant")) {
		t.Errorf("%d asks with %v, want one with the grant as bearer", asks.Load(), gotAuth.Load())
	}
	// Remembered until forgotten; then asked again, and a failure is
	// answered at once until retryAfter passed.
	e.Endpoint(context.Background())
	e.Forget("10.244.1.7:3128")
	fail.Store(1)
	if _, err := e.Endpoint(context.Background()); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("failed ask: %v", err)
	}
	if _, err := e.Endpoint(context.Background()); err == nil || asks.Load() != 2 {
		t.Errorf("within retryAfter: %v after %d asks, want the last error and 2 asks", err, asks.Load())
	}
	fail.Store(0)
	time.Sleep(retryAfter)
	if ep, err := e.Endpoint(context.Background()); err != nil || ep != "10.244.1.7:3128" || asks.Load() != 3 {
		t.Errorf("after retryAfter: %q %v after %d asks", ep, err, asks.Load())
	}
}

// The Dialer forgets an endpoint that no longer is this namespace's proxy.
func TestDialerForgets(t *testing.T) {
	pub, key, _ := signedgrant.GenerateKey()
	proxy := startProxy(t, pub, echo(t), 4)
	for _, tc := range []struct {
		grant  []byte
		target string
		forget bool
	}{
		{signed(t, key, "tenant", time.Now().Add(time.Minute)), "10.96.9.9:1", false}, // destination refused
		{signed(t, key, "other", time.Now().Add(time.Minute)), "10.96.12.7:80", true}, // another namespace's proxy
	} {
		var forgot bool
		d := &Dialer{Endpoints: forgetter{proxy, &forgot}, Grant: func() ([]byte, error) { return tc.grant, nil }}
		if _, err := d.Dial(context.Background(), netip.MustParseAddrPort(tc.target)); err == nil || forgot != tc.forget {
			t.Errorf("%s: %v, forgot %v want %v", tc.target, err, forgot, tc.forget)
		}
	}
}

type forgetter struct {
	ep     string
	forgot *bool
}

func (f forgetter) Endpoint(context.Context) (string, error) { return f.ep, nil }
func (f forgetter) Forget(string)                            { *f.forgot = true }

// A tunnel half-closes: a destination that ends its side first still gets
// what the client sends after (the proxy splices the raw connections).
func TestProxyHalfClose(t *testing.T) {
	pub, key, _ := signedgrant.GenerateKey()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("bye"))
		c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	proxy := startProxy(t, pub, ln.Addr().(*net.TCPAddr).AddrPort(), 4)
	c, err := Dial(context.Background(), proxy, netip.MustParseAddrPort("10.96.12.7:80"), signed(t, key, "tenant", time.Now().Add(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := io.ReadAll(c); err != nil || string(b) != "bye" {
		t.Fatalf("read %q %v", b, err)
	}
	c.Write([]byte("after your EOF"))
	c.(interface{ CloseWrite() error }).CloseWrite()
	select {
	case s := <-got:
		if s != "after your EOF" {
			t.Errorf("the destination got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Error("the destination got nothing after its half-close")
	}
}
