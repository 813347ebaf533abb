package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a real nameserver on loopback (UDP and TCP, one port)
// serving a zone, the way CoreDNS answers: the CNAME chain and the target's
// records in one answer, unless chase is false (it then answers the first
// CNAME alone). Answers with more than truncateOver records come truncated
// over UDP.
type dnsServer struct {
	addr         string
	z            zone
	chase        bool
	truncateOver int
	udpQueries   atomic.Int32
	tcpQueries   atomic.Int32
}

func startDNS(t *testing.T, z zone, chase bool, truncateOver int) *dnsServer {
	t.Helper()
	s := &dnsServer{z: z, chase: chase, truncateOver: truncateOver}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = pc.LocalAddr().String()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.udpQueries.Add(1)
			if out := s.reply(buf[:n], true); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				s.tcpQueries.Add(1)
				out := s.reply(q, false)
				binary.BigEndian.PutUint16(l[:], uint16(len(out)))
				c.Write(append(l[:], out...))
			}()
		}
	}()
	return s
}

func (s *dnsServer) reply(in []byte, udp bool) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(in); err != nil || len(m.Questions) != 1 {
		return nil
	}
	q := m.Questions[0]
	h := dnsmessage.Header{ID: m.ID, Response: true, RecursionAvailable: true}
	name := strings.ToLower(q.Name.String())
	var rrs []dnsmessage.Resource
	rh := func(n string) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(n), Class: dnsmessage.ClassINET, TTL: 5}
	}
	for cur, hops := name, 0; ; hops++ {
		if s.z.down[cur] || hops > 20 {
			h.RCode = dnsmessage.RCodeServerFailure
			break
		}
		if t, ok := s.z.cname[cur]; ok {
			rrs = append(rrs, dnsmessage.Resource{Header: rh(cur), Body: &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(t)}})
			if !s.chase {
				break
			}
			cur = t
			continue
		}
		as, ok := s.z.addrs[cur]
		if !ok {
			h.RCode = dnsmessage.RCodeNameError
			break
		}
		for _, a := range as {
			switch {
			case q.Type == dnsmessage.TypeA && a.Is4():
				rrs = append(rrs, dnsmessage.Resource{Header: rh(cur), Body: &dnsmessage.AResource{A: a.As4()}})
			case q.Type == dnsmessage.TypeAAAA && a.Is6():
				rrs = append(rrs, dnsmessage.Resource{Header: rh(cur), Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
			}
		}
		break
	}
	if udp && s.truncateOver > 0 && len(rrs) > s.truncateOver {
		h.Truncated = true
		rrs = rrs[:s.truncateOver]
	}
	out, err := (&dnsmessage.Message{Header: h, Questions: m.Questions, Answers: rrs}).Pack()
	if err != nil {
		return nil
	}
	return out
}

