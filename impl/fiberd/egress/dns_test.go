package egress

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// testPolicy is the installation default's shape: the cluster's names,
// minus the API server and the platform's namespaces.
var testPolicy = &egresspolicy.Policy{
	Domains: []string{"svc.cluster.local"},
	DenyNames: []string{
		"kubernetes.default.svc.cluster.local",
		".kube-system.svc.cluster.local",
		".knative-serving.svc.cluster.local",
		".lampyr-system.svc.cluster.local",
	},
	Allow: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("127.0.0.0/8")},
	Deny:  []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")},
}

// zone is a cluster's DNS as kube-dns serves it: a name is a CNAME (an
// ExternalName Service) or has addresses.
type zone struct {
	cname map[string]string
	addrs map[string][]netip.Addr
	down  map[string]bool
}

// lookup answers as a recursive server does: the whole chain and the
// addresses at its end (zoneLookup models no server's bugs; the Resolver
// tests below do).
func (z zone) lookup(_ context.Context, name string, typ dnsmessage.Type) (Answer, error) {
	ans := Answer{Chain: []string{name}}
	for cur := name; ; {
		if z.down[cur] {
			return ans, &net.DNSError{Err: "timeout", Name: name, IsTimeout: true}
		}
		if t, ok := z.cname[cur]; ok {
			ans.Chain = append(ans.Chain, t)
			cur = t
			continue
		}
		as, ok := z.addrs[cur]
		if !ok {
			return ans, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
		}
		for _, a := range as {
			if (typ == dnsmessage.TypeA) == a.Is4() {
				ans.Addrs = append(ans.Addrs, a)
			}
		}
		return ans, nil
	}
}

var cluster = zone{
	cname: map[string]string{
		// The cases: a tenant's ExternalName Services.
		"kdns.ns.svc.cluster.local.":    "kube-dns.kube-system.svc.cluster.local.",
		"hook.ns.svc.cluster.local.":    "webhook.knative-serving.svc.cluster.local.",
		"hop1.ns.svc.cluster.local.":    "hop2.other.svc.cluster.local.",
		"hop2.other.svc.cluster.local.": "kube-dns.kube-system.svc.cluster.local.",
		"api.ns.svc.cluster.local.":     "kubernetes.default.svc.cluster.local.",
		"ext.ns.svc.cluster.local.":     "www.example.com.",
		// Allowed chains: to another tenant namespace's Service, twice.
		"db.ns.svc.cluster.local.":     "db.data.svc.cluster.local.",
		"far.ns.svc.cluster.local.":    "db.ns.svc.cluster.local.",
		"dangle.ns.svc.cluster.local.": "gone.data.svc.cluster.local.",
		"slow.ns.svc.cluster.local.":   "down.data.svc.cluster.local.",
		"slowk.ns.svc.cluster.local.":  "down.kube-system.svc.cluster.local.",
	},
	addrs: map[string][]netip.Addr{
		"backend.ns.svc.cluster.local.":              {netip.MustParseAddr("10.96.12.7"), netip.MustParseAddr("fd00::7")},
		"db.data.svc.cluster.local.":                 {netip.MustParseAddr("10.96.40.4")},
		"kube-dns.kube-system.svc.cluster.local.":    {netip.MustParseAddr("10.96.0.10")},
		"webhook.knative-serving.svc.cluster.local.": {netip.MustParseAddr("10.96.3.3")},
		"kubernetes.default.svc.cluster.local.":      {netip.MustParseAddr("10.96.0.1")},
		"apiip.ns.svc.cluster.local.":                {netip.MustParseAddr("10.96.0.1")},
		"www.example.com.":                           {netip.MustParseAddr("10.96.50.5")},
	},
	down: map[string]bool{"down.data.svc.cluster.local.": true, "down.kube-system.svc.cluster.local.": true, "down.ns.svc.cluster.local.": true},
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
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		want  []string // addresses answered, and then allowed to connect to
	}{
		{"backend.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.12.7"}},
		{"backend.ns.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil}, // IPv4 link: no data
		{"backend.ns.svc.cluster.local.", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, nil},
		{"nope.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"down.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure, nil},
		{"example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		// Denied by name, asked directly.
		{"kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"kube-dns.kube-system.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		// Denied by address: the API server's ClusterIP under a tenant name.
		{"apiip.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		// Denied along the chain (issue 31): ExternalName -> kube-dns,
		// -> the Knative webhook, -> kube-dns in two hops through another
		// tenant's ExternalName, -> the API server, -> outside the domains.
		{"kdns.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"kdns.ns.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, nil},
		{"kdns.ns.svc.cluster.local.", dnsmessage.TypeSRV, dnsmessage.RCodeNameError, nil},
		{"hook.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"hop1.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"api.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"ext.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		// A denied name on the chain wins over the server's failure.
		{"slowk.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		// Allowed chains: one and two hops to another tenant's Service.
		{"db.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.40.4"}},
		{"far.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.40.4"}},
		{"dangle.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"slow.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure, nil},
	} {
		t.Run(tc.name+"/"+tc.typ.String(), func(t *testing.T) {
			g := NewGuard(testPolicy, cluster.lookup)
			out := g.Answer(context.Background(), query(t, tc.name, tc.typ))
			var p dnsmessage.Parser
			h, err := p.Start(out)
			if err != nil {
				t.Fatal(err)
			}
			p.SkipAllQuestions()
			as, _ := p.AllAnswers()
			var got []string
			for _, rr := range as {
				if rr.Header.Name.String() != tc.name {
					t.Errorf("answer owned by %s, want the name asked", rr.Header.Name)
				}
				switch b := rr.Body.(type) {
				case *dnsmessage.AResource:
					got = append(got, netip.AddrFrom4(b.A).String())
				case *dnsmessage.AAAAResource:
					got = append(got, netip.AddrFrom16(b.AAAA).String())
				}
			}
			if h.ID != 7 || !h.Response || h.RCode != tc.rcode || len(got) != len(tc.want) {
				t.Fatalf("id %d rcode %v answers %v, want rcode %v answers %v", h.ID, h.RCode, got, tc.rcode, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] || !g.MayConnect(netip.MustParseAddr(got[i])) {
					t.Errorf("answer %s (want %s) not connectable", got[i], tc.want[i])
				}
			}
			// Nothing a refused chain ended at may be connected to, even
			// where its address is inside Allow.
			for _, a := range []string{"10.96.0.10", "10.96.3.3", "10.96.0.1", "10.96.50.5", "10.96.12.8", "127.0.0.1"} {
				if g.MayConnect(netip.MustParseAddr(a)) {
					t.Errorf("MayConnect(%s) after asking %s", a, tc.name)
				}
			}
		})
	}
	g := NewGuard(testPolicy, cluster.lookup)
	if out := g.Answer(context.Background(), []byte{1, 2, 3}); out != nil {
		t.Errorf("garbage answered: %x", out)
	}
}
