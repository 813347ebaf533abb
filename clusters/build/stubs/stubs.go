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
