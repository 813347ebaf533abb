package server_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/fiberd/backend/process"
	"lampyr.dev/serving/impl/fiberd/egress"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// hostAddr is a non-loopback IPv4 address of this machine, standing in for
// a cluster Service's ClusterIP.
func hostAddr(t testing.TB) netip.Addr {
	t.Helper()
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			return p.Addr()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine to stand in for a Service")
	return netip.Addr{}
}

// Service bindings in real fibers: a fiber reaches a "Service" by the name
// its resolver answers and nothing else: not the same address unresolved,
// not a name outside the policy, not a name whose address is denied,
// not fiberd's API, no UDP.
func TestEgressServiceBindings(t *testing.T) {
	ip := hostAddr(t)
	svc, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	go func() {
		for {
			c, err := svc.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(svc.Addr().(*net.TCPAddr).Port)
	udp, err := net.ListenPacket("udp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	udpGot := make(chan struct{}, 16)
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := udp.ReadFrom(b)
			if err != nil {
				return
			}
			udpGot <- struct{}{}
			udp.WriteTo(b[:n], from)
		}
	}()
	names := map[string]netip.Addr{
		"backend.default.svc.cluster.local.":    ip,
		"kubernetes.default.svc.cluster.local.": ip, // allowed address, denied name
		"metadata.default.svc.cluster.local.":   netip.MustParseAddr("169.254.169.254"),
		"loop.default.svc.cluster.local.":       netip.MustParseAddr("127.0.0.1"),
		"other.default.svc.cluster.local.":      netip.MustParseAddr("192.0.2.7"), // outside Allow
		"example.com.":                          ip,                               // outside Domains
	}
	// A tenant's ExternalName Services: to a denied name, and to the
	// allowed one (issue 31).
	cnames := map[string]string{
		"kdns.default.svc.cluster.local.":  "kube-dns.kube-system.svc.cluster.local.",
		"alias.default.svc.cluster.local.": "backend.default.svc.cluster.local.",
	}
	names["kube-dns.kube-system.svc.cluster.local."] = ip // allowed address, denied name
	lookups := 0
	pol := &egresspolicy.Policy{
		Domains:         []string{"svc.cluster.local"},
		DenyNames:       []string{"kubernetes.default.svc.cluster.local", ".lampyr-system.svc.cluster.local", ".kube-system.svc.cluster.local"},
		Allow:           []netip.Prefix{netip.PrefixFrom(ip, 32)},
		SearchNamespace: "default",
	}
	inst := evil(t, fiberdtest.Options{WarmFibers: -1, Egress: &process.Egress{
		Policy: pol,
		Lookup: func(ctx context.Context, host string, _ dnsmessage.Type) (egress.Answer, error) {
			lookups++
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
	}})
	c := inst.Client
	probe := func(q string) probe {
		t.Helper()
		code, p := fresh(t, c, "/net?"+q)
		if code != 200 {
			t.Fatalf("/net?%s: status %d", q, code)
		}
		t.Logf("/net?%s: %s", q, p.Result)
		return p
	}

	// The binding works, by full name and through the search path.
	for _, n := range []string{"backend.default.svc.cluster.local", "backend.default", "backend", "alias"} {
		if p := probe("name=" + n + ":" + port); !strings.Contains(p.Result, "tcp "+n+":"+port+": connected") {
			t.Errorf("%s: the fiber could not reach the Service by name: %s", n, p.Result)
		}
	}
	// Everything else is refused.
	for _, q := range []string{
		"tcp=" + net.JoinHostPort(ip.String(), port),                        // the same address, not resolved
		"tcp=" + inst.Endpoint + "," + fiberdtest.HostListener(t),           // fiberd's API, the host's loopback
		"name=kubernetes.default.svc.cluster.local:" + port,                 // denied name
		"name=kdns.default.svc.cluster.local:" + port,                       // denied name along the chain
		"name=x.lampyr-system.svc.cluster.local:80",                         // denied namespace
		"name=metadata.default.svc.cluster.local:80",                        // link-local
		"name=loop.default.svc.cluster.local:" + port,                       // loopback
		"name=other.default.svc.cluster.local:80",                           // outside Allow
		"name=example.com:" + port,                                          // outside Domains
		"route=" + udp.LocalAddr().String() + ",169.254.169.254:53",         // UDP
		"route=" + egresspolicy.ResolverAddr.String() + ":5353",             // the resolver, not its port
		"tcp=" + net.JoinHostPort(egresspolicy.ResolverAddr.String(), "53"), // no DNS over TCP, no other port
	} {
		if p := probe(q); p.Escaped {
			t.Errorf("%s escaped: %s", q, p.Result)
		}
	}
	select {
	case <-udpGot:
		t.Error("a fiber's UDP datagram reached the host")
	default:
	}
	if lookups == 0 {
		t.Error("the resolver never asked the Home's resolver")
	}
}

// A fiber that connects again from the same source port right after the
// destination closed the last connection on it (Linux reuses such ports)
// gets through at once. fiberd's stack closed first and kept the 4-tuple in
// TIME-WAIT, where gVisor drops a new SYN unless a listener (not the
// forwarder) takes it: such calls hung until the caller's timeout.
func TestEgressReusedSourcePort(t *testing.T) {
	ip := hostAddr(t)
	svc, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	go func() {
		for {
			c, err := svc.Accept()
			if err != nil {
				return
			}
			c.Close() // the destination closes first
		}
	}()
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "reuse", IdleTimeout: time.Minute, WarmFibers: -1, Egress: &process.Egress{
		Policy: &egresspolicy.Policy{Domains: []string{"svc.cluster.local"}, Allow: []netip.Prefix{netip.PrefixFrom(ip, 32)}},
		Lookup: func(_ context.Context, host string, _ dnsmessage.Type) (egress.Answer, error) {
			return egress.Answer{Chain: []string{host}, Addrs: []netip.Addr{ip}}, nil
		},
	}})
	f, err := inst.Client.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Client.Release(context.Background(), f.ID)
	path := "/dial?lport=40123&addr=backend.default.svc.cluster.local:" + strconv.Itoa(svc.Addr().(*net.TCPAddr).Port)
	for i := range 3 {
		start := time.Now()
		resp, b := get(t, inst.Client, f.ID, path)
		if resp.StatusCode != 200 {
			t.Fatalf("dial %d from the same port: %d %s", i, resp.StatusCode, b)
		}
		if d := time.Since(start); d > 900*time.Millisecond {
			t.Errorf("dial %d from the same port took %s (a dropped SYN waits for its 1 s retransmit)", i, d)
		}
	}
}
