// Package ext stands in for github.com/traefik/traefik/dynamic/ext, the
// nested module Traefik v3.7's go.mod requires through a directory replace
// (./pkg/config/dynamic/ext). A nested module is never part of its parent's
// module zip, and the module proxy refuses the path, so Traefik v3.7 cannot
// be built from the proxy unmodified without it. Upstream's package is two
// empty struct types that dynamic.HTTPConfiguration and dynamic.Router
// embed (extension points for Traefik's own distributions); v3.7.9 uses
// nothing else of it. If a later Traefik needs more, its build fails naming
// this package (impl/build/gobuild says it is supplied from source).
//
// This directory is source for the scratch build (impl/build/stubs
// embeds it); it is compiled here too so go vet checks it.
package ext

// HTTP is a dynamic.HTTPConfiguration extension: empty upstream.
type HTTP struct{}

// Router is a dynamic.Router extension: empty upstream.
type Router struct{}
