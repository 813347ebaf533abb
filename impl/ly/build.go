package ly

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"lampyr.dev/serving/impl/artifact"
)

// ArtifactDir is where `ly build` leaves the artifact, relative to the
// service directory: an OCI image layout holding one snapshot artifact.
const ArtifactDir = ".lampyr/artifact"

// BuildOptions tune Build.
type BuildOptions struct {
	// ArtifactDir overrides <dir>/.lampyr/artifact.
	ArtifactDir string
	// GOARCH of the handler; default: this machine's.
	GOARCH string
	// Log receives the go toolchain's output.
	Log io.Writer
}

// Built is a snapshot artifact on disk.
type Built struct {
	Dir    string
	Image  v1.Image
	Digest v1.Hash
	Config artifact.Config
}

// Build compiles the handler and packs it, with the project's files, into a
// snapshot artifact (docs/contracts.md §6) stored as an OCI layout. The
// same sources give the same digest: the build is trimmed, stripped and
// without VCS stamps, and the layer is reproducible.
func Build(ctx context.Context, dir string, p *Project, o BuildOptions) (*Built, error) {
	out := o.ArtifactDir
	if out == "" {
		out = filepath.Join(dir, ArtifactDir)
	}
	stage, err := os.MkdirTemp("", "ly-build-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	root := filepath.Join(stage, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	arch := o.GOARCH
	if arch == "" {
		arch = runtime.GOARCH
	}
	main := p.Main
	if !strings.HasPrefix(main, ".") {
		main = "./" + main
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", filepath.Join(root, "handler"), main)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-mod=mod")
	var msgs strings.Builder
	cmd.Stdout, cmd.Stderr = &msgs, &msgs
	if o.Log != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&msgs, o.Log), io.MultiWriter(&msgs, o.Log)
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s in %s: %w\n%s", main, dir, err, strings.TrimSpace(msgs.String()))
	}
	for _, f := range p.Files {
		if err := copyTree(filepath.Join(dir, f), filepath.Join(root, f)); err != nil {
			return nil, fmt.Errorf("files: %w", err)
		}
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOVERSION: %w", err)
	}
	cfg := artifact.Config{
		Entrypoint:     []string{"/handler"},
		Port:           p.Port,
		Protocol:       p.Protocol,
		ReadinessPath:  p.ReadinessPath,
		Runtime:        artifact.Runtime{Name: "go", Version: strings.TrimSpace(string(goVersion))},
		AdapterVersion: adapterVersion(dir),
		HelperVersion:  artifact.HelperProtocolVersion,
	}
	if p.StartupTimeout != "" {
		d, _ := time.ParseDuration(p.StartupTimeout)
		cfg.StartupTimeoutSeconds = int32((d + time.Second - 1) / time.Second)
	}
	img, err := artifact.Build(root, cfg)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := lp.AppendImage(img); err != nil {
		return nil, fmt.Errorf("writing %s: %w", out, err)
	}
	return LoadArtifact(out)
}

// LoadArtifact opens the snapshot artifact `ly build` left in dir.
func LoadArtifact(dir string) (*Built, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("no artifact in %s: run `ly build` first (%v)", dir, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d manifests, want exactly one snapshot artifact: run `ly build` again", dir, len(m.Manifests))
	}
	d := m.Manifests[0].Digest
	img, err := lp.Image(d)
	if err != nil {
		return nil, err
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	var cfg artifact.Config
	if err := jsonUnmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%s: config: %w", dir, err)
	}
	mt, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if mt.Config.MediaType != artifact.ConfigMediaType {
		return nil, fmt.Errorf("%s holds %s, not a Lampyr snapshot artifact: run `ly build` again", dir, mt.Config.MediaType)
	}
	return &Built{Dir: dir, Image: img, Digest: d, Config: cfg}, nil
}

func copyTree(src, dst string) error {
	return filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			return os.MkdirAll(target, 0o755)
		case fi.Mode().IsRegular():
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, fi.Mode().Perm())
		default:
			return errors.New(path + ": only regular files and directories can go into a snapshot")
		}
	})
}
