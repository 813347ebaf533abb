package egresspolicy

import (
	"net/netip"
	"testing"
)

var testPolicy = &Policy{
	Domains:   []string{"svc.cluster.local"},
	DenyNames: []string{"kubernetes.default.svc.cluster.local", ".lampyr-system.svc.cluster.local"},
	Allow:     []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("127.0.0.0/8")},
	Deny:      []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")},
}

func TestNameAllowed(t *testing.T) {
	for name, want := range map[string]bool{
		"backend.ns.svc.cluster.local":                 true,
		"Backend.NS.svc.cluster.local.":                true,
		"svc.cluster.local":                            false, // the suffix itself
		"kubernetes.default.svc.cluster.local.":        false,
		"fiber-router.lampyr-system.svc.cluster.local": false,
		"lampyr-system.svc.cluster.local":              false,
		"evil.svc.cluster.local.example.com":           false,
		"example.com":                                  false,
		"a..svc.cluster.local":                         false,
		"":                                             false,
	} {
		if got := testPolicy.NameAllowed(name); got != want {
			t.Errorf("NameAllowed(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestAddrAllowed(t *testing.T) {
	for a, want := range map[string]bool{
		"10.96.12.7":        true,
		"10.96.0.1":         false, // Deny
		"127.0.0.1":         false, // AlwaysDenied wins over Allow
		"169.254.169.254":   false,
		"10.244.0.5":        false, // outside Allow
		"100.127.255.1":     false, // the fiber network
		"::ffff:10.96.12.7": true,
	} {
		if got := testPolicy.AddrAllowed(netip.MustParseAddr(a)); got != want {
			t.Errorf("AddrAllowed(%s) = %v, want %v", a, got, want)
		}
	}
}
