package portability

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"lampyr.dev/serving/conformance/upstream"
)

// Results of one target in one check.
const (
	// ResultReference marks the reference's own column: it passed the
	// check's own assertions (a status, a count), or failed them.
	ResultReference = "reference"
	ResultSame      = "same"
	ResultDiffers   = "differs"
	// ResultError: the target gave no answer to compare.
	ResultError = "error"
	// ResultPass and ResultFail are a target's verdict in a check that
	// judges each target on its own (each ran its own way, unread
	// bodies).
	ResultPass = "pass"
	ResultFail = "FAIL"
	// ResultKnown: a difference the targets file declares (Targets.Known);
	// ResultStale: a declared one that did not happen (fails the check).
	ResultKnown = "known"
	ResultStale = "stale"
)

// TargetResult is one target's result in a check, beside the reference's.
type TargetResult struct {
	Target string `json:"target"`
	Result string `json:"result"`
	// Detail is the difference (-reference +target, naming the field), the
	// error, or why the target failed the check.
	Detail string `json:"detail,omitempty"`
}

// OK tells whether the target's result passes the check.
func (r TargetResult) OK() bool {
	return r.Result == ResultSame || r.Result == ResultPass || r.Result == ResultReference || r.Result == ResultKnown
}

// Check is one row of the report: a check, and each target's result.
type Check struct {
	Name     string         `json:"name"`
	Passed   bool           `json:"passed"`
	Detail   string         `json:"detail,omitempty"`
	Duration time.Duration  `json:"duration"`
	Targets  []TargetResult `json:"targets,omitempty"`
}

// NewCheck is a check from its targets' results (the reference first):
// passed when every one is OK and refProblem (the reference's own
// assertions) is empty.
func NewCheck(name string, d time.Duration, refProblem string, results []TargetResult) Check {
	c := Check{Name: name, Duration: d, Targets: results, Passed: refProblem == ""}
	var details []string
	if refProblem != "" {
		details = append(details, refProblem)
	}
	for i, r := range results {
		if i == 0 && r.Result == ResultReference && refProblem != "" {
			c.Targets[i].Result, c.Targets[i].Detail = ResultFail, refProblem
		}
		if !r.OK() {
			c.Passed = false
			if r.Detail != "" {
				details = append(details, r.Detail)
			} else {
				details = append(details, r.Target+": "+r.Result)
			}
		}
	}
	c.Detail = strings.Join(details, "\n")
	return c
}

// TargetFacts are what a ConformanceReport records of one target: the
// implementation (name, version, networking) and the cluster.
type TargetFacts struct {
	Name      string `json:"name"`
	Reference bool   `json:"reference,omitempty"`
	Profile   string `json:"profile"`
	// Mode is managed (a Kind cluster this run created or reused) or
	// external (a cluster given by kubeconfig).
	Mode           string                  `json:"mode"`
	Implementation upstream.Implementation `json:"implementation"`
	Cluster        upstream.Cluster        `json:"cluster"`
	Context        string                  `json:"context,omitempty"`
	Registry       string                  `json:"registry,omitempty"`
	Namespace      string                  `json:"namespace"`
}

// NWayReport is the proof's N-way report: every check with each target's
// result beside the reference's.
type NWayReport struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Date       time.Time     `json:"date"`
	Reference  string        `json:"reference"`
	Targets    []TargetFacts `json:"targets"`
	Checks     []Check       `json:"checks"`
	Passed     int           `json:"passed"`
	Total      int           `json:"total"`
	Seconds    float64       `json:"seconds"`
	// Result is success when every check passed, else failure.
	Result    string   `json:"result"`
	Reproduce []string `json:"reproduce,omitempty"`
}

// NewNWayReport totals the checks.
func NewNWayReport(ref string, facts []TargetFacts, checks []Check, total time.Duration) *NWayReport {
	r := &NWayReport{APIVersion: "portability.lampyr.dev/v1alpha1", Kind: "PortabilityReport", Date: time.Now().UTC(),
		Reference: ref, Targets: facts, Checks: checks, Total: len(checks), Seconds: total.Seconds(), Result: "success"}
	for _, c := range checks {
		if c.Passed {
			r.Passed++
		}
	}
	if r.Passed != r.Total {
		r.Result = "failure"
	}
	return r
}

// Write puts report.json and report.md into dir.
func (r *NWayReport) Write(dir string) error {
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), raw, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.Markdown()), 0o644)
}

// Markdown is the human report: the targets' facts, one column per target
// (the reference first), and each difference in full.
func (r *NWayReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Knative portability proof\n\n")
	for _, t := range r.Targets {
		role := ""
		if t.Reference {
			role = " (the reference)"
		}
		fmt.Fprintf(&b, "- %s%s: %s %s, %s profile; networking %s; Kubernetes %s (%d node(s)), %s; gateway %s, KUBECONFIG=%s",
			t.Name, role, t.Implementation.Name, t.Implementation.Version, t.Profile, t.Implementation.Networking,
			orUnknown(t.Cluster.KubernetesVersion), t.Cluster.Nodes, t.Mode, t.Cluster.Gateway, t.Cluster.Kubeconfig)
		if t.Context != "" {
			fmt.Fprintf(&b, " (context %s)", t.Context)
		}
		if t.Registry != "" {
			fmt.Fprintf(&b, "; registry %s", t.Registry)
		}
		b.WriteString("\n")
	}
	names := make([]string, len(r.Targets))
	for i, t := range r.Targets {
		names[i] = t.Name
		if t.Reference {
			names[i] += " (reference)"
		}
	}
	fmt.Fprintf(&b, "\n| check | %s | result | time |\n|---|%s---|---|\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)))
	for _, c := range r.Checks {
		cells := make([]string, len(r.Targets))
		for i, t := range r.Targets {
			cells[i] = "-"
			for _, tr := range c.Targets {
				if tr.Target == t.Name {
					cells[i] = tr.Result
				}
			}
		}
		res := "FAIL"
		if c.Passed {
			res = "pass"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Name, strings.Join(cells, " | "), res, c.Duration.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, "\n%d/%d checks passed in %s.\n", r.Passed, r.Total, (time.Duration(r.Seconds * float64(time.Second))).Round(time.Second))
	known := false
	for _, c := range r.Checks {
		for _, tr := range c.Targets {
			if tr.Result == ResultKnown {
				if !known {
					b.WriteString("\n## Known differences (declared in the targets file)\n\n")
					known = true
				}
				fmt.Fprintf(&b, "- %s, %s: %s\n", c.Name, tr.Target, tr.Detail)
			}
		}
	}
	for _, c := range r.Checks {
		if c.Passed || c.Detail == "" {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n", c.Name)
		for _, tr := range c.Targets {
			if !tr.OK() && tr.Detail != "" {
				fmt.Fprintf(&b, "%s (%s):\n\n```\n%s\n```\n\n", tr.Target, tr.Result, tr.Detail)
			}
		}
		if !strings.Contains(c.Detail, "```") && len(c.Targets) == 0 {
			fmt.Fprintf(&b, "```\n%s\n```\n", c.Detail)
		}
	}
	if len(r.Reproduce) > 0 {
		b.WriteString("\n## Reproduce\n\n```\n" + strings.Join(r.Reproduce, "\n") + "\n```\n")
	}
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
