// Package metrics holds fiber-router's Prometheus metrics, served on the admin
// port.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is one router's set of metrics. Each router instance (and each
// test) gets its own registry, so parallel routers never share counters.
type Metrics struct {
	Registry *prometheus.Registry

	Requests        *prometheus.CounterVec
	RequestDuration *prometheus.HistogramVec
	FibersAcquired  *prometheus.CounterVec
	AcquireDuration *prometheus.HistogramVec
	AcquireInFiberd *prometheus.HistogramVec
	FibersReleased  *prometheus.CounterVec
	FibersLeaked    *prometheus.CounterVec
	FibersLive      *prometheus.GaugeVec
	QueueDepth      *prometheus.GaugeVec
	InFlight        prometheus.Gauge
	Revisions       prometheus.Gauge
	MetadataRefused *prometheus.CounterVec
	Probes          *prometheus.CounterVec
}

// Label names. Revision-level labels only: per-request values such as paths
// would explode the series count.
var revLabels = []string{"namespace", "revision"}

// New creates and registers the metrics.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_requests_total",
			Help: "Requests answered, by Revision and status class (1xx for upgraded WebSockets; 'probe' and router errors included).",
		}, []string{"namespace", "revision", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lampyr_router_request_duration_seconds",
			Help: "Time from request arrival to the end of the response, stream or WebSocket.",
			// From sub-millisecond router errors to streams near timeoutSeconds.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, revLabels),
		FibersAcquired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_fibers_acquired_total",
			Help: "Fibers acquired from fiberd.",
		}, revLabels),
		AcquireDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lampyr_router_fiber_acquire_seconds",
			Help:    "Round trip of a fiber lease from fiberd (a fresh fiber's start included), successful ones only.",
			Buckets: []float64{.0002, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, revLabels),
		AcquireInFiberd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lampyr_router_fiber_acquire_in_fiberd_seconds",
			Help:    "Of each lease's round trip (lampyr_router_fiber_acquire_seconds), the time fiberd says it took to answer (a fresh fiber's start included); the rest is the way to the Home and back.",
			Buckets: []float64{.0002, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, revLabels),
		FibersReleased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_fibers_released_total",
			Help: "Fibers released to fiberd (killed).",
		}, revLabels),
		FibersLeaked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_fibers_leaked_total",
			Help: "Fibers whose release failed after retries; they may live until fiberd reaps them.",
		}, revLabels),
		FibersLive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lampyr_router_fibers_live",
			Help: "Fibers this router holds (acquired and not yet released).",
		}, revLabels),
		QueueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lampyr_router_queue_depth",
			Help: "Requests waiting for a fiber because their Revision is at max-scale.",
		}, revLabels),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lampyr_router_in_flight_requests",
			Help: "Requests, streams and WebSockets being served.",
		}),
		Revisions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lampyr_router_revisions",
			Help: "Revisions in the routing table.",
		}),
		MetadataRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_metadata_refused_total",
			Help: "Router metadata not used, once per Revision and cause, by reason: malformed (or name, labels and data disagree, or too big), endpoint (a Home endpoint the router does not dial), full (--max-revisions reached), namespace-full (--max-revisions-per-namespace reached for the Revision's namespace).",
		}, []string{"reason"}),
		Probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lampyr_router_probes_total",
			Help: "Knative network probes (K-Network-Probe, a KIngress's readiness through the gateway) answered, by status: 503 for a Revision this router cannot serve yet, which the prober retries after a back-off (issue 32: the probe phase is where a new Route waits longer on Lampyr than on stock).",
		}, []string{"code"}),
	}
	r.MustRegister(m.Requests, m.RequestDuration, m.FibersAcquired, m.AcquireDuration, m.AcquireInFiberd, m.FibersReleased, m.FibersLeaked,
		m.FibersLive, m.QueueDepth, m.InFlight, m.Revisions, m.MetadataRefused, m.Probes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Revision returns the pool observer for one Revision.
func (m *Metrics) Revision(namespace, revision string) *RevisionObserver {
	return &RevisionObserver{
		acquired: m.FibersAcquired.WithLabelValues(namespace, revision),
		acquire:  m.AcquireDuration.WithLabelValues(namespace, revision),
		inFiberd: m.AcquireInFiberd.WithLabelValues(namespace, revision),
		released: m.FibersReleased.WithLabelValues(namespace, revision),
		leaked:   m.FibersLeaked.WithLabelValues(namespace, revision),
		live:     m.FibersLive.WithLabelValues(namespace, revision),
		queue:    m.QueueDepth.WithLabelValues(namespace, revision),
	}
}

// RevisionObserver implements pool.Observer with pre-resolved series, so the
// hot path does no label lookups.
type RevisionObserver struct {
	acquired, released, leaked prometheus.Counter
	acquire, inFiberd          prometheus.Observer
	live, queue                prometheus.Gauge
}

// Acquired implements pool.Observer.
func (o *RevisionObserver) Acquired(d, inFiberd time.Duration) {
	o.acquired.Inc()
	o.live.Inc()
	o.acquire.Observe(d.Seconds())
	if inFiberd > 0 {
		o.inFiberd.Observe(inFiberd.Seconds())
	}
}

// Released implements pool.Observer.
func (o *RevisionObserver) Released() { o.released.Inc(); o.live.Dec() }

// Leaked implements pool.Observer.
func (o *RevisionObserver) Leaked() { o.leaked.Inc(); o.live.Dec() }

// QueueDepth implements pool.Observer.
func (o *RevisionObserver) QueueDepth(delta int) { o.queue.Add(float64(delta)) }

// Forget drops a removed Revision's series, so a long-lived router's
// /metrics does not grow with every Revision it ever served.
func (m *Metrics) Forget(namespace, revision string) {
	l := prometheus.Labels{"namespace": namespace, "revision": revision}
	m.Requests.DeletePartialMatch(l)
	m.RequestDuration.Delete(l)
	m.FibersAcquired.Delete(l)
	m.AcquireDuration.Delete(l)
	m.AcquireInFiberd.Delete(l)
	m.FibersReleased.Delete(l)
	m.FibersLeaked.Delete(l)
	m.FibersLive.Delete(l)
	m.QueueDepth.Delete(l)
}
