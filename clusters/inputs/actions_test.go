package inputs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"lampyr.dev/serving/impl/progress"
)

// recorded is an action that notes its name when it runs and fails when
// told to.
type recorded struct {
	name string
	err  error
	ran  *[]string
	mu   *sync.Mutex
}

func (r recorded) Name() string { return r.name }

func (r recorded) Execute(ctx context.Context, _ *buildState) error {
	r.mu.Lock()
	*r.ran = append(*r.ran, r.name)
	r.mu.Unlock()
	return r.err
}

func TestRunActionsInOrderUntilTheFirstError(t *testing.T) {
	var out strings.Builder
	log := progress.New(&out)
	var ran []string
	mu := &sync.Mutex{}
	act := func(name string, err error) action { return recorded{name: name, err: err, ran: &ran, mu: mu} }
	boom := errors.New("boom")
	s := &buildState{b: &Builder{Log: log}}
	err := runActions(context.Background(), log, s, []action{
		act("first", nil),
		concurrently{"both at once", []action{act("left", nil), act("right", nil)}},
		act("fails", boom),
		act("never", nil),
	})
	if !errors.Is(err, boom) {
		t.Fatalf("runActions: %v, want the failing action's error", err)
	}
	if got := strings.Join(ran, ","); got != "first,left,right,fails" && got != "first,right,left,fails" {
		t.Errorf("ran %s, want first, left and right (either order), fails, and nothing after", got)
	}
	for _, line := range []string{" ✓ first (", " ✓ both at once (", " ✓ left (", " ✓ right (", " ✗ fails failed after "} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("progress lacks %q:\n%s", line, out.String())
		}
	}
	if strings.Contains(out.String(), "never") {
		t.Errorf("an action after a failure printed progress:\n%s", out.String())
	}
}

func TestConcurrentlyReturnsAChildsError(t *testing.T) {
	var ran []string
	mu := &sync.Mutex{}
	boom := errors.New("boom")
	s := &buildState{b: &Builder{Log: progress.New(&strings.Builder{})}}
	c := concurrently{"pair", []action{recorded{name: "ok", ran: &ran, mu: mu}, recorded{name: "bad", err: boom, ran: &ran, mu: mu}}}
	if err := c.Execute(context.Background(), s); !errors.Is(err, boom) {
		t.Errorf("concurrently: %v, want the failing child's error", err)
	}
}

func TestBuildActionsAreNamed(t *testing.T) {
	seen := map[string]bool{}
	var walk func([]action)
	walk = func(as []action) {
		for _, a := range as {
			if a.Name() == "" || seen[a.Name()] {
				t.Errorf("action %T has an empty or repeated name %q", a, a.Name())
			}
			seen[a.Name()] = true
			if c, ok := a.(concurrently); ok {
				walk(c.actions)
			}
		}
	}
	walk(buildActions())
	if len(seen) != 8 {
		t.Errorf("%d named actions, want 8 (six steps, two of them side by side)", len(seen))
	}
}
