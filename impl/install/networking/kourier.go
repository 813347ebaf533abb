package networking

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/install/manifest"
)

// Kourier is Knative's default KIngress (net-kourier v0.48.0): its
// controller builds here from the pinned module, but its gateway is Envoy,
// which no registry reachable from these machines serves and no Go module
// builds. It is complete for machines with a registry; offline runs skip it
// with NeedsRegistry's reason.
type Kourier struct{}

func init() { register(Kourier{}) }

const (
	kourierModule    = "knative.dev/net-kourier"
	kourierVersion   = NetKourierVersion
	kourierPackage   = "knative.dev/net-kourier/cmd/kourier"
	kourierNamespace = "kourier-system"
	// KourierEnvoyImage is the gateway image net-kourier's release names.
	KourierEnvoyImage = "docker.io/envoyproxy/envoy:v1.36-latest"
)

// Name implements Provider.
func (Kourier) Name() string { return "kourier" }

// Describe implements Provider.
func (Kourier) Describe() string {
	return "net-kourier " + kourierVersion + " (gateway: Envoy, pulled from a registry)"
}

// IngressFinalizer: net-kourier's reconciler finalizes its KIngresses.
func (Kourier) IngressFinalizer() string { return knativeIngressFinalizer }

// IngressClass implements Provider.
func (Kourier) IngressClass() string { return "kourier.ingress.networking.knative.dev" }

// NeedsRegistry implements Provider.
func (Kourier) NeedsRegistry() string {
	return "kourier's gateway is Envoy (" + KourierEnvoyImage + "), which must be pulled from a container registry; no Envoy binary can be built or installed offline"
}

// Gateway implements Provider.
func (Kourier) Gateway(nodePort int) Gateway {
	return Gateway{Namespace: kourierNamespace, Service: "kourier", NodePort: nodePort}
}

// Publish builds the Kourier controller.
func (Kourier) Publish(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	refs, err := p.Publish(ctx, kourierSpec(),
		[]publish.Image{{Package: kourierPackage, Repo: "net-kourier/kourier"}})
	if err != nil {
		return nil, err
	}
	return map[string]string{kourierPackage: refs[kourierPackage]}, nil
}

// Manifests renders net-kourier's release config from its module, with the
// controller's ko:// reference resolved and the public gateway Service
// turned from LoadBalancer (nothing provisions one in Kind) into a NodePort.
func (Kourier) Manifests(images map[string]string, gw Gateway) ([]*unstructured.Unstructured, error) {
	mod, err := gobuild.Download(context.Background(), kourierModule, kourierVersion)
	if err != nil {
		return nil, err
	}
	out, err := manifest.ReadDir(filepath.Join(mod.Dir, "config"))
	if err != nil {
		return nil, err
	}
	var unresolved []string
	for _, o := range out {
		if o.GetKind() != "Deployment" {
			if o.GetKind() == "Service" && o.GetName() == gw.Service && o.GetNamespace() == gw.Namespace {
				if err := toNodePort(o, gw.NodePort); err != nil {
					return nil, err
				}
			}
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			cm := c.(map[string]any)
			img, _ := cm["image"].(string)
			if ko, ok := strings.CutPrefix(img, "ko://"); ok {
				if ref := images[ko]; ref != "" {
					cm["image"] = ref
				} else {
					unresolved = append(unresolved, img)
				}
			}
		}
		_ = unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers")
	}
	if len(unresolved) > 0 {
		return nil, fmt.Errorf("kourier manifests: unresolved images %v", unresolved)
	}
	return out, nil
}

func toNodePort(svc *unstructured.Unstructured, nodePort int) error {
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	found := false
	for _, p := range ports {
		pm := p.(map[string]any)
		if pm["port"] == int64(80) {
			pm["nodePort"] = int64(nodePort)
			found = true
		}
	}
	if !found {
		return fmt.Errorf("service %s/%s has no port 80 to publish", svc.GetNamespace(), svc.GetName())
	}
	_ = unstructured.SetNestedSlice(svc.Object, ports, "spec", "ports")
	return unstructured.SetNestedField(svc.Object, "NodePort", "spec", "type")
}

func kourierSpec() gobuild.Spec {
	return gobuild.Spec{Name: "net-kourier", Module: kourierModule, Version: kourierVersion, Packages: []string{kourierPackage}, LDFlags: "-s -w"}
}
