package feasibility

import (
	"strings"
	"testing"
)

func TestSelectedIsFirstStrategyPassingEveryProof(t *testing.T) {
	m := &Matrix{}
	for _, p := range Proofs {
		m.Add(Result{Provider: "traefik-knative", Strategy: "endpointslice", Proof: p, Outcome: OutcomePass})
		out := OutcomePass
		if p == Proofs[1] {
			out = OutcomeFail
		}
		m.Add(Result{Provider: "traefik-knative", Strategy: "externalname", Proof: p, Outcome: out, Evidence: "status 404"})
		m.Add(Result{Provider: "kourier", Strategy: "externalname", Proof: p, Outcome: OutcomeSkipped, Evidence: "needs a container registry"})
	}
	sel := m.Selected()
	if sel["traefik-knative"] != "endpointslice" || len(sel) != 1 {
		t.Fatalf("Selected() = %v, want only traefik-knative: endpointslice", sel)
	}
	// Both passing: the seed's order wins.
	m2 := &Matrix{}
	for _, s := range []string{"endpointslice", "externalname"} {
		for _, p := range Proofs {
			m2.Add(Result{Provider: "kourier", Strategy: s, Proof: p, Outcome: OutcomePass})
		}
	}
	if got := m2.Selected()["kourier"]; got != "externalname" {
		t.Errorf("both pass: selected %q, want externalname (tried first)", got)
	}
	tab := m.Table()
	for _, want := range []string{"selected strategy for traefik-knative: endpointslice", "selected strategy for kourier: not measured", "status 404"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	// Missing a proof is not passing.
	m3 := &Matrix{}
	m3.Add(Result{Provider: "traefik-knative", Strategy: "endpointslice", Proof: Proofs[0], Outcome: OutcomePass})
	if _, ok := m3.Selected()["traefik-knative"]; ok {
		t.Error("a strategy with unmeasured proofs was selected")
	}
}
