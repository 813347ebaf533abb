// Command controller is Lampyr's Knative Serving controller: the upstream
// reconcilers from knative.dev/serving v0.50.0, used as a library and
// unchanged, plus the Lampyr Revision reconciler in place of the stock
// Revision, ServerlessService and autoscaler ones (no Pods, no KPA, no
// activator). It is shaped after upstream cmd/controller/main.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"

	versioned "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	netcfg "knative.dev/networking/pkg/config"
	filteredfactory "knative.dev/pkg/client/injection/kube/informers/factory/filtered"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/injection/sharedmain"
	"knative.dev/pkg/reconciler"
	"knative.dev/pkg/signals"
	"knative.dev/pkg/system"
	"knative.dev/serving/pkg/networking"
	"knative.dev/serving/pkg/reconciler/certificate"
	"knative.dev/serving/pkg/reconciler/configuration"
	"knative.dev/serving/pkg/reconciler/domainmapping"
	"knative.dev/serving/pkg/reconciler/gc"
	"knative.dev/serving/pkg/reconciler/labeler"
	"knative.dev/serving/pkg/reconciler/nscert"
	"knative.dev/serving/pkg/reconciler/route"
	"knative.dev/serving/pkg/reconciler/service"

	"knative.dev/serving/pkg/client/certmanager/injection/informers/acme/v1/challenge"
	v1certificate "knative.dev/serving/pkg/client/certmanager/injection/informers/certmanager/v1/certificate"
	"knative.dev/serving/pkg/client/certmanager/injection/informers/certmanager/v1/certificaterequest"
	"knative.dev/serving/pkg/client/certmanager/injection/informers/certmanager/v1/clusterissuer"
	"knative.dev/serving/pkg/client/certmanager/injection/informers/certmanager/v1/issuer"

	"lampyr.dev/serving/impl/reconciler/revision"
)

// component names the controller for sharedmain: its logging and
// observability ConfigMap keys, leader-election lease prefix and metrics.
// Upstream's "controller" is kept so config-logging's loglevel.controller
// and config-leader-election apply unchanged; the Lampyr Revision
// reconciler's lease name still differs from stock's (it is derived from
// the reconciler's Go type), so the two can never both lead.
const component = "controller"

// ctors is upstream's list minus revision.NewController and
// serverlessservice.NewController (both Pod-based), plus Lampyr's Revision
// reconciler. nscert is kept as upstream has it: it only acts when
// config-network selects namespaces for wildcard certificates.
var ctors = []injection.ControllerConstructor{
	configuration.NewController,
	labeler.NewController,
	revision.NewController,
	route.NewController,
	service.NewController,
	gc.NewController,
	nscert.NewController,
	domainmapping.NewController,
}

func main() {
	flag.DurationVar(&reconciler.DefaultTimeout,
		"reconciliation-timeout", reconciler.DefaultTimeout,
		"The amount of time to give each reconciliation of a resource to complete before its context is canceled.")

	ctx := signals.NewContext()
	// The Lampyr Revision reconciler caches only its own ConfigMaps and
	// EndpointSlices and fiber-router's slices, through filtered informers.
	ctx = filteredfactory.WithSelectors(ctx, revision.FilteredInformerSelectors()...)

	// This parses flags, so the flag above must be defined before it runs.
	cfg := injection.ParseAndGetRESTConfigOrDie()
	client := kubernetes.NewForConfigOrDie(cfg)

	// As upstream: the certificate reconciler (cert-manager backed
	// KCertificates) runs only when config-network asks for it, and then
	// cert-manager's CRDs must exist.
	if shouldEnableNetCertManagerController(ctx, client) {
		v := versioned.NewForConfigOrDie(cfg)
		if ok, err := certManagerCRDsExist(v); !ok {
			log.Fatalf("Please install cert-manager: %v", err)
		}
		for _, inf := range []injection.InformerInjector{challenge.WithInformer, v1certificate.WithInformer, certificaterequest.WithInformer, clusterissuer.WithInformer, issuer.WithInformer} {
			injection.Default.RegisterInformer(inf)
		}
		ctors = append(ctors, certificate.NewController)
	}

	sharedmain.MainWithConfig(ctx, component, cfg, ctors...)
}

func shouldEnableNetCertManagerController(ctx context.Context, client *kubernetes.Clientset) bool {
	cm, err := client.CoreV1().ConfigMaps(system.Namespace()).Get(ctx, netcfg.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		log.Fatalf("Failed to get ConfigMap %s/%s: %v", system.Namespace(), netcfg.ConfigMapName, err)
	}
	return certManagerRequired(cm)
}

func certManagerRequired(cm *corev1.ConfigMap) bool {
	netCfg, err := netcfg.NewConfigFromMap(cm.Data)
	if err != nil {
		log.Fatalf("Failed to construct network config: %v", err)
	}
	return networking.IsNetCertManagerControllerRequired(netCfg)
}

func certManagerCRDsExist(client *versioned.Clientset) (bool, error) {
	if ok, err := findCRD(client, "cert-manager.io/v1", []string{"certificaterequests", "certificates", "clusterissuers", "issuers"}); !ok {
		return false, err
	}
	if ok, err := findCRD(client, "acme.cert-manager.io/v1", []string{"challenges"}); !ok {
		return false, err
	}
	return true, nil
}

func findCRD(client *versioned.Clientset, groupVersion string, crds []string) (bool, error) {
	resourceList, err := client.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false, err
	}
	present := map[string]bool{}
	for _, r := range resourceList.APIResources {
		present[r.Name] = true
	}
	for _, crd := range crds {
		if !present[crd] {
			return false, fmt.Errorf("cert-manager CRD missing: %s", crd)
		}
	}
	return true, nil
}
