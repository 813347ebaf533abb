package clusters

import (
	"path/filepath"
	"runtime"
)

// RepoRoot is the root of this checkout (the directory holding go.mod),
// whose impl/config and commands the lampyr profile builds. Here rather
// than in clusters/e2eutil so that `ly cluster install` does not link the
// suites' helpers.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), ".."))
}