func TestResolverLookup(t *testing.T) {
	z := zone{cname: map[string]string{}, addrs: map[string][]netip.Addr{}, down: cluster.down}
	for k, v := range cluster.cname {
		z.cname[k] = v
	}
	for k, v := range cluster.addrs {
		z.addrs[k] = v
	}
	z.cname["loop1.ns.svc.cluster.local."] = "loop2.ns.svc.cluster.local."
	z.cname["loop2.ns.svc.cluster.local."] = "loop1.ns.svc.cluster.local."
	var many []netip.Addr
	for i := range 40 {
		many = append(many, netip.AddrFrom4([4]byte{10, 96, 60, byte(i)}))
	}
	z.addrs["many.ns.svc.cluster.local."] = many

	for _, chase := range []bool{true, false} {
		s := startDNS(t, z, chase, 20)
		// A dead server first: the next one is asked.
		dead, _ := net.ListenPacket("udp", "127.0.0.1:0")
		deadAddr := dead.LocalAddr().String()
		dead.Close()
		r := &Resolver{Servers: []string{deadAddr, s.addr}}
		for _, tc := range []struct {
			name     string
			typ      dnsmessage.Type
			chain    []string
			addrs    int
			notFound bool
			fail     bool
		}{
			{name: "backend.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"backend.ns.svc.cluster.local."}, addrs: 1},
			{name: "Backend.NS.svc.cluster.local", typ: dnsmessage.TypeAAAA, chain: []string{"backend.ns.svc.cluster.local."}, addrs: 1},
			{name: "kdns.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"kdns.ns.svc.cluster.local.", "kube-dns.kube-system.svc.cluster.local."}, addrs: 1},
			{name: "hop1.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"hop1.ns.svc.cluster.local.", "hop2.other.svc.cluster.local.", "kube-dns.kube-system.svc.cluster.local."}, addrs: 1},
			{name: "far.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"far.ns.svc.cluster.local.", "db.ns.svc.cluster.local.", "db.data.svc.cluster.local."}, addrs: 1},
			{name: "dangle.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"dangle.ns.svc.cluster.local.", "gone.data.svc.cluster.local."}, notFound: true},
			{name: "nope.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"nope.ns.svc.cluster.local."}, notFound: true},
			{name: "down.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"down.ns.svc.cluster.local."}, fail: true},
			{name: "loop1.ns.svc.cluster.local.", typ: dnsmessage.TypeA, fail: true},
			// Truncated over UDP, whole over TCP.
			{name: "many.ns.svc.cluster.local.", typ: dnsmessage.TypeA, chain: []string{"many.ns.svc.cluster.local."}, addrs: 40},
		} {
			ans, err := r.Lookup(context.Background(), tc.name, tc.typ)
			var de *net.DNSError
			switch {
			case tc.notFound:
				if !errors.As(err, &de) || !de.IsNotFound {
					t.Errorf("chase=%v %s: %v, want not found", chase, tc.name, err)
				}
			case tc.fail:
				if err == nil || (errors.As(err, &de) && de.IsNotFound) {
					t.Errorf("chase=%v %s: %v, want a failure", chase, tc.name, err)
				}
			case err != nil:
				t.Errorf("chase=%v %s: %v", chase, tc.name, err)
			case len(ans.Addrs) != tc.addrs:
				t.Errorf("chase=%v %s: %d addresses %v, want %d", chase, tc.name, len(ans.Addrs), ans.Addrs, tc.addrs)
			}
			if tc.chain != nil && !reflect.DeepEqual(ans.Chain, tc.chain) {
				t.Errorf("chase=%v %s: chain %v, want %v", chase, tc.name, ans.Chain, tc.chain)
			}
		}
		if s.tcpQueries.Load() == 0 {
			t.Errorf("chase=%v: no TCP query after a truncated answer", chase)
		}
	}
}

// The Guard over a real server: the ExternalName to kube-dns is
// refused although kube-dns's address is allowed.
func TestGuardOverResolver(t *testing.T) {
	s := startDNS(t, cluster, true, 0)
	g := NewGuard(testPolicy, (&Resolver{Servers: []string{s.addr}}).Lookup)
	for name, want := range map[string]dnsmessage.RCode{
		"kdns.ns.svc.cluster.local.":    dnsmessage.RCodeNameError,
		"hook.ns.svc.cluster.local.":    dnsmessage.RCodeNameError,
		"hop1.ns.svc.cluster.local.":    dnsmessage.RCodeNameError,
		"far.ns.svc.cluster.local.":     dnsmessage.RCodeSuccess,
		"backend.ns.svc.cluster.local.": dnsmessage.RCodeSuccess,
	} {
		var p dnsmessage.Parser
		h, err := p.Start(g.Answer(context.Background(), query(t, name, dnsmessage.TypeA)))
		if err != nil || h.RCode != want {
			t.Errorf("%s: %v %v, want %v", name, h.RCode, err, want)
		}
	}
	if g.MayConnect(netip.MustParseAddr("10.96.0.10")) || !g.MayConnect(netip.MustParseAddr("10.96.40.4")) {
		t.Error("kube-dns connectable, or the allowed chain's end not")
	}
}

func TestResolverFromConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(p, []byte("search ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver bogus\noptions ndots:5\n"), 0o644)
	if got := ResolverFromConf(p).Servers; !reflect.DeepEqual(got, []string{"10.96.0.10:53", "[fe80::1%eth0]:53"}) {
		t.Errorf("servers %v", got)
	}
	if got := ResolverFromConf(filepath.Join(t.TempDir(), "none")).Servers; len(got) != 2 || got[0] != "127.0.0.1:53" {
		t.Errorf("no resolv.conf: servers %v", got)
	}
}
