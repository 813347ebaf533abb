package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/egress"
	"lampyr.dev/serving/impl/fiberd/egress/proxy"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/egresspolicy"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// handlerPackage has /call?url=...: one GET through a new connection, the
// portability proof's and the measure of a Service calling another.
const handlerPackage = "lampyr.dev/serving/fixtures/cmd/handler"

// egressRig is a "Service" on a host address, the names the fibers'
// resolver knows, and an egress proxy of namespace "default" on loopback
// (standing in for the tenant's egress Pod).
type egressRig struct {
	svc     string // host:port of the Service
	tunnels atomic.Int32
	proxy   string
	grant   []byte
}

func newEgressRig(t testing.TB) *egressRig {
	t.Helper()
	ip := hostAddr(t)
	r := &egressRig{}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong\n") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.svc = ln.Addr().String()

	pub, key, _ := signedgrant.GenerateKey()
	r.grant, err = signedgrant.Sign(key, signedgrant.Claims{
		GrantID: "g", Home: "h", Namespace: "default", Revision: "r", Helper: signedgrant.Helper{Port: 8080},
		MemoryPerFiberBytes: 1, MaxFibers: 1, Execution: signedgrant.Execution{Mode: "fresh"},
		IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy.Server{Key: pub, Namespace: "default", Logf: t.Logf}
	d := &net.Dialer{}
	p.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.tunnels.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(pln)
	t.Cleanup(func() { pln.Close(); p.Close() })
	r.proxy = pln.Addr().String()
	return r
}

// egress is the fibers' egress: dialled directly or through the proxy.
func (r *egressRig) egress(viaProxy bool) *process.Egress {
	ip := netip.MustParseAddrPort(r.svc).Addr()
	names := map[string]netip.Addr{"backend.default.svc.cluster.local.": ip, "kube-dns.kube-system.svc.cluster.local.": ip}
	cnames := map[string]string{"kdns.default.svc.cluster.local.": "kube-dns.kube-system.svc.cluster.local."}
	eg := &process.Egress{
		Policy: &egresspolicy.Policy{
			Domains:         []string{"svc.cluster.local"},
			DenyNames:       []string{".kube-system.svc.cluster.local"},
			Allow:           []netip.Prefix{netip.PrefixFrom(ip, 32)},
			SearchNamespace: "default",
		},
		Lookup: func(_ context.Context, host string, _ dnsmessage.Type) (egress.Answer, error) {
			ans := egress.Answer{Chain: []string{host}}
			if t, ok := cnames[host]; ok {
				ans.Chain = append(ans.Chain, t)
				host = t
			}
			if a, ok := names[host]; ok {
				ans.Addrs = []netip.Addr{a}
				return ans, nil
			}
			return ans, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
	}
	if viaProxy {
		d := &proxy.Dialer{Endpoints: proxy.Static(r.proxy), Grant: func() ([]byte, error) { return r.grant, nil }}
		eg.Dial = d.Dial
	}
	return eg
}

type callResult struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}

func call(tb testing.TB, c *client.Client, id, url string) callResult {
	req, _ := http.NewRequest(http.MethodGet, "http://app/call?url="+url, nil)
	resp, err := c.Do(req, id)
	if err != nil {
		tb.Fatalf("/call %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var res callResult
	if err := json.Unmarshal(body, &res); err != nil || resp.StatusCode != 200 {
		tb.Fatalf("/call %s: status %d: %q %v", url, resp.StatusCode, body, err)
	}
	return res
}

// Through the egress proxy the fiber sees what it saw when fiberd dialled
// from the Home: the Service by name, the same refusals (the resolver and
// policy are fiberd's, before the proxy is asked).
func TestEgressThroughProxy(t *testing.T) {
	r := newEgressRig(t)
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{HandlerPackage: handlerPackage, Mode: "reuse", IdleTimeout: time.Minute, WarmFibers: -1, Egress: r.egress(true)})
	f, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Client.Release(context.Background(), f.ID)
	port := strconv.Itoa(int(netip.MustParseAddrPort(r.svc).Port()))
	for _, u := range []string{
		"http://" + r.svc + "/",                               // not resolved by the fiber (yet)
		"http://kdns.default.svc.cluster.local:" + port + "/", // denied along the chain
	} {
		if res := call(t, inst.Client, f.ID, u); res.Status != 0 || res.Error == "" {
			t.Errorf("%s reached: %+v", u, res)
		}
	}
	if n := r.tunnels.Load(); n != 0 {
		t.Errorf("%d tunnels after refused calls, want none (fiberd refuses before asking the proxy)", n)
	}
	if res := call(t, inst.Client, f.ID, "http://backend:"+port+"/"); res.Status != 200 || res.Body != "pong\n" {
		t.Errorf("by name through the proxy: %+v", res)
	}
	if n := r.tunnels.Load(); n != 1 {
		t.Errorf("%d tunnels through the proxy, want 1", n)
	}
}

// BenchmarkEgressCall measures one /call (the fiber resolves the name,
// connects, GETs and reads the answer) with fiberd dialling from the Home
// and through the egress proxy on loopback. With -count N the two
// alternate, so the machine's load falls on both.
//
//	go test ./impl/fiberd/server -run '^$' -bench EgressCall -benchtime 2000x -count 3
func BenchmarkEgressCall(b *testing.B) {
	r := newEgressRig(b)
	for _, viaProxy := range []bool{false, true} {
		name := "dial=direct"
		if viaProxy {
			name = "dial=proxy"
		}
		b.Run(name, func(b *testing.B) {
			inst := fiberdtest.StartInstance(b, fiberdtest.Options{HandlerPackage: handlerPackage, Mode: "reuse", IdleTimeout: time.Minute, WarmFibers: 1, Egress: r.egress(viaProxy), Logf: func(string, ...any) {}})
			f, err := inst.Client.Acquire(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Client.Release(context.Background(), f.ID)
			u := fmt.Sprintf("http://backend.default.svc.cluster.local:%d/", netip.MustParseAddrPort(r.svc).Port())
			call(b, inst.Client, f.ID, u) // warm: the fiber's first lookup and connection
			before := r.tunnels.Load()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if res := call(b, inst.Client, f.ID, u); res.Status != 200 {
					b.Fatalf("call %d after %s: %+v ", len(lat), time.Since(t0), res)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			p50, p99 := percentiles(lat)
			b.ReportMetric(float64(p50.Microseconds())/1000, "call-p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "call-p99-ms")
			b.ReportMetric(float64(slices.Max(lat).Microseconds())/1000, "call-max-ms")
			if got := r.tunnels.Load() - before; viaProxy != (got > 0) {
				b.Fatalf("%d tunnels through the proxy with %s", got, name)
			}
		})
	}
}
