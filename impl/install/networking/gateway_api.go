package networking

import (
	"context"
	"fmt"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/build/stubs"
	"lampyr.dev/serving/impl/install/knative"
	"lampyr.dev/serving/impl/install/manifest"
)

// GatewayAPI is Knative's own KIngress implementation over Gateway API,
// knative.dev/net-gateway-api (controller and webhook, manifests from the
// module's config/), with Traefik v3.7's Gateway API provider as the
// data plane and the standard-channel Gateway API CRDs. Unlike Traefik's
// Knative provider, net-gateway-api reports a KIngress Ready only once
// every HTTPRoute parent has Accepted it and a probe sent through the
// gateway Pods (K-Network-Probe, answered by queue-proxy or fiber-router
// with the expected K-Network-Hash) shows the new configuration is served.
//
// Known limits that stay (measured, docs/networking.md): Traefik refuses
// ExternalName backends (so DomainMapping's placeholder Service and
// Lampyr's externalname backend strategy are not served); no per-route
// timeouts (supported-features stays empty); net-gateway-api does not
// implement KIngress httpOption (HTTP -> HTTPS redirects).
type GatewayAPI struct{}

func init() { register(GatewayAPI{}) }

const (
	// GatewayAPIName is the provider's name.
	GatewayAPIName = "gateway-api"

	netGatewayAPIModule     = "knative.dev/net-gateway-api"
	netGatewayAPIController = netGatewayAPIModule + "/cmd/controller"
	netGatewayAPIWebhook    = netGatewayAPIModule + "/cmd/webhook"
	gatewayAPIModule        = "sigs.k8s.io/gateway-api"

	// GatewayClassName is the GatewayClass Traefik's Gateway API provider
	// controls; ExternalGateway and LocalGateway are Knative's Gateways
	// (names as net-gateway-api's documentation uses them).
	GatewayClassName       = "traefik"
	traefikGatewayCtrlName = "traefik.io/gateway-controller"
	ExternalGateway        = "knative-gateway"
	LocalGateway           = "knative-local-gateway"

	// Traefik's entry points. A Gateway listener binds to the entry point
	// whose address has the listener's port, so the Gateways' listeners
	// use these ports; net-gateway-api adds a listener on 443 to the
	// external Gateway for each KIngress with TLS, hence the entry point
	// on 443 (the Pod may bind it as non-root: ip_unprivileged_port_start).
	gwWebPort      = 8080
	gwInternalPort = 8081
	gwTLSPort      = 443
)

// Name implements Provider.
func (GatewayAPI) Name() string { return GatewayAPIName }

// Describe implements Provider.
func (GatewayAPI) Describe() string {
	return fmt.Sprintf("net-gateway-api %s over Traefik %s's Gateway API provider (Gateway API %s standard CRDs)",
		NetGatewayAPIVersion, TraefikGatewayVersion, GatewayAPIVersion)
}

// IngressFinalizer: net-gateway-api finalizes its KIngresses (it removes
// their TLS listeners from the external Gateway).
func (GatewayAPI) IngressFinalizer() string { return knativeIngressFinalizer }

// IngressClass implements Provider: net-gateway-api's class.
func (GatewayAPI) IngressClass() string { return "gateway-api.ingress.networking.knative.dev" }

// NeedsRegistry implements Provider: everything builds here.
func (GatewayAPI) NeedsRegistry() string { return "" }

// Gateway implements Provider: Traefik's public Service.
func (GatewayAPI) Gateway(nodePort int) Gateway {
	gw := Gateway{Namespace: traefikNamespace, Service: "traefik", NodePort: nodePort}
	if nodePort != 0 {
		gw.TLSNodePort = nodePort + TLSNodePortOffset
	}
	return gw
}

// NetGatewayAPISpec builds net-gateway-api's controller and webhook with
// the knative.dev/networking and knative.dev/pkg versions the pinned
// Serving requires (v0.49.1 requires older ones; raised, it builds
// unchanged, and the controller speaks the same KIngress API as Serving).
func NetGatewayAPISpec(ctx context.Context) (gobuild.Spec, error) {
	pins, err := knative.PinnedVersions(ctx)
	if err != nil {
		return gobuild.Spec{}, err
	}
	req := map[string]string{}
	for _, m := range []string{"knative.dev/networking", "knative.dev/pkg"} {
		if pins[m] == "" {
			return gobuild.Spec{}, fmt.Errorf("%s@%s does not require %s", knative.ServingModule, knative.ServingVersion, m)
		}
		req[m] = pins[m]
	}
	return gobuild.Spec{
		Name: "net-gateway-api", Module: netGatewayAPIModule, Version: NetGatewayAPIVersion,
		Packages: []string{netGatewayAPIController, netGatewayAPIWebhook},
		Require:  req, LDFlags: "-s -w",
	}, nil
}

