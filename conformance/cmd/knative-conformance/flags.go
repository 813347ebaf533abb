package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/impl/install/networking"
)

type options struct {
	cluster, kubeconfig, gatewayService, ingressEndpoint, ingressClass, provider string
	registry, implementation, version, expectations, out, suites, reference      string
	parallel                                                                     int
	timeout                                                                      time.Duration
	extraArgs, run                                                               string
	// imageSnapshots: "auto" (on for Lampyr), "true" or "false".
	imageSnapshots string
	// lampyrConfig: config-lampyr settings for the run on a managed Lampyr
	// cluster (key=value,...).
	lampyrConfig string
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("knative-conformance", flag.ContinueOnError)
	fs.StringVar(&o.cluster, "cluster", "", "managed mode: a cluster created by `just cluster-up` (stock, lampyr)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "third-party mode: the cluster's kubeconfig")
	fs.StringVar(&o.gatewayService, "gateway-service", "", "third-party mode: namespace/name of the Service in front of the KIngress implementation (its port 80 NodePort is dialled)")
	fs.StringVar(&o.ingressEndpoint, "ingress-endpoint", "127.0.0.1", "address that reaches the gateway Service's node ports")
	fs.StringVar(&o.ingressClass, "ingress-class", "", "the KIngress class (default: the --provider's)")
	fs.StringVar(&o.provider, "provider", "", "networking provider installed on the cluster ("+strings.Join(networking.Names(), ", ")+"; default: on a managed cluster the one installed there, else from "+environ.Networking+", else "+networking.Default+")")
	fs.StringVar(&o.registry, "registry", "", "where the test images are pushed, as registry/path (default: localhost:5002, the local registry)")
	fs.StringVar(&o.implementation, "implementation", "", "name of the implementation under test (default: from the cluster's profile)")
	fs.StringVar(&o.version, "version", "", "its version (default: Knative Serving's pinned version, or this checkout's for Lampyr)")
	fs.StringVar(&o.expectations, "expectations", "", "declared expectations (default: conformance/expectations/<profile>-<provider>.yaml)")
	fs.StringVar(&o.out, "out", "", "report directory (default: $LAMPYR_ARTIFACTS/conformance/<cluster>)")
	fs.StringVar(&o.suites, "suites", "api,runtime,ingress", "comma-separated suites: api, runtime (Knative Serving's), ingress (Knative networking's KIngress suite)")
	fs.StringVar(&o.reference, "reference", "", "a reference report.yaml (stock) to compare with, written as side-by-side.md")
	fs.IntVar(&o.parallel, "parallel", 4, "parallel tests within a suite (go test -parallel)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Minute, "per-suite go test timeout")
	fs.StringVar(&o.run, "run", "", "only the tests matching this go test -run pattern (the report is then partial; the ingress suite's tests are TestIngressConformance/<name>)")
	fs.StringVar(&o.extraArgs, "suite-args", "", "extra space-separated flags for the api and runtime suites (e.g. -disable-optional-api)")
	fs.StringVar(&o.imageSnapshots, "image-snapshots", "auto", "snapshot each test image and register it in config-lampyr image-snapshots, so the suites' image-only Services run on Lampyr (auto: when the implementation is lampyr)")
	fs.StringVar(&o.lampyrConfig, "lampyr-config", "default-memory-per-fiber=64Mi,fiber-memory-capacity=16Gi,namespace-fiber-memory-share=100%", "managed Lampyr clusters: config-lampyr settings for the run, key=value,... (the suites keep many Revisions alive at once, all in one namespace, and send 200 concurrent requests to one; the test images need far less than the default 256Mi per fiber)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch o.imageSnapshots {
	case "auto", "true", "false":
	default:
		return nil, fmt.Errorf("--image-snapshots %q: want auto, true or false", o.imageSnapshots)
	}
	switch {
	case o.cluster == "" && o.kubeconfig == "":
		return nil, errors.New("say which cluster: --cluster NAME (created by `just cluster-up`) or --kubeconfig PATH with --gateway-service NS/NAME (third-party mode)")
	case o.cluster != "" && o.kubeconfig != "":
		return nil, errors.New("--cluster and --kubeconfig are two modes: give one")
	case o.kubeconfig != "" && !strings.Contains(o.gatewayService, "/"):
		return nil, fmt.Errorf("--gateway-service %q: third-party mode needs the gateway Service as namespace/name (e.g. traefik/traefik, kourier-system/kourier)", o.gatewayService)
	}
	for _, s := range strings.Split(o.suites, ",") {
		if _, ok := suites[s]; !ok {
			return nil, fmt.Errorf("--suites: unknown suite %q (known: api, runtime, ingress)", s)
		}
	}
	return o, nil
}
