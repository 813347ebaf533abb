//go:build linux

package helper

import "testing"

// The profile assembles on this architecture: every name it keeps exists
// and every condition is valid.
func TestSeccompProfileAssembles(t *testing.T) {
	f, err := seccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := f.Policy.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	if !f.NoNewPrivs || len(prog) < 100 {
		t.Fatalf("filter: no_new_privs %t, %d instructions", f.NoNewPrivs, len(prog))
	}
	for _, g := range SeccompGroups {
		if g.Why == "" {
			t.Errorf("a group without its reason: %v", g.Names)
		}
	}
}