// Publish builds Traefik v3.7 and net-gateway-api's controller and webhook,
// both at once (the builder runs them side by side when a slot is free).
func (GatewayAPI) Publish(ctx context.Context, p *publish.Publisher) (map[string]string, error) {
	var traefik string
	var refs map[string]string
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		traefik, err = publishTraefik(gctx, p, TraefikGatewaySpec, TraefikGatewayVersion)
		return err
	})
	g.Go(func() error {
		spec, err := NetGatewayAPISpec(gctx)
		if err != nil {
			return err
		}
		refs, err = p.Publish(gctx, spec, []publish.Image{
			{Package: netGatewayAPIController, Repo: "net-gateway-api/controller"},
			{Package: netGatewayAPIWebhook, Repo: "net-gateway-api/webhook"},
		})
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	refs["traefik"] = traefik
	return refs, nil
}

// TraefikGatewayArgs run Traefik's Gateway API provider alone, with an
// entry point per Gateway listener port.
func TraefikGatewayArgs() []any {
	return append([]any{
		fmt.Sprintf("--entryPoints.web.address=:%d", gwWebPort),
		fmt.Sprintf("--entryPoints.internal.address=:%d", gwInternalPort),
		fmt.Sprintf("--entryPoints.websecure.address=:%d", gwTLSPort),
		"--entryPoints.traefik.address=:9000",
		"--ping=true",
		"--log.level=INFO",
		"--log.noColor=true",
		// One JSON line per answer of 500 or more (the gateway's own 502s
		// and 504s included): which backend address it went to, what that
		// backend answered (OriginStatus 0: none). Without it a 502 from
		// Traefik cannot be traced to the replica it dialled.
		"--accesslog=true",
		"--accesslog.format=json",
		"--accesslog.filters.statuscodes=500-599",
		// Offline clusters: no release check, no usage report.
		"--global.checkNewVersion=false",
		"--global.sendAnonymousUsage=false",
		"--providers.kubernetesgateway=true",
		// Traefik applies a provider's configuration at most once per
		// providersThrottleDuration (2 s by default). Readiness no longer
		// depends on it (net-gateway-api probes the data plane), but every
		// Route change waits for it: apply quickly.
		"--providers.providersThrottleDuration=100ms",
	}, traefikGraceArgs("web", "internal", "websecure")...)
}

// GatewayConfig is config-gateway's data: net-gateway-api's Gateways, and
// the Services whose Pods it probes (the port named http). No
// supported-features: Traefik has no per-route request timeouts.
func GatewayConfig() map[string]string {
	entry := func(gw, svc string) string {
		b, _ := yaml.Marshal([]map[string]any{{
			"class":   GatewayClassName,
			"gateway": traefikNamespace + "/" + gw,
			"service": traefikNamespace + "/" + svc,
		}})
		return string(b)
	}
	return map[string]string{
		"external-gateways": entry(ExternalGateway, "traefik"),
		"local-gateways":    entry(LocalGateway, "traefik-internal"),
	}
}

// Manifests renders the Gateway API CRDs, Traefik with its Gateway API
// provider (RBAC from its module's reference file), the GatewayClass and
// Knative's two Gateways, and net-gateway-api from its module's config/
// with config-gateway filled in.
func (GatewayAPI) Manifests(images map[string]string, gw Gateway) ([]*unstructured.Unstructured, error) {
	for _, k := range []string{"traefik", netGatewayAPIController, netGatewayAPIWebhook} {
		if images[k] == "" {
			return nil, fmt.Errorf("%s manifests: no image for %s (run Publish first)", GatewayAPIName, k)
		}
	}
	crds, err := gatewayAPICRDs()
	if err != nil {
		return nil, err
	}
	rbac, err := traefikRBAC(TraefikGatewayVersion, "kubernetes-gateway-rbac.yml", "traefik-gwapi-")
	if err != nil {
		return nil, err
	}
	objs := append(crds, traefikObjects(images["traefik"], TraefikGatewayArgs(), []any{
		map[string]any{"name": "web", "containerPort": int64(gwWebPort)},
		map[string]any{"name": "internal", "containerPort": int64(gwInternalPort)},
		map[string]any{"name": "websecure", "containerPort": int64(gwTLSPort)},
		map[string]any{"name": "admin", "containerPort": int64(9000)},
	}, map[string]any{
		"sysctls": []any{map[string]any{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}},
	},
		traefikService("traefik", "NodePort", servicePort{"http", 80, gwWebPort, gw.NodePort}, servicePort{"https", 443, gwTLSPort, gw.TLSNodePort}),
		traefikService("traefik-internal", "ClusterIP", servicePort{"http", 80, gwInternalPort, 0}),
	)...)
	// The patched provider follows an ExternalName backend to the local
	// gateway's own Service only (a Route's placeholder, which a
	// DomainMapping's KIngress routes to: TraefikGatewaySpec).
	if err := setTraefikEnv(objs, stubs.TraefikExternalNameEnv, traefikNamespace+"/traefik-internal"); err != nil {
		return nil, err
	}
	objs = append(objs, rbac...)
	objs = append(objs, gatewayClass(), gateway(ExternalGateway, gwWebPort), gateway(LocalGateway, gwInternalPort))
	ngw, err := netGatewayAPIObjects(images)
	if err != nil {
		return nil, err
	}
	return append(objs, ngw...), nil
}

// gatewayAPICRDs are the standard channel of the pinned Gateway API
// release, with its safe-upgrades ValidatingAdmissionPolicy, as its
// standard-install.yaml bundles them.
func gatewayAPICRDs() ([]*unstructured.Unstructured, error) {
	mod, err := gobuild.Download(context.Background(), gatewayAPIModule, GatewayAPIVersion)
	if err != nil {
		return nil, err
	}
	return manifest.ReadDir(filepath.Join(mod.Dir, "config", "crd", "standard"))
}

func gatewayClass() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
		"metadata": map[string]any{"name": GatewayClassName},
		"spec":     map[string]any{"controllerName": traefikGatewayCtrlName},
	}}
}

