package ly

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	servingclient "knative.dev/serving/pkg/client/clientset/versioned"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/trust/seal"
)

// Cluster is a Lampyr installation as ly reaches it.
type Cluster struct {
	Context         string
	Kube            kubernetes.Interface
	Serving         servingclient.Interface
	Dynamic         dynamic.Interface
	LampyrNamespace string
}

// Connect loads the kubeconfig (KUBECONFIG or ~/.kube/config, or path) at
// context (empty: the current context).
func Connect(path, context string) (*Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig: %w", err)
	}
	name := context
	if name == "" {
		name = raw.CurrentContext
	}
	if name == "" {
		return nil, errors.New("no kube context: set KUBECONFIG or pass --context (a Kind cluster from this repository: KUBECONFIG=~/.cache/lampyr/clusters/lampyr.kubeconfig)")
	}
	if _, ok := raw.Contexts[name]; !ok {
		return nil, fmt.Errorf("--context %q is not in the kubeconfig (contexts: %s)", name, strings.Join(contextNames(raw.Contexts), ", "))
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kube context %s: %w", name, err)
	}
	// API warnings (the webhook's secure-defaults advice) as plain lines.
	rc.WarningHandler = rest.NewWarningWriter(os.Stderr, rest.WarningWriterOptions{Deduplicate: true})
	c := &Cluster{Context: name, LampyrNamespace: contract.SystemNamespace}
	if c.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if c.Serving, err = servingclient.NewForConfig(rc); err != nil {
		return nil, err
	}
	if c.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
		return nil, err
	}
	return c, nil
}

func contextNames[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Installation is what `ly cluster describe` prints and deploy uses.
type Installation struct {
	Context            string `json:"context"`
	Namespace          string `json:"namespace"`
	FleetKeyID         string `json:"fleetKeyID"`
	FleetPublicKeyPEM  string `json:"fleetPublicKey"`
	TemplateRepository string `json:"templateRepository"`
	Registry           string `json:"registry"`
	BackendStrategy    string `json:"backendStrategy,omitempty"`
	fleet              *seal.PublicKey
}

// Describe reads the installation's fleet public key and template repository.
func (c *Cluster) Describe(ctx context.Context) (*Installation, error) {
	ns := c.LampyrNamespace
	cfg, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, contract.ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("context %s has no Lampyr installation (ConfigMap %s/%s not found): install it with `ly cluster install`", c.Context, ns, contract.ConfigMapName)
	}
	if err != nil {
		return nil, fmt.Errorf("context %s: %w", c.Context, err)
	}
	in := &Installation{Context: c.Context, Namespace: ns, TemplateRepository: strings.TrimSpace(cfg.Data[lampyrconfig.KeyTemplateRepository]), BackendStrategy: cfg.Data[lampyrconfig.KeyBackendStrategy]}
	if in.TemplateRepository == "" {
		return nil, fmt.Errorf("template repository missing: set %s in ConfigMap %s/%s (e.g. localhost:5002/lampyr/templates)", lampyrconfig.KeyTemplateRepository, ns, contract.ConfigMapName)
	}
	in.Registry, _, _ = strings.Cut(in.TemplateRepository, "/")
	key, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, contract.FleetKeyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("the fleet public key is not published yet (ConfigMap %s/%s): is lampyr-grant-controller running? kubectl -n %s get pods", ns, contract.FleetKeyName, ns)
	}
	if err != nil {
		return nil, err
	}
	if in.fleet, err = seal.ParsePublicKeyPEM([]byte(key.Data[contract.FleetPublicKeyKey])); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s key %s: %w", ns, contract.FleetKeyName, contract.FleetPublicKeyKey, err)
	}
	in.FleetKeyID = in.fleet.KeyID()
	in.FleetPublicKeyPEM = key.Data[contract.FleetPublicKeyKey]
	return in, nil
}
