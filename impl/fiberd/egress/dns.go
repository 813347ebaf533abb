// Package egress is a fiber's only way out of its network namespace: its
// service bindings (docs/networking.md, "Service bindings"). A fiber has
// loopback and one point-to-point interface whose every packet fiberd
// reads; fiberd answers DNS for the fiber with a restricted resolver (real
// queries to the Home's nameserver, every name of the answer's CNAME chain
// checked: resolver.go) and opens only TCP connections to addresses that
// resolver handed to this fiber and the installation's policy allows,
// through the tenant namespace's egress Pod (package proxy) or from the
// Home (DirectDial). Nothing else leaves: no UDP but DNS to the resolver,
// no ICMP, no connection to an address the fiber did not resolve.
package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// maxResolved bounds the addresses one fiber may hold resolved; past it
// the oldest are forgotten (a fiber cannot grow fiberd's memory).
const maxResolved = 4096

// maxAnswers keeps every answer within 512 bytes, so no client needs DNS
// over TCP (which the resolver does not serve).
const maxAnswers = 16

// answerTTL is short: a fiber re-resolves soon after a Service changes.
const answerTTL = 5

// Guard is one fiber's resolver and connection check: it answers the
// fiber's DNS queries under the policy and remembers which addresses it
// handed out; MayConnect allows only those.
type Guard struct {
	pol    *egresspolicy.Policy
	lookup Lookup

	mu       sync.Mutex
	resolved map[netip.Addr]struct{}
	order    []netip.Addr
}

// NewGuard returns a fiber's guard. lookup is the Home's own resolver.
func NewGuard(pol *egresspolicy.Policy, lookup Lookup) *Guard {
	return &Guard{pol: pol, lookup: lookup, resolved: map[netip.Addr]struct{}{}}
}

// MayConnect says whether the fiber may open a connection to a: the
// resolver handed it a, and the policy allows it now.
func (g *Guard) MayConnect(a netip.Addr) bool {
	a = a.Unmap()
	g.mu.Lock()
	_, ok := g.resolved[a]
	g.mu.Unlock()
	return ok && g.pol.AddrAllowed(a)
}

func (g *Guard) remember(as []netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range as {
		if _, ok := g.resolved[a]; ok {
			continue
		}
		if len(g.order) >= maxResolved {
			delete(g.resolved, g.order[0])
			g.order = g.order[1:]
		}
		g.resolved[a] = struct{}{}
		g.order = append(g.order, a)
	}
}

// Answer answers one DNS query message; nil means drop it (not a query).
func (g *Guard) Answer(ctx context.Context, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	resp := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if err != nil || len(qs) != 1 || h.OpCode != 0 {
		resp.RCode = dnsmessage.RCodeFormatError
		if err == nil && h.OpCode != 0 {
			resp.RCode = dnsmessage.RCodeNotImplemented
		}
		return build(resp, qs, nil)
	}
	q := qs[0]
	name := q.Name.String()
	switch {
	case q.Class != dnsmessage.ClassINET:
		resp.RCode = dnsmessage.RCodeNotImplemented
		return build(resp, qs, nil)
	case !g.pol.NameAllowed(name):
		resp.RCode = dnsmessage.RCodeNameError
		return build(resp, qs, nil)
	}
	// Whatever the type, the name's A records decide whether it exists
	// for the fiber (an allowed chain to an allowed address); only an A
	// query is answered with records: the link carries IPv4 alone, so
	// AAAA and the other types get none, and never a different verdict.
	ans, err := g.lookup(ctx, egresspolicy.Canonical(name), dnsmessage.TypeA)
	// Every name the answer went through must be one the fiber could have
	// asked for: an allowed name that is a CNAME (an ExternalName
	// Service) of a denied one, or of one outside the allowed domains,
	// does not exist for the fiber, whatever else the server said. None
	// of its addresses is remembered.
	for _, n := range ans.Chain {
		if !g.pol.NameAllowed(n) {
			resp.RCode = dnsmessage.RCodeNameError
			return build(resp, qs, nil)
		}
	}
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			resp.RCode = dnsmessage.RCodeNameError
		} else {
			resp.RCode = dnsmessage.RCodeServerFailure
		}
		return build(resp, qs, nil)
	}
	as := ans.Addrs
	var keep []netip.Addr
	for _, a := range as {
		a = a.Unmap()
		if !g.pol.AddrAllowed(a) {
			continue
		}
		if q.Type == dnsmessage.TypeA && a.Is4() {
			keep = append(keep, a)
		}
	}
	if len(keep) == 0 && len(as) > 0 && !anyAllowed(g.pol, as) {
		// Every address is one the fiber may not reach: the name does
		// not exist for it.
		resp.RCode = dnsmessage.RCodeNameError
		return build(resp, qs, nil)
	}
	if len(keep) > maxAnswers {
		keep = keep[:maxAnswers]
	}
	g.remember(keep)
	return build(resp, qs, keep)
}

func anyAllowed(pol *egresspolicy.Policy, as []netip.Addr) bool {
	for _, a := range as {
		if pol.AddrAllowed(a) {
			return true
		}
	}
	return false
}

func build(h dnsmessage.Header, qs []dnsmessage.Question, as []netip.Addr) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	b.StartQuestions()
	for _, q := range qs {
		b.Question(q)
	}
	b.StartAnswers()
	if len(qs) == 1 {
		rh := dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: answerTTL}
		for _, a := range as {
			if a.Is4() {
				b.AResource(rh, dnsmessage.AResource{A: a.As4()})
			} else {
				b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
