package fetchq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// fetcher answers keys: "slow/..." only when its context ends, "fail/..."
// with an error, anything else with the key itself; it counts calls.
type fetcher struct {
	mu    sync.Mutex
	calls map[string]int
	// gate, if set, holds "gated/..." keys until closed.
	gate chan struct{}
}

func (f *fetcher) fetch(ctx context.Context, key string) (string, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[key]++
	f.mu.Unlock()
	switch {
	case strings.HasPrefix(key, "slow/"):
		<-ctx.Done()
		return "", ctx.Err()
	case strings.HasPrefix(key, "gated/"):
		select {
		case <-f.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	case strings.HasPrefix(key, "fail/"):
		return "", errors.New("registry says no")
	}
	return "value of " + key, nil
}

func (f *fetcher) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[key]
}

// notes collects notifications.
type notes chan types.NamespacedName

func (n notes) notify(w types.NamespacedName) { n <- w }

func (n notes) wait(t *testing.T, want types.NamespacedName, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case got := <-n:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("%s was not notified within %s", want, within)
		}
	}
}

func nn(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

// TestATarpitDelaysOnlyItsNamespace: namespace a names registries that
// never answer; b's key is fetched at once, and a's attempts run one at a
// time, each ended by the timeout.
func TestATarpitDelaysOnlyItsNamespace(t *testing.T) {
	f := &fetcher{}
	n := make(notes, 16)
	q := New(t.Context(), f.fetch, n.notify, Options{Timeout: 300 * time.Millisecond})

	if r := q.Get(nn("a", "r1"), "slow/1"); r.State != Pending || r.Ahead != 0 {
		t.Fatalf("a's first key: %+v, want Pending, nothing ahead", r)
	}
	if r := q.Get(nn("a", "r2"), "slow/2"); r.State != Pending || r.Ahead != 1 {
		t.Fatalf("a's second key: %+v, want Pending behind one", r)
	}
	start := time.Now()
	if r := q.Get(nn("b", "r"), "fast"); r.State != Pending {
		t.Fatalf("b's key: %+v, want Pending", r)
	}
	n.wait(t, nn("b", "r"), 100*time.Millisecond)
	if r := q.Get(nn("b", "r"), "fast"); r.State != Done || r.Value != "value of fast" {
		t.Fatalf("b's key after the notification: %+v", r)
	}
	t.Logf("b answered in %s while a's registry hung", time.Since(start))
	if f.count("slow/2") != 0 {
		t.Error("a's second attempt ran beside its first: want one at a time per namespace")
	}

	n.wait(t, nn("a", "r1"), 2*time.Second)
	r := q.Get(nn("a", "r1"), "slow/1")
	var te *TimeoutError
	if r.State != Failed || !errors.As(r.Err, &te) || r.Err.Error() != "no answer within 300ms" {
		t.Fatalf("a's hung key after its timeout: %+v, want Failed with a TimeoutError", r)
	}
	n.wait(t, nn("a", "r2"), 2*time.Second)
	if got := time.Since(start); got < 550*time.Millisecond {
		t.Errorf("a's two hung keys ended after %s, want one timeout after the other", got)
	}
}

func TestBackoffAndCache(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	f := &fetcher{}
	n := make(notes, 16)
	q := New(t.Context(), f.fetch, n.notify, Options{Backoff: 10 * time.Second, MaxBackoff: 25 * time.Second, Clock: clk})
	w := nn("a", "r")

	want := []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second}
	for i, backoff := range want {
		if r := q.Get(w, "fail/x"); r.State != Pending || (i > 0 && r.Err == nil) {
			t.Fatalf("attempt %d: %+v, want Pending (with the last error after the first)", i+1, r)
		}
		n.wait(t, w, time.Second)
		r := q.Get(w, "fail/x")
		if r.State != Failed || r.Err == nil || !r.RetryAt.Equal(clk.Now().Add(backoff)) {
			t.Fatalf("attempt %d: %+v, want Failed, retry in %s", i+1, r, backoff)
		}
		// Before RetryAt nothing runs.
		clk.SetTime(r.RetryAt.Add(-time.Millisecond))
		if r := q.Get(w, "fail/x"); r.State != Failed || f.count("fail/x") != i+1 {
			t.Fatalf("before RetryAt: %+v after %d calls, want Failed and no new attempt", r, f.count("fail/x"))
		}
		clk.SetTime(r.RetryAt)
	}

	// A success is kept: no second call.
	q.Get(w, "ok")
	n.wait(t, w, time.Second)
	for range 3 {
		if r := q.Get(w, "ok"); r.State != Done || r.Value != "value of ok" {
			t.Fatalf("cached success: %+v", r)
		}
	}
	if f.count("ok") != 1 {
		t.Errorf("a cached success was fetched %d times", f.count("ok"))
	}
}

func TestBoundedQueueAndCache(t *testing.T) {
	f := &fetcher{gate: make(chan struct{})}
	n := make(notes, 64)
	q := New(t.Context(), f.fetch, n.notify, Options{MaxQueued: 2, MaxCached: 2})
	w := nn("a", "r")
	q.Get(w, "gated/running")
	q.Get(w, "gated/1")
	q.Get(w, "gated/2")
	if r := q.Get(w, "gated/3"); r.State != Failed || !errors.Is(r.Err, ErrBusy) {
		t.Fatalf("a third waiting key: %+v, want ErrBusy", r)
	}
	// Another namespace is not affected.
	if r := q.Get(nn("b", "r"), "gated/b"); r.State != Pending {
		t.Fatalf("b beside a full a: %+v", r)
	}
	close(f.gate)
	for i := 0; i < 4; i++ {
		<-n
	}
	q.mu.Lock()
	kept := len(q.results)
	q.mu.Unlock()
	if kept != 2 {
		t.Errorf("%d results kept, want MaxCached 2", kept)
	}

	// The least recently used result goes first.
	q = New(t.Context(), f.fetch, n.notify, Options{MaxCached: 2})
	for _, k := range []string{"k1", "k2"} {
		q.Get(w, k)
		n.wait(t, w, time.Second)
	}
	q.Get(w, "k1")
	q.Get(w, "k3")
	n.wait(t, w, time.Second)
	if r := q.Get(w, "k1"); r.State != Done {
		t.Errorf("k1, used last, was evicted: %+v", r)
	}
	if r := q.Get(w, "k2"); r.State != Pending {
		t.Errorf("k2, used least recently, was kept: %+v", r)
	}
}

// TestAnAnswerServesEveryNamespace: b's attempt, queued behind b's own
// slow key, finds a's fresh answer for the same key and does not fetch.
func TestAnAnswerServesEveryNamespace(t *testing.T) {
	f := &fetcher{gate: make(chan struct{})}
	n := make(notes, 16)
	q := New(t.Context(), f.fetch, n.notify, Options{})
	q.Get(nn("b", "first"), "gated/b")
	q.Get(nn("b", "second"), "shared")
	q.Get(nn("a", "r"), "shared")
	n.wait(t, nn("a", "r"), time.Second)
	close(f.gate)
	n.wait(t, nn("b", "second"), time.Second)
	if r := q.Get(nn("b", "second"), "shared"); r.State != Done {
		t.Fatalf("b's key: %+v", r)
	}
	if got := f.count("shared"); got != 1 {
		t.Errorf("shared fetched %d times, want once", got)
	}
	q.mu.Lock()
	left := len(q.namespaces)
	q.mu.Unlock()
	if left != 0 {
		t.Errorf("%d idle namespaces kept, want none", left)
	}
}
