package server_test

import (
	"context"
	"testing"
	"time"

	"lampyr.dev/serving/impl/fiberd/fiberdtest"
)

// An acquisition's answer says how long fiberd took (acquireMicros): more
// than nothing and no more than the caller's whole round trip, so
// fiber-router can tell fiberd's share of a lease from the way there.
func TestAcquireSaysItsOwnTime(t *testing.T) {
	h := fiberdtest.StartInstance(t, fiberdtest.Options{Revision: "t-00001"})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		f, err := h.Client.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rt := time.Since(t0)
		if in := time.Duration(f.AcquireMicros) * time.Microsecond; f.AcquireMicros <= 0 || in > rt {
			t.Errorf("acquisition %d: fiberd says it took %v of a %v round trip", i, in, rt)
		}
		h.Client.Release(ctx, f.ID)
	}
}
