package progress

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSummaryListsStepsSlowestFirst(t *testing.T) {
	var out bytes.Buffer
	l := New(&out)
	_ = l.Step("quick", func() error { return nil })
	_ = l.Step("slow", func() error { time.Sleep(30 * time.Millisecond); return nil })
	_ = l.Step("broken", func() error { time.Sleep(10 * time.Millisecond); return errors.New("no") })
	out.Reset()
	l.Summary("setup", 5*time.Millisecond)
	s := out.String()
	if !strings.HasPrefix(s, "setup: ") || !strings.Contains(s, "CPU") {
		t.Fatalf("summary head: %q", s)
	}
	slow, broken := strings.Index(s, "slow"), strings.Index(s, "broken (failed)")
	if slow < 0 || broken < 0 || slow > broken {
		t.Errorf("want slow before broken (failed): %q", s)
	}
	if strings.Contains(s, "quick") {
		t.Errorf("a step under the minimum is listed: %q", s)
	}
}