// gateway is one of Knative's Gateways: one HTTP listener on port, routes
// from every namespace (KIngresses live in the Services' namespaces).
func gateway(name string, port int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": name, "namespace": traefikNamespace},
		"spec": map[string]any{
			"gatewayClassName": GatewayClassName,
			"listeners": []any{map[string]any{
				"name": "http", "port": int64(port), "protocol": "HTTP",
				"allowedRoutes": map[string]any{"namespaces": map[string]any{"from": "All"}},
			}},
		},
	}}
}

// netGatewayAPIObjects renders net-gateway-api's config/ with the images
// built here and config-gateway pointing at Traefik. config-gateway comes
// first: net-gateway-api's webhook validates it once registered.
func netGatewayAPIObjects(images map[string]string) ([]*unstructured.Unstructured, error) {
	mod, err := gobuild.Download(context.Background(), netGatewayAPIModule, NetGatewayAPIVersion)
	if err != nil {
		return nil, err
	}
	all, err := manifest.ReadDir(filepath.Join(mod.Dir, "config"))
	if err != nil {
		return nil, err
	}
	objs := make([]knative.Object, len(all))
	for i, o := range all {
		objs[i] = knative.Object{Unstructured: o, Source: netGatewayAPIModule + "@" + NetGatewayAPIVersion + "/config"}
	}
	if err := knative.ResolveImages(objs, images); err != nil {
		return nil, err
	}
	var first, rest []*unstructured.Unstructured
	found := false
	for _, o := range all {
		if o.GetKind() == "ConfigMap" && o.GetName() == "config-gateway" {
			for k, v := range GatewayConfig() {
				if err := unstructured.SetNestedField(o.Object, v, "data", k); err != nil {
					return nil, err
				}
			}
			first = append(first, o)
			found = true
			continue
		}
		rest = append(rest, o)
	}
	if !found {
		return nil, fmt.Errorf("%s@%s/config has no config-gateway ConfigMap", netGatewayAPIModule, NetGatewayAPIVersion)
	}
	for _, o := range rest {
		if ns := o.GetNamespace(); ns != "" && ns != knative.Namespace {
			return nil, fmt.Errorf("%s %s/%s: net-gateway-api's objects are expected in %s", o.GetKind(), ns, o.GetName(), knative.Namespace)
		}
	}
	return append(first, rest...), nil
}
