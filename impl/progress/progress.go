// Package progress prints kind-style status lines for long work: one line
// when a step starts and one with its duration when it ends, so a person (or
// a CI log) can see where the time went; Summary lists the steps again at
// the end, slowest first.
package progress

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Log is a line printer safe for concurrent steps.
type Log struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
	steps []Record
}

// Record is one finished step.
type Record struct {
	Name     string
	Start    time.Time
	Duration time.Duration
	Err      bool
}

// New prints to out (os.Stderr when nil).
func New(out io.Writer) *Log {
	if out == nil {
		out = os.Stderr
	}
	return &Log{out: out, start: time.Now()}
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
	exact := time.Since(start)
	d := exact.Round(100 * time.Millisecond)
	l.mu.Lock()
	l.steps = append(l.steps, Record{Name: name, Start: start, Duration: exact, Err: err != nil})
	l.mu.Unlock()
	if err != nil {
		l.Printf(" ✗ %s failed after %s: %v", name, d, err)
		return err
	}
	l.Printf(" ✓ %s (%s)", name, d)
	return nil
}

// Steps are the finished steps, in the order they finished.
func (l *Log) Steps() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Record(nil), l.steps...)
}

// Summary prints where the time went since the Log was made: the wall
// time, the CPU this process and its finished children used (go build,
// debootstrap), and every step of at least min, slowest first. Steps
// overlap (inputs build beside each other), so they add up to more than
// the wall time.
func (l *Log) Summary(title string, min time.Duration) {
	wall := time.Since(l.start).Round(time.Second)
	var lines []string
	lines = append(lines, fmt.Sprintf("%s: %s wall, %s", title, wall, cpuLine(wall)))
	steps := l.Steps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].Duration > steps[j].Duration })
	for _, s := range steps {
		if s.Duration < min {
			continue
		}
		mark := ""
		if s.Err {
			mark = " (failed)"
		}
		lines = append(lines, fmt.Sprintf("   %8s  from +%-8s %s%s", s.Duration.Round(100*time.Millisecond), s.Start.Sub(l.start).Round(time.Second), s.Name, mark))
	}
	l.Printf("%s", strings.Join(lines, "\n"))
}

// cpuLine says how much CPU this process and its waited-for children used
// (user+system), and what that is in cores over wall.
func cpuLine(wall time.Duration) string {
	var self, kids syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) != nil || syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids) != nil {
		return "CPU unknown"
	}
	cpu := tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
	cores := 0.0
	if wall > 0 {
		cores = cpu.Seconds() / wall.Seconds()
	}
	return fmt.Sprintf("%s CPU (%.2f cores on average; steps, slowest first, with their start)", cpu.Round(time.Second), cores)
}

func tv(t syscall.Timeval) time.Duration {
	return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
}
