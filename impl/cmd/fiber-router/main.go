// Command fiber-router is Lampyr's shared data plane: every Revision's backend
// Service leads here, and each request runs in a fiber leased from the
// Revision's Home (docs/contracts.md §2-§4).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/router/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fiber-router:", err)
		os.Exit(1)
	}
}

func run() error {
	def := proxy.DefaultConfig()
	var (
		httpPort   = flag.Int("http-port", 80, "port for HTTP/1.1 (and h2c) traffic; the backend Service's port 80 targets it")
		h2cPort    = flag.Int("h2c-port", 81, "port for h2c (gRPC) traffic; the backend Service's port 81 targets it")
		adminPort  = flag.Int("admin-port", 9091, "port for /healthz, /readyz and /metrics")
		tokenFile  = flag.String("token-file", "/var/run/lampyr/fiber-router-token/token", "file holding the router's fiberd service token (Secret lampyr-system/fiber-router-token); re-read every minute")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig for running outside a cluster; in-cluster config when empty")
		resync     = flag.Duration("resync", 10*time.Minute, "informer resync period for router metadata ConfigMaps")

		timeout      = flag.Duration("default-timeout", def.DefaultTimeout, "request/stream/WebSocket lifetime for Revisions whose metadata has timeoutSeconds 0")
		queueTimeout = flag.Duration("queue-timeout", def.QueueTimeout, "how long a request waits for a fiber at max-scale before 503 + Retry-After")
		maxQueue     = flag.Int("max-queue", def.MaxQueue, "most requests waiting per Revision; more get 503 at once")
		maxFibers    = flag.Int("default-max-fibers", 0, "per-replica fiber cap for Revisions whose maxFibers is 0; 0 leaves it to fiberd")

		drainDelay   = flag.Duration("drain-delay", 5*time.Second, "after SIGTERM, keep serving this long with readiness failing so endpoints drop the pod")
		drainTimeout = flag.Duration("drain-timeout", 30*time.Second, "after the drain delay, how long in-flight requests may finish before they are cut")
		logLevel     = flag.String("log-level", "info", "debug, info, warn or error")
	)
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	token, err := watchToken(*tokenFile, logger)
	if err != nil {
		return err
	}

	src := revision.NewConfigMapSource(kube, *resync)
	src.OnError = func(err error) { logger.Warn("unusable router metadata", "err", err) }

	srv := server.New(server.Options{
		HTTPAddr:  fmt.Sprintf(":%d", *httpPort),
		H2CAddr:   fmt.Sprintf(":%d", *h2cPort),
		AdminAddr: fmt.Sprintf(":%d", *adminPort),
		Proxy: proxy.Config{
			DefaultTimeout:   *timeout,
			QueueTimeout:     *queueTimeout,
			MaxQueue:         *maxQueue,
			DefaultMaxFibers: *maxFibers,
		},
		Source:       src,
		Client:       fibers.NewFiberdClient(token),
		Logger:       logger,
		DrainDelay:   *drainDelay,
		DrainTimeout: *drainTimeout,
	})
	if err := srv.Start(); err != nil {
		return err
	}
	logger.Info("fiber-router serving", "http", srv.HTTPAddr(), "h2c", srv.H2CAddr(), "admin", srv.AdminAddr())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	logger.Info("draining", "signal", s.String(), "inFlight", srv.Router.InFlight())
	// A second signal skips the rest of the drain.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-sig; cancel() }()
	err = srv.Shutdown(ctx)
	logger.Info("stopped", "err", err)
	return nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (pass --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// watchToken reads the token now (a missing token is fatal: every fiberd
// call would be refused) and re-reads it every minute, because kubelet
// updates a mounted Secret in place when it rotates.
func watchToken(path string, logger *slog.Logger) (func() string, error) {
	read := func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("--token-file %s is empty", path)
		}
		return tok, nil
	}
	tok, err := read()
	if err != nil {
		return nil, err
	}
	var cur atomic.Value
	cur.Store(tok)
	go func() {
		for range time.Tick(time.Minute) {
			if t, err := read(); err != nil {
				logger.Warn("keeping the previous fiberd token", "err", err)
			} else {
				cur.Store(t)
			}
		}
	}()
	return func() string { return cur.Load().(string) }, nil
}
