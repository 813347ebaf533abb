// Command grant-controller runs the CapacityGrant controller
// (lampyr.dev/serving/impl/grant): admission against the installation's fiber
// capacity, Homes, signed grants and their renewal.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/grant"
	"lampyr.dev/serving/impl/grant/resources"
)

func main() {
	var (
		kubeconfig = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig; empty means in-cluster")
		systemNS   = flag.String("system-namespace", envOr("SYSTEM_NAMESPACE", contract.SystemNamespace), "namespace of config-lampyr and the installation's keys")
		homesNS    = flag.String("homes-namespace", envOr("LAMPYR_HOMES_NAMESPACE", resources.DefaultHomesNamespace), "namespace every Home (Pod, Service, Secret) runs in; never a tenant's")
		elect      = flag.Bool("leader-elect", true, "run only while holding the Lease lampyr-grant-controller in the system namespace")
	)
	flag.Parse()
	zl, _ := zap.NewProduction()
	logger := zl.Sugar().Named("grant-controller")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = logging.WithLogger(ctx, logger)

	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		log.Fatalf("grant-controller: cluster config: %v", err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	run := func(ctx context.Context) {
		keys, err := grant.EnsureKeys(ctx, kube, *systemNS)
		if err != nil {
			logger.Fatalw("loading the installation's keys", zap.Error(err))
		}
		c := grant.NewController(ctx, grant.Options{Kube: kube, Dynamic: dyn, SystemNamespace: *systemNS, HomesNamespace: *homesNS, Keys: keys})
		logger.Infow("grant controller running", "systemNamespace", *systemNS, "homesNamespace", *homesNS)
		if err := c.Run(ctx); err != nil {
			logger.Fatalw("grant controller stopped", zap.Error(err))
		}
	}
	if !*elect {
		run(ctx)
		return
	}
	id, _ := os.Hostname()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: contract.GrantControllerName, Namespace: *systemNS},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: run,
			OnStoppedLeading: func() {
				// Another replica takes over; exit so we restart clean.
				logger.Info("lost leadership")
				os.Exit(0)
			},
		},
	})
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
