package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

// A Home Pod being deleted (SIGTERM): fiberd starts no fiber any more and
// is no longer ready, so fiber-router holds new requests for the
// replacement Home, while a request under way runs to its end; Drain
// returns once it has.
func TestDrainFinishesRequestsUnderWayAndStartsNoFiber(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "fresh"})
	c := inst.Client
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		body   string
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://app.example.com/sleep?ms=1500", nil)
		resp, err := c.Do(req, f.ID)
		if err != nil {
			done <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{status: resp.StatusCode, body: string(b)}
	}()
	// The request is under way once fiberd counts it.
	deadline := time.Now().Add(10 * time.Second)
	for inst.Server.Active() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the proxied request never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	drained := make(chan int64, 1)
	start := time.Now()
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		drained <- inst.Server.Drain(dctx)
	}()
	time.Sleep(100 * time.Millisecond)

	_, err = c.Acquire(ctx)
	var fe *client.Error
	if !errors.As(err, &fe) || fe.Status != http.StatusServiceUnavailable || fe.Reason != contract.ReasonNotReady || !strings.Contains(fe.Message, "shutting down") {
		t.Fatalf("acquire while draining: %v, want 503 NotReady saying the Home is shutting down", err)
	}
	if err := c.Ready(ctx); err == nil {
		t.Fatal("/readyz answered ready while draining")
	}
	select {
	case left := <-drained:
		t.Fatalf("Drain returned after %s with %d under way, before the request ended", time.Since(start), left)
	default:
	}
	a := <-done
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, "slept") {
		t.Fatalf("the request under way: %d %q %v, want 200 slept", a.status, a.body, a.err)
	}
	select {
	case left := <-drained:
		if left != 0 {
			t.Fatalf("Drain returned with %d under way", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last request ended")
	}
}

// SIGTERM first hands over: while fiber-router still asks, the Home serves
// new fibers and stays ready (its Pod stays Ready, so the grant controller
// keeps naming it until the replacement is Ready); once nothing is asked
// for the quiet period, Handover returns and Drain refuses new fibers.
func TestHandoverServesWhileFibersAreAskedFor(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "fresh"})
	c := inst.Client
	ctx := context.Background()
	ended := make(chan time.Duration, 1)
	go func() { ended <- inst.Server.Handover(ctx, 20*time.Second, 500*time.Millisecond) }()
	for i := 0; i < 8; i++ {
		f, err := c.Acquire(ctx)
		if err != nil {
			t.Fatalf("acquisition %d during the handover: %v", i, err)
		}
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("/readyz during the handover: %v", err)
		}
		_ = c.Release(ctx, f.ID)
		select {
		case d := <-ended:
			t.Fatalf("Handover ended after %s while fibers were still asked for", d)
		case <-time.After(150 * time.Millisecond):
		}
	}
	select {
	case d := <-ended:
		if d >= 20*time.Second {
			t.Fatalf("Handover ran to its bound (%s), not to the quiet period", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Handover did not end once nothing was asked")
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	go inst.Server.Drain(dctx)
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Acquire(ctx); err == nil {
		t.Fatal("acquired a fiber after the handover, while draining")
	}
}

// A fresh fiber leased just before SIGTERM is used right after: Drain waits
// for its request instead of exiting under it.
func TestDrainWaitsForAFiberLeasedAndNotYetUsed(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{Mode: "fresh"})
	c := inst.Client
	ctx := context.Background()
	f, err := c.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan int64, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		drained <- inst.Server.Drain(dctx)
	}()
	select {
	case left := <-drained:
		t.Fatalf("Drain returned (%d left) with a fiber leased and not yet used", left)
	case <-time.After(300 * time.Millisecond):
	}
	req, _ := http.NewRequest(http.MethodGet, "http://app.example.com/", nil)
	resp, err := c.Do(req, f.ID)
	if err != nil {
		t.Fatalf("the leased fiber's request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the leased fiber's request: %d", resp.StatusCode)
	}
	select {
	case left := <-drained:
		if left != 0 {
			t.Fatalf("Drain returned with %d under way", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the leased fiber served its request")
	}
}
