package tenancy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// outcome is what one attack did on one side.
type outcome struct {
	ran      bool
	observed string
	refused  bool
	// err: the attack could not be carried out (or its control failed).
	err string
	// verdict is what a parity row compares between the sides (which
	// Services were Ready, whether the call answered): empty, refused.
	verdict string
}

// verdictOf is o's verdict for a parity comparison.
func (o outcome) verdictOf() string {
	if o.verdict != "" {
		return o.verdict
	}
	if o.refused {
		return "refused"
	}
	return "not refused"
}

// result is one row of the report.
type result struct {
	attack
	lampyr, stock outcome
}

var (
	resultsMu sync.Mutex
	results   []*result
)

func addResult(r *result) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	results = append(results, r)
}

// snapshotResults copies the rows for rendering.
func snapshotResults() []result {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	out := make([]result, len(results))
	for i, r := range results {
		out[i] = *r
	}
	return out
}

// parityDiffers: a parity row whose stock side ran came to another verdict
// than Lampyr (a stock side that did not run compares nothing).
func (r result) parityDiffers() (bool, string) {
	if !r.parity || r.appliesTo&onStock == 0 || !r.stock.ran || r.stock.err != "" || !r.lampyr.ran || r.lampyr.err != "" {
		return false, ""
	}
	l, s := r.lampyr.verdictOf(), r.stock.verdictOf()
	if l == s {
		return false, ""
	}
	return true, fmt.Sprintf("Lampyr %s, stock %s", l, s)
}

// lampyrCell: Lampyr must refuse every attack and pass every control, and
// agree with stock on a parity row.
func (r result) lampyrCell() string {
	o := r.lampyr
	differs, why := r.parityDiffers()
	switch {
	case r.appliesTo&onLampyr == 0:
		return "n/a"
	case !o.ran:
		return "not run"
	case o.err != "":
		return "NOT RUN: " + o.err
	case differs:
		return "PARITY FAILED (" + why + "): " + o.observed
	case r.control && o.refused:
		return "CONTROL FAILED: " + o.observed
	case r.control:
		return "ok: " + o.observed
	case o.refused:
		return "refused: " + o.observed
	}
	return "ESCAPED: " + o.observed
}

// stockCell: a reference; an attack that works there is reported as such.
func (r result) stockCell() string {
	o := r.stock
	switch {
	case r.appliesTo&onStock == 0:
		return "n/a"
	case !o.ran:
		return "not run"
	case o.err != "":
		return "not run: " + o.err
	case r.control:
		return o.observed
	case o.refused:
		return "refused: " + o.observed
	}
	return "reached: no defence in stock Knative (" + o.observed + ")"
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// renderReport is the Markdown report: header lines, then one row per
// attack.
func renderReport(header []string, rows []result) string {
	var b strings.Builder
	b.WriteString("# Hostile-tenant suite\n\n")
	for _, h := range header {
		b.WriteString(h + "\n")
	}
	escaped, notRun := 0, 0
	for _, r := range rows {
		if r.appliesTo&onLampyr == 0 {
			continue
		}
		differs, _ := r.parityDiffers()
		switch {
		case r.lampyr.err != "":
			notRun++
		case r.control == r.lampyr.refused || differs:
			escaped++
		}
	}
	fmt.Fprintf(&b, "\n%d rows; on Lampyr %d not refused (or control failed, or parity failed), %d not run.\n\n", len(rows), escaped, notRun)
	b.WriteString("| attack | expected | Lampyr observed | stock observed |\n|---|---|---|---|\n")
	var without []string
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.name), cell(r.expected), cell(r.lampyrCell()), cell(r.stockCell()))
		if r.withoutDefence != "" {
			without = append(without, fmt.Sprintf("- **%s**: %s", strings.Fields(r.name)[0], strings.Join(strings.Fields(r.withoutDefence), " ")))
		}
	}
	if len(without) > 0 {
		b.WriteString("\nHow each guard-rail row fails when its defence is removed:\n\n" + strings.Join(without, "\n") + "\n")
	}
	return b.String()
}

// reportHeader says when and against what the suite ran.
func reportHeader() []string {
	h := []string{fmt.Sprintf("Run %s. Tenants: %s (user %s) attacks %s (user %s); each holds only the namespace `edit` role, used through impersonation.",
		time.Now().UTC().Format(time.RFC3339), nsA, userA, nsB, userB)}
	for _, s := range the().sides {
		if s.podSecurity == nil {
			continue
		}
		var levels []string
		for _, ns := range []string{nsA, nsB} {
			levels = append(levels, ns+": "+s.podSecurity[ns])
		}
		line := fmt.Sprintf("- %s: Pod Security %s", s.name, strings.Join(levels, ", "))
		if s.backend != "" {
			line += "; fibers on the " + s.backend + " backend"
		}
		if s.err != nil {
			line += "; not set up: " + s.err.Error()
		}
		h = append(h, line)
	}
	h = append(h, "", "Lampyr must refuse every attack (a control row must pass); the stock column is a reference and never fails the suite, except on a parity row, where Lampyr must come to stock's verdict.")
	return h
}

// writeReport writes _artifacts/tenancy/report.md (after every attack, so a
// cut-short run still leaves one).
func writeReport() error {
	dir := suite.Artifacts()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(renderReport(reportHeader(), snapshotResults())), 0o644)
}
