// Package runscpin says which runsc the gvisor backend runs and how it is
// built: a package of its own so the installer, which puts runsc in the
// Home image, does not link the backend.
package runscpin

import "lampyr.dev/serving/impl/build/gobuild"

// Version is the gvisor.dev/gvisor version runsc is built from: the
// one go.mod pins for fiberd's network stack (a test keeps them equal),
// a go-branch commit that supports the Go toolchain the project builds
// with (docs/environment.md).
const Version = "v0.0.0-20260701204157-69c2d17aea96"

// HomePath is where the Home image holds runsc (fiberd --runsc).
const HomePath = "/runsc"

// Spec builds runsc from the pinned module, statically (the Home
// image has no libc), stripped like every pinned build. Upstream documents
// the plain go build of the go branch as best effort; the tests in this
// package run what it builds.
func Spec() gobuild.Spec {
	return gobuild.Spec{Name: "runsc", Module: "gvisor.dev/gvisor", Version: Version,
		Packages: []string{"gvisor.dev/gvisor/runsc"}, LDFlags: "-s -w"}
}
