package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/fiberd/sockmap"
)

// tunnelClient sends HTTP/1.1 requests over one already-open tunnel.
func tunnelClient(conn net.Conn) *http.Client {
	used := false
	return &http.Client{Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, errors.New("the tunnel was already used")
			}
			used = true
			return conn, nil
		},
		MaxConnsPerHost: 1,
	}}
}

func tunnelGet(t *testing.T, hc *http.Client, path string) hello {
	t.Helper()
	resp, err := hc.Get("http://app.example.com" + path)
	if err != nil {
		t.Fatalf("GET %s through the tunnel: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s through the tunnel: %d %s", path, resp.StatusCode, b)
	}
	return decodeHello(t, b)
}

func fiberState(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	l, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range l.Fibers {
		if f.ID == id {
			return f.State
		}
	}
	return "gone"
}

// bothSplices runs test with tunnels joined in the kernel (sockmap) and
// with tunnels copied by fiberd, and checks each took the path it names.
func bothSplices(t *testing.T, opts fiberdtest.Options, test func(t *testing.T, inst *fiberdtest.Instance)) {
	for _, path := range []string{"kernel", "user"} {
		t.Run(path, func(t *testing.T) {
			if path == "kernel" {
				sp, err := sockmap.New(1)
				if err != nil {
					t.Skipf("kernel splicing is unavailable on this machine (fiberd falls back to copying, tested by the user subtest): %v", err)
				}
				sp.Close()
			}
			o := opts
			o.UserSpaceTunnels = path == "user"
			inst := fiberdtest.StartInstance(t, o)
			test(t, inst)
			if n := tunnelsOpened(t, inst, path); n == 0 {
				t.Fatalf("no tunnel took the %s path (fiberd_tunnels_total{splice=%q} = 0)", path, path)
			}
			other := map[string]string{"kernel": "user", "user": "kernel"}[path]
			if n := tunnelsOpened(t, inst, other); n != 0 {
				t.Fatalf("%v tunnels took the %s path, want all on %s", n, other, path)
			}
		})
	}
}

// tunnelsOpened reads fiberd_tunnels_total{splice=path}.
func tunnelsOpened(t *testing.T, inst *fiberdtest.Instance, path string) float64 {
	return inst.Metric(t, `fiberd_tunnels_total{splice="`+path+`"}`)
}

// leaseTunnel acquires a fiber and opens a tunnel to it.
func leaseTunnel(t *testing.T, c *client.Client) (client.Fiber, net.Conn) {
	t.Helper()
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Tunnel(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	return f, conn
}

func TestTunnelCarriesRequestsAndHoldsTheFiber(t *testing.T) {
	bothSplices(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: 30 * time.Second}, testTunnelCarriesRequests)
}

func testTunnelCarriesRequests(t *testing.T, inst *fiberdtest.Instance) {
	c := inst.Client
	ctx := context.Background()
	f, conn := leaseTunnel(t, c)
	hc := tunnelClient(conn)
	for i := int64(1); i <= 3; i++ {
		h := tunnelGet(t, hc, "/")
		if h.Served != i {
			t.Fatalf("request %d through the tunnel was the handler's request %d: the tunnel must reach the same live fiber", i, h.Served)
		}
		if h.Host != "app.example.com" {
			t.Fatalf("handler saw Host %q, want the client's app.example.com", h.Host)
		}
	}
	if s := fiberState(t, c, f.ID); s != client.StateTunneled {
		t.Fatalf("fiber state with an open tunnel: %q, want %q", s, client.StateTunneled)
	}
	// Exclusivity: neither a proxied request nor a second tunnel gets in.
	if resp, body := get(t, c, f.ID, "/"); resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), contract.ReasonFiberBusy.String()) {
		t.Fatalf("proxied request into a tunneled fiber: %d %s, want 409 %s", resp.StatusCode, body, contract.ReasonFiberBusy)
	}
	if c2, err := c.Tunnel(ctx, f.ID); !client.IsFiberBusy(err) {
		if c2 != nil {
			c2.Close()
		}
		t.Fatalf("second tunnel into a tunneled fiber: %v, want 409 %s", err, contract.ReasonFiberBusy)
	}
	// Closing the tunnel gives the fiber back; the process is the same.
	hc.CloseIdleConnections()
	waitFor(t, "the fiber to leave state tunneled", 5*time.Second, func() bool { return fiberState(t, c, f.ID) == client.StateAcquired })
	resp, body := get(t, c, f.ID, "/")
	if resp.StatusCode != 200 || decodeHello(t, body).Served != 4 {
		t.Fatalf("proxied request after the tunnel closed: %d %s, want the handler's 4th request", resp.StatusCode, body)
	}
	// A streamed (chunked) response passes as bytes too.
	conn, err := c.Tunnel(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	hc = tunnelClient(conn)
	sresp, err := hc.Get("http://app.example.com/stream?n=3")
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := io.ReadAll(sresp.Body)
	sresp.Body.Close()
	if sresp.StatusCode != 200 || strings.Count(string(sb), "\n") < 3 {
		t.Fatalf("streamed response through the tunnel: %d %q", sresp.StatusCode, sb)
	}
	hc.CloseIdleConnections()
}

