// Package stubs holds the source of modules the Go module proxy cannot
// serve but a pinned build needs, supplied to clusters/build/gobuild as
// Spec.Local (a directory replace in the scratch module). Each stand-in is
// as small as what the pinned module uses of it, and says why it exists.
package stubs

import (
	"embed"
	"io/fs"
	"path"

	"lampyr.dev/serving/clusters/build/gobuild"
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
		"clusters/build/stubs/traefik-dynamic-ext: Traefik v3.7's nested module, which the module proxy refuses")
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
		Files: map[string]string{legoDNSFile: `// Replaced by lampyr.dev/serving clusters/build/stubs.LegoDNS: an offline
// test build of Traefik has no use for ACME DNS-01 providers.

package dns

import (
	"fmt"

	"` + modulePath + `/challenge"
)

// NewDNSChallengeProviderByName knows no provider in this build.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("ACME DNS provider %q is not built into this offline test build of Traefik (lampyr.dev/serving clusters/build/stubs.LegoDNS)", name)
}
`},
		Origin: "clusters/build/stubs.LegoDNS: lego's ACME DNS provider registry left out of the offline test Traefik",
	}
}
