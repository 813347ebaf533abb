// Package networking holds the KIngress implementations a cluster profile
// can install. A provider returns its manifests and its ingress class;
// changing it must not change Service, Revision or routing semantics
// (seed 000, "Networking evolution").
package networking

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters/publish"
)

// Gateway is where a provider receives public traffic.
type Gateway struct {
	Namespace, Service string
	// NodePort is the public HTTP NodePort (published on 127.0.0.1).
	NodePort int
}

// Provider is one KIngress implementation.
type Provider interface {
	Name() string
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

// Get returns a provider by name.
func Get(name string) (Provider, error) {
	p, ok := providers[name]
	if !ok {
		return nil, fmt.Errorf("unknown networking provider %q (known: %v)", name, Names())
	}
	return p, nil
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
