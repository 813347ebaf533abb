// Package feasibility is the Revision backend feasibility gate (seed 000):
// for each networking provider and each backend strategy Lampyr can give a
// Revision's Service, it proves on a real Lampyr cluster whether the
// unchanged upstream Route reconciler and the gateway reach fiber-router
// through it, and selects, per provider, the first strategy that passes
// every proof. This file holds the result matrix; the Ginkgo suite fills it.
package feasibility

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Strategies in the order the seed tries them.
var Strategies = []string{"externalname", "endpointslice"}

// Proofs, in order; a strategy is selected only if it passes all of them.
var Proofs = []string{
	"1 KIngress Ready",
	"2 50/50 split",
	"3 handler sees its Revision",
	"4 tag selects its Revision",
	"5 HTTP, stream, WebSocket",
	"6a recovers after rollout restart",
	"6b recovers after all router pods deleted",
}

// Outcome of one proof.
const (
	OutcomePass    = "pass"
	OutcomeFail    = "FAIL"
	OutcomeSkipped = "skipped"
)

// Result is one cell of the matrix.
type Result struct {
	Provider string        `json:"provider"`
	Strategy string        `json:"strategy"`
	Proof    string        `json:"proof"`
	Outcome  string        `json:"outcome"`
	Evidence string        `json:"evidence"`
	Duration time.Duration `json:"durationNanos"`
	// Recovery is the time to the first good response (proof 6).
	Recovery time.Duration `json:"recoveryNanos,omitempty"`
}

// Matrix collects results; safe for concurrent use.
type Matrix struct {
	mu      sync.Mutex
	Results []Result `json:"results"`
	// Providers describes each measured provider (what ran, with versions).
	Providers map[string]string `json:"providers,omitempty"`
}

// SetProvider records what a provider name stood for in this run.
func (m *Matrix) SetProvider(name, description string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Providers == nil {
		m.Providers = map[string]string{}
	}
	m.Providers[name] = description
}

// Add records a result.
func (m *Matrix) Add(r Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Results = append(m.Results, r)
}

// Selected returns, per provider, the first strategy (in Strategies order)
// whose every proof passed; providers with none are absent.
func (m *Matrix) Selected() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	passed := map[string]map[string]int{}
	for _, r := range m.Results {
		if passed[r.Provider] == nil {
			passed[r.Provider] = map[string]int{}
		}
		if r.Outcome == OutcomePass {
			passed[r.Provider][r.Strategy]++
		}
	}
	out := map[string]string{}
	for prov, byStrategy := range passed {
		for _, s := range Strategies {
			if byStrategy[s] == len(Proofs) {
				out[prov] = s
				break
			}
		}
	}
	return out
}

// JSON is the matrix with the selection.
func (m *Matrix) JSON() ([]byte, error) {
	sel := m.Selected()
	m.mu.Lock()
	defer m.mu.Unlock()
	return json.MarshalIndent(struct {
		Providers map[string]string `json:"providers,omitempty"`
		Results   []Result          `json:"results"`
		Selected  map[string]string `json:"selected"`
	}{m.Providers, m.Results, sel}, "", "  ")
}

// Table renders the matrix for the test output.
func (m *Matrix) Table() string {
	sel := m.Selected()
	m.mu.Lock()
	rs := append([]Result(nil), m.Results...)
	descs := map[string]string{}
	for k, v := range m.Providers {
		descs[k] = v
	}
	m.mu.Unlock()
	order := map[string]int{}
	for i, p := range Proofs {
		order[p] = i
	}
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Provider != rs[j].Provider {
			return rs[i].Provider < rs[j].Provider
		}
		if rs[i].Strategy != rs[j].Strategy {
			return strategyIndex(rs[i].Strategy) < strategyIndex(rs[j].Strategy)
		}
		return order[rs[i].Proof] < order[rs[j].Proof]
	})
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tSTRATEGY\tPROOF\tRESULT\tTIME\tEVIDENCE")
	for _, r := range rs {
		t := r.Duration.Round(100 * time.Millisecond).String()
		if r.Recovery > 0 {
			t += fmt.Sprintf(" (first good response after %s)", r.Recovery.Round(10*time.Millisecond))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Provider, r.Strategy, r.Proof, r.Outcome, t, oneLine(r.Evidence))
	}
	tw.Flush()
	provs := map[string]bool{}
	for _, r := range rs {
		provs[r.Provider] = true
	}
	names := make([]string, 0, len(provs))
	for p := range provs {
		names = append(names, p)
	}
	sort.Strings(names)
	measured := map[string]bool{}
	for _, r := range rs {
		if r.Outcome != OutcomeSkipped {
			measured[r.Provider] = true
		}
	}
	for _, p := range names {
		if d := descs[p]; d != "" {
			fmt.Fprintf(&b, "%s: %s\n", p, d)
		}
	}
	for _, p := range names {
		if !measured[p] {
			fmt.Fprintf(&b, "selected strategy for %s: not measured (skipped, see evidence)\n", p)
			continue
		}
		if s, ok := sel[p]; ok {
			fmt.Fprintf(&b, "selected strategy for %s: %s\n", p, s)
		} else {
			fmt.Fprintf(&b, "selected strategy for %s: none (no strategy passed every proof)\n", p)
		}
	}
	return b.String()
}

func strategyIndex(s string) int {
	for i, x := range Strategies {
		if x == s {
			return i
		}
	}
	return len(Strategies)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}
