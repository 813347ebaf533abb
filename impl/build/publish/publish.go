// Package publish builds Go main packages into images and pushes them to the
// local registry, returning digest-pinned references: how every Knative,
// networking, Lampyr and fixture image reaches a cluster. A registry keeps the
// manifest digest, so Pods can pull by digest (loading docker archives into
// containerd would not preserve it).
package publish

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"lampyr.dev/serving/impl/build/gobuild"
	"lampyr.dev/serving/impl/build/image"
	"lampyr.dev/serving/impl/progress"
)

// Publisher builds and pushes.
type Publisher struct {
	Go       *gobuild.Builder
	Registry string // e.g. localhost:5002
	Log      *progress.Log
	// BuildOnly runs the Go builds and nothing else: Push writes nothing
	// and answers a placeholder reference. A prebuild runs the install code
	// with it before the clusters and their registry exist, so the builds
	// it starts are exactly those the install will ask for (the same
	// specs, the same cache keys).
	BuildOnly bool
}

// placeholderDigest is what a BuildOnly Push answers.
const placeholderDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// Image says how to make one image from one package of a build.
type Image struct {
	// Package is the main package (one of Spec.Packages).
	Package string
	// Repo is the repository under the registry, e.g. knative-serving/controller.
	Repo    string
	Options image.Options
}

// Publish builds spec once and pushes one image per entry of imgs,
// returning Package -> digest reference.
func (p *Publisher) Publish(ctx context.Context, spec gobuild.Spec, imgs []Image) (map[string]string, error) {
	var bins []gobuild.Binary
	label := spec.Name
	if spec.Version != "" {
		label += " " + spec.Version
	}
	err := p.Log.Step(fmt.Sprintf("Building %s (%d image(s))", label, len(imgs)), func() (err error) {
		bins, err = p.Go.Build(ctx, spec, "")
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if p.BuildOnly {
		for _, im := range imgs {
			out[im.Package] = fmt.Sprintf("%s/%s@%s", p.Registry, im.Repo, placeholderDigest)
		}
		return out, nil
	}
	byPkg := map[string]string{}
	for _, b := range bins {
		byPkg[b.Package] = b.Path
	}
	for _, im := range imgs {
		bin, ok := byPkg[im.Package]
		if !ok {
			return nil, fmt.Errorf("%s: package %s is not part of the build", spec.Name, im.Package)
		}
		img, err := image.FromBinary(bin, path.Base(im.Package), im.Options)
		if err != nil {
			return nil, err
		}
		ref, err := p.Push(ctx, im.Repo, tagFor(spec), img)
		if err != nil {
			return nil, err
		}
		out[im.Package] = ref
	}
	return out, nil
}

// Push writes img to Registry/repo:tag and returns Registry/repo@digest.
func (p *Publisher) Push(ctx context.Context, repo, tag string, img v1.Image) (string, error) {
	if p.BuildOnly {
		return fmt.Sprintf("%s/%s@%s", p.Registry, repo, placeholderDigest), nil
	}
	t, err := name.NewTag(fmt.Sprintf("%s/%s:%s", p.Registry, repo, tag))
	if err != nil {
		return "", err
	}
	if err := remote.Write(t, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s (is the local registry up? `just cluster-up`): %w", t, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%s@%s", p.Registry, repo, d), nil
}

func tagFor(spec gobuild.Spec) string {
	if spec.Version != "" {
		return strings.ReplaceAll(spec.Version, "+", "_")
	}
	return "dev"
}
