package networking

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/publish"
	"lampyr.dev/serving/impl/build/stubs"
	"lampyr.dev/serving/impl/install/manifest"
)

// Both Traefik-based providers run Traefik in this namespace, as
// Deployment traefik behind Service traefik (public, NodePort) and
// traefik-internal (cluster-local), so switching provider on a cluster
// replaces one Traefik with the other.
const (
	traefikModule    = "github.com/traefik/traefik/v3"
	traefikPackage   = "github.com/traefik/traefik/v3/cmd/traefik"
	traefikNamespace = "traefik"
	traefikSA        = "traefik-controller"
)

// TraefikSpec is the build of Traefik at version: unmodified, CGO off,
// with its go.mod's own replace and exclude directives (Go ignores them in
// a dependency) and, where that go.mod replaces a module with a directory
// outside the module zip, the stand-in this repository supplies for it.
func TraefikSpec(ctx context.Context, version string) (gobuild.Spec, error) {
	dl, err := gobuild.Download(ctx, traefikModule, version)
	if err != nil {
		return gobuild.Spec{}, err
	}
	gomod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return gobuild.Spec{}, err
	}
	s := gobuild.Spec{
		Name: "traefik", Module: traefikModule, Version: version, Inherit: gomod,
		Packages: []string{traefikPackage},
		LDFlags:  "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=" + version,
	}
	if strings.Contains(string(gomod), stubs.TraefikDynamicExtPath+" =>") {
		s.Local = append(s.Local, stubs.TraefikDynamicExt())
	}
	mf, err := modfile.Parse(dl.GoMod, gomod, nil)
	if err != nil {
		return gobuild.Spec{}, err
	}
	for _, r := range mf.Require {
		if r.Mod.Path == "github.com/go-acme/lego/v4" || r.Mod.Path == "github.com/go-acme/lego/v5" {
			s.Patches = append(s.Patches, stubs.LegoDNS(r.Mod.Path, r.Mod.Version))
		}
	}
	return s, nil
}

// TraefikGatewaySpec is TraefikSpec with the Gateway API provider patched
// to follow an ExternalName backend to the gateway's own Services, and only
// to them (stubs.TraefikGatewayExternalName, which says why; the Deployment
// lists them in stubs.TraefikExternalNameEnv).
func TraefikGatewaySpec(ctx context.Context, version string) (gobuild.Spec, error) {
	s, err := TraefikSpec(ctx, version)
	if err != nil {
		return gobuild.Spec{}, err
	}
	dl, err := gobuild.Download(ctx, traefikModule, version)
	if err != nil {
		return gobuild.Spec{}, err
	}
	patch, err := stubs.TraefikGatewayExternalName(traefikModule, version, dl.Dir)
	if err != nil {
		return gobuild.Spec{}, err
	}
	s.Patches = append(s.Patches, patch)
	return s, nil
}

// publishTraefik builds Traefik at version with build (TraefikSpec or
// TraefikGatewaySpec) and pushes its image.
func publishTraefik(ctx context.Context, p *publish.Publisher, build func(context.Context, string) (gobuild.Spec, error), version string) (string, error) {
	spec, err := build(ctx, version)
	if err != nil {
		return "", err
	}
	refs, err := p.Publish(ctx, spec, []publish.Image{{Package: traefikPackage, Repo: "traefik/traefik"}})
	if err != nil {
		return "", err
	}
	return refs[traefikPackage], nil
}

// traefikRBAC reads one of the RBAC reference files in Traefik's module
// (docs/content/reference/dynamic-configuration), prefixes every name with
// prefix and binds the role to Traefik's ServiceAccount in our namespace.
func traefikRBAC(version, file, prefix string) ([]*unstructured.Unstructured, error) {
	mod, err := gobuild.Download(context.Background(), traefikModule, version)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(mod.Dir, "docs/content/reference/dynamic-configuration", file)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("traefik RBAC reference %s: %w", path, err)
	}
	rbac, err := manifest.Parse(raw)
	if err != nil {
		return nil, err
	}
	roles := map[string]string{}
	for _, o := range rbac {
		if o.GetKind() == "ClusterRole" {
			roles[o.GetName()] = prefix + o.GetName()
		}
	}
	for _, o := range rbac {
		o.SetName(prefix + o.GetName())
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			sm := s.(map[string]any)
			sm["name"], sm["namespace"] = traefikSA, traefikNamespace
		}
		_ = unstructured.SetNestedSlice(o.Object, subjects, "subjects")
		ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		if roles[ref] == "" {
			return nil, fmt.Errorf("%s: ClusterRoleBinding %s names ClusterRole %s, which the file does not define", path, o.GetName(), ref)
		}
		_ = unstructured.SetNestedField(o.Object, roles[ref], "roleRef", "name")
	}
	return rbac, nil
}

