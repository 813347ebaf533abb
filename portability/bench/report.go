// Package bench is the side-by-side performance report of stock Knative and
// Lampyr on the paired clusters (`just bench-portability`): latency
// statistics, a closed-loop load generator, and the JSON, markdown and
// self-contained HTML (SVG) renderings. The Ginkgo suite takes the
// measurements on real clusters.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Sample is a set of latencies (and outcomes) of one measurement on one side.
type Sample struct {
	Latencies []time.Duration `json:"-"`
	Millis    []float64       `json:"latenciesMs"`
	Errors    int             `json:"errors"`
	// Unfinished counts requests still running when the load window ended
	// (not in Latencies): a side that completes nothing shows it here.
	Unfinished int           `json:"unfinished"`
	Codes      map[int]int   `json:"codes"`
	Duration   time.Duration `json:"durationNanos"`
}

// Add records one request.
func (s *Sample) Add(d time.Duration, code int) {
	s.Latencies = append(s.Latencies, d)
	s.Millis = append(s.Millis, float64(d.Microseconds())/1000)
	if s.Codes == nil {
		s.Codes = map[int]int{}
	}
	s.Codes[code]++
	if code != 200 {
		s.Errors++
	}
}

// Percentile returns the p-th percentile (0-100), nearest rank.
func (s *Sample) Percentile(p float64) time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	d := append([]time.Duration(nil), s.Latencies...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	rank := int(math.Ceil(p / 100 * float64(len(d))))
	if rank < 1 {
		rank = 1
	}
	return d[rank-1]
}

// Mean is the mean latency (0 for an empty sample).
func (s *Sample) Mean() time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	var t time.Duration
	for _, d := range s.Latencies {
		t += d
	}
	return t / time.Duration(len(s.Latencies))
}

// Throughput is successful requests per second over the sample's duration.
func (s *Sample) Throughput() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(len(s.Latencies)-s.Errors) / s.Duration.Seconds()
}

// Load runs a closed loop of concurrency workers against do for d and
// returns the sample.
func Load(ctx context.Context, concurrency int, d time.Duration, do func(ctx context.Context) (int, error)) *Sample {
	s := &Sample{}
	var mu sync.Mutex
	// start before the deadline is set, so the window measured is never
	// shorter than d (it was, by a hair: a flaky unit test in CI).
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				code, err := do(ctx)
				el := time.Since(t0)
				if ctx.Err() != nil && err != nil {
					mu.Lock()
					s.Unfinished++ // cut by the end of the window
					mu.Unlock()
					return
				}
				if err != nil {
					code = -1
				}
				mu.Lock()
				s.Add(el, code)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.Duration = time.Since(start)
	return s
}

// GetFunc returns a request function for GET gateway+path with host.
func GetFunc(client *http.Client, gateway, host, path string) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, gateway+path, nil)
		if err != nil {
			return 0, err
		}
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
}

