package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lampyr.dev/serving/impl/fiberd/pool"
)

// The pool tells fiberd's metrics when it empties the warm pool.
var (
	_ pool.WarmIdleObserver = (*metrics)(nil)
	_ pool.WarmIdleObserver = idleObserver{}
)

type metrics struct {
	reg         *prometheus.Registry
	started     *prometheus.CounterVec
	startDur    prometheus.Histogram
	acquireDur  *prometheus.HistogramVec
	ended       *prometheus.CounterVec
	refused     prometheus.Counter
	requests    prometheus.Counter
	tunnels     *prometheus.CounterVec
	tunnelsOpen prometheus.Gauge
	grantValid  prometheus.Gauge
	grantExpiry prometheus.Gauge
	// refusedCredentials counts calls refused for a bad, expired or
	// other Home's credential: a rising count is someone trying.
	refusedCredentials prometheus.Counter
	// warmEmptied counts the warm pool emptied after --warm-idle without
	// a request (its fibers: fiberd_fibers_ended_total{reason="warm idle"}).
	warmEmptied prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		reg:                prometheus.NewRegistry(),
		started:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_fiber_starts_total", Help: "Fiber starts by result."}, []string{"result"}),
		startDur:           prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fiberd_fiber_start_seconds", Help: "Time to start a fiber until its handler listens.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		acquireDur:         prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fiberd_acquire_seconds", Help: "Acquisition latency by source (warm pool or cold start).", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18)}, []string{"source"}),
		ended:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_fibers_ended_total", Help: "Fibers ended by reason."}, []string{"reason"}),
		refused:            prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_acquire_refused_total", Help: "Acquisitions refused at maxFibers."}),
		requests:           prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_proxied_requests_total", Help: "Requests proxied into fibers."}),
		tunnels:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_tunnels_total", Help: "Tunnels opened to reuse-mode fibers (their requests are not counted one by one), by how bytes are carried: kernel (sockmap) or user (copied by fiberd)."}, []string{"splice"}),
		tunnelsOpen:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_tunnels_open", Help: "Tunnels open now."}),
		grantValid:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_grant_valid", Help: "1 while fiberd holds a valid grant."}),
		grantExpiry:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "fiberd_grant_expiry_timestamp_seconds", Help: "Expiry of the current grant."}),
		refusedCredentials: prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_refused_credentials_total", Help: "API and proxied calls refused for a credential that is malformed, expired, signed by another key or minted for another Home."}),
		warmEmptied:        prometheus.NewCounter(prometheus.CounterOpts{Name: "fiberd_warm_pool_emptied_total", Help: "Times the warm pool was emptied after --warm-idle without a request (refilled at the next acquisition)."}),
	}
	m.reg.MustRegister(m.started, m.startDur, m.acquireDur, m.ended, m.refused, m.requests, m.tunnels, m.tunnelsOpen, m.grantValid, m.grantExpiry, m.refusedCredentials, m.warmEmptied)
	return m
}

func (m *metrics) FiberStarted(d time.Duration, err error) {
	if err != nil {
		m.started.WithLabelValues("error").Inc()
		return
	}
	m.started.WithLabelValues("ok").Inc()
	m.startDur.Observe(d.Seconds())
}

func (m *metrics) FiberAcquired(d time.Duration, warm bool) {
	src := "cold"
	if warm {
		src = "warm"
	}
	m.acquireDur.WithLabelValues(src).Observe(d.Seconds())
}

func (m *metrics) FiberEnded(reason string) { m.ended.WithLabelValues(reason).Inc() }

func (m *metrics) WarmPoolEmptied(int) { m.warmEmptied.Inc() }
