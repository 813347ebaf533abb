// Package egresspolicy is the fibers' egress policy: which names a fiber
// may resolve and which addresses it may connect to. The grant controller
// and config-lampyr parse it, fiberd enforces it (impl/fiberd/egress); it
// lives with the other trust libraries so the control plane need not import
// fiberd.
package egresspolicy

import (
	"fmt"
	"net/netip"
	"strings"
)

// Policy says which names a fiber may resolve and which addresses it may
// connect to. The zero Policy allows nothing.
type Policy struct {
	// Domains are the DNS suffixes a fiber may resolve, e.g.
	// "svc.cluster.local" (every Service of the cluster, by its cluster
	// DNS name). A name outside all of them is answered NXDOMAIN.
	Domains []string
	// DenyNames are names, or suffixes written ".suffix", a fiber may not
	// resolve even inside Domains, e.g. "kubernetes.default.svc.cluster.local"
	// or ".lampyr-system.svc.cluster.local".
	DenyNames []string
	// Allow are the address ranges a fiber may connect to (after resolving
	// a name to them), e.g. the cluster's Service CIDR.
	Allow []netip.Prefix
	// Deny are ranges refused even inside Allow (the Kubernetes API's
	// ClusterIP, the node, the Home). AlwaysDenied is refused on top.
	Deny []netip.Prefix
	// SearchNamespace is the fiber's namespace: its resolv.conf searches
	// <ns>.svc.<domain>, svc.<domain> and <domain>, as a Pod's does.
	SearchNamespace string
	// ClusterDomain is the cluster's DNS domain, default "cluster.local".
	ClusterDomain string
}

// AlwaysDenied are refused whatever the policy: loopback (the Home's own
// ports, fiberd's API), link-local (cloud metadata), unspecified,
// multicast and broadcast, and the fiber network's own range.
var AlwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
	FiberNet,
}

// FiberNet is the fiber side of the point-to-point link: the fiber's own
// address FiberAddr and its resolver ResolverAddr. Traffic to it never
// leaves fiberd.
var (
	FiberNet     = netip.MustParsePrefix("100.127.255.0/30")
	ResolverAddr = netip.MustParseAddr("100.127.255.1")
	FiberAddr    = netip.MustParseAddr("100.127.255.2")
)

// Canonical lower-cases a DNS name and gives it one trailing dot.
func Canonical(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".") + "."
}

// NameAllowed says whether a fiber may resolve name.
func (p *Policy) NameAllowed(name string) bool {
	n := Canonical(name)
	if n == "." || strings.Contains(n, "..") {
		return false
	}
	for _, d := range p.DenyNames {
		if strings.HasPrefix(d, ".") {
			if suffix := Canonical(d[1:]); n == suffix || strings.HasSuffix(n, "."+suffix) {
				return false
			}
		} else if n == Canonical(d) {
			return false
		}
	}
	for _, d := range p.Domains {
		if suffix := Canonical(d); strings.HasSuffix(n, "."+suffix) {
			return true
		}
	}
	return false
}

// AddrAllowed says whether a fiber may connect to a.
func (p *Policy) AddrAllowed(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() {
		return false
	}
	for _, d := range AlwaysDenied {
		if d.Contains(a) {
			return false
		}
	}
	for _, d := range p.Deny {
		if d.Contains(a) {
			return false
		}
	}
	for _, r := range p.Allow {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// ResolvConf is the fiber's /etc/resolv.conf under this policy: the
// resolver's address and a Pod's search path.
func (p *Policy) ResolvConf() string {
	cd := p.ClusterDomain
	if cd == "" {
		cd = "cluster.local"
	}
	search := "svc." + cd + " " + cd
	if p.SearchNamespace != "" {
		search = p.SearchNamespace + ".svc." + cd + " " + search
	}
	return fmt.Sprintf("# fiber egress: fiberd's restricted resolver (docs/networking.md, \"Service bindings\")\nnameserver %s\nsearch %s\noptions ndots:5\n", ResolverAddr, search)
}

// ParsePrefixes parses a comma-separated list of CIDRs or addresses (an
// address is its own /32 or /128); flag names the setting in errors.
func ParsePrefixes(flag, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		pf, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is neither an address nor a CIDR (write e.g. 10.96.0.0/12)", flag, f)
		}
		out = append(out, pf.Masked())
	}
	return out, nil
}
