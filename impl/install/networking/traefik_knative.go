package networking

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/publish"
)

// TraefikKnative is Traefik v3.6.12 with its experimental Knative provider:
// the first offline KIngress implementation (no Envoy can be had here),
// selectable as "traefik-knative". Its known limits, from its source and
// measured on these machines: it dials backends by ClusterIP (an
// ExternalName backend answers 404 while the KIngress is still marked
// Ready), it does not probe the data plane (a KIngress is marked Ready after
// a fixed delay), and it does not rewrite Host (no DomainMapping).
type TraefikKnative struct{}

func init() { register(TraefikKnative{}) }

// TraefikKnativeName is the provider's name.
const TraefikKnativeName = "traefik-knative"

// Name implements Provider.
func (TraefikKnative) Name() string { return TraefikKnativeName }

// Describe implements Provider.
func (TraefikKnative) Describe() string {
	return "Traefik " + TraefikKnativeVersion + ", experimental Knative provider"
}

// IngressClass implements Provider.
func (TraefikKnative) IngressClass() string { return "traefik.ingress.networking.knative.dev" }

// NeedsRegistry implements Provider: Traefik builds here.
func (TraefikKnative) NeedsRegistry() string { return "" }

// Gateway implements Provider.
func (TraefikKnative) Gateway(nodePort int) Gateway {
	return Gateway{Namespace: traefikNamespace, Service: "traefik", NodePort: nodePort}
}

// Publish builds Traefik from its pinned module (CGO off, unmodified).
func (TraefikKnative) Publish(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	ref, err := publishTraefik(ctx, p, TraefikSpec, TraefikKnativeVersion)
	if err != nil {
		return nil, err
	}
	return map[string]string{"traefik": ref}, nil
}

// TraefikKnativeArgs are the flags that run the Knative provider with a
// public entrypoint (behind the NodePort Service) and a private one (behind
// the cluster-local Service).
func TraefikKnativeArgs() []any {
	return append([]any{
		"--entryPoints.web.address=:8080",
		"--entryPoints.internal.address=:8081",
		"--entryPoints.traefik.address=:9000",
		"--ping=true",
		"--log.level=INFO",
		"--experimental.knative=true",
		"--providers.knative=true",
		"--providers.knative.publicEntrypoints=web",
		"--providers.knative.publicService.name=traefik",
		"--providers.knative.publicService.namespace=" + traefikNamespace,
		"--providers.knative.privateEntrypoints=internal",
		"--providers.knative.privateService.name=traefik-internal",
		"--providers.knative.privateService.namespace=" + traefikNamespace,
		// The provider marks a KIngress Ready once it has handed the new
		// configuration over (after its own throttleDuration, 0 by default),
		// but Traefik applies a provider's configuration at most once per
		// providersThrottleDuration (2s by default): for up to 2 s a Ready
		// Route answered Traefik's "404 page not found" (Knative's own
		// conformance suites probe right after Ready and failed on it).
		// Apply quickly, and report Ready only after the apply has had time.
		// 500ms was not always enough on a loaded two-core node: a fresh
		// stock run of Knative's suites, with benchmarks running beside it,
		// saw 404s right after Ready in four tests (2026-11-30); 1s halves
		// that exposure for one more second of apply -> Ready on both profiles.
		"--providers.providersThrottleDuration=100ms",
		"--providers.knative.throttleDuration=1s",
	}, traefikGraceArgs("web", "internal")...)
}

// Manifests renders Traefik: the RBAC from its module's reference file (the
// ServiceAccount subject moved to our namespace), a Deployment, and the
// public NodePort and private ClusterIP Services.
func (TraefikKnative) Manifests(images map[string]string, gw Gateway) ([]*unstructured.Unstructured, error) {
	img := images["traefik"]
	if img == "" {
		return nil, fmt.Errorf("%s manifests: no traefik image (run Publish first)", TraefikKnativeName)
	}
	rbac, err := traefikRBAC(TraefikKnativeVersion, "kubernetes-knative-rbac.yml", "traefik-")
	if err != nil {
		return nil, err
	}
	objs := traefikObjects(img, TraefikKnativeArgs(), []any{
		map[string]any{"name": "web", "containerPort": int64(8080)},
		map[string]any{"name": "internal", "containerPort": int64(8081)},
		map[string]any{"name": "admin", "containerPort": int64(9000)},
	}, nil,
		traefikService("traefik", "NodePort", servicePort{"http", 80, 8080, gw.NodePort}),
		traefikService("traefik-internal", "ClusterIP", servicePort{"http", 80, 8081, 0}),
	)
	return append(objs, rbac...), nil
}