func TestTunnelEndsWithTheFiberAndOnSilence(t *testing.T) {
	// silence bound = max(idleTimeoutSeconds 2, maxRequestSeconds 1) = 2s
	bothSplices(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: 2 * time.Second, MaxRequestSeconds: 1}, testTunnelEnds)
}

func testTunnelEnds(t *testing.T, inst *fiberdtest.Instance) {
	c := inst.Client
	ctx := context.Background()

	// Released while tunneled: the tunnel closes, the fiber is gone.
	f, conn := leaseTunnel(t, c)
	if err := c.Release(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Fatalf("tunnel of a released fiber still open: read %d bytes, err %v", n, err)
	}
	conn.Close()
	if s := fiberState(t, c, f.ID); s != "gone" {
		t.Fatalf("released fiber is %s", s)
	}

	// A tunnel in use outlives the silence bound: fiberd sees its traffic
	// even when the kernel carries every byte.
	_, conn = leaseTunnel(t, c)
	hc := tunnelClient(conn)
	for i := int64(1); i <= 8; i++ {
		if h := tunnelGet(t, hc, "/"); h.Served != i {
			t.Fatalf("request %d through a busy tunnel reached the handler's request %d", i, h.Served)
		}
		time.Sleep(500 * time.Millisecond)
	}
	hc.CloseIdleConnections()

	// A tunnel nobody uses is closed after the silence bound, and the
	// fiber is then released as idle like any other.
	g, conn := leaseTunnel(t, c)
	defer conn.Close()
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := conn.Read(make([]byte, 1))
	d := time.Since(start)
	if err == nil || isTimeout(err) {
		t.Fatalf("silent tunnel not closed by fiberd within 10s: %v", err)
	}
	if d < 1500*time.Millisecond {
		t.Fatalf("silent tunnel closed after %s, before the 2s silence bound", d)
	}
	waitFor(t, "the idle fiber to be released", 10*time.Second, func() bool { return fiberState(t, c, g.ID) == "gone" })

	// A tunnel ends when the grant stops covering the Revision, as new
	// proxied requests are then refused.
	_, conn = leaseTunnel(t, c)
	defer conn.Close()
	hc = tunnelClient(conn)
	tunnelGet(t, hc, "/")
	inst.WriteRawGrant(t, []byte("not a grant"))
	// Busy enough that the silence bound never applies.
	start = time.Now()
	for {
		resp, err := hc.Get("http://app.example.com/")
		if err != nil {
			break
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if time.Since(start) > 8*time.Second {
			t.Fatal("a busy tunnel still serves 8s after the grant became invalid")
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func TestTunnelRefusals(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{})
	c := inst.Client
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *client.Error
	if _, err := c.Tunnel(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || apiErr.Reason != contract.ReasonTunnelRefused {
		t.Fatalf("tunnel into a fresh-mode fiber: %v, want 409 %s", err, contract.ReasonTunnelRefused)
	}
	// The refusal spent nothing: the fiber still serves its one request.
	if resp, body := get(t, c, f.ID, "/"); resp.StatusCode != 200 {
		t.Fatalf("fresh fiber after a refused tunnel: %d %s", resp.StatusCode, body)
	}
	if _, err := c.Tunnel(ctx, "no-such-fiber"); !client.IsNotFound(err) && !(errors.As(err, &apiErr) && apiErr.Reason == contract.ReasonTunnelRefused) {
		t.Fatalf("tunnel into an unknown fiber: %v", err)
	}
	bad, _ := client.New(inst.Endpoint, "wrong-token")
	if _, err := bad.Tunnel(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
		t.Fatalf("tunnel with a wrong token: %v, want 401", err)
	}
	// Without the Upgrade headers the endpoint says how to ask.
	req, _ := http.NewRequest(http.MethodPost, "http://"+inst.Endpoint+client.TunnelPath(f.ID), nil)
	req.Header.Set("Authorization", "Bearer "+inst.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "Upgrade: "+client.TunnelProtocol) {
		t.Fatalf("tunnel request without Upgrade: %d %s", resp.StatusCode, b)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
