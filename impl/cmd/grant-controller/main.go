// Command grant-controller runs the CapacityGrant controller
// (lampyr.dev/serving/impl/grant): admission against the installation's fiber
// capacity, Homes, signed grants and their renewal. Like impl/cmd/controller
// it runs on knative.dev/pkg/injection/sharedmain, which provides the
// informers, the work queue, leader election, logging and metrics.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	filteredfactory "knative.dev/pkg/client/injection/kube/informers/factory/filtered"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/injection/sharedmain"
	"knative.dev/pkg/leaderelection"
	"knative.dev/pkg/signals"
	"knative.dev/pkg/system"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/grant"
	"lampyr.dev/serving/impl/grant/homes"
)

// component names the controller for sharedmain: its logger, its
// config-logging / config-observability keys and the prefix of its
// leader-election Leases in the system namespace.
const component = "grant-controller"

// leaderElection keeps the timing the grant controller had before it ran on
// sharedmain (a replacement Pod takes over within seconds of a crash), with
// one bucket: admission is one decision over all grants. A
// config-leader-election ConfigMap in the system namespace is not read.
var leaderElection = leaderelection.Config{
	Buckets:       1,
	LeaseDuration: 15 * time.Second,
	RenewDeadline: 10 * time.Second,
	RetryPeriod:   2 * time.Second,
}

func main() {
	var (
		systemNS = flag.String("system-namespace", envOr(system.NamespaceEnvKey, contract.SystemNamespace), "namespace of config-lampyr and the installation's keys")
		homesNS  = flag.String("homes-namespace", envOr("LAMPYR_HOMES_NAMESPACE", contract.HomesNamespace), "namespace every Home (Pod, Service, Secret) runs in; never a tenant's")
		egress   = flag.String("egress-api-listen", fmt.Sprintf(":%d", contract.EgressAPIPort), "address of the fibers' egress API (POST "+contract.EgressAPIPath+", for Homes only; empty: not served)")
		elect    = flag.Bool("leader-elect", true, "reconcile only while holding the grant controller's Lease ("+component+".*) in the system namespace")
	)
	// This parses the flags (ours, and -kubeconfig defaulting to
	// $KUBECONFIG; empty means in-cluster), so ours are defined before.
	cfg := injection.ParseAndGetRESTConfigOrDie()
	// sharedmain and the system-namespace informers read the namespace
	// from the environment.
	if err := os.Setenv(system.NamespaceEnvKey, *systemNS); err != nil {
		log.Fatalf("grant-controller: setting %s: %v", system.NamespaceEnvKey, err)
	}

	ctx := signals.NewContext()
	ctx = homes.WithNamespace(ctx, *homesNS)
	// Quota Pods live in tenant namespaces: cached through a filtered
	// informer (their label only), never every Pod of the cluster.
	ctx = filteredfactory.WithSelectors(ctx, grant.FilteredInformerSelectors()...)
	ctx = grant.WithEgressAPI(ctx, *egress)
	ctx = leaderelection.WithConfig(ctx, &leaderElection)
	if !*elect {
		ctx = sharedmain.WithHADisabled(ctx)
	}
	sharedmain.MainWithConfig(ctx, component, cfg, grant.NewController)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
