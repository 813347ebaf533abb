package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/egress/proxy"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// Environment of `fiberd egress-proxy` (the egress Pod's spec sets them;
// impl/grant/resources MakeEgressPod).
const (
	// EnvGrantKey is the grant controller's public key, PEM.
	EnvGrantKey = contract.EgressGrantKeyEnv
	// EnvPodNamespace is the egress Pod's namespace (downward API).
	EnvPodNamespace = contract.EgressNamespaceEnv
)

// egressProxyMain runs `fiberd egress-proxy`: the tenant namespace's
// egress proxy (package proxy). It needs no privilege and no file: the
// key and namespace come from its environment.
func egressProxyMain(args []string) error {
	fs := flag.NewFlagSet("fiberd egress-proxy", flag.ContinueOnError)
	listen := fs.String("listen", fmt.Sprintf(":%d", contract.EgressProxyPort), "address the proxy listens on")
	namespace := fs.String("namespace", os.Getenv(EnvPodNamespace), "the namespace whose grants are served (default $"+EnvPodNamespace+")")
	keyPEM := fs.String("grant-key", os.Getenv(EnvGrantKey), "the grant controller's public key, PEM (default $"+EnvGrantKey+")")
	maxTunnels := fs.Int("max-tunnels", proxy.DefaultMaxTunnels, "most open tunnels; more are answered 503")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *namespace == "" {
		return fmt.Errorf("--namespace (or $%s) is required: only grants of the proxy's own namespace are served", EnvPodNamespace)
	}
	key, err := signedgrant.ParsePublicKey(bytes.TrimSpace([]byte(*keyPEM)))
	if err != nil {
		return fmt.Errorf("--grant-key (or $%s): %w", EnvGrantKey, err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	s := &proxy.Server{Key: key, Namespace: *namespace, MaxTunnels: *maxTunnels}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	log.Printf("fiberd egress-proxy: serving grants of namespace %s on %s", *namespace, ln.Addr())
	err = s.Serve(ln)
	s.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
