package bench

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentilesAndRatios(t *testing.T) {
	s := &Sample{}
	for i := 1; i <= 100; i++ {
		s.Add(time.Duration(i)*time.Millisecond, 200)
	}
	if got := s.Percentile(50); got != 50*time.Millisecond {
		t.Errorf("p50 = %s", got)
	}
	if got := s.Percentile(99); got != 99*time.Millisecond {
		t.Errorf("p99 = %s", got)
	}
	r := Row{Stock: 200, Lampyr: 1, Goal: "<= 0.01"}
	if m, ok := r.Met(); !ok || !m {
		t.Errorf("1/200 <= 0.01: met=%v ok=%v", m, ok)
	}
	if m, ok := (Row{Stock: 1, Lampyr: 2, Goal: "<= 1.0"}).Met(); !ok || m {
		t.Error("2/1 <= 1.0 reported met")
	}
	if _, ok := (Row{Stock: 0, Lampyr: 2, Goal: "<= 1.0"}).Met(); ok {
		t.Error("a ratio over zero must not be judged")
	}
	if m, ok := (Row{Stock: -0.716, Lampyr: 3.11, Goal: "<= 1.0"}).Met(); ok || m {
		t.Errorf("a ratio over a negative stock figure judged: met=%v ok=%v", m, ok)
	}
	res := Results{Rows: []Row{{Metric: "idle CPU", Stock: -0.716, Lampyr: 3.11, Goal: "<= 1.0"}}}
	if met, missed := res.Verdict(); len(met) != 0 || len(missed) != 1 {
		t.Errorf("verdict over a negative stock figure: met %d, missed %d", len(met), len(missed))
	}
	if !math.IsNaN((Row{}).Ratio()) {
		t.Error("0/0 ratio must be NaN")
	}
}

func TestLoadCountsErrorsAndStops(t *testing.T) {
	var n atomic.Int64
	s := Load(context.Background(), 2, 200*time.Millisecond, func(ctx context.Context) (int, error) {
		time.Sleep(5 * time.Millisecond)
		if n.Add(1)%2 == 0 {
			return 503, nil
		}
		return 200, nil
	})
	if len(s.Latencies) == 0 || s.Errors == 0 || s.Codes[200] == 0 {
		t.Errorf("sample %+v", s.Codes)
	}
	if s.Duration < 200*time.Millisecond || s.Duration > 2*time.Second {
		t.Errorf("duration %s", s.Duration)
	}
}

