package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// routerTotals is what every fiber-router replica has recorded for the
// Revisions of one Service in the bench namespace: request and fiber
// acquisition time (histogram sums, seconds) and counts.
// inFiberd* are fiberd's own account of its share of the leases
// (lampyr_router_fiber_acquire_in_fiberd_seconds).
type routerTotals struct {
	reqSum, acqSum, inFiberdSum       float64
	reqCount, acqCount, inFiberdCount uint64
}

func (a routerTotals) minus(b routerTotals) routerTotals {
	return routerTotals{a.reqSum - b.reqSum, a.acqSum - b.acqSum, a.inFiberdSum - b.inFiberdSum, a.reqCount - b.reqCount, a.acqCount - b.acqCount, a.inFiberdCount - b.inFiberdCount}
}

func (a routerTotals) plus(b routerTotals) routerTotals {
	return routerTotals{a.reqSum + b.reqSum, a.acqSum + b.acqSum, a.inFiberdSum + b.inFiberdSum, a.reqCount + b.reqCount, a.acqCount + b.acqCount, a.inFiberdCount + b.inFiberdCount}
}

// scrapeRouters reads each fiber-router's /metrics (admin port) through the
// API server's pod proxy and sums the series of service's Revisions.
func scrapeRouters(ctx context.Context, kube kubernetes.Interface, service string) (routerTotals, error) {
	var t routerTotals
	pods, err := kube.CoreV1().Pods("lampyr-system").List(ctx, metav1.ListOptions{LabelSelector: "app=fiber-router"})
	if err != nil {
		return t, err
	}
	if len(pods.Items) == 0 {
		return t, fmt.Errorf("no fiber-router pods in lampyr-system")
	}
	for _, p := range pods.Items {
		raw, err := kube.CoreV1().Pods("lampyr-system").ProxyGet("http", p.Name, "9091", "/metrics", nil).DoRaw(ctx)
		if err != nil {
			return t, fmt.Errorf("scraping %s: %w", p.Name, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
		if err != nil {
			return t, fmt.Errorf("parsing %s's metrics: %w", p.Name, err)
		}
		sum := func(name string) (float64, uint64) {
			var s float64
			var c uint64
			mf := mfs[name]
			if mf == nil {
				return 0, 0
			}
			for _, m := range mf.GetMetric() {
				if ours(m, service) {
					s += m.GetHistogram().GetSampleSum()
					c += m.GetHistogram().GetSampleCount()
				}
			}
			return s, c
		}
		rs, rc := sum("lampyr_router_request_duration_seconds")
		as, ac := sum("lampyr_router_fiber_acquire_seconds")
		fs, fc := sum("lampyr_router_fiber_acquire_in_fiberd_seconds")
		t = t.plus(routerTotals{rs, as, fs, rc, ac, fc})
	}
	return t, nil
}

// ours: a series of one of service's Revisions (name-NNNNN) in the bench
// namespace.
func ours(m *dto.Metric, service string) bool {
	var nsOK, revOK bool
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "namespace":
			nsOK = l.GetValue() == ns
		case "revision":
			// service-00001, not another Service whose name starts with
			// service's ("cold" and "cold-nowarm").
			n, ok := strings.CutPrefix(l.GetValue(), service+"-")
			revOK = ok && n != "" && strings.Trim(n, "0123456789") == ""
		}
	}
	return nsOK && revOK
}

// breakdownRows splits Lampyr's mean client latency for a phase into the
// part before the router (Traefik, the backend Service hop), the fiber
// lease (fiberd round trip, a fresh fiber's start included) and the rest
// of the router's time (proxying through the Home to the handler and back).
func breakdownRows(group string, clientMeanMs float64, d routerTotals) []Row {
	if d.reqCount == 0 {
		return []Row{{Group: group, Metric: "breakdown", Note: "the routers recorded no request for this phase"}}
	}
	router := d.reqSum / float64(d.reqCount) * 1000
	acq := d.acqSum / float64(d.reqCount) * 1000 // reuse: most requests lease nothing
	note := fmt.Sprintf("%d requests, %d fiber leases (router metrics)", d.reqCount, d.acqCount)
	rows := []Row{
		{Group: group, Metric: "client mean", Unit: "ms", Lampyr: clientMeanMs, Note: note},
		{Group: group, Metric: "before the router (gateway, Service hop)", Unit: "ms", Lampyr: clientMeanMs - router},
		{Group: group, Metric: "fiber lease per request", Unit: "ms", Lampyr: acq},
	}
	// fiberd's own account of the leases, where every lease gave one
	// (a fiberd before acquireMicros gives none): the lease split into
	// fiberd's time (a start included) and the way to the Home and back.
	if d.inFiberdCount > 0 && d.inFiberdCount == d.acqCount {
		in := d.inFiberdSum / float64(d.reqCount) * 1000
		rows = append(rows,
			Row{Group: group, Metric: "fiber lease: in fiberd (its own account, a start included)", Unit: "ms", Lampyr: in},
			Row{Group: group, Metric: "fiber lease: router -> Home and back", Unit: "ms", Lampyr: acq - in})
	}
	return append(rows, Row{Group: group, Metric: "router -> Home -> handler and back", Unit: "ms", Lampyr: router - acq})
}

// A Service's series are its Revisions' only: "cold" must not take
// "cold-nowarm"'s (the first cold breakdowns mixed both, 2026-12-07).
func TestOursMatchesOneServicesRevisions(t *testing.T) {
	series := func(namespace, rev string) *dto.Metric {
		return &dto.Metric{Label: []*dto.LabelPair{
			{Name: proto.String("namespace"), Value: proto.String(namespace)},
			{Name: proto.String("revision"), Value: proto.String(rev)},
		}}
	}
	for _, tc := range []struct {
		ns, rev, service string
		want             bool
	}{
		{ns, "cold-00001", "cold", true},
		{ns, "cold-00012", "cold", true},
		{ns, "cold-nowarm-00001", "cold", false},
		{ns, "cold-nowarm-00001", "cold-nowarm", true},
		{ns, "cold-", "cold", false},
		{"other", "cold-00001", "cold", false},
	} {
		if got := ours(series(tc.ns, tc.rev), tc.service); got != tc.want {
			t.Errorf("ours(%s/%s, %q) = %v, want %v", tc.ns, tc.rev, tc.service, got, tc.want)
		}
	}
}

// The lease is split by fiberd's own account only when every lease of the
// phase carried one.
func TestBreakdownSplitsTheLease(t *testing.T) {
	d := routerTotals{reqSum: 0.4, acqSum: 0.3, inFiberdSum: 0.2, reqCount: 20, acqCount: 20, inFiberdCount: 20}
	rows := breakdownRows("g", 25, d)
	got := map[string]float64{}
	for _, r := range rows {
		got[r.Metric] = r.Lampyr
	}
	for metric, want := range map[string]float64{
		"fiber lease per request": 15, "fiber lease: in fiberd (its own account, a start included)": 10,
		"fiber lease: router -> Home and back": 5, "router -> Home -> handler and back": 5, "before the router (gateway, Service hop)": 5,
	} {
		if v, ok := got[metric]; !ok || v < want-1e-9 || v > want+1e-9 {
			t.Errorf("%s = %v (present %v), want %v", metric, v, ok, want)
		}
	}
	d.inFiberdCount = 19 // one lease from a fiberd that did not say
	for _, r := range breakdownRows("g", 25, d) {
		if strings.HasPrefix(r.Metric, "fiber lease: ") {
			t.Errorf("row %q with one lease unaccounted for", r.Metric)
		}
	}
}
