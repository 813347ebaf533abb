// Command fiber-router is Lampyr's shared data plane: every Revision's backend
// Service leads here, and each request runs in a fiber leased from the
// Revision's Home (docs/contracts.md §2-§4). It reads router metadata only in
// Lampyr's own namespace and presents each Home a credential minted for that
// Home alone (docs/security.md §3, §4).
package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/router/fibers"
	"lampyr.dev/serving/impl/router/proxy"
	"lampyr.dev/serving/impl/router/revision"
	"lampyr.dev/serving/impl/router/server"
	"lampyr.dev/serving/impl/trust/routercred"
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
	routerKeyFile, kubeconfig    string
	// metadataNamespace holds the router metadata; homesNamespace the Home
	// Services a Home endpoint may name.
	metadataNamespace, homesNamespace string
	maxRevisions                      int
	maxRevisionsPerNamespace          int
	allowUnauthenticatedHomes         bool
	resync                            time.Duration
	proxy                             proxy.Config
	drainDelay, drainTimeout          time.Duration
	logLevel                          string
}

func parseFlags(args []string) (options, error) {
	def := proxy.DefaultConfig()
	var o options
	// SYSTEM_NAMESPACE is set from the Pod's namespace, as Knative
	// components do; without it, Lampyr's default namespace.
	systemNamespace := os.Getenv("SYSTEM_NAMESPACE")
	if systemNamespace == "" {
		systemNamespace = contract.SystemNamespace
	}
	fs := flag.NewFlagSet("fiber-router", flag.ContinueOnError)
	fs.IntVar(&o.httpPort, "http-port", 80, "port for HTTP/1.1 (and h2c) traffic; the backend Service's port 80 targets it")
	fs.IntVar(&o.h2cPort, "h2c-port", 81, "port for h2c (gRPC) traffic; the backend Service's port 81 targets it")
	fs.IntVar(&o.adminPort, "admin-port", 9091, "port for /healthz, /readyz and /metrics")
	fs.StringVar(&o.routerKeyFile, "router-key-file", "/var/run/lampyr/fiber-router-key/private.pem", "PEM file of the router key (Secret lampyr-system/fiber-router-key, key private.pem) with which the router mints each Home's credential; read at start, so a rotated key needs a restart")
	fs.StringVar(&o.metadataNamespace, "metadata-namespace", systemNamespace, "the only namespace whose router metadata ConfigMaps are read (Lampyr's own, where tenants cannot write); default $SYSTEM_NAMESPACE, else "+contract.SystemNamespace)
	fs.StringVar(&o.homesNamespace, "homes-namespace", contract.HomesNamespace, "namespace of the Home Services; router metadata naming a Home endpoint that is neither an IP address nor a Service there is refused")
	fs.IntVar(&o.maxRevisions, "max-revisions", 10000, "most Revisions the router holds; metadata of further Revisions is refused (logged, counted in lampyr_router_metadata_refused_total{reason=\"full\"}) until some are deleted")
	fs.IntVar(&o.maxRevisionsPerNamespace, "max-revisions-per-namespace", 1000, "most Revisions of any one namespace the router holds, so one tenant cannot fill --max-revisions and leave the others' Revisions unknown (404); further Revisions of that namespace are refused (logged, counted in lampyr_router_metadata_refused_total{reason=\"namespace-full\"}) until some of its own are deleted, other namespaces unaffected. Keep --max-revisions at least tenant namespaces x this")
	fs.BoolVar(&o.allowUnauthenticatedHomes, "allow-unauthenticated-homes", false, "also dial, in clear, Homes whose router metadata names no key (data.homeKeySHA256 empty: Homes of a Lampyr version before Home keys) during an upgrade; off, they are refused (503, logged) and sent no credential. Every Home the current grant controller runs has a key; turn this off once all do (docs/security.md §3)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for running outside a cluster; in-cluster config when empty")
	fs.DurationVar(&o.resync, "resync", 10*time.Minute, "informer resync period for router metadata ConfigMaps")
	fs.DurationVar(&o.proxy.DefaultTimeout, "default-timeout", def.DefaultTimeout, "request/stream/WebSocket lifetime for Revisions whose metadata has timeoutSeconds 0")
	fs.DurationVar(&o.proxy.QueueTimeout, "queue-timeout", def.QueueTimeout, "how long a request waits for a fiber at max-scale before 503 + Retry-After")
	fs.IntVar(&o.proxy.MaxQueue, "max-queue", def.MaxQueue, "most requests waiting per Revision (at max-scale, and separately for its Home); more get 503 at once")
	fs.DurationVar(&o.proxy.HomeWait, "home-wait", def.HomeWait, "how long a request is held while its Revision has no Home that can start fibers (the Home Pod deleted, evicted or drained and its replacement starting) before 503 + Retry-After; 0 answers 503 at once")
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
	switch {
	case o.metadataNamespace == "":
		// An informer reads every namespace when given none.
		return o, errors.New("--metadata-namespace is empty; pass Lampyr's system namespace (router metadata is never read cluster-wide)")
	case o.homesNamespace == "":
		return o, errors.New("--homes-namespace is empty; pass the namespace of the Home Services")
	case o.maxRevisions < 1:
		return o, fmt.Errorf("--max-revisions %d: want at least 1", o.maxRevisions)
	case o.maxRevisionsPerNamespace < 1 || o.maxRevisionsPerNamespace > o.maxRevisions:
		return o, fmt.Errorf("--max-revisions-per-namespace %d: want 1 to --max-revisions (%d)", o.maxRevisionsPerNamespace, o.maxRevisions)
	case o.routerKeyFile == "":
		return o, errors.New("--router-key-file is empty; pass the mounted router key (Secret lampyr-system/fiber-router-key, key private.pem)")
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

	key, err := readRouterKey(o.routerKeyFile)
	if err != nil {
		return err
	}

	homes := fibers.NewFiberdClient(routercred.NewMinter(key))
	homes.AllowUnauthenticatedHomes = o.allowUnauthenticatedHomes
	if o.allowUnauthenticatedHomes {
		logger.Warn("--allow-unauthenticated-homes: Homes whose metadata names no key are dialled in clear, and whoever holds their address is sent their credential")
	}
	srv := server.New(server.Options{
		HTTPAddr:     fmt.Sprintf(":%d", o.httpPort),
		H2CAddr:      fmt.Sprintf(":%d", o.h2cPort),
		AdminAddr:    fmt.Sprintf(":%d", o.adminPort),
		Proxy:        o.proxy,
		Source:       revision.NewConfigMapSource(kube, o.metadataNamespace, o.homesNamespace, o.resync),
		Client:       homes,
		Logger:       logger,
		MaxRevisions: o.maxRevisions,
		DrainDelay:   o.drainDelay,
		DrainTimeout: o.drainTimeout,
		// One tenant cannot fill the table for the others.
		MaxRevisionsPerNamespace: o.maxRevisionsPerNamespace,
	})
	if err := srv.Start(); err != nil {
		return err
	}
	logger.Info("fiber-router serving", "http", srv.HTTPAddr(), "h2c", srv.H2CAddr(), "admin", srv.AdminAddr(),
		"metadataNamespace", o.metadataNamespace, "homesNamespace", o.homesNamespace, "routerKeyID", routercred.KeyID(key.Public().(ed25519.PublicKey))[:16])

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

// readRouterKey reads the router key. Without it no Home would let the
// router in, so a missing or unreadable key is fatal rather than a router
// that is ready and fails every request.
func readRouterKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--router-key-file: %w (mount Secret lampyr-system/fiber-router-key, which the grant controller creates)", err)
	}
	key, err := routercred.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("--router-key-file %s: %w", path, err)
	}
	return key, nil
}
