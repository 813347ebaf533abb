// Package installenv is where the installer's commands read their
// environment: `ly cluster install` here, and the cluster framework's
// commands and suites through clusters/environ, which uses the same names
// and defaults. Only the standard library, so that
// clusters/cmd/lampyr-inputs (which must compile in seconds) finds the same
// cache. Every variable is listed in docs/environment.md.
package installenv

import (
	"os"
	"path/filepath"
)

// The variables read here. The lampyr profile's input overrides and
// LAMPYR_ONLINE are install.Env* (install.LampyrSourcesFrom).
const (
	// CacheDir holds everything built from pinned versions.
	CacheDir = "LAMPYR_CACHE_DIR"
	// StateDir holds the Kind clusters' kubeconfigs and records.
	StateDir = "LAMPYR_STATE_DIR"
	// Networking names the networking provider installs use.
	Networking = "LAMPYR_NETWORKING"
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

// State is LAMPYR_STATE_DIR, else <cache>/clusters.
func State(cache string) string {
	if d := os.Getenv(StateDir); d != "" {
		return d
	}
	return filepath.Join(cache, "clusters")
}

// Provider is LAMPYR_NETWORKING, else def (networking.Default; passed in
// so that this package stays light).
func Provider(def string) string {
	if v := os.Getenv(Networking); v != "" {
		return v
	}
	return def
}

// Set reports whether variable k is "1".
func Set(k string) bool { return os.Getenv(k) == "1" }
