package eventing

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/fixtures/events"
	"lampyr.dev/serving/portability"
)

// eventReport collects each case's comparison and delivery counts.
type eventReport struct {
	mu       sync.Mutex
	start    time.Time
	installs []string
	cases    []caseResult
}

type caseResult struct {
	name          string
	stock, lampyr Counts
	diffs         []string
	notes         []string
	took          time.Duration
}

func (r *eventReport) add(c caseResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cases = append(r.cases, c)
}

// Markdown renders the report.
func (r *eventReport) Markdown() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# Knative Eventing on stock Knative and on Lampyr\n\n")
	fmt.Fprintf(&b, "Total %s. Installs: %s.\n\n", time.Since(r.start).Round(time.Second), strings.Join(r.installs, "; "))
	fmt.Fprintf(&b, "| case | result | stock | lampyr | took |\n|---|---|---|---|---|\n")
	for _, c := range r.cases {
		res := "identical"
		if len(c.diffs) > 0 {
			res = fmt.Sprintf("**%d difference(s)**", len(c.diffs))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", c.name, res, c.stock, c.lampyr, c.took.Round(100*time.Millisecond))
	}
	for _, c := range r.cases {
		if len(c.diffs)+len(c.notes) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n", c.name)
		for _, n := range c.notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		for _, d := range c.diffs {
			fmt.Fprintf(&b, "- DIFF %s\n", d)
		}
	}
	return b.String()
}

// deliveryCase sends evs to both sides, waits until done holds on each,
// compares the records (all of them, or those accepted only) and records
// the counts; it returns both sides' records.
func deliveryCase(ctx context.Context, name, prefix string, parallel, acceptedOnly bool, timeout time.Duration, done func([]events.Record) bool, evs ...event.Event) (a, b []events.Record) {
	t0 := time.Now()
	for _, s := range the().sides {
		send(ctx, s, parallel, evs...)
	}
	a = settle(ctx, the().stock, prefix, timeout, 5*time.Second, done)
	b = settle(ctx, the().lampyr, prefix, timeout, 5*time.Second, done)
	writeJSON(name+"-stock.json", a)
	writeJSON(name+"-lampyr.json", b)
	ca, cb := a, b
	if acceptedOnly {
		ca, cb = accepted(a), accepted(b)
	}
	diffs := diffRecords(ca, cb)
	c := caseResult{name: name, stock: count(len(evs), a), lampyr: count(len(evs), b), diffs: diffs, took: time.Since(t0)}
	fmt.Fprintf(GinkgoWriter, "%s\n  stock:  %s %s\n  lampyr: %s %s\n", name, c.stock, summary(a), c.lampyr, summary(b))
	the().report.add(c)
	return a, b
}

func accepted(rs []events.Record) []events.Record {
	var out []events.Record
	for _, r := range rs {
		if r.Answer >= 200 && r.Answer < 300 {
			r.Attempt = 0 // which attempt got through is a platform's timing
			out = append(out, r)
		}
	}
	return out
}

func lastCase() *caseResult {
	the().report.mu.Lock()
	defer the().report.mu.Unlock()
	return &the().report.cases[len(the().report.cases)-1]
}

func writeJSON(name string, v any) {
	raw, _ := json.MarshalIndent(v, "", "  ")
	_ = os.WriteFile(filepath.Join(the().artDir, name), raw, 0o644)
}

// conditions maps an object's condition types to their status.
func conditions(u *unstructured.Unstructured) map[string]string {
	out := map[string]string{}
	cs, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range cs {
		m, _ := c.(map[string]any)
		out[fmt.Sprint(m["type"])] = fmt.Sprint(m["status"])
	}
	return out
}

