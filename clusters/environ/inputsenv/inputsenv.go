// Package inputsenv is the part of clusters/environ the cluster inputs
// need, without the rest of the framework: clusters/cmd/lampyr-inputs
// builds the inputs in the background while a suite compiles, so it must
// compile in seconds and find the same cache as the suite.
package inputsenv

import (
	"os"

	"lampyr.dev/serving/impl/install/installenv"
)

// The variables read here (listed in docs/environment.md with the others).
const (
	// CacheDir holds everything built from pinned versions (the
	// installer's: installenv.CacheDir).
	CacheDir = installenv.CacheDir
	// DebianMirror is where the node image's packages come from.
	DebianMirror = "LAMPYR_DEBIAN_MIRROR"
)

// Cache is LAMPYR_CACHE_DIR, else $XDG_CACHE_HOME/lampyr, else
// ~/.cache/lampyr: the cache `ly cluster install` and the suites use
// (installenv.Cache).
func Cache() string { return installenv.Cache() }

// Mirror is LAMPYR_DEBIAN_MIRROR ("" for the default).
func Mirror() string { return os.Getenv(DebianMirror) }
