package networking

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/clusters/build/gobuild"
	"lampyr.dev/serving/clusters/manifest"
	"lampyr.dev/serving/clusters/publish"
)

// Traefik v3.6.12 with its experimental Knative provider: the offline
// KIngress implementation (no Envoy can be had here). Its known limits, from
// its source and measured on these machines: it dials backends by ClusterIP
// (an ExternalName backend answers 404 while the KIngress is still marked
// Ready), it does not probe the data plane (a KIngress is marked Ready after a
// short delay), and it does not rewrite Host (no DomainMapping).
type Traefik struct{}

func init() { register(Traefik{}) }

const (
	traefikModule    = "github.com/traefik/traefik/v3"
	traefikVersion   = "v3.6.12"
	traefikPackage   = "github.com/traefik/traefik/v3/cmd/traefik"
	traefikNamespace = "traefik"
)

// Name implements Provider.
func (Traefik) Name() string { return "traefik" }

// IngressClass implements Provider.
func (Traefik) IngressClass() string { return "traefik.ingress.networking.knative.dev" }

// NeedsRegistry implements Provider: Traefik builds here.
func (Traefik) NeedsRegistry() string { return "" }

// Gateway implements Provider.
func (Traefik) Gateway(nodePort int) Gateway {
	return Gateway{Namespace: traefikNamespace, Service: "traefik", NodePort: nodePort}
}

// Publish builds Traefik from its pinned module (CGO off, unmodified).
func (Traefik) Publish(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	dl, err := gobuild.Download(ctx, traefikModule, traefikVersion)
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return nil, err
	}
	refs, err := p.Publish(ctx, gobuild.Spec{
		Name: "traefik", Module: traefikModule, Version: traefikVersion, Inherit: gomod,
		Packages: []string{traefikPackage},
		LDFlags:  "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=" + traefikVersion,
	}, []publish.Image{{Package: traefikPackage, Repo: "traefik/traefik"}})
	if err != nil {
		return nil, err
	}
	return map[string]string{"traefik": refs[traefikPackage]}, nil
}

// TraefikArgs are the flags that run the Knative provider with a public
// entrypoint (behind the NodePort Service) and a private one (behind the
// cluster-local Service).
func TraefikArgs() []any {
	return []any{
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
	}
}

// Manifests renders Traefik: the RBAC from its module's reference file (the
// ServiceAccount subject moved to our namespace), a Deployment, and the
// public NodePort and private ClusterIP Services.
func (Traefik) Manifests(images map[string]string, gw Gateway) ([]*unstructured.Unstructured, error) {
	img := images["traefik"]
	if img == "" {
		return nil, fmt.Errorf("traefik manifests: no traefik image (run Publish first)")
	}
	mod, err := gobuild.Download(context.Background(), traefikModule, traefikVersion)
	if err != nil {
		return nil, err
	}
	rbacFile := filepath.Join(mod.Dir, "docs/content/reference/dynamic-configuration/kubernetes-knative-rbac.yml")
	raw, err := os.ReadFile(rbacFile)
	if err != nil {
		return nil, fmt.Errorf("traefik RBAC reference %s: %w", rbacFile, err)
	}
	rbac, err := manifest.Parse(raw)
	if err != nil {
		return nil, err
	}
	for _, o := range rbac {
		o.SetName("traefik-" + o.GetName())
		if o.GetKind() == "ClusterRoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				sm := s.(map[string]any)
				sm["name"], sm["namespace"] = "traefik-controller", traefikNamespace
			}
			_ = unstructured.SetNestedSlice(o.Object, subjects, "subjects")
			_ = unstructured.SetNestedField(o.Object, "traefik-knative-networking-role", "roleRef", "name")
		}
	}
	labels := map[string]any{"app": "traefik"}
	objs := []*unstructured.Unstructured{
		{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": traefikNamespace}}},
		{Object: map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "traefik-controller", "namespace": traefikNamespace}}},
	}
	objs = append(objs, rbac...)
	objs = append(objs,
		&unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": "traefik", "namespace": traefikNamespace, "labels": labels},
			"spec": map[string]any{
				"replicas": int64(1),
				"selector": map[string]any{"matchLabels": labels},
				"template": map[string]any{
					"metadata": map[string]any{"labels": labels},
					"spec": map[string]any{
						"serviceAccountName": "traefik-controller",
						"containers": []any{map[string]any{
							"name": "traefik", "image": img, "args": TraefikArgs(),
							"ports": []any{
								map[string]any{"name": "web", "containerPort": int64(8080)},
								map[string]any{"name": "internal", "containerPort": int64(8081)},
								map[string]any{"name": "admin", "containerPort": int64(9000)},
							},
							"readinessProbe": map[string]any{"httpGet": map[string]any{"path": "/ping", "port": int64(9000)}, "periodSeconds": int64(2)},
						}},
					},
				},
			},
		}},
		service("traefik", "NodePort", labels, 8080, gw.NodePort),
		service("traefik-internal", "ClusterIP", labels, 8081, 0),
	)
	return objs, nil
}

func service(name, typ string, selector map[string]any, target, nodePort int) *unstructured.Unstructured {
	port := map[string]any{"name": "http", "port": int64(80), "targetPort": int64(target), "protocol": "TCP"}
	if nodePort != 0 {
		port["nodePort"] = int64(nodePort)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": traefikNamespace},
		"spec":     map[string]any{"type": typ, "selector": selector, "ports": []any{port}},
	}}
}
