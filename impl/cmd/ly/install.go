package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/impl/progress"
)

// clusterInstall is `ly cluster install`: the lampyr install profile
// (upstream Serving CRDs, webhook and configuration rendered from
// knative.dev/serving, Lampyr's controller, grant controller, fiber-router,
// CapacityGrant CRD, and the networking provider) applied server-side to
// the kube context, with images built from this checkout and pushed to the
// local registry (localhost:5002), or taken from LAMPYR_CLUSTER_INPUTS /
// LAMPYR_CONTROLLER_MANIFEST + LAMPYR_GRANT_IMAGE. The cluster must pull
// from that registry: Kind clusters made by `just cluster-up` do.
func clusterInstall(ctx context.Context, c common, provider string, nodePort int, log io.Writer) error {
	path := c.kubeconfig
	if path == "" {
		path = strings.Split(os.Getenv("KUBECONFIG"), string(os.PathListSeparator))[0]
	}
	if path == "" {
		home, _ := os.UserHomeDir()
		path = filepath.Join(home, ".kube", "config")
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w (set KUBECONFIG or --kubeconfig)", path, err)
	}
	ctxName := c.context
	if ctxName == "" {
		ctxName = raw.CurrentContext
	}
	if _, ok := raw.Contexts[ctxName]; !ok || ctxName == "" {
		return fmt.Errorf("no kube context %q in %s: pass --context", ctxName, path)
	}
	// The installer uses a kubeconfig's current context: pin the chosen one.
	raw.CurrentContext = ctxName
	tmp, err := os.CreateTemp("", "ly-kubeconfig-*")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := clientcmd.WriteToFile(*raw, tmp.Name()); err != nil {
		return err
	}
	env := clusters.NewEnv(progress.New(log), environ.Clusters())
	name := strings.TrimPrefix(ctxName, "kind-")
	info := kindcluster.Info{Name: name, Kubeconfig: tmp.Name(), Ports: []kindcluster.PortMapping{{NodePort: clusters.DefaultNodePort}}}
	if known, err := env.Manager().ReadInfo(name); err == nil && len(known.Ports) > 0 {
		info.Ports = known.Ports
	}
	if nodePort > 0 {
		info.Ports = []kindcluster.PortMapping{{NodePort: nodePort}}
	}
	fmt.Fprintf(log, "installing the lampyr profile (%s, gateway NodePort %d) on context %s\n", provider, info.Gateway().NodePort, ctxName)
	return env.Install(ctx, info, "lampyr", provider)
}
