package clusters

import "lampyr.dev/serving/impl/install"

// RepoRoot is the root of this checkout (the directory holding go.mod),
// whose impl/config and commands the lampyr profile builds
// (install.RepoRoot).
func RepoRoot() string { return install.RepoRoot() }
