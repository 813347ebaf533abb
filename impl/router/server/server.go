// Package server runs fiber-router: the data ports the Revision backend
// Services point at (80 http, 81 h2c; docs/contracts.md §3), the admin port
// (health, readiness, Prometheus), the metadata source, and graceful drain.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"lampyr.dev/serving/impl/internal/linger"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/metrics"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
)

// Options configure a Server. Addresses may use port 0 (tests); the bound
// addresses are reported by the Server's Addr methods once Start returns.
type Options struct {
	HTTPAddr  string // ":80"
	H2CAddr   string // ":81"
	AdminAddr string // ":9091"

	Proxy  proxy.Config
	Source revision.Source
	Client fibers.Client
	Logger *slog.Logger

	// MaxRevisions bounds the Revisions the router holds (revision.Table);
	// 0 means no bound.
	MaxRevisions int
	// MaxRevisionsPerNamespace bounds the Revisions of one namespace
	// (revision.Table); 0 means no bound.
	MaxRevisionsPerNamespace int

	// DrainDelay keeps serving after SIGTERM while readiness already fails,
	// so endpoints (and EndpointSlice mirrors) drop this pod before it stops
	// accepting connections.
	DrainDelay time.Duration
	// DrainTimeout bounds how long in-flight requests, streams and
	// WebSockets may run on during shutdown before they are cut.
	DrainTimeout time.Duration
}

// Server is one fiber-router instance.
type Server struct {
	opts    Options
	Router  *proxy.Router
	Table   *revision.Table
	Metrics *metrics.Metrics

	httpLn, h2cLn, adminLn net.Listener
	data                   []*http.Server
	admin                  *http.Server
	draining               atomic.Bool
	shutdownOnce           sync.Once
	shutdownErr            error
	sourceDone             chan error
	cancelSource           context.CancelFunc
}

// New builds a Server; nothing listens until Start.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := metrics.New()
	rt := proxy.New(opts.Proxy, opts.Client, m, opts.Logger)
	s := &Server{opts: opts, Router: rt, Table: revision.NewTable(rt), Metrics: m}
	s.Table.MaxRevisions = opts.MaxRevisions
	s.Table.MaxRevisionsPerNamespace = opts.MaxRevisionsPerNamespace
	s.Table.OnRefused = s.metadataRefused
	// Every reason from the start, so an alert on a rate sees 0 rather
	// than no series.
	for _, reason := range revision.Reasons {
		m.MetadataRefused.WithLabelValues(reason)
	}
	return s
}

// metadataRefused logs and counts router metadata the table refused; the
// table reports each Revision's refusal once, not at every resync.
func (s *Server) metadataRefused(e *revision.RefusedError) {
	s.Metrics.MetadataRefused.WithLabelValues(e.Reason).Inc()
	s.opts.Logger.Warn("router metadata refused", "revision", e.Key.String(), "reason", e.Reason, "err", e.Err)
}

// Start binds all ports and starts serving; readiness waits for the metadata
// source to sync.
func (s *Server) Start() error {
	var err error
	if s.httpLn, err = net.Listen("tcp", s.opts.HTTPAddr); err != nil {
		return fmt.Errorf("listen http %s: %w", s.opts.HTTPAddr, err)
	}
	if s.h2cLn, err = net.Listen("tcp", s.opts.H2CAddr); err != nil {
		s.httpLn.Close()
		return fmt.Errorf("listen h2c %s: %w", s.opts.H2CAddr, err)
	}
	if s.adminLn, err = net.Listen("tcp", s.opts.AdminAddr); err != nil {
		s.httpLn.Close()
		s.h2cLn.Close()
		return fmt.Errorf("listen admin %s: %w", s.opts.AdminAddr, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.cancelSource = cancel
	s.sourceDone = make(chan error, 1)
	go func() { s.sourceDone <- s.opts.Source.Run(ctx, s.Table) }()

	// Both data ports accept HTTP/1.1 and prior-knowledge h2c, as
	// queue-proxy does: the gateway picks the protocol from the Service
	// port's appProtocol, and a mislabelled port should still work.
	for _, ln := range []net.Listener{s.httpLn, s.h2cLn} {
		srv := &http.Server{
			Handler:           s.Router,
			ReadHeaderTimeout: 30 * time.Second,
			// No Read/WriteTimeout: streams and WebSockets live up to the
			// Revision's timeoutSeconds, which the router enforces itself.
			IdleTimeout: 120 * time.Second,
			Protocols:   dataProtocols(),
			ErrorLog:    slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelDebug),
		}
		s.data = append(s.data, srv)
		// A connection closed after an answer whose request body the
		// gateway is still sending (a handler that did not read it) is
		// read to its end, not reset: the gateway then passes the answer
		// on instead of a 502 (package linger).
		go func() { _ = srv.Serve(linger.Listener(ln)) }()
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.admin.Serve(s.adminLn) }()
	return nil
}

func dataProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// ready is the readiness verdict: a router that has not seen the metadata
// would answer 404 for Revisions that exist, so it must not get traffic.
func (s *Server) ready() error {
	if s.draining.Load() {
		return errors.New("draining")
	}
	if !s.opts.Source.HasSynced() {
		return errors.New("router metadata not synced yet")
	}
	return nil
}

// Ready reports readiness as /readyz does.
func (s *Server) Ready() bool { return s.ready() == nil }

// HTTPAddr is the bound HTTP/1.1 address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// H2CAddr is the bound h2c address.
func (s *Server) H2CAddr() string { return s.h2cLn.Addr().String() }

// AdminAddr is the bound admin address.
func (s *Server) AdminAddr() string { return s.adminLn.Addr().String() }

// Shutdown drains: readiness fails at once, the data ports keep serving for
// DrainDelay, then stop accepting; in-flight requests (including hijacked
// WebSockets, which http.Server.Shutdown does not track) get up to
// DrainTimeout; whatever remains is cut and every fiber released.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(ctx) })
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.draining.Store(true)
	select {
	case <-time.After(s.opts.DrainDelay):
	case <-ctx.Done():
	}
	drainCtx, cancel := context.WithTimeout(ctx, s.opts.DrainTimeout)
	defer cancel()
	for _, srv := range s.data {
		// Shutdown closes the listeners and idle connections and waits
		// for active ones; it is bounded by drainCtx like everything else.
		go func() { _ = srv.Shutdown(drainCtx) }()
	}
	err := s.Router.Drain(drainCtx)
	for _, srv := range s.data {
		_ = srv.Close()
	}
	s.cancelSource()
	<-s.sourceDone
	_ = s.admin.Close()
	return err
}
