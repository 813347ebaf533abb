// Command fiber-router is Lampyr's shared data plane: every Revision's backend
// Service leads here, and each request runs in a fiber leased from the
// Revision's Home (docs/contracts.md §2-§4).
package main

import (
	"context"
	"errors"
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
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "fiber-router:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	httpPort, h2cPort, adminPort int
	tokenFile, kubeconfig        string
	resync                       time.Duration
	proxy                        proxy.Config
	drainDelay, drainTimeout     time.Duration
	logLevel                     string
}

func parseFlags(args []string) (options, error) {
	def := proxy.DefaultConfig()
	var o options
	fs := flag.NewFlagSet("fiber-router", flag.ContinueOnError)
	fs.IntVar(&o.httpPort, "http-port", 80, "port for HTTP/1.1 (and h2c) traffic; the backend Service's port 80 targets it")
	fs.IntVar(&o.h2cPort, "h2c-port", 81, "port for h2c (gRPC) traffic; the backend Service's port 81 targets it")
	fs.IntVar(&o.adminPort, "admin-port", 9091, "port for /healthz, /readyz and /metrics")
	fs.StringVar(&o.tokenFile, "token-file", "/var/run/lampyr/fiber-router-token/token", "file holding the router's fiberd service token (Secret lampyr-system/fiber-router-token); re-read every minute")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for running outside a cluster; in-cluster config when empty")
	fs.DurationVar(&o.resync, "resync", 10*time.Minute, "informer resync period for router metadata ConfigMaps")
	fs.DurationVar(&o.proxy.DefaultTimeout, "default-timeout", def.DefaultTimeout, "request/stream/WebSocket lifetime for Revisions whose metadata has timeoutSeconds 0")
	fs.DurationVar(&o.proxy.QueueTimeout, "queue-timeout", def.QueueTimeout, "how long a request waits for a fiber at max-scale before 503 + Retry-After")
	fs.IntVar(&o.proxy.MaxQueue, "max-queue", def.MaxQueue, "most requests waiting per Revision; more get 503 at once")
	fs.IntVar(&o.proxy.DefaultMaxFibers, "default-max-fibers", 0, "per-replica fiber cap for Revisions whose maxFibers is 0; 0 leaves it to fiberd")
	fs.BoolVar(&o.proxy.FiberTunnels, "fiber-tunnels", def.FiberTunnels, "carry reuse-mode requests over one byte tunnel per fiber through its Home (fiberd's tunnel call) instead of fiberd's per-request proxy; Homes without the call are detected and use the proxy")
	fs.DurationVar(&o.drainDelay, "drain-delay", 5*time.Second, "after SIGTERM, keep serving this long with readiness failing so endpoints drop the pod")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "after the drain delay, how long in-flight requests may finish before they are cut")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, nil
}

func run() error {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		return err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	token, err := watchToken(o.tokenFile, logger)
	if err != nil {
		return err
	}

	src := revision.NewConfigMapSource(kube, o.resync)
	src.OnError = func(err error) { logger.Warn("unusable router metadata", "err", err) }

	srv := server.New(server.Options{
		HTTPAddr:     fmt.Sprintf(":%d", o.httpPort),
		H2CAddr:      fmt.Sprintf(":%d", o.h2cPort),
		AdminAddr:    fmt.Sprintf(":%d", o.adminPort),
		Proxy:        o.proxy,
		Source:       src,
		Client:       fibers.NewFiberdClient(token),
		Logger:       logger,
		DrainDelay:   o.drainDelay,
		DrainTimeout: o.drainTimeout,
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
