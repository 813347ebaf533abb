package metrics

import (
	"testing"
	"time"
)

func series(t *testing.T, m *Metrics, name string) int {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

func TestObserverAndForget(t *testing.T) {
	m := New()
	o := m.Revision("demo", "a-00001")
	o.Acquired(time.Millisecond, 700*time.Microsecond)
	o.Acquired(time.Millisecond, 0) // fiberd did not say: no in-fiberd sample
	o.Released()
	o.Leaked()
	o.QueueDepth(1)
	m.Requests.WithLabelValues("demo", "a-00001", "200").Inc()
	m.Revision("demo", "b-00001").Acquired(time.Millisecond, 600*time.Microsecond)

	mfs, _ := m.Registry.Gather()
	var live float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "lampyr_router_fibers_live" {
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "revision" && l.GetValue() == "a-00001" {
						live = s.GetGauge().GetValue()
					}
				}
			}
		}
	}
	if live != 0 {
		t.Fatalf("live = %v after 2 acquired, 1 released, 1 leaked; want 0", live)
	}
	for _, mf := range mfs {
		if mf.GetName() == "lampyr_router_fiber_acquire_in_fiberd_seconds" {
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "revision" && l.GetValue() == "a-00001" {
						if h := s.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 0.0007 {
							t.Errorf("a-00001's in-fiberd time: %d samples, sum %v; want the one fiberd reported, 0.0007", h.GetSampleCount(), h.GetSampleSum())
						}
					}
				}
			}
		}
	}
	m.Forget("demo", "a-00001")
	for _, name := range []string{"lampyr_router_fibers_acquired_total", "lampyr_router_fiber_acquire_seconds", "lampyr_router_fiber_acquire_in_fiberd_seconds", "lampyr_router_fibers_live"} {
		if n := series(t, m, name); n != 1 {
			t.Fatalf("%s has %d series after forgetting a-00001, want only b-00001's", name, n)
		}
	}
	if n := series(t, m, "lampyr_router_requests_total"); n != 0 {
		t.Fatalf("requests_total kept %d series", n)
	}
}
