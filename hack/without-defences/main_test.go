package main

import (
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		status, message, want string
		ok                    bool
	}{
		{"passed", "", "PASSED", false},
		{"failed", `attack "G6 Home processes" succeeded on Lampyr: ...`, "fails, as it must", true},
		{"failed", `parity row "G1a quota": Lampyr differs from stock`, "fails, as it must", true},
		{"failed", `control "G2a NetworkPolicy" failed on Lampyr (no answer (connect)): the refusals it backs prove nothing`, "fails, as it must", true},
		{"failed", "G7: could not be carried out on Lampyr, so it proves nothing", "inconclusive", false},
		{"failed", "A BeforeSuite node failed", "inconclusive", false},
	} {
		got, ok := verdict(c.status, c.message)
		if ok != c.ok || !strings.HasPrefix(got, c.want) {
			t.Errorf("verdict(%q, %q) = %q, %t; want %q..., %t", c.status, c.message, got, ok, c.want, c.ok)
		}
	}
}
