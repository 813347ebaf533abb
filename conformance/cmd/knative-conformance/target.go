package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/conformance/upstream"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/networking"
)

// resolveTarget settles what is tested and where: the networking provider
// (on a managed cluster, the one installed there), the mode, the gateway,
// the implementation and its version, the declared expectations and the
// report directory.
func (r *runner) resolveTarget(ctx context.Context) error {
	o, rep := r.o, r.rep
	if o.cluster != "" && o.provider == "" {
		// Managed mode: test what the cluster runs.
		info, err := r.env.Manager().ReadInfo(o.cluster)
		if err != nil {
			return usageError(err)
		}
		c, err := e2eutil.NewClients(info.Kubeconfig)
		if err != nil {
			return usageError(err)
		}
		installed, err := install.InstalledProvider(ctx, c.Install())
		if err != nil {
			return usageError(err)
		}
		if installed != nil {
			o.provider = installed.Name()
		}
	}
	if o.provider == "" {
		o.provider = environ.Provider()
	}
	prov, err := networking.Get(o.provider)
	if err != nil {
		return usageError(err)
	}
	o.provider = prov.Name()
	if o.ingressClass == "" {
		o.ingressClass = prov.IngressClass()
	}
	if o.cluster != "" {
		info, err := r.env.Manager().ReadInfo(o.cluster)
		if err != nil {
			return usageError(err)
		}
		o.kubeconfig = info.Kubeconfig
		r.profile, _ = clusters.PairedProfile(o.cluster)
		gw := prov.Gateway(info.Gateway().NodePort)
		r.gwNS, r.gwName = gw.Namespace, gw.Service
		if info.Gateway().HostPort != info.Gateway().NodePort {
			return usageError(fmt.Errorf("cluster %s publishes its gateway NodePort %d on host port %d: the suites dial the NodePort itself, so use a cluster whose ports match (stock, lampyr)", o.cluster, info.Gateway().NodePort, info.Gateway().HostPort))
		}
		rep.Cluster = upstream.Cluster{Name: o.cluster, Gateway: fmt.Sprintf("%s:%d (%s/%s)", o.ingressEndpoint, gw.NodePort, r.gwNS, r.gwName)}
	} else {
		rep.Mode = "third-party"
		r.gwNS, r.gwName, _ = strings.Cut(o.gatewayService, "/")
		rep.Cluster = upstream.Cluster{Kubeconfig: o.kubeconfig, Gateway: fmt.Sprintf("%s (%s/%s)", o.ingressEndpoint, r.gwNS, r.gwName)}
	}
	if o.implementation == "" {
		switch r.profile {
		case "lampyr":
			o.implementation = "lampyr"
		case "stock":
			o.implementation = "knative-serving"
		default:
			return usageError(errors.New("--implementation: name the implementation under test (no cluster profile to infer it from)"))
		}
	}
	if o.version == "" {
		o.version = knative.ServingVersion
		if r.profile == "lampyr" {
			o.version = upstream.GitVersion(r.root)
		}
	}
	if o.expectations == "" && r.profile != "" {
		o.expectations = filepath.Join(r.root, "conformance", "expectations", r.profile+"-"+o.provider+".yaml")
		if _, err := os.Stat(o.expectations); errors.Is(err, os.ErrNotExist) {
			// A provider's first run: nothing is declared, so every failure
			// is undeclared and the run fails, but its report is what the
			// declarations are written from.
			r.log.Printf("warning: no declared expectations for %s on %s (%s does not exist): every failure counts as undeclared; write that file from this run's report", r.profile, o.provider, o.expectations)
			o.expectations = ""
		}
	}
	if o.expectations != "" {
		if r.exp, err = upstream.LoadExpectations(o.expectations); err != nil {
			return usageError(err)
		}
		rep.Claimed, rep.Unsupported = r.exp.Claimed, r.exp.UnsupportedWithTests()
	}
	if o.out == "" {
		o.out = filepath.Join(environ.ArtifactsDir(), "conformance", orName(o.cluster, o.implementation))
	}
	rep.Implementation = upstream.Implementation{Name: o.implementation, Version: o.version, Networking: fmt.Sprintf("%s: %s (class %s)", o.provider, prov.Describe(), o.ingressClass)}
	if rep.Implementation.Name == "lampyr" {
		rep.Implementation.URL = "https://lampyr.dev/serving"
	}
	return nil
}

// checkCluster connects to the cluster, records its version, node count
// and host in the report, and checks that the gateway Service exists.
func (r *runner) checkCluster(ctx context.Context) error {
	o, rep := r.o, r.rep
	c, err := e2eutil.NewClients(o.kubeconfig)
	if err != nil {
		return usageError(err)
	}
	r.c = c
	if v, err := c.Kube.Discovery().ServerVersion(); err == nil {
		rep.Cluster.KubernetesVersion = v.GitVersion
	} else {
		return fmt.Errorf("cluster at %s does not answer: %w", o.kubeconfig, err)
	}
	if nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		rep.Cluster.Nodes = len(nodes.Items)
	}
	if _, err := c.Kube.CoreV1().Services(r.gwNS).Get(ctx, r.gwName, metav1.GetOptions{}); err != nil {
		return usageError(fmt.Errorf("gateway Service %s/%s: %w (is Knative Serving installed with %s?)", r.gwNS, r.gwName, err, o.provider))
	}
	host, _ := os.Hostname()
	rep.Cluster.Host = host
	return nil
}