// Row is one line of the report: a metric measured on both sides.
type Row struct {
	Group  string  `json:"group"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Stock  float64 `json:"stock"`
	Lampyr float64 `json:"lampyr"`
	// Goal is the target for lampyr/stock, e.g. "<= 1.0"; empty: none.
	Goal string `json:"goal,omitempty"`
	Note string `json:"note,omitempty"`
	// Load is the machine's load average when the figure was taken (the
	// machines differ up to 3x; a figure without its load says little).
	Load string `json:"load,omitempty"`
}

// Ratio is lampyr/stock (NaN when stock is 0 or less: an idle-cost row
// whose stock difference came out below zero, its noise, has no ratio; a
// negative one judged "<= 1.0" met while Lampyr's cost was 3.1 millicores
// a Service against stock's -0.7, 2026-12-07).
func (r Row) Ratio() float64 {
	if r.Stock <= 0 {
		return math.NaN()
	}
	return r.Lampyr / r.Stock
}

// Met reports whether the ratio meets Goal ("<= x" or ">= x"); ok is false
// when there is no goal or no ratio.
func (r Row) Met() (met, ok bool) {
	var op string
	var x float64
	if _, err := fmt.Sscanf(r.Goal, "%s %g", &op, &x); err != nil || math.IsNaN(r.Ratio()) {
		return false, false
	}
	switch op {
	case "<=":
		return r.Ratio() <= x, true
	case ">=":
		return r.Ratio() >= x, true
	}
	return false, false
}

// Results is the whole run.
type Results struct {
	Machine map[string]string  `json:"machine"`
	Started time.Time          `json:"started"`
	Rows    []Row              `json:"rows"`
	Samples map[string]*Sample `json:"samples"` // "<measurement>/<side>"
	// Breakdown splits Lampyr's latency by hop (from its routers' metrics).
	Breakdown []Row `json:"breakdown,omitempty"`
	// Timelines are the apply -> Ready samples, one per Service and side,
	// each milestone in ms after the apply.
	Timelines []Timeline `json:"timelines,omitempty"`
}

// Timeline is one apply -> Ready sample: when each milestone was first
// seen after the apply (ms), on one side.
type Timeline struct {
	Side    string             `json:"side"`
	Service string             `json:"service"`
	At      map[string]float64 `json:"atMs"`
	Load    string             `json:"load,omitempty"`
}

// Verdict splits the rows that have a goal into those that meet it and
// those that do not (or could not be measured).
func (r *Results) Verdict() (met, missed []Row) {
	for _, row := range r.Rows {
		if row.Goal == "" {
			continue
		}
		if m, ok := row.Met(); ok && m {
			met = append(met, row)
		} else {
			missed = append(missed, row)
		}
	}
	return met, missed
}

// milestoneOrder lists the milestones the timelines hold, in the order a
// Revision passes them (the known ones first, then any other by name).
func (r *Results) milestoneOrder() []string {
	seen := map[string]bool{}
	for _, t := range r.Timelines {
		for k := range t.At {
			seen[k] = true
		}
	}
	var out []string
	for _, m := range AllMilestones {
		if seen[m] {
			out = append(out, m)
			delete(seen, m)
		}
	}
	rest := make([]string, 0, len(seen))
	for k := range seen {
		rest = append(rest, k)
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// AllMilestones are the apply -> Ready milestones, in order, of both sides
// (the grant's are Lampyr's alone; stock's Pod is its Revision's first).
var AllMilestones = []string{
	"Revision created", "grant Admitted", "Pod scheduled", "Pod started", "Pod Ready",
	"grant HomeReady", "Revision ResourcesAvailable", "Revision Ready", "Service Ready", "first response",
}

// JSON renders the report.
func (r *Results) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// Markdown renders the summary table.
func (r *Results) Markdown() string {
	var b strings.Builder
	keys := make([]string, 0, len(r.Machine))
	for k := range r.Machine {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(&b, "# Stock Knative vs Lampyr, same machine, same Service\n\n")
	met, missed := r.Verdict()
	fmt.Fprintf(&b, "**Verdict: %d of %d goals met.**", len(met), len(met)+len(missed))
	if len(missed) > 0 {
		var names []string
		for _, row := range missed {
			names = append(names, row.Group+" "+row.Metric)
		}
		fmt.Fprintf(&b, " Not met: %s.", strings.Join(names, "; "))
	}
	b.WriteString("\n\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Machine[k])
	}
	fmt.Fprintf(&b, "\n| group | metric | stock | lampyr | lampyr/stock | goal | met | load |\n|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		ratio := "n/a"
		if !math.IsNaN(row.Ratio()) {
			ratio = fmt.Sprintf("%.3g", row.Ratio())
		}
		met := ""
		if m, ok := row.Met(); ok {
			met = map[bool]string{true: "yes", false: "no"}[m]
		}
		metric := row.Metric
		if row.Note != "" {
			metric += " (" + row.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Group, metric, fmtVal(row.Stock, row.Unit), fmtVal(row.Lampyr, row.Unit), ratio, row.Goal, met, row.Load)
	}
	if len(r.Timelines) > 0 {
		order := r.milestoneOrder()
		fmt.Fprintf(&b, "\n## apply -> Ready, every sample (ms after the apply)\n\n| side | Service | %s | load |\n|---|---|%s---|\n", strings.Join(order, " | "), strings.Repeat("---|", len(order)))
		for _, t := range r.Timelines {
			cells := make([]string, len(order))
			for i, m := range order {
				if v, ok := t.At[m]; ok {
					cells[i] = fmt.Sprintf("%.0f", v)
				} else {
					cells[i] = "-"
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Side, t.Service, strings.Join(cells, " | "), t.Load)
		}
	}
	if len(r.Breakdown) > 0 {
		fmt.Fprintf(&b, "\n## Where Lampyr's time goes (mean per request)\n\n| phase | part | lampyr |\n|---|---|---|\n")
		for _, row := range r.Breakdown {
			part := row.Metric
			if row.Note != "" {
				part += " (" + row.Note + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", row.Group, part, fmtVal(row.Lampyr, row.Unit))
		}
	}
	return b.String()
}

func fmtVal(v float64, unit string) string {
	switch {
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f %s", v, unit)
	default:
		return fmt.Sprintf("%.3g %s", v, unit)
	}
}

// HTML renders a self-contained page a platform engineer reads in a
// minute: the verdict first, each goal's figure against its target, every
// figure with the machine's load, the apply -> Ready timeline of every
// sample, and both sides' latency distributions (log-scale CDFs with ticks
// and units).
func (r *Results) HTML() string {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=\"utf-8\"><title>Stock Knative vs Lampyr</title>")
	b.WriteString("<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}td.l,th.l{text-align:left}.met{background:#e6f4e6}.missed{background:#fbe3e3}.verdict{font-size:1.4em;padding:.5em 1em;border-radius:6px;display:inline-block}svg{border:1px solid #ddd;margin:.5em 0}details{margin:1em 0}small{color:#555}</style></head><body>")
	b.WriteString("<h1>Stock Knative vs Lampyr: same machine, same Service</h1>")
	met, missed := r.Verdict()
	cls := "met"
	if len(missed) > 0 {
		cls = "missed"
	}
	fmt.Fprintf(&b, "<p class=\"verdict %s\">%d of %d goals met</p>", cls, len(met), len(met)+len(missed))
	b.WriteString("<h2>Goals</h2><table><tr><th class=l>figure</th><th>stock</th><th>lampyr</th><th>lampyr/stock</th><th>goal</th><th class=l>machine load</th></tr>")
	for _, row := range append(append([]Row(nil), missed...), met...) {
		c := "missed"
		if m, ok := row.Met(); ok && m {
			c = "met"
		}
		fmt.Fprintf(&b, "<tr class=%s><td class=l>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class=l>%s</td></tr>", c,
			html.EscapeString(row.Group+": "+row.Metric+noteSuffix(row.Note)), fmtVal(row.Stock, row.Unit), fmtVal(row.Lampyr, row.Unit), ratioText(row), html.EscapeString(row.Goal), html.EscapeString(row.Load))
	}
	b.WriteString("</table>")
	if len(r.Timelines) > 0 {
		b.WriteString("<h2>apply &rarr; Ready, every sample</h2><p><small>Each dot is one sample's milestone, in seconds after the apply; the bar is the median.</small></p>")
		b.WriteString(timelineSVG(r.Timelines, r.milestoneOrder()))
	}
	names := map[string]bool{}
	for k := range r.Samples {
		names[strings.SplitN(k, "/", 2)[0]] = true
	}
	ms := make([]string, 0, len(names))
	for n := range names {
		ms = append(ms, n)
	}
	sort.Strings(ms)
	if len(ms) > 0 {
		// Not for a run without latency samples (the scale or footprint
		// spec alone): a heading over nothing.
		b.WriteString("<h2>Latency distributions</h2><p><small>Cumulative share of requests answered within x ms (log scale): <span style=\"color:#d62728\">stock</span>, <span style=\"color:#1f77b4\">lampyr</span>.</small></p>")
	}
	for _, m := range ms {
		// A measurement of one side only (Lampyr's egress modes) has no
		// CDF pair to draw.
		if r.Samples[m+"/stock"] == nil && r.Samples[m+"/lampyr"] == nil {
			continue
		}
		fmt.Fprintf(&b, "<h3>%s</h3>%s", html.EscapeString(m), cdfSVG(r.Samples[m+"/stock"], r.Samples[m+"/lampyr"], r.Samples[m+"/floor"]))
	}
	b.WriteString("<h2>Every figure</h2><table><tr><th class=l>group</th><th class=l>metric</th><th>stock</th><th>lampyr</th><th>lampyr/stock</th><th>goal</th><th class=l>load</th></tr>")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "<tr><td class=l>%s</td><td class=l>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class=l>%s</td></tr>", html.EscapeString(row.Group), html.EscapeString(row.Metric+noteSuffix(row.Note)), fmtVal(row.Stock, row.Unit), fmtVal(row.Lampyr, row.Unit), ratioText(row), html.EscapeString(row.Goal), html.EscapeString(row.Load))
	}
	b.WriteString("</table>")
	if len(r.Breakdown) > 0 {
		b.WriteString("<h2>Where Lampyr's time goes</h2><table><tr><th class=l>phase</th><th class=l>part</th><th>lampyr</th></tr>")
		for _, row := range r.Breakdown {
			fmt.Fprintf(&b, "<tr><td class=l>%s</td><td class=l>%s</td><td>%s</td></tr>", html.EscapeString(row.Group), html.EscapeString(row.Metric+noteSuffix(row.Note)), fmtVal(row.Lampyr, row.Unit))
		}
		b.WriteString("</table>")
	}
	keys := make([]string, 0, len(r.Machine))
	for k := range r.Machine {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("<h2>Machine</h2><ul>")
	for _, k := range keys {
		fmt.Fprintf(&b, "<li>%s: %s</li>", html.EscapeString(k), html.EscapeString(r.Machine[k]))
	}
	b.WriteString("</ul></body></html>\n")
	return b.String()
}

func noteSuffix(n string) string {
	if n == "" {
		return ""
	}
	return " (" + n + ")"
}

func ratioText(row Row) string {
	if math.IsNaN(row.Ratio()) {
		return "n/a"
	}
	return fmt.Sprintf("%.3g", row.Ratio())
}

// logTicks are the 1-2-5 values of each decade between lo and hi, or
// every whole multiple of the decade when fewer than three fall there.
func logTicks(lo, hi float64) []float64 {
	ticks := func(ms []float64) []float64 {
		var out []float64
		for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
			for _, m := range ms {
				if v := d * m; v >= lo && v <= hi {
					out = append(out, v)
				}
			}
		}
		return out
	}
	if out := ticks([]float64{1, 2, 5}); len(out) >= 3 {
		return out
	}
	// A narrow range (apply -> Ready: 1.3-3.5 s had the one tick "2s"):
	// every whole multiple of the decade.
	return ticks([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9})
}

func tickLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	default:
		return fmt.Sprintf("%gµs", v*1000)
	}
}

// durLabel is a latency in ms, three significant figures, in its unit.
func durLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.3gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%.3gms", v)
	default:
		return fmt.Sprintf("%.3gµs", v*1000)
	}
}

// cdfSVG draws both sides' cumulative latency distributions (and a floor
// when the measurement has one), with x ticks
// (ms, log scale) and y ticks (share of requests).
func cdfSVG(stock, lampyr, floor *Sample) string {
	const w, h, pad = 720.0, 260.0, 48.0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range []*Sample{stock, lampyr, floor} {
		if s == nil {
			continue
		}
		for _, v := range s.Millis {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		return "<p>(no samples)</p>"
	}
	if hi <= lo {
		hi = lo * 10
	}
	x := func(v float64) float64 {
		return pad + (math.Log10(math.Max(v, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(w-2*pad)
	}
	y := func(f float64) float64 { return h - pad - f*(h-2*pad) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, w, h)
	for _, t := range logTicks(lo, hi) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, x(t), pad, x(t), h-pad, x(t), h-pad+14, tickLabel(t))
	}
	for _, f := range []float64{0, .25, .5, .75, 1} {
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" font-size="10" text-anchor="end">%g%%</text>`, pad, y(f), w-pad, y(f), pad-4, y(f)+3, f*100)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11" text-anchor="middle">latency (log scale)</text>`, w/2, h-8)
	for i, s := range []*Sample{stock, lampyr, floor} {
		if s == nil || len(s.Millis) == 0 {
			continue
		}
		vs := append([]float64(nil), s.Millis...)
		sort.Float64s(vs)
		var pts []string
		for j, v := range vs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(v), y(float64(j+1)/float64(len(vs)))))
		}
		color, name := "#d62728", "stock"
		switch i {
		case 1:
			color, name = "#1f77b4", "lampyr"
		case 2:
			// The cold rows' floor: the handler fork+exec'd on the host.
			color, name = "#7f7f7f", "floor: plain fork+exec"
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" fill="%s">%s (n=%d, p50 %s)</text>`, pad+10, 16+float64(i)*16, color, name, len(vs), durLabel(vs[(len(vs)-1)/2]))
	}
	b.WriteString("</svg>")
	return b.String()
}

