package egress

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/trust/egresspolicy"
)

var testPolicy = &egresspolicy.Policy{
	Domains:   []string{"svc.cluster.local"},
	DenyNames: []string{"kubernetes.default.svc.cluster.local", ".lampyr-system.svc.cluster.local"},
	Allow:     []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("127.0.0.0/8")},
	Deny:      []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")},
}

func query(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAnswer(t *testing.T) {
	g := NewGuard(testPolicy, func(_ context.Context, _, host string) ([]netip.Addr, error) {
		switch host {
		case "backend.ns.svc.cluster.local.":
			return []netip.Addr{netip.MustParseAddr("10.96.12.7")}, nil
		case "api.ns.svc.cluster.local.": // an ExternalName to the API server
			return []netip.Addr{netip.MustParseAddr("10.96.0.1")}, nil
		case "down.ns.svc.cluster.local.":
			return nil, &net.DNSError{Err: "timeout", IsTimeout: true}
		}
		return nil, &net.DNSError{Err: "no such host", IsNotFound: true}
	})
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		n     int
	}{
		{"backend.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"backend.ns.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0},
		{"api.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"nope.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"down.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure, 0},
		{"kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
	} {
		out := g.Answer(context.Background(), query(t, tc.name, tc.typ))
		var p dnsmessage.Parser
		h, err := p.Start(out)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p.SkipAllQuestions()
		as, _ := p.AllAnswers()
		if h.ID != 7 || !h.Response || h.RCode != tc.rcode || len(as) != tc.n {
			t.Errorf("%s %v: id %d rcode %v answers %d, want rcode %v answers %d", tc.name, tc.typ, h.ID, h.RCode, len(as), tc.rcode, tc.n)
		}
	}
	if !g.MayConnect(netip.MustParseAddr("10.96.12.7")) {
		t.Error("a resolved, allowed address is refused")
	}
	for _, a := range []string{"10.96.0.1", "10.96.12.8", "127.0.0.1"} {
		if g.MayConnect(netip.MustParseAddr(a)) {
			t.Errorf("MayConnect(%s) without resolving it", a)
		}
	}
	if out := g.Answer(context.Background(), []byte{1, 2, 3}); out != nil {
		t.Errorf("garbage answered: %x", out)
	}
}
