// Package inputsenv is the part of clusters/environ the cluster inputs
// need, without the rest of the framework: clusters/cmd/lampyr-inputs
// builds the inputs in the background while a suite compiles, so it must
// compile in seconds and find the same cache as the suite.
package inputsenv

import (
	"os"
	"path/filepath"
)

// The variables read here (listed in docs/environment.md with the others).
const (
	// CacheDir holds everything built from pinned versions.
	CacheDir = "LAMPYR_CACHE_DIR"
	// DebianMirror is where the node image's packages come from.
	DebianMirror = "LAMPYR_DEBIAN_MIRROR"
)

// Cache is LAMPYR_CACHE_DIR, else $XDG_CACHE_HOME/lampyr, else
// ~/.cache/lampyr.
func Cache() string {
	if d := os.Getenv(CacheDir); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "lampyr")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "lampyr-cache")
	}
	return filepath.Join(home, ".cache", "lampyr")
}

// Mirror is LAMPYR_DEBIAN_MIRROR ("" for the default).
func Mirror() string { return os.Getenv(DebianMirror) }
