package install

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Clients are what an install talks to a cluster with: the rest config
// (server-side apply builds its own mapper from it), the typed client for
// ConfigMaps and Pods, and the dynamic client for KIngresses. Its own type,
// so the installer that ships in `ly cluster install` does not take the test
// framework's helpers; clusters/e2eutil converts its Clients to it.
type Clients struct {
	Config  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewClients loads a kubeconfig file (its current context), with the same
// client rate limits the suites use.
func NewClients(kubeconfig string) (*Clients, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return ClientsFor(cfg)
}

// ClientsFor makes the typed and dynamic clients for cfg.
func ClientsFor(cfg *rest.Config) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{Config: cfg, Kube: kube, Dynamic: dyn}, nil
}

// kingresses are Knative's KIngresses, whose finalizers a provider switch
// releases.
var kingresses = schema.GroupVersionResource{Group: "networking.internal.knative.dev", Version: "v1alpha1", Resource: "ingresses"}
