package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

// readyzIdle asks /readyz (no credential, as the grant controller does)
// and returns its IdleSecondsHeader.
func readyzIdle(t *testing.T, inst *fiberdtest.Instance) time.Duration {
	t.Helper()
	u := inst.Client.URL()
	u.Path = client.ReadyzPath
	resp, err := inst.Client.HTTP.Get(u.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d, want 200", resp.StatusCode)
	}
	d, ok, err := client.ParseIdleSeconds(resp.Header)
	if err != nil || !ok {
		t.Fatalf("/readyz header %s = %q: ok %v, %v", client.IdleSecondsHeader, resp.Header.Get(client.IdleSecondsHeader), ok, err)
	}
	return d
}

// /readyz says how long the Home has been idle: 0 while a fiber is leased,
// then growing; and with --warm-idle its warm pool is emptied after that
// long without a request (the Home stays ready) and refilled after the
// next acquisition.
func TestReadyzSaysHowLongTheHomeIsIdle(t *testing.T) {
	inst := fiberdtest.StartInstance(t, fiberdtest.Options{WarmFibers: 1, WarmIdle: 2 * time.Second})
	ctx := context.Background()
	readyzIdle(t, inst)
	f, err := inst.Client.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if d := readyzIdle(t, inst); d != 0 {
		t.Fatalf("idle %s with a fiber leased for 1.1 s, want 0", d)
	}
	// Idle from inside the release: measured from before it.
	releasing := time.Now()
	if err := inst.Client.Release(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "idle to reach 1 s", 3*time.Second, func() bool { return readyzIdle(t, inst) >= time.Second })
	if d := readyzIdle(t, inst); d > time.Since(releasing) {
		t.Fatalf("idle %s, %s after the release began", d, time.Since(releasing))
	}

	// --warm-idle 2 s: the warm fiber ends, readiness stays.
	warm := func() int {
		l, err := inst.Client.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range l.Fibers {
			if f.State == client.StateWarm {
				n++
			}
		}
		return n
	}
	// The pool counts it just after it takes the fibers off its list.
	waitFor(t, "the warm pool emptied and counted", 5*time.Second, func() bool {
		return warm() == 0 && inst.Metric(t, "fiberd_warm_pool_emptied_total") >= 1
	})
	if d := readyzIdle(t, inst); d < 2*time.Second {
		t.Errorf("idle %s once the warm pool was emptied after 2 s idle", d)
	}
	if _, err := inst.Client.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the warm pool refilled", 10*time.Second, func() bool { return warm() == 1 })
}
