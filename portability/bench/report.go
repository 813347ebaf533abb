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
}

// Ratio is lampyr/stock (NaN when stock is 0).
func (r Row) Ratio() float64 {
	if r.Stock == 0 {
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
	for _, k := range keys {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Machine[k])
	}
	fmt.Fprintf(&b, "\n| group | metric | stock | lampyr | lampyr/stock | goal | met |\n|---|---|---|---|---|---|---|\n")
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
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", row.Group, metric, fmtVal(row.Stock, row.Unit), fmtVal(row.Lampyr, row.Unit), ratio, row.Goal, met)
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

// HTML renders a self-contained page: the table and, per measurement with
// latencies, an SVG of both sides' latency CDFs.
func (r *Results) HTML() string {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=\"utf-8\"><title>Stock Knative vs Lampyr</title>")
	b.WriteString("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}svg{border:1px solid #ddd;margin:1em 0}</style></head><body>")
	b.WriteString("<h1>Stock Knative vs Lampyr</h1><ul>")
	keys := make([]string, 0, len(r.Machine))
	for k := range r.Machine {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "<li>%s: %s</li>", html.EscapeString(k), html.EscapeString(r.Machine[k]))
	}
	b.WriteString("</ul><table><tr><th>group</th><th>metric</th><th>stock</th><th>lampyr</th><th>lampyr/stock</th><th>goal</th></tr>")
	for _, row := range r.Rows {
		ratio := "n/a"
		if !math.IsNaN(row.Ratio()) {
			ratio = fmt.Sprintf("%.3g", row.Ratio())
		}
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>", html.EscapeString(row.Group), html.EscapeString(row.Metric), fmtVal(row.Stock, row.Unit), fmtVal(row.Lampyr, row.Unit), ratio, html.EscapeString(row.Goal))
	}
	b.WriteString("</table>")
	if len(r.Breakdown) > 0 {
		b.WriteString("<h2>Where Lampyr's time goes (mean per request)</h2><table><tr><th>phase</th><th>part</th><th>lampyr</th></tr>")
		for _, row := range r.Breakdown {
			part := row.Metric
			if row.Note != "" {
				part += " (" + row.Note + ")"
			}
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>", html.EscapeString(row.Group), html.EscapeString(part), fmtVal(row.Lampyr, row.Unit))
		}
		b.WriteString("</table>")
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
	for _, m := range ms {
		fmt.Fprintf(&b, "<h2>%s: latency CDF (ms, log scale)</h2>%s", html.EscapeString(m), cdfSVG(r.Samples[m+"/stock"], r.Samples[m+"/lampyr"]))
	}
	b.WriteString("</body></html>\n")
	return b.String()
}

// cdfSVG draws both sides' cumulative latency distributions.
func cdfSVG(stock, lampyr *Sample) string {
	const w, h, pad = 640.0, 240.0, 40.0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range []*Sample{stock, lampyr} {
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
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11">%.3g ms</text><text x="%.0f" y="%.0f" font-size="11" text-anchor="end">%.3g ms</text>`, pad, h-8, lo, w-pad, h-8, hi)
	for i, s := range []*Sample{stock, lampyr} {
		if s == nil || len(s.Millis) == 0 {
			continue
		}
		vs := append([]float64(nil), s.Millis...)
		sort.Float64s(vs)
		var pts []string
		for j, v := range vs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(v), h-pad-float64(j+1)/float64(len(vs))*(h-2*pad)))
		}
		color, name := "#d62728", "stock"
		if i == 1 {
			color, name = "#1f77b4", "lampyr"
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" fill="%s">%s (n=%d)</text>`, pad+10, 16+float64(i)*16, color, name, len(vs))
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
