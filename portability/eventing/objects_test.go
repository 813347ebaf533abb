package eventing

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"lampyr.dev/serving/fixtures/events"
)

var (
	brokers    = schema.GroupVersionResource{Group: "eventing.knative.dev", Version: "v1", Resource: "brokers"}
	triggerGVR = schema.GroupVersionResource{Group: "eventing.knative.dev", Version: "v1", Resource: "triggers"}
)

// trigger is one Trigger of the suite: what it filters and how the sink
// and the delivery behave.
type trigger struct {
	name   string
	filter map[string]string
	// query is the Receiver's behaviour (fail=, crash=, sleepms=).
	query    url.Values
	delivery map[string]any
}

// eventType names each trigger's events.
func eventType(t string) string { return "dev.lampyr." + t }

var triggers = []trigger{
	// Filters on type and an extension attribute.
	{name: "basic", filter: map[string]string{"type": eventType("basic"), "color": "blue"}},
	// 500 twice then 202: delivered on the third attempt, linear backoff.
	{name: "retry", filter: map[string]string{"type": eventType("retry")}, query: url.Values{"fail": {"2"}},
		delivery: map[string]any{"retry": int64(3), "backoffPolicy": "linear", "backoffDelay": "PT1S"}},
	// Always 500: after 1 + 2 attempts, to the dead-letter Service.
	{name: "dead", filter: map[string]string{"type": eventType("dead")}, query: url.Values{"fail": {"100"}},
		delivery: map[string]any{"retry": int64(2), "backoffPolicy": "linear", "backoffDelay": "PT0.5S",
			"deadLetterSink": map[string]any{"ref": ksvcRef(dlq), "uri": subscriberURI(nil)}}},
	// No retries, a 10 s timeout: the first attempt must land, from no
	// running fiber on Lampyr (fresh mode releases each one).
	{name: "wake", filter: map[string]string{"type": eventType("wake")},
		delivery: map[string]any{"retry": int64(0), "timeout": "PT10S"}},
	// A slow sink (2 s) with max-scale 1 and a burst: excess deliveries wait or are
	// refused and retried; none may be lost.
	{name: "burst", filter: map[string]string{"type": eventType("burst")}, query: url.Values{"sleepms": {"2000"}},
		delivery: map[string]any{"retry": int64(12), "backoffPolicy": "exponential", "backoffDelay": "PT0.5S"}},
	// The sink's process exits mid-event on the first attempt: a retry,
	// not a loss (stock restarts the container, Lampyr starts a new fiber).
	{name: "crash", filter: map[string]string{"type": eventType("crash")}, query: url.Values{"crash": {"1"}},
		delivery: map[string]any{"retry": int64(6), "backoffPolicy": "exponential", "backoffDelay": "PT1S"}},
}

func ksvcRef(name string) map[string]any {
	return map[string]any{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": name}
}

// applyEventing creates the Broker and every Trigger on s.
func applyEventing(ctx context.Context, s *side) {
	objs := []*unstructured.Unstructured{{Object: map[string]any{
		"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
		"metadata": map[string]any{"name": broker, "namespace": ns},
	}}}
	for _, t := range triggers {
		filter := map[string]any{}
		for k, v := range t.filter {
			filter[k] = v
		}
		spec := map[string]any{
			"broker":     broker,
			"filter":     map[string]any{"attributes": filter},
			"subscriber": map[string]any{"ref": ksvcRef(sink), "uri": subscriberURI(t.query)},
		}
		if t.delivery != nil {
			spec["delivery"] = t.delivery
		}
		objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
			"metadata": map[string]any{"name": t.name, "namespace": ns},
			"spec":     spec,
		}})
	}
	for _, o := range objs {
		gvr := triggerGVR
		if o.GetKind() == "Broker" {
			gvr = brokers
		}
		body, err := o.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		force := true
		_, err = s.Clients.Dynamic.Resource(gvr).Namespace(ns).Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "eventing-portability", Force: &force})
		Expect(err).NotTo(HaveOccurred(), "%s %s on %s", o.GetKind(), o.GetName(), s.Name)
	}
}