// timelineSVG draws every sample's milestones, one lane per milestone and
// side, with a tick per second after the apply.
func timelineSVG(ts []Timeline, order []string) string {
	const w, lane, left, pad = 720.0, 16.0, 230.0, 24.0
	hi := 0.0
	for _, t := range ts {
		for _, v := range t.At {
			hi = math.Max(hi, v)
		}
	}
	if hi <= 0 {
		return "<p>(no milestones)</p>"
	}
	hi = math.Ceil(hi/1000) * 1000
	x := func(v float64) float64 { return left + v/hi*(w-left-pad) }
	var lanes [][2]string
	for _, m := range order {
		for _, side := range []string{"stock", "lampyr"} {
			for _, t := range ts {
				if _, ok := t.At[m]; ok && t.Side == side {
					lanes = append(lanes, [2]string{m, side})
					break
				}
			}
		}
	}
	h := pad*2 + lane*float64(len(lanes))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, w, h)
	step := 1000.0
	if hi > 20000 {
		step = 5000
	}
	for v := 0.0; v <= hi; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%gs</text>`, x(v), pad, x(v), h-pad, x(v), h-pad+14, v/1000)
	}
	for i, l := range lanes {
		yy := pad + lane*float64(i) + lane/2
		color := "#d62728"
		if l[1] == "lampyr" {
			color = "#1f77b4"
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end" fill="%s">%s: %s</text>`, left-6, yy+4, color, l[1], html.EscapeString(l[0]))
		var vs []float64
		for _, t := range ts {
			if v, ok := t.At[l[0]]; ok && t.Side == l[1] {
				vs = append(vs, v)
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s" fill-opacity="0.5"/>`, x(v), yy, color)
			}
		}
		sort.Float64s(vs)
		med := vs[(len(vs)-1)/2]
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="2"/>`, x(med), yy-6, x(med), yy+6)
	}
	b.WriteString("</svg>")
	return b.String()
}

// Merge adds o's requests to s.
func (s *Sample) Merge(o *Sample) {
	s.Latencies = append(s.Latencies, o.Latencies...)
	s.Millis = append(s.Millis, o.Millis...)
	if s.Codes == nil {
		s.Codes = map[int]int{}
	}
	for c, n := range o.Codes {
		s.Codes[c] += n
	}
	s.Errors += o.Errors
	s.Unfinished += o.Unfinished
	s.Duration += o.Duration
}
