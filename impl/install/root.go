package install

import (
	"path/filepath"
	"runtime"
)

// RepoRoot is the root of this checkout (the directory holding go.mod),
// whose impl/config and commands the lampyr profile builds: `ly cluster
// install` builds Lampyr from the checkout it was built from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}
