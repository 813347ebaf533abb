package e2eutil

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
)

// RepoRoot is the root of this repository (the directory holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BuildAndPush builds a main package of this repository into an image and
// pushes it to registry/repo:tag, returning the digest-pinned reference as
// the host names it (the nodes name the registry the same way).
func BuildAndPush(ctx context.Context, cacheDir, pkg, registry, repo, tag string) (string, error) {
	b := &gobuild.Builder{WorkDir: filepath.Join(cacheDir, "go-local")}
	bins, err := b.Build(ctx, gobuild.Spec{Name: filepath.Base(pkg), Dir: RepoRoot(), Packages: []string{pkg}}, "")
	if err != nil {
		return "", err
	}
	img, err := image.FromBinary(bins[0].Path, filepath.Base(pkg), image.Options{})
	if err != nil {
		return "", err
	}
	ref, err := name.NewTag(fmt.Sprintf("%s/%s:%s", registry, repo, tag))
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s (is the local registry running? `just cluster-up`): %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%s@%s", registry, repo, d), nil
}
