// Package stubs holds the source of modules the Go module proxy cannot
// serve but a pinned build needs, supplied to impl/build/gobuild as
// Spec.Local (a directory replace in the scratch module). Each stand-in is
// as small as what the pinned module uses of it, and says why it exists.
package stubs

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"lampyr.dev/serving/impl/build/gobuild"
)

//go:embed traefik-dynamic-ext/*.go
var sources embed.FS

// TraefikDynamicExtPath is the nested module Traefik v3.7's go.mod requires
// and replaces with ./pkg/config/dynamic/ext, outside its module zip.
const TraefikDynamicExtPath = "github.com/traefik/traefik/dynamic/ext"

// TraefikDynamicExt is the stand-in for TraefikDynamicExtPath
// (traefik-dynamic-ext/ext.go says what it holds and why).
func TraefikDynamicExt() gobuild.LocalModule {
	return module(TraefikDynamicExtPath, "traefik-dynamic-ext",
		"impl/build/stubs/traefik-dynamic-ext: Traefik v3.7's nested module, which the module proxy refuses")
}

func module(modPath, dir, origin string) gobuild.LocalModule {
	files := map[string]string{}
	entries, err := fs.ReadDir(sources, dir)
	if err != nil {
		panic(err) // embedded at build time: cannot fail
	}
	for _, e := range entries {
		b, err := sources.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		files[e.Name()] = string(b)
	}
	return gobuild.LocalModule{Path: modPath, Files: files, Origin: origin}
}

// legoDNSFile is lego's generated registry of ACME DNS-01 providers
// (providers/dns/zz_gen_dns_providers.go): one function that imports every
// one of its ~190 providers, most with a cloud SDK.
const legoDNSFile = "providers/dns/zz_gen_dns_providers.go"

// LegoDNS replaces lego's registry of ACME DNS-01 providers with one that
// knows none, for the Traefik the test clusters run (Traefik imports the
// registry for its ACME DNS challenge). Offline, no ACME DNS challenge can
// run (its providers call their DNS vendors' APIs), and the registry's
// imports were 1,258 of the 2,640 packages Traefik v3.7.9 compiled (its
// largest cost on a cold machine, issue 30). A Traefik configured with a DNS
// challenge provider fails to start that resolver with this error instead.
// modulePath is the lego major version Traefik requires
// (github.com/go-acme/lego/v4 or /v5).
func LegoDNS(modulePath, version string) gobuild.ModulePatch {
	return gobuild.ModulePatch{
		Path: modulePath, Version: version,
		Files: map[string]string{legoDNSFile: `// Replaced by lampyr.dev/serving impl/build/stubs.LegoDNS: an offline
// test build of Traefik has no use for ACME DNS-01 providers.

package dns

import (
	"fmt"

	"` + modulePath + `/challenge"
)

// NewDNSChallengeProviderByName knows no provider in this build.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("ACME DNS provider %q is not built into this offline test build of Traefik (lampyr.dev/serving impl/build/stubs.LegoDNS)", name)
}
`},
		Origin: "impl/build/stubs.LegoDNS: lego's ACME DNS provider registry left out of the offline test Traefik",
	}
}

// TraefikGatewayFile is the file of Traefik's Gateway API provider that
// resolves a backendRef to a Service's addresses.
const TraefikGatewayFile = "pkg/provider/kubernetes/gateway/kubernetes.go"

// TraefikExternalNameEnv names, in the Traefik container's environment, the
// Services (namespace/name, comma-separated) that the patched Gateway API
// provider follows an ExternalName backend to.
const TraefikExternalNameEnv = "LAMPYR_TRAEFIK_EXTERNALNAME_SERVICES"

// traefikExternalNameRefusal is the statement of Traefik's Gateway API
// provider (v3.6, v3.7) that refuses every ExternalName Service as a
// backend; TraefikGatewayExternalName replaces it.
const traefikExternalNameRefusal = `	if service.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, corev1.ServicePort{}, errors.New("type ExternalName is not supported for Kubernetes Service reference")
	}
`