// newEvent is one event of the suite; identical on both sides.
func newEvent(typ, id string, ext map[string]string) event.Event {
	e := event.New()
	e.SetID(id)
	e.SetSource("/lampyr/eventing-suite")
	e.SetType(eventType(typ))
	e.SetTime(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	for k, v := range ext {
		e.SetExtension(k, v)
	}
	Expect(e.SetData("application/json", map[string]string{"id": id, "kind": typ})).To(Succeed())
	return e
}

// send posts events into s's Broker from the recorder Pod.
func send(ctx context.Context, s *side, parallel bool, evs ...event.Event) []events.SendResult {
	body, err := json.Marshal(events.SendRequest{To: s.brokerURL, Events: evs, Parallel: parallel})
	Expect(err).NotTo(HaveOccurred())
	raw, err := s.Clients.Kube.CoreV1().RESTClient().Post().Namespace(ns).Resource("services").Name(recName+":80").SubResource("proxy").Suffix("send").
		SetHeader("Content-Type", "application/json").Body(body).Timeout(2 * time.Minute).DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred(), "sending through the recorder on %s: %s", s.Name, raw)
	var res []events.SendResult
	Expect(json.Unmarshal(raw, &res)).To(Succeed(), string(raw))
	for _, r := range res {
		Expect(r.Status).To(Equal(202), "the Broker on %s refused event %s: %+v", s.Name, r.ID, r)
	}
	return res
}

func getRecords(ctx context.Context, s *side) ([]events.Record, error) {
	raw, err := s.Clients.Kube.CoreV1().Services(ns).ProxyGet("http", recName, "80", "/records", nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", s.Name, err, raw)
	}
	var rs []events.Record
	return rs, json.Unmarshal(raw, &rs)
}

// recordsOf are s's records of events whose id starts with prefix.
func recordsOf(ctx context.Context, s *side, prefix string) []events.Record {
	rs, err := getRecords(ctx, s)
	Expect(err).NotTo(HaveOccurred())
	var out []events.Record
	for _, r := range rs {
		if strings.HasPrefix(r.ID, prefix) {
			out = append(out, r)
		}
	}
	events.SortRecords(out)
	return out
}

