package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/installenv"
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
	cache := installenv.Cache()
	inst := &install.Installer{
		Cache:   cache,
		Online:  installenv.Set(install.EnvOnline),
		Sources: install.LampyrSourcesFrom(os.Getenv),
		Log:     progress.New(log),
	}
	name := strings.TrimPrefix(ctxName, "kind-")
	target := install.Cluster{Name: name, Kubeconfig: tmp.Name(), NodePort: install.DefaultNodePort}
	// A Kind cluster made by `just cluster-up` recorded its gateway's port.
	if p, ok := install.RecordedNodePort(installenv.State(cache), name); ok {
		target.NodePort = p
	}
	if nodePort > 0 {
		target.NodePort = nodePort
	}
	fmt.Fprintf(log, "installing the lampyr profile (%s, gateway NodePort %d) on context %s\n", provider, target.NodePort, ctxName)
	return inst.Install(ctx, target, install.ProfileLampyr, provider)
}
