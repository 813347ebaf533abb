// Package networking holds the KIngress implementations an install profile
// can install, with their pinned versions (versions.go). A provider returns
// its manifests and its ingress class; changing it must not change
// Service, Revision or routing semantics (seed 000, "Networking
// evolution").
package networking

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
)

// Gateway is where a provider receives public traffic.
type Gateway struct {
	Namespace, Service string
	// NodePort is the public HTTP NodePort (published on 127.0.0.1).
	NodePort int
	// TLSNodePort is the public HTTPS NodePort, where the provider serves
	// KIngress TLS (0: none); the framework's clusters publish it on
	// 127.0.0.1 (clusters.TLSPortFor).
	TLSNodePort int
}

// TLSNodePortOffset pins the HTTPS NodePort next to the HTTP one (30080,
// 31080, 32080 -> 30443, 31443, 32443), so it is known without asking the
// cluster and can be published like the HTTP one.
const TLSNodePortOffset = 363

// Default is the networking provider every suite, tool and install uses
// unless told otherwise (installenv.Provider reads LAMPYR_NETWORKING at the
// edge): net-gateway-api over Traefik's Gateway API provider, the offline
// KIngress that probes the data plane before reporting Ready.
const Default = GatewayAPIName

// Provider is one KIngress implementation.
type Provider interface {
	Name() string
	// Describe says what runs, with versions, for reports.
	Describe() string
	// IngressClass goes to config-network's ingress-class.
	IngressClass() string
	// Publish builds the provider's images into the registry and returns
	// them by name.
	Publish(ctx context.Context, p *publish.Publisher) (map[string]string, error)
	// Manifests renders the provider with its images.
	Manifests(images map[string]string, gw Gateway) ([]*unstructured.Unstructured, error)
	// Gateway says where public traffic enters.
	Gateway(nodePort int) Gateway
	// NeedsRegistry is non-empty when the provider pulls an image that
	// cannot be built here; it says which and why.
	NeedsRegistry() string
}

var providers = map[string]Provider{}

func register(p Provider) { providers[p.Name()] = p }

// aliases are older names still accepted: "traefik" was the Knative
// provider's name until gateway-api (which runs Traefik too) became the
// default, and `ly cluster install --provider traefik` and
// `knative-conformance --provider traefik` are documented to users.
var aliases = map[string]string{"traefik": TraefikKnativeName}

// Get returns a provider by name (or by an alias of it).
func Get(name string) (Provider, error) {
	if a, ok := aliases[name]; ok {
		name = a
	}
	p, ok := providers[name]
	if !ok {
		return nil, fmt.Errorf("unknown networking provider %q (known: %v)", name, Names())
	}
	return p, nil
}

// ForIngressClass returns the provider whose KIngress class is class (as
// config-network's ingress-class records it on a cluster).
func ForIngressClass(class string) (Provider, bool) {
	for _, p := range providers {
		if p.IngressClass() == class {
			return p, true
		}
	}
	return nil, false
}

// Names lists the providers.
func Names() []string {
	var out []string
	for n := range providers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// placeholderImages name an image for every key a provider's Manifests
// looks up, for rendering a provider only to learn which objects it owns.
func placeholderImages() map[string]string {
	const p = "placeholder.invalid/image@sha256:0000000000000000000000000000000000000000000000000000000000000000"
	return map[string]string{"traefik": p, netGatewayAPIController: p, netGatewayAPIWebhook: p, kourierPackage: p}
}

// Rendered is what p installs (images are placeholders): for knowing which
// objects a provider owns, e.g. its Deployments in knative-serving.
func Rendered(p Provider, nodePort int) ([]*unstructured.Unstructured, error) {
	return p.Manifests(placeholderImages(), p.Gateway(nodePort))
}

// Leftovers are the objects provider from renders that provider to does
// not: what to delete when a cluster switches from one to the other.
// Namespaces and CustomResourceDefinitions stay (deleting a namespace
// takes time and would race the new provider's objects in it; deleting a
// CRD deletes every object of its kind).
func Leftovers(from, to Provider, gw Gateway) ([]*unstructured.Unstructured, error) {
	old, err := Rendered(from, gw.NodePort)
	if err != nil {
		return nil, fmt.Errorf("rendering %s to find what it installed: %w", from.Name(), err)
	}
	cur, err := Rendered(to, gw.NodePort)
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", to.Name(), err)
	}
	key := func(o *unstructured.Unstructured) string {
		return o.GroupVersionKind().GroupKind().String() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	keep := map[string]bool{}
	for _, o := range cur {
		keep[key(o)] = true
	}
	var out []*unstructured.Unstructured
	for _, o := range old {
		switch o.GetKind() {
		case "Namespace", "CustomResourceDefinition":
			continue
		}
		if !keep[key(o)] {
			out = append(out, o)
		}
	}
	return out, nil
}

// knativeIngressFinalizer is the finalizer Knative's generated KIngress
// reconcilers (net-gateway-api's, net-kourier's) put on the KIngresses of
// their class: the resource's name.
const knativeIngressFinalizer = "ingresses.networking.internal.knative.dev"

// IngressFinalizer is the finalizer p's controller puts on the KIngresses
// of its class, or "" if it puts none (Traefik's Knative provider). A
// cluster switched away from such a provider must remove it: nothing else
// will, and a KIngress (and its namespace) could never be deleted.
func IngressFinalizer(p Provider) string {
	if f, ok := p.(interface{ IngressFinalizer() string }); ok {
		return f.IngressFinalizer()
	}
	return ""
}

// Specs are the Go builds a provider's Publish runs (for the first-run
// estimate; Publish itself builds them).
func Specs(ctx context.Context, p Provider) ([]gobuild.Spec, error) {
	switch p.(type) {
	case GatewayAPI:
		t, err := TraefikGatewaySpec(ctx, TraefikGatewayVersion)
		if err != nil {
			return nil, err
		}
		n, err := NetGatewayAPISpec(ctx)
		return []gobuild.Spec{t, n}, err
	case TraefikKnative:
		t, err := TraefikSpec(ctx, TraefikKnativeVersion)
		return []gobuild.Spec{t}, err
	case Kourier:
		return []gobuild.Spec{kourierSpec()}, nil
	}
	return nil, nil
}