var _ = Describe("Knative Eventing delivers to a Lampyr Service exactly as to a stock one", Label("cluster", "eventing"), Ordered, ContinueOnFailure, func() {
	It("reports the same Broker, Trigger and Addressable Service status", Label("status"), func(ctx SpecContext) {
		type view struct {
			Conditions map[string]string
			Fields     map[string]string
		}
		// Each side's object is read once it is Ready: a Trigger Ready in
		// BeforeSuite can turn SubscriptionReady Unknown for a moment while
		// the InMemoryChannel takes another subscriber (seen once on
		// Lampyr, 2026-12-02 08:17), and a comparison of a converged state
		// against a passing one would change from run to run.
		get := func(s *side, gvr schema.GroupVersionResource, name string, fields ...[]string) view {
			u, err := s.Clients.WaitReady(ctx, gvr, ns, name, 2*time.Minute)
			Expect(err).NotTo(HaveOccurred(), "%s %s on %s", gvr.Resource, name, s.Name)
			v := view{Conditions: conditions(u), Fields: map[string]string{}}
			for _, f := range fields {
				x, _, _ := unstructured.NestedString(u.Object, f...)
				v.Fields[strings.Join(f, ".")] = x
			}
			return v
		}
		var diffs []string
		compare := func(what string, gvr schema.GroupVersionResource, name string, fields ...[]string) {
			a, b := get(the().stock, gvr, name, fields...), get(the().lampyr, gvr, name, fields...)
			if d := portability.Diff(what, a, b); d != "" {
				diffs = append(diffs, d)
			}
		}
		addr := []string{"status", "address", "url"}
		compare("Service "+sink+" (Addressable)", e2eutil.KServices, sink, addr)
		compare("Service "+dlq+" (Addressable)", e2eutil.KServices, dlq, addr)
		compare("Broker "+broker, brokers, broker, addr)
		for _, t := range triggers {
			compare("Trigger "+t.name, triggerGVR, t.name, []string{"status", "subscriberUri"}, []string{"status", "deadLetterSinkUri"})
		}
		u, err := the().lampyr.Clients.Dynamic.Resource(e2eutil.KServices).Namespace(ns).Get(ctx, sink, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		url, _, _ := unstructured.NestedString(u.Object, "status", "address", "url")
		the().report.add(caseResult{name: "status", diffs: diffs, notes: []string{"Service " + sink + " status.address.url on both: " + url}})
		Expect(url).To(Equal("http://" + sink + "." + ns + ".svc.cluster.local"))
		Expect(diffs).To(BeEmpty())
	})

	It("delivers the events the Trigger's filter selects, with identical attributes, extensions and data", Label("delivery"), func(ctx SpecContext) {
		plain := newEvent("basic", "basic-2", map[string]string{"color": "blue", "tenant": "acme"})
		plain.SetSubject("orders/42")
		Expect(plain.SetData("text/plain", "hello eventing")).To(Succeed())
		evs := []event.Event{
			newEvent("basic", "basic-1", map[string]string{"color": "blue"}),
			plain,
			newEvent("basic", "basic-3", map[string]string{"color": "red"}),  // filtered out: extension
			newEvent("other", "basic-4", map[string]string{"color": "blue"}), // filtered out: type
		}
		a, _ := deliveryCase(ctx, "filtered delivery", "basic-", false, false, 2*time.Minute, delivered(sink, "basic-1", "basic-2"), evs...)
		ids := []string{}
		for _, r := range a {
			ids = append(ids, r.ID)
		}
		Expect(ids).To(Equal([]string{"basic-1", "basic-2"}), "stock, the reference, must show the filter at work")
		_, stamped := a[0].Extensions["knativearrivaltime"]
		lastCase().notes = append(lastCase().notes, fmt.Sprintf("stock: the Broker's knativearrivaltime extension reached the sink: %v (compared by presence)", stamped))
		Expect(lastCase().diffs).To(BeEmpty())
	})

	It("retries a failing sink with the configured backoff, then delivers", Label("delivery", "retries"), func(ctx SpecContext) {
		a, b := deliveryCase(ctx, "retries (500, 500, then 202)", "retry-", false, false, 2*time.Minute, delivered(sink, "retry-1"), newEvent("retry", "retry-1", nil))
		for _, s := range []struct {
			name string
			rs   []events.Record
		}{{"stock", a}, {"lampyr", b}} {
			Expect(summary(s.rs)).To(Equal("[retry-1@event-sink#1->500 retry-1@event-sink#2->500 retry-1@event-sink#3->202]"), s.name)
			// linear PT1S: Eventing's dispatcher (go-retryablehttp, which
			// numbers the first retry 0) waits 0 s, then 1 s, then 2 s.
			var gaps []string
			for i := 1; i < len(s.rs); i++ {
				gap := s.rs[i].Received.Sub(s.rs[i-1].Received)
				gaps = append(gaps, gap.Round(10*time.Millisecond).String())
				want := time.Duration(i-1) * time.Second
				Expect(gap).To(BeNumerically(">=", want-200*time.Millisecond), "%s: retry %d came after %s (linear PT1S: %s)", s.name, i, gap, want)
				Expect(gap).To(BeNumerically("<", want+3*time.Second), "%s: retry %d came after %s (linear PT1S: %s)", s.name, i, gap, want)
			}
			lastCase().notes = append(lastCase().notes, fmt.Sprintf("%s: gaps between attempts %v (linear, backoffDelay PT1S)", s.name, gaps))
		}
		Expect(lastCase().diffs).To(BeEmpty())
	})

	It("dead-letters an event when retries are exhausted", Label("delivery", "retries"), func(ctx SpecContext) {
		a, _ := deliveryCase(ctx, "dead letter (always 500, retry 2)", "dead-", false, false, 2*time.Minute, delivered(dlq, "dead-1"), newEvent("dead", "dead-1", map[string]string{"color": "green"}))
		Expect(summary(a)).To(Equal("[dead-1@event-dlq#1->202 dead-1@event-sink#1->500 dead-1@event-sink#2->500 dead-1@event-sink#3->500]"), "stock")
		for _, r := range a {
			if r.Sink == dlq {
				Expect(r.Extensions).To(HaveKeyWithValue("knativeerrorcode", "500"), "the Broker's dead-letter extensions")
			}
		}
		Expect(lastCase().diffs).To(BeEmpty())
	})

	It("wakes the Service for an event and delivers on the first attempt, within the Trigger's timeout", Label("lampyr-specific"), Label("scaling"), func(ctx SpecContext) {
		// Fresh mode: Lampyr releases a fiber when its response ends, so
		// no fiber of the sink runs now; the Trigger allows no retry and
		// 10 s.
		live := routerMetric(ctx, "lampyr_router_fibers_live", "")
		Expect(live).NotTo(BeNil(), "fiber-router's metrics were unreadable: nothing shows that no fiber of %s was live before the event", sink)
		Expect(live[""]).To(BeZero(), "a fiber of %s is live before the event", sink)
		_, b := deliveryCase(ctx, "wake from no fiber (retry 0, timeout PT10S)", "wake-", false, false, time.Minute, delivered(sink, "wake-1"), newEvent("wake", "wake-1", nil))
		Expect(summary(b)).To(Equal("[wake-1@event-sink#1->202]"))
		lastCase().notes = append(lastCase().notes, fmt.Sprintf("fiber-router's lampyr_router_fibers_live for %s-00001 just before the event: %v", sink, live))
		Expect(lastCase().diffs).To(BeEmpty())
	})

	It("holds max-scale under a burst: excess deliveries wait or are refused and retried, none is lost", Label("lampyr-specific"), Label("scaling"), func(ctx SpecContext) {
		// 8 deliveries of 2 s each to max-scale 1 take 16 s one after the
		// other: more than fiber-router's 10 s queue, so Lampyr refuses
		// the last ones (503) and the Broker retries them; stock's
		// activator holds them for the Revision's timeout.
		const n = 8
		var evs []event.Event
		var ids []string
		for i := range n {
			id := fmt.Sprintf("burst-%02d", i)
			ids = append(ids, id)
			evs = append(evs, newEvent("burst", id, nil))
		}
		before := routerCodes(ctx)
		givenUp := routerRefusals(ctx)
		a, b := deliveryCase(ctx, fmt.Sprintf("burst of %d to max-scale 1 (sink sleeps 2 s)", n), "burst-", true, true, 5*time.Minute, delivered(sink, ids...), evs...)
		Expect(count(n, a).Received).To(Equal(n), "stock")
		Expect(count(n, b).Received).To(Equal(n), "lampyr")
		Expect(maxOverlap(b)).To(BeNumerically("<=", 1), "Lampyr ran more than max-scale 1 deliveries at once")
		after := routerCodes(ctx)
		lastCase().notes = append(lastCase().notes,
			fmt.Sprintf("most deliveries in the sink at once: stock %d, lampyr %d (max-scale 1)", maxOverlap(a), maxOverlap(b)),
			fmt.Sprintf("Lampyr fiber-router answers to the Broker for %s-00001 during the burst (lampyr_router_requests_total by code): %s", sink, codeDelta(before, after)),
			fmt.Sprintf("deliveries the Broker filter gave up on (\"failed to send event\" log lines): %s", routerRefusalsSince(ctx, givenUp)))
		Expect(lastCase().diffs).To(BeEmpty())
	})

	It("retries an event whose fiber crashed mid-request, and does not lose it", Label("lampyr-specific"), Label("restart"), func(ctx SpecContext) {
		a, b := deliveryCase(ctx, "crash mid-event (exit on attempt 1)", "crash-", false, false, 3*time.Minute, delivered(sink, "crash-1"), newEvent("crash", "crash-1", nil))
		for _, rs := range [][]events.Record{a, b} {
			Expect(summary(rs)).To(Equal("[crash-1@event-sink#1->0 crash-1@event-sink#2->202]"))
		}
		Expect(lastCase().diffs).To(BeEmpty())
	})
})

// maxOverlap is the most deliveries that were inside the sink at once,
// from the report times and the sink's 2 s sleep (a lower bound of each
// delivery's stay).
func maxOverlap(rs []events.Record) int {
	var ts []time.Time
	for _, r := range rs {
		if r.Sink == sink && r.Answer >= 200 && r.Answer < 300 {
			ts = append(ts, r.Received)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	most := 0
	for i := range ts {
		n := 1
		for j := i + 1; j < len(ts) && ts[j].Sub(ts[i]) < 1900*time.Millisecond; j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// routerRefusals and routerRefusalsSince count the mt-broker-filter's log
// lines on each side about deliveries it gave up on (it logs once per
// event, after its retries; retries themselves are not logged). Best
// effort, for the report: zero means nothing was lost in the Broker.
func routerRefusals(ctx context.Context) map[string]int {
	out := map[string]int{}
	for _, s := range the().sides {
		out[s.Name] = filterFailures(ctx, s)
	}
	return out
}

func routerRefusalsSince(ctx context.Context, before map[string]int) string {
	var parts []string
	for _, s := range the().sides {
		parts = append(parts, fmt.Sprintf("%s %d", s.Name, filterFailures(ctx, s)-before[s.Name]))
	}
	return strings.Join(parts, ", ")
}

func filterFailures(ctx context.Context, s *side) int {
	pods, err := s.Clients.Kube.CoreV1().Pods("knative-eventing").List(ctx, metav1.ListOptions{LabelSelector: "eventing.knative.dev/brokerRole=filter"})
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range pods.Items {
		raw, err := s.Clients.Kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, nil).DoRaw(ctx)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.Contains(l, "failed to send event") {
				n++
			}
		}
	}
	return n
}

// routerCodes reads fiber-router's lampyr_router_requests_total for the
// sink's Revision, by code, through the API server's Pod proxy (best
// effort: nil when unreadable).
func routerCodes(ctx context.Context) map[string]float64 {
	return routerMetric(ctx, "lampyr_router_requests_total", "code")
}

// routerMetric sums fiber-router's metric name for the sink's Revision by
// the label by ("" sums everything under "").
func routerMetric(ctx context.Context, name, by string) map[string]float64 {
	pods, err := the().lampyr.Clients.Kube.CoreV1().Pods("lampyr-system").List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
	if err != nil || len(pods.Items) == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, p := range pods.Items {
		raw, err := the().lampyr.Clients.Kube.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, "9091", "/metrics", nil).DoRaw(ctx)
		if err != nil {
			fmt.Fprintf(GinkgoWriter, "fiber-router metrics of %s: %v\n", p.Name, err)
			return nil
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if !strings.HasPrefix(l, name+"{") || !strings.Contains(l, `namespace="`+ns+`"`) || !strings.Contains(l, `revision="`+sink+`-00001"`) {
				continue
			}
			j := strings.LastIndex(l, " ")
			if j < 0 {
				continue
			}
			code := ""
			if i := strings.Index(l, by+`="`); by != "" && i >= 0 {
				code = l[i+len(by)+2:]
				code = code[:strings.Index(code, `"`)]
			}
			var v float64
			fmt.Sscan(l[j+1:], &v)
			out[code] += v
		}
	}
	return out
}

func codeDelta(before, after map[string]float64) string {
	if before == nil || after == nil {
		return "unavailable"
	}
	var parts []string
	for code, v := range after {
		if d := v - before[code]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s: %.0f", code, d))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
