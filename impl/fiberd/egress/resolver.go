package egress

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"lampyr.dev/serving/impl/trust/egresspolicy"
)

// Answer is what the Home's nameserver answered for one name and type: the
// names its CNAME chain went through, the name asked first, and the
// addresses at the chain's end. The Guard checks every name of Chain, not
// only the first: an ExternalName Service of the tenant's aimed at a denied
// name resolves through it (kube-dns answers a CNAME).
type Answer struct {
	Chain []string
	Addrs []netip.Addr
}

// Lookup asks the Home's nameserver for name (fully qualified) and typ
// (dnsmessage.TypeA or TypeAAAA). Its errors are *net.DNSError, with
// IsNotFound for a name that does not exist.
type Lookup func(ctx context.Context, name string, typ dnsmessage.Type) (Answer, error)

const (
	// maxChain bounds the CNAMEs followed for one name (a loop or a long
	// chain is a failure, as for glibc's resolver).
	maxChain = 16
	// maxQueries bounds the queries of one lookup: a server that answers
	// a CNAME without its target's records is asked for the target.
	maxQueries = 4
	// attemptTimeout bounds one query to one server.
	attemptTimeout = 2 * time.Second
	// udpSize is the EDNS0 buffer size offered (the DNS flag day's value:
	// no fragmentation); longer answers come truncated and are asked
	// again over TCP.
	udpSize = 1232
)

// Resolver sends DNS queries to the Home's nameservers (kube-dns) and
// returns whole answers, CNAME chains included, which net.Resolver does not.
type Resolver struct {
	// Servers are host:port addresses, tried in order.
	Servers []string
}

// ResolverFromConf reads the nameservers of a resolv.conf; without any it
// uses 127.0.0.1:53 and [::1]:53, as Go's and glibc's resolvers do.
func ResolverFromConf(path string) *Resolver {
	r := &Resolver{}
	if f, err := os.Open(path); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			fs := strings.Fields(s.Text())
			if len(fs) >= 2 && fs[0] == "nameserver" {
				if a, err := netip.ParseAddr(fs[1]); err == nil {
					r.Servers = append(r.Servers, netip.AddrPortFrom(a, 53).String())
				}
			}
		}
	}
	if len(r.Servers) == 0 {
		r.Servers = []string{"127.0.0.1:53", "[::1]:53"}
	}
	return r
}

// Lookup implements Lookup.
func (r *Resolver) Lookup(ctx context.Context, name string, typ dnsmessage.Type) (Answer, error) {
	cur := egresspolicy.Canonical(name)
	ans := Answer{Chain: []string{cur}}
	seen := map[string]bool{cur: true}
	for range maxQueries {
		msg, err := r.exchange(ctx, cur, typ)
		if err != nil {
			return ans, &net.DNSError{Err: err.Error(), Name: name, IsTemporary: true, IsTimeout: errors.Is(err, context.DeadlineExceeded) || isTimeout(err)}
		}
		asked := cur
		cnames, addrs := records(msg, typ)
		for {
			t, ok := cnames[cur]
			if !ok {
				break
			}
			if seen[t] || len(ans.Chain) >= maxChain {
				return ans, &net.DNSError{Err: "CNAME loop or chain longer than 16 names", Name: name}
			}
			seen[t] = true
			cur = t
			ans.Chain = append(ans.Chain, cur)
		}
		switch msg.RCode {
		case dnsmessage.RCodeSuccess:
		case dnsmessage.RCodeNameError:
			return ans, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
		default:
			return ans, &net.DNSError{Err: "server answered " + msg.RCode.String(), Name: name, IsTemporary: true}
		}
		if as := addrs[cur]; len(as) > 0 || cur == asked {
			ans.Addrs = as
			return ans, nil
		}
		// The chain ends at a name this answer has no records for (a
		// server that does not chase CNAMEs): ask for that name.
	}
	return ans, &net.DNSError{Err: "CNAME chain not resolved within 4 queries", Name: name}
}

