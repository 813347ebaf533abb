package portability

import (
	"context"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/harness"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
)

// TargetFacts reads what a ConformanceReport records of each target, the
// reference first: the implementation (as the targets file names it, else
// from the profile and what the cluster shows), its networking provider,
// and the cluster (Kubernetes version, nodes, gateway, kubeconfig).
func (f *Fleet) TargetFacts(ctx context.Context, list *Targets) []TargetFacts {
	host, _ := os.Hostname()
	var out []TargetFacts
	for _, t := range append([]*harness.Target{f.Reference}, f.Others()...) {
		spec, _ := list.ByName(t.Name)
		tf := TargetFacts{Name: t.Name, Reference: t == f.Reference, Profile: t.Profile, Mode: "managed",
			Registry: t.Registry, Namespace: f.Namespace, Context: t.Context,
			Cluster: upstream.Cluster{Name: t.Name, Kubeconfig: t.Kubeconfig, Gateway: t.Gateway, Host: host}}
		if t.External {
			tf.Mode = "external"
			tf.Cluster.Name = t.Context
			tf.Cluster.Kubeconfig = t.Source
		}
		if v, err := t.Clients.Kube.Discovery().ServerVersion(); err == nil {
			tf.Cluster.KubernetesVersion = v.GitVersion
		}
		if nodes, err := t.Clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
			tf.Cluster.Nodes = len(nodes.Items)
		}
		tf.Implementation = upstream.Implementation{Name: spec.Implementation, Version: spec.Version, Networking: describeProvider(t.Provider)}
		if tf.Implementation.Name == "" {
			tf.Implementation.Name = map[string]string{clusters.ProfileStock: "knative-serving", clusters.ProfileLampyr: "lampyr"}[t.Profile]
		}
		if tf.Implementation.Version == "" {
			tf.Implementation.Version = installedVersion(ctx, t)
		}
		out = append(out, tf)
	}
	return out
}

func describeProvider(name string) string {
	if name == "" {
		return "unknown (not stated, and config-network names no known class)"
	}
	p, err := networking.Get(name)
	if err != nil {
		return name
	}
	return fmt.Sprintf("%s: %s (class %s)", p.Name(), p.Describe(), p.IngressClass())
}

// installedVersion is what this run installed on a managed target (the
// pinned Serving; Lampyr from this checkout), else the version label
// Knative's release manifests put on the knative-serving namespace.
func installedVersion(ctx context.Context, t *harness.Target) string {
	if !t.External {
		if t.Profile == clusters.ProfileLampyr {
			return upstream.GitVersion(e2eutil.RepoRoot())
		}
		return knative.ServingVersion
	}
	ns, err := t.Clients.Kube.CoreV1().Namespaces().Get(ctx, knative.Namespace, metav1.GetOptions{})
	if err == nil {
		if v := ns.Labels["app.kubernetes.io/version"]; v != "" {
			return "serving " + v
		}
	}
	return "unknown"
}
