// Package progress prints kind-style status lines for long work: one line
// when a step starts and one with its duration when it ends, so a person (or
// a CI log) can see where the time went.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Log is a line printer safe for concurrent steps.
type Log struct {
	mu  sync.Mutex
	out io.Writer
}

// New prints to out (os.Stderr when nil).
func New(out io.Writer) *Log {
	if out == nil {
		out = os.Stderr
	}
	return &Log{out: out}
}

// Printf prints one line.
func (l *Log) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, format+"\n", args...)
}

// Write lets a Log receive tool output.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Write(p)
}

// Step runs fn between a start line and an end line with its duration.
func (l *Log) Step(name string, fn func() error) error {
	start := time.Now()
	l.Printf(" • %s ...", name)
	err := fn()
	d := time.Since(start).Round(100 * time.Millisecond)
	if err != nil {
		l.Printf(" ✗ %s failed after %s: %v", name, d, err)
		return err
	}
	l.Printf(" ✓ %s (%s)", name, d)
	return nil
}
