//go:build linux

package helper

import (
	"testing"
	"time"
)

func TestReadySteps(t *testing.T) {
	for _, tc := range []struct {
		line  string
		ok    bool
		steps []ReadyStep
	}{
		{"ready\n", true, nil},
		{"ready root=410 lo=52 exec=1200 confined=30 listen=2100\n", true, []ReadyStep{
			{StepRoot, 410 * time.Microsecond}, {StepLoopback, 52 * time.Microsecond}, {StepExec, 1200 * time.Microsecond},
			{StepConfined, 30 * time.Microsecond}, {StepListen, 2100 * time.Microsecond}}},
		// Fields that do not parse are left out; the line still says ready.
		{"ready root=x lo=-1 exec\n", true, nil},
		{"ready", false, nil},                 // no newline: cut short
		{"readyish\n", false, nil},            // not the ready line
		{"error: ready root=1\n", false, nil}, // a failure
		{"failed: {}\n", false, nil},
	} {
		steps, ok := ReadySteps(tc.line)
		if ok != tc.ok || len(steps) != len(tc.steps) {
			t.Errorf("ReadySteps(%q) = %v, %v; want %v, %v", tc.line, steps, ok, tc.steps, tc.ok)
			continue
		}
		for i := range steps {
			if steps[i] != tc.steps[i] {
				t.Errorf("ReadySteps(%q)[%d] = %v, want %v", tc.line, i, steps[i], tc.steps[i])
			}
		}
	}
}