// A stopping Traefik replica leaves the endpoints for traefikPreStopSeconds,
// then finishes the connections under way for up to traefikGraceSeconds:
// the longest timeoutSeconds a Revision may set (Knative's
// max-revision-timeout-seconds, 600), as Knative's activator and
// fiber-router do. With Traefik's
// default lifeCycle.graceTimeOut (10 s) a drained node or a rolled gateway
// cut every stream and WebSocket through the replica that stopped, on both
// sides of the pair (the operations suite's drain run, 2026-12-05: 1 stream
// and 1 WebSocket on each). Traefik's connection tracker waits for hijacked
// connections too, so a WebSocket lives until it closes or the grace ends.
const (
	traefikPreStopSeconds = 5
	traefikGraceSeconds   = 600
)

// traefikGraceArgs set the grace on every entry point that serves
// requests.
func traefikGraceArgs(entryPoints ...string) []any {
	var out []any
	for _, ep := range entryPoints {
		out = append(out, fmt.Sprintf("--entryPoints.%s.transport.lifeCycle.graceTimeOut=%ds", ep, traefikGraceSeconds))
	}
	return out
}

// traefikObjects are what both Traefik providers run: the namespace, the
// ServiceAccount, the Deployment and its Services.
func traefikObjects(img string, args []any, ports []any, podSecurity map[string]any, services ...*unstructured.Unstructured) []*unstructured.Unstructured {
	labels := map[string]any{"app": "traefik"}
	pod := map[string]any{
		"serviceAccountName": traefikSA,
		"containers": []any{map[string]any{
			"name": "traefik", "image": img, "args": args,
			"ports":          ports,
			"readinessProbe": map[string]any{"httpGet": map[string]any{"path": "/ping", "port": int64(9000)}, "periodSeconds": int64(2)},
			// Kubernetes' own sleep (the image has no shell): the Pod
			// leaves the Services' endpoints before Traefik stops
			// accepting; Traefik then finishes what is under way, streams
			// and WebSockets included (traefikGraceArgs).
			"lifecycle": map[string]any{"preStop": map[string]any{"sleep": map[string]any{"seconds": int64(traefikPreStopSeconds)}}},
		}},
		"terminationGracePeriodSeconds": int64(traefikPreStopSeconds + traefikGraceSeconds + 5),
		// Two replicas on different nodes where there are several: every
		// request passes the gateway, so one replica rolled (an upgrade
		// that changes its image), evicted or on a drained node reset
		// every connection until its successor was Ready (the operations
		// suite's upgrade and drain runs, 2026-12-05).
		"topologySpreadConstraints": []any{map[string]any{
			"maxSkew": int64(1), "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
			"labelSelector": map[string]any{"matchLabels": labels},
		}},
	}
	if podSecurity != nil {
		pod["securityContext"] = podSecurity
	}
	objs := []*unstructured.Unstructured{
		{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": traefikNamespace}}},
		{Object: map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": traefikSA, "namespace": traefikNamespace}}},
		{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": "traefik", "namespace": traefikNamespace, "labels": labels},
			"spec": map[string]any{
				"replicas": int64(2),
				"strategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": int64(0), "maxSurge": int64(1)}},
				"selector": map[string]any{"matchLabels": labels},
				"template": map[string]any{"metadata": map[string]any{"labels": labels}, "spec": pod},
			},
		}},
		{Object: map[string]any{
			"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
			"metadata": map[string]any{"name": "traefik", "namespace": traefikNamespace},
			"spec":     map[string]any{"maxUnavailable": int64(1), "selector": map[string]any{"matchLabels": labels}},
		}},
	}
	return append(objs, services...)
}

// setTraefikEnv sets one environment variable on the traefik container of
// the Deployment among objs.
func setTraefikEnv(objs []*unstructured.Unstructured, name, value string) error {
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != "traefik" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			cm := c.(map[string]any)
			if cm["name"] != "traefik" {
				continue
			}
			env, _ := cm["env"].([]any)
			cm["env"] = append(env, map[string]any{"name": name, "value": value})
			return unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
		}
	}
	return fmt.Errorf("no traefik container to set %s on", name)
}

// servicePort is one port of a Traefik Service.
type servicePort struct {
	name             string
	port, target, np int
}

func traefikService(name, typ string, ports ...servicePort) *unstructured.Unstructured {
	var ps []any
	for _, p := range ports {
		m := map[string]any{"name": p.name, "port": int64(p.port), "targetPort": int64(p.target), "protocol": "TCP"}
		if p.np != 0 {
			m["nodePort"] = int64(p.np)
		}
		ps = append(ps, m)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": traefikNamespace},
		"spec":     map[string]any{"type": typ, "selector": map[string]any{"app": "traefik"}, "ports": ps},
	}}
}
