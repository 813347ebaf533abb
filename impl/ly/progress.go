package ly

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Output modes of the progress display.
const (
	OutputTerminal = "terminal" // symbols, for people at a terminal
	OutputPlain    = "plain"    // one plain line per event, for logs and CI
	OutputJSON     = "json"     // one JSON object per event, for scripts
)

// Progress shows the phases of a command (artifact verification, template
// sealing, the Service's configuration...) with their elapsed times.
type Progress struct {
	w     io.Writer
	mode  string
	now   func() time.Time
	start time.Time
	mu    sync.Mutex
}

// Event is one line of --output json.
type Event struct {
	Time    string  `json:"time"`
	Phase   string  `json:"phase"`
	Event   string  `json:"event"` // start, detail, done, failed, warning, result
	Message string  `json:"message,omitempty"`
	Elapsed float64 `json:"elapsedSeconds,omitempty"`
	Fields  any     `json:"fields,omitempty"`
}

// NewProgress writes to w in mode; now is the clock (nil: time.Now).
func NewProgress(w io.Writer, mode string, now func() time.Time) *Progress {
	if now == nil {
		now = time.Now
	}
	return &Progress{w: w, mode: mode, now: now, start: now()}
}

// Phase is a running phase.
type Phase struct {
	p     *Progress
	name  string
	start time.Time
}

// Phase runs fn as a named phase, printing its start, details and outcome.
func (p *Progress) Phase(name string, fn func(ph *Phase) error) error {
	ph := &Phase{p: p, name: name, start: p.now()}
	p.emit(name, "start", "", 0, nil)
	err := fn(ph)
	el := p.now().Sub(ph.start)
	if err != nil {
		p.emit(name, "failed", err.Error(), el, nil)
		return err
	}
	p.emit(name, "done", "", el, nil)
	return nil
}

// Detail prints a line inside the phase.
func (ph *Phase) Detail(format string, a ...any) {
	ph.p.emit(ph.name, "detail", fmt.Sprintf(format, a...), ph.p.now().Sub(ph.start), nil)
}

// Warn prints a warning that does not stop the command.
func (p *Progress) Warn(format string, a ...any) {
	p.emit("", "warning", fmt.Sprintf(format, a...), 0, nil)
}

// Result prints the command's outcome (and, in JSON, its fields).
func (p *Progress) Result(msg string, fields any) {
	p.emit("", "result", msg, p.now().Sub(p.start), fields)
}

func (p *Progress) emit(phase, event, msg string, el time.Duration, fields any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	secs := el.Round(100 * time.Millisecond).Seconds()
	switch p.mode {
	case OutputJSON:
		b, _ := json.Marshal(Event{Time: p.now().UTC().Format(time.RFC3339), Phase: phase, Event: event, Message: msg, Elapsed: secs, Fields: fields})
		fmt.Fprintln(p.w, string(b))
	case OutputTerminal:
		switch event {
		case "start":
			fmt.Fprintf(p.w, "• %s ...\n", phase)
		case "detail":
			fmt.Fprintf(p.w, "  %s\n", msg)
		case "done":
			fmt.Fprintf(p.w, "✓ %s (%s)\n", phase, fmtSecs(secs))
		case "failed":
			fmt.Fprintf(p.w, "✗ %s (%s): %s\n", phase, fmtSecs(secs), msg)
		case "warning":
			fmt.Fprintf(p.w, "! %s\n", msg)
		case "result":
			fmt.Fprintf(p.w, "%s (%s)\n", msg, fmtSecs(secs))
		}
	default:
		switch event {
		case "start":
			fmt.Fprintf(p.w, "[%s] started\n", phase)
		case "detail":
			fmt.Fprintf(p.w, "[%s] %s\n", phase, msg)
		case "done":
			fmt.Fprintf(p.w, "[%s] done in %s\n", phase, fmtSecs(secs))
		case "failed":
			fmt.Fprintf(p.w, "[%s] FAILED after %s: %s\n", phase, fmtSecs(secs), msg)
		case "warning":
			fmt.Fprintf(p.w, "warning: %s\n", msg)
		case "result":
			fmt.Fprintf(p.w, "%s (total %s)\n", msg, fmtSecs(secs))
		}
	}
}

func fmtSecs(s float64) string { return fmt.Sprintf("%.1fs", s) }