// traefikExternalNameFollow follows an ExternalName Service only when it
// names one of the Services listed in TraefikExternalNameEnv, and then
// routes to that Service's own endpoints: the name is never resolved or
// dialled, so no other name can be reached this way.
const traefikExternalNameFollow = `	if service.Spec.Type == corev1.ServiceTypeExternalName {
		// Patched by lampyr.dev/serving (impl/build/stubs.TraefikGatewayExternalName).
		target, ok := lampyrExternalNameTarget(service.Spec.ExternalName)
		if !ok {
			return nil, corev1.ServicePort{}, errors.New("type ExternalName is not supported for Kubernetes Service reference")
		}
		namespace, ref.Name = target[0], gatev1.ObjectName(target[1])
		service, err = p.client.GetService(namespace, string(ref.Name))
		if err != nil {
			return nil, corev1.ServicePort{}, fmt.Errorf("getting service %s/%s, which an ExternalName Service names: %w", namespace, ref.Name, err)
		}
		if service.Spec.Type == corev1.ServiceTypeExternalName {
			return nil, corev1.ServicePort{}, errors.New("type ExternalName is not supported for Kubernetes Service reference")
		}
	}
`

// traefikExternalNameTarget is appended to the file.
const traefikExternalNameTarget = `
// lampyrExternalNameTarget returns the Service (namespace, name) an
// ExternalName names when it is one of those listed in
// ` + TraefikExternalNameEnv + ` (namespace/name,...): the name is the
// Service's own DNS name (name.namespace, name.namespace.svc or
// name.namespace.svc.<cluster domain>). Added by lampyr.dev/serving
// (impl/build/stubs.TraefikGatewayExternalName).
func lampyrExternalNameTarget(externalName string) ([2]string, bool) {
	host := strings.TrimSuffix(strings.ToLower(externalName), ".")
	for _, s := range strings.Split(os.Getenv("` + TraefikExternalNameEnv + `"), ",") {
		ns, name, ok := strings.Cut(strings.TrimSpace(s), "/")
		if !ok || ns == "" || name == "" {
			continue
		}
		base := strings.ToLower(name + "." + ns)
		if host == base || host == base+".svc" || strings.HasPrefix(host, base+".svc.") {
			return [2]string{ns, name}, true
		}
	}
	return [2]string{}, false
}
`

// TraefikGatewayExternalName patches Traefik's Gateway API provider (the
// file TraefikGatewayFile of module at version, read from moduleDir) so
// that an ExternalName Service naming one of the Services listed in the
// container's TraefikExternalNameEnv is followed to that Service's
// endpoints; every other ExternalName is refused as before.
//
// Why: Knative Serving makes each Route's placeholder Service an
// ExternalName to the local gateway's Service (net-gateway-api reports it
// as the private load balancer's DomainInternal, as upstream's
// configuration for every gateway does), and a DomainMapping's KIngress
// routes to that placeholder with its host rewritten. Traefik refuses
// every ExternalName backend (traefik/traefik#12950; the option proposed
// in #13050 would follow any name), so a DomainMapping got 500. Reporting
// the local gateway by IP instead (e8fa514) served DomainMappings but left
// no DomainInternal, which Knative's own ingress conformance tests
// (visibility, visibility/path, visibility/split, host-rewrite) need.
// Following only the gateway's own Service keeps both and gives a tenant
// nothing new: an ExternalName of its own to any other name (kube-dns, a
// webhook) is still refused (the tenancy suite's row 12), and one naming
// the local gateway reaches what the tenant's Pods reach anyway.
func TraefikGatewayExternalName(module, version, moduleDir string) (gobuild.ModulePatch, error) {
	raw, err := os.ReadFile(filepath.Join(moduleDir, filepath.FromSlash(TraefikGatewayFile)))
	if err != nil {
		return gobuild.ModulePatch{}, fmt.Errorf("patching %s@%s: %w", module, version, err)
	}
	src := string(raw)
	if n := strings.Count(src, traefikExternalNameRefusal); n != 1 {
		return gobuild.ModulePatch{}, fmt.Errorf("patching %s@%s: %s holds the ExternalName refusal %d times, want once: the patch (impl/build/stubs.TraefikGatewayExternalName) no longer matches this version", module, version, TraefikGatewayFile, n)
	}
	for _, imp := range []string{`"errors"`, `"fmt"`, `"os"`, `"strings"`, `gatev1 "sigs.k8s.io/gateway-api/apis/v1"`} {
		if !strings.Contains(src, "\t"+imp+"\n") {
			return gobuild.ModulePatch{}, fmt.Errorf("patching %s@%s: %s no longer imports %s, which the patch uses", module, version, TraefikGatewayFile, imp)
		}
	}
	src = strings.Replace(src, traefikExternalNameRefusal, traefikExternalNameFollow, 1) + traefikExternalNameTarget
	return gobuild.ModulePatch{
		Path: module, Version: version,
		Files:  map[string]string{TraefikGatewayFile: src},
		Origin: "impl/build/stubs.TraefikGatewayExternalName: Traefik's Gateway API provider follows an ExternalName only to the Services listed in " + TraefikExternalNameEnv,
	}, nil
}
