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
type routerTotals struct {
	reqSum, acqSum     float64
	reqCount, acqCount uint64
}

func (a routerTotals) minus(b routerTotals) routerTotals {
	return routerTotals{a.reqSum - b.reqSum, a.acqSum - b.acqSum, a.reqCount - b.reqCount, a.acqCount - b.acqCount}
}

func (a routerTotals) plus(b routerTotals) routerTotals {
	return routerTotals{a.reqSum + b.reqSum, a.acqSum + b.acqSum, a.reqCount + b.reqCount, a.acqCount + b.acqCount}
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
		t.reqSum, t.reqCount, t.acqSum, t.acqCount = t.reqSum+rs, t.reqCount+rc, t.acqSum+as, t.acqCount+ac
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
	return []Row{
		{Group: group, Metric: "client mean", Unit: "ms", Lampyr: clientMeanMs, Note: note},
		{Group: group, Metric: "before the router (gateway, Service hop)", Unit: "ms", Lampyr: clientMeanMs - router},
		{Group: group, Metric: "fiber lease per request", Unit: "ms", Lampyr: acq},
		{Group: group, Metric: "router -> Home -> handler and back", Unit: "ms", Lampyr: router - acq},
	}
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
