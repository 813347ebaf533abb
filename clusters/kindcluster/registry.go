package kindcluster

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/kind/pkg/cluster/nodes"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"

	"lampyr.dev/serving/impl/progress"
)

// Registry is the shared local registry, run as Kind's local-registry
// documentation describes: one container, published on 127.0.0.1:HostPort,
// joined to the "kind" network, and named in each node's containerd hosts
// config so that localhost:HostPort means the same registry on the host and
// inside every node.
type Registry struct {
	Container string
	Image     string
	HostPort  int
	created   bool
}

// DefaultRegistryPort is the port of Kind's documentation.
const DefaultRegistryPort = 5002

// HostAddress is the registry as the host and the nodes name it.
func (r *Registry) HostAddress() string { return fmt.Sprintf("localhost:%d", r.HostPort) }

// HostsTOML is the containerd hosts file for HostAddress inside a node.
func (r *Registry) HostsTOML() string {
	return fmt.Sprintf("[host.\"http://%s:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", r.Container)
}

// Ensure starts the registry container unless it already runs.
func (r *Registry) Ensure(ctx context.Context, log *progress.Log) error {
	state, err := docker(ctx, "inspect", "-f", "{{.State.Running}} {{.Config.Image}}", r.Container)
	if err == nil {
		running, img, _ := strings.Cut(state, " ")
		if img == r.Image {
			if running == "true" {
				return nil
			}
			_, err = docker(ctx, "start", r.Container)
			return err
		}
		// A new registry build: replace the container; the images it
		// holds live in a volume and survive.
		log.Printf(" • replacing registry %s (image %s -> %s); stored images are kept", r.Container, img, r.Image)
		if _, err := docker(ctx, "rm", "-f", r.Container); err != nil {
			return err
		}
	}
	return log.Step(fmt.Sprintf("Starting registry %s on 127.0.0.1:%d", r.Container, r.HostPort), func() error {
		if _, err := docker(ctx, "run", "-d", "--restart=always", "--name", r.Container,
			"-v", r.Container+"-data:/var/lib/registry",
			"-p", fmt.Sprintf("127.0.0.1:%d:5000", r.HostPort), r.Image); err != nil {
			return err
		}
		r.created = true
		return nil
	})
}

// ConfigureNode joins the registry to the node's network and writes the
// node's hosts file. containerd reads hosts files on each pull.
func (r *Registry) ConfigureNode(ctx context.Context, n nodes.Node) error {
	network, err := docker(ctx, "inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", n.String())
	if err != nil {
		return err
	}
	for _, net := range strings.Fields(network) {
		if out, err := docker(ctx, "network", "connect", net, r.Container); err != nil && !strings.Contains(out, "already exists") {
			return err
		}
	}
	return nodeutils.WriteFile(n, fmt.Sprintf("/etc/containerd/certs.d/%s/hosts.toml", r.HostAddress()), r.HostsTOML())
}

// CleanupIfCreated removes the container if Ensure created it (after an
// interrupted or failed first creation).
func (r *Registry) CleanupIfCreated(log *progress.Log) {
	if !r.created {
		return
	}
	log.Printf(" • removing registry %s created by this run", r.Container)
	_, _ = docker(context.Background(), "rm", "-f", r.Container)
	r.created = false
}