// settle waits until done(records) holds on s, then quiet more seconds
// without a new record (late or duplicate deliveries show in the result),
// and returns the records of prefix.
func settle(ctx context.Context, s *side, prefix string, timeout, quiet time.Duration, done func([]events.Record) bool) []events.Record {
	var rs []events.Record
	Eventually(func() bool {
		rs = recordsOf(ctx, s, prefix)
		return done(rs)
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(BeTrue(), "%s: records of %s never complete: %s", s.Name, prefix, summary(rs))
	n := len(rs)
	Consistently(func() int { return len(recordsOf(ctx, s, prefix)) }).WithContext(ctx).WithTimeout(quiet).WithPolling(time.Second).Should(Equal(n), "%s: more deliveries of %s after they completed", s.Name, prefix)
	return recordsOf(ctx, s, prefix)
}

// delivered: every id got an accepting answer at sink.
func delivered(sinkName string, ids ...string) func([]events.Record) bool {
	return func(rs []events.Record) bool {
		ok := map[string]bool{}
		for _, r := range rs {
			if r.Sink == sinkName && r.Answer >= 200 && r.Answer < 300 {
				ok[r.ID] = true
			}
		}
		for _, id := range ids {
			if !ok[id] {
				return false
			}
		}
		return true
	}
}

// volatile are extension attributes whose values are per-delivery facts
// (the Broker's arrival timestamp, trace context): compared by presence.
var volatile = map[string]bool{"knativearrivaltime": true, "traceparent": true, "tracestate": true}

// compared is a Record reduced to what must be identical on both sides.
type compared struct {
	Sink, ID                                                        string
	Attempt, Answer                                                 int
	Source, Type, Subject, SpecVersion, DataContentType, Time, Data string
	Extensions                                                      map[string]string
}

func reduce(rs []events.Record) map[string]compared {
	out := map[string]compared{}
	for _, r := range rs {
		ext := map[string]string{}
		for k, v := range r.Extensions {
			if volatile[k] {
				v = "(present)"
			}
			ext[k] = v
		}
		c := compared{Sink: r.Sink, ID: r.ID, Attempt: r.Attempt, Answer: r.Answer, Source: r.Source, Type: r.Type, Subject: r.Subject,
			SpecVersion: r.SpecVersion, DataContentType: r.DataContentType, Time: r.Time, Data: r.Data, Extensions: ext}
		out[fmt.Sprintf("event %s at %s, attempt %d", r.ID, r.Sink, r.Attempt)] = c
	}
	return out
}

// diffRecords names each event and attribute that differs.
func diffRecords(a, b []events.Record) []string {
	ra, rb := reduce(a), reduce(b)
	keys := map[string]bool{}
	for k := range ra {
		keys[k] = true
	}
	for k := range rb {
		keys[k] = true
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []string
	for _, k := range names {
		x, okA := ra[k]
		y, okB := rb[k]
		switch {
		case !okA:
			out = append(out, k+": only on lampyr")
			continue
		case !okB:
			out = append(out, k+": only on stock")
			continue
		}
		attr := func(name, s, l string) {
			if s != l {
				out = append(out, fmt.Sprintf("%s: attribute %s: stock %q, lampyr %q", k, name, s, l))
			}
		}
		attr("answer", fmt.Sprint(x.Answer), fmt.Sprint(y.Answer))
		attr("source", x.Source, y.Source)
		attr("type", x.Type, y.Type)
		attr("subject", x.Subject, y.Subject)
		attr("specversion", x.SpecVersion, y.SpecVersion)
		attr("datacontenttype", x.DataContentType, y.DataContentType)
		attr("time", x.Time, y.Time)
		attr("data", x.Data, y.Data)
		ext := map[string]bool{}
		for e := range x.Extensions {
			ext[e] = true
		}
		for e := range y.Extensions {
			ext[e] = true
		}
		var en []string
		for e := range ext {
			en = append(en, e)
		}
		sort.Strings(en)
		for _, e := range en {
			s, okS := x.Extensions[e]
			l, okL := y.Extensions[e]
			if !okS {
				s = "(absent)"
			}
			if !okL {
				l = "(absent)"
			}
			attr("extension "+e, s, l)
		}
	}
	return out
}

func summary(rs []events.Record) string {
	var b []string
	for _, r := range rs {
		b = append(b, fmt.Sprintf("%s@%s#%d->%d", r.ID, r.Sink, r.Attempt, r.Answer))
	}
	return "[" + strings.Join(b, " ") + "]"
}

// Counts are one case's delivery figures on one side.
type Counts struct {
	Sent, Received, Attempts, Retried, DeadLettered int
}

func (c Counts) String() string {
	return fmt.Sprintf("sent %d / received %d / retried %d / dead-lettered %d (attempts at the sink %d)", c.Sent, c.Received, c.Retried, c.DeadLettered, c.Attempts)
}

// count: received = distinct ids accepted by the Trigger's sink; retried =
// attempts at the sink beyond the first per id (refusals before the sink,
// e.g. by a platform at max-scale, are not seen here); dead-lettered =
// distinct ids accepted by the dead-letter sink.
func count(sent int, rs []events.Record) Counts {
	c := Counts{Sent: sent}
	ids, ok, dead := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, r := range rs {
		switch r.Sink {
		case sink:
			c.Attempts++
			ids[r.ID] = true
			if r.Answer >= 200 && r.Answer < 300 {
				ok[r.ID] = true
			}
		case dlq:
			if r.Answer >= 200 && r.Answer < 300 {
				dead[r.ID] = true
			}
		}
	}
	c.Received, c.Retried, c.DeadLettered = len(ok), c.Attempts-len(ids), len(dead)
	return c
}

// clearRecords forgets s's records (each case starts from none).
func clearRecords(ctx context.Context, s *side) {
	raw, err := s.Clients.Kube.CoreV1().RESTClient().Delete().Namespace(ns).Resource("services").Name(recName + ":80").SubResource("proxy").Suffix("records").DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred(), "%s: %s", s.Name, raw)
}