func TestRenderings(t *testing.T) {
	r := &Results{Machine: map[string]string{"cpus": "2"}, Samples: map[string]*Sample{}}
	a, b := &Sample{}, &Sample{}
	a.Add(300*time.Millisecond, 200)
	b.Add(2*time.Millisecond, 200)
	r.Samples["cold/stock"], r.Samples["cold/lampyr"] = a, b
	r.Rows = append(r.Rows, Row{Group: "cold request", Metric: "p50", Unit: "ms", Stock: 300, Lampyr: 2, Goal: "<= 0.01"})
	md := r.Markdown()
	for _, want := range []string{"| cold request | p50 | 300 ms | 2.00 ms | 0.00667 | <= 0.01 | yes |", "- cpus: 2"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	h := r.HTML()
	if !strings.Contains(h, "<svg") || !strings.Contains(h, "polyline") || !strings.Contains(h, "lampyr (n=1") {
		t.Errorf("html lacks the CDF plot:\n%s", h)
	}
	if _, err := r.JSON(); err != nil {
		t.Fatal(err)
	}
}

func TestBreakdownRowsAndRendering(t *testing.T) {
	// 10 requests, 60 ms in the routers of which 20 ms leasing 2 fibers;
	// clients saw 10 ms each.
	rows := breakdownRows("Lampyr warm c=1", 10, routerTotals{reqSum: 0.060, acqSum: 0.020, reqCount: 10, acqCount: 2})
	want := map[string]float64{"client mean": 10, "before the router (gateway, Service hop)": 4, "fiber lease per request": 2, "router -> Home -> handler and back": 4}
	for _, r := range rows {
		if w, ok := want[r.Metric]; !ok || math.Abs(r.Lampyr-w) > 1e-9 {
			t.Errorf("%s = %v, want %v", r.Metric, r.Lampyr, w)
		}
	}
	if got := breakdownRows("x", 1, routerTotals{}); len(got) != 1 || !strings.Contains(got[0].Note, "no request") {
		t.Errorf("empty totals: %+v", got)
	}
	r := &Results{Breakdown: rows}
	if md := r.Markdown(); !strings.Contains(md, "Where Lampyr's time goes") || !strings.Contains(md, "fiber lease per request") {
		t.Errorf("markdown lacks the breakdown:\n%s", md)
	}
	if h := r.HTML(); !strings.Contains(h, "router -&gt; Home -&gt; handler and back") {
		t.Error("html lacks the breakdown")
	}
	s := &Sample{}
	s.Add(time.Millisecond, 200)
	s.Add(3*time.Millisecond, 200)
	if s.Mean() != 2*time.Millisecond {
		t.Errorf("mean = %s", s.Mean())
	}
}

func TestTimelineRowsAndRendering(t *testing.T) {
	ts := []Timeline{
		{Side: "lampyr", Service: "ready-0", At: map[string]float64{"Revision created": 100, "grant Admitted": 300, "Revision Ready": 5000}},
		{Side: "lampyr", Service: "ready-1", At: map[string]float64{"Revision created": 300, "Revision Ready": 4000}},
		{Side: "lampyr", Service: "ready-2", At: map[string]float64{"Revision created": 200}},
		{Side: "stock", Service: "ready-0", At: map[string]float64{"Revision created": 50, "Revision Ready": 3000}},
	}
	rows := timelineRows(ts)
	byMetric := map[string]Row{}
	for _, r := range rows {
		byMetric[r.Metric] = r
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3 (the milestones seen): %+v", len(rows), rows)
	}
	if r := byMetric["Revision created"]; r.Lampyr != 200 || r.Stock != 50 || r.Note != "seen in 1/1 stock, 3/3 lampyr samples" {
		t.Errorf("created: %+v", r)
	}
	if r := byMetric["Revision Ready"]; r.Lampyr != 4000 || r.Note != "seen in 1/1 stock, 2/3 lampyr samples" {
		t.Errorf("ready (lower median of 4 s, 5 s): %+v", r)
	}
	if r := byMetric["grant Admitted"]; r.Stock != 0 || r.Lampyr != 300 {
		t.Errorf("admitted: %+v", r)
	}
	res := &Results{Timelines: ts, Rows: append(rows, Row{Group: "g", Metric: "m", Stock: 1, Lampyr: 2, Goal: "<= 0.5", Load: "1.5"})}
	md := res.Markdown()
	for _, want := range []string{"**Verdict: 0 of 1 goals met.** Not met: g m.", "| lampyr | ready-0 | 100 | 300 | 5000 |", "| stock | ready-0 | 50 | - | 3000 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	h := res.HTML()
	for _, want := range []string{"0 of 1 goals met", "lampyr: grant Admitted", "<circle"} {
		if !strings.Contains(h, want) {
			t.Errorf("html lacks %q", want)
		}
	}
}

func TestLogTicks(t *testing.T) {
	got := logTicks(1.5, 120)
	want := []float64{2, 5, 10, 20, 50, 100}
	if len(got) != len(want) {
		t.Fatalf("ticks %v, want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("ticks %v, want %v", got, want)
		}
	}
	if got := logTicks(1300, 3500); len(got) != 2 || got[0] != 2000 || got[1] != 3000 {
		t.Errorf("ticks of 1.3-3.5 s %v, want [2000 3000]", got)
	}
	if tickLabel(2000) != "2s" || tickLabel(5) != "5ms" || tickLabel(0.5) != "500µs" {
		t.Error("tick labels")
	}
}