// records indexes an answer section: each owner's CNAME target, and each
// owner's addresses of typ. Records of other classes or types are ignored.
func records(msg *dnsmessage.Message, typ dnsmessage.Type) (cnames map[string]string, addrs map[string][]netip.Addr) {
	cnames, addrs = map[string]string{}, map[string][]netip.Addr{}
	for _, rr := range msg.Answers {
		if rr.Header.Class != dnsmessage.ClassINET {
			continue
		}
		owner := egresspolicy.Canonical(rr.Header.Name.String())
		switch b := rr.Body.(type) {
		case *dnsmessage.CNAMEResource:
			if _, dup := cnames[owner]; !dup {
				cnames[owner] = egresspolicy.Canonical(b.CNAME.String())
			}
		case *dnsmessage.AResource:
			if typ == dnsmessage.TypeA {
				addrs[owner] = append(addrs[owner], netip.AddrFrom4(b.A))
			}
		case *dnsmessage.AAAAResource:
			if typ == dnsmessage.TypeAAAA {
				addrs[owner] = append(addrs[owner], netip.AddrFrom16(b.AAAA).Unmap())
			}
		}
	}
	return cnames, addrs
}

// exchange asks each server in turn until one answers: over UDP, and over
// TCP when the answer came truncated.
func (r *Resolver) exchange(ctx context.Context, name string, typ dnsmessage.Type) (*dnsmessage.Message, error) {
	q := dnsmessage.Question{Class: dnsmessage.ClassINET, Type: typ}
	var err error
	if q.Name, err = dnsmessage.NewName(name); err != nil {
		return nil, err
	}
	var errs []error
	for _, srv := range r.Servers {
		if ctx.Err() != nil {
			break
		}
		msg, err := exchangeWith(ctx, "udp", srv, q)
		if err == nil && msg.Truncated {
			msg, err = exchangeWith(ctx, "tcp", srv, q)
			if err == nil && msg.Truncated {
				err = errors.New("answer truncated over TCP")
			}
		}
		if err == nil {
			return msg, nil
		}
		errs = append(errs, err)
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	if len(errs) == 0 {
		return nil, errors.New("no nameserver configured")
	}
	return nil, errors.Join(errs...)
}

func exchangeWith(ctx context.Context, network, server string, q dnsmessage.Question) (*dnsmessage.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	var id [2]byte
	rand.Read(id[:])
	b := dnsmessage.NewBuilder(make([]byte, 2, 514), dnsmessage.Header{ID: binary.BigEndian.Uint16(id[:]), RecursionDesired: true})
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAdditionals()
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(udpSize, dnsmessage.RCodeSuccess, false); err != nil {
		return nil, err
	}
	b.OPTResource(opt, dnsmessage.OPTResource{})
	out, err := b.Finish()
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if network == "tcp" {
		binary.BigEndian.PutUint16(out, uint16(len(out)-2))
		if _, err := c.Write(out); err != nil {
			return nil, err
		}
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return nil, err
		}
		resp := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, resp); err != nil {
			return nil, err
		}
		return parseReply(resp, out[2:], q)
	}
	if _, err := c.Write(out[2:]); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// A datagram that is not the reply to this query (a late answer
		// to an earlier one, or a forgery) is skipped, as Go's resolver
		// does.
		if msg, err := parseReply(buf[:n], out[2:], q); err == nil {
			return msg, nil
		}
	}
}

// parseReply accepts only the reply to query: same ID, a response, the same
// one question.
func parseReply(resp, query []byte, q dnsmessage.Question) (*dnsmessage.Message, error) {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return nil, fmt.Errorf("malformed DNS reply: %w", err)
	}
	if !h.Response || h.ID != binary.BigEndian.Uint16(query) {
		return nil, errors.New("not the reply to this query")
	}
	if h.Truncated {
		// Asked again over TCP; what was cut need not parse.
		return &dnsmessage.Message{Header: h}, nil
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return nil, fmt.Errorf("malformed DNS reply: %w", err)
	}
	if len(m.Questions) != 1 || m.Questions[0].Type != q.Type || m.Questions[0].Class != q.Class ||
		!strings.EqualFold(m.Questions[0].Name.String(), q.Name.String()) {
		return nil, errors.New("reply to another question")
	}
	return &m, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
