package prober

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Report is what a Prober saw.
type Report struct {
	// Phases in the order the suite named them.
	Phases []string
	// Rows: one per phase, side, Service and kind that saw traffic.
	Rows []Row
	// Failures, in the order they happened.
	Failures []Failure
	// Duration from Start to Stop.
	Duration time.Duration
}

// Row counts one phase of one target's traffic of one kind. Sent counts
// attempts that ended in the phase: requests, stream chunks (and streams
// that failed) and WebSocket echoes (and connections that failed).
type Row struct {
	Phase   string
	Side    string
	Service string
	Kind    Kind
	Sent    int
	Failed  int
	// LongestGap is the longest time without an answer that ended in
	// this phase (or, in the last phase, was still open at Stop).
	LongestGap time.Duration
}

// Failed is every failure of side (all sides: "").
func (r Report) Failed(side string) int {
	n := 0
	for _, row := range r.Rows {
		if side == "" || row.Side == side {
			n += row.Failed
		}
	}
	return n
}

// Markdown is the report as a table (phase x side x Service x kind:
// sent, failed, longest gap), then the failures, at most maxFailures of
// them (0: all).
func (r Report) Markdown(maxFailures int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| phase | side | Service | kind | sent | failed | longest gap without an answer |\n|---|---|---|---|---:|---:|---:|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %s |\n", row.Phase, row.Side, row.Service, row.Kind, row.Sent, row.Failed, row.LongestGap.Round(time.Millisecond))
	}
	if len(r.Failures) == 0 {
		b.WriteString("\nNo failures.\n")
		return b.String()
	}
	fmt.Fprintf(&b, "\n%d failures:\n\n", len(r.Failures))
	for i, f := range r.Failures {
		if maxFailures > 0 && i == maxFailures {
			fmt.Fprintf(&b, "- ... %d more\n", len(r.Failures)-i)
			break
		}
		status := ""
		if f.Status != 0 {
			status = fmt.Sprintf(" (status %d)", f.Status)
		}
		fmt.Fprintf(&b, "- %s %s %s/%s %s%s: %s\n", f.At.UTC().Format("15:04:05.000"), f.Phase, f.Side, f.Service, f.Kind, status, f.Err)
	}
	return b.String()
}

// JSON is the report for machines.
func (r Report) JSON() ([]byte, error) {
	type row struct {
		Row
		LongestGapMs int64 `json:"longestGapMs"`
	}
	out := struct {
		Phases     []string  `json:"phases"`
		Rows       []row     `json:"rows"`
		Failures   []Failure `json:"failures"`
		DurationMs int64     `json:"durationMs"`
	}{Phases: r.Phases, Failures: r.Failures, DurationMs: r.Duration.Milliseconds()}
	for _, x := range r.Rows {
		out.Rows = append(out.Rows, row{Row: x, LongestGapMs: x.LongestGap.Milliseconds()})
	}
	return json.MarshalIndent(out, "", "  ")
}
