// Package image assembles OCI images the way ko does: a static Go binary on a
// minimal base (CA certificates, a non-root user, a writable /tmp), with fixed
// timestamps so the same binary always gives the same digest. No Dockerfile,
// no daemon, no registry is needed to build; the result can be written as a
// tarball (docker load, kind load) or pushed to a registry.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootUID is distroless's "nonroot" user, which Knative's Deployments
// expect (runAsNonRoot with no explicit user).
const NonRootUID = 65532

// epoch is the timestamp of every file and of the image itself, for
// reproducible digests.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of a layer built in memory.
type File struct {
	Path string
	Mode int64
	// Body is the content of a regular file; nil with Dir makes a directory.
	Body    []byte
	Dir     bool
	Symlink string
	UID     int
}

// Layer builds a reproducible uncompressed-then-gzipped layer from files,
// sorted by path, with every parent directory present.
func Layer(files []File) (v1.Layer, error) {
	all := map[string]File{}
	for _, f := range files {
		all[f.Path] = f
		for d := path.Dir(f.Path); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = File{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := all[p]
		hdr := &tar.Header{Name: p[1:], Mode: f.Mode, ModTime: epoch, Uid: f.UID, Gid: f.UID, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case f.Symlink != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Symlink
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// hostCABundle is where Debian keeps the CA bundle the base layer carries.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// BaseFiles are the static base: what distroless/static gives ko images.
func BaseFiles(caBundle []byte) []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Body: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID))},
		{Path: "/etc/group", Mode: 0o644, Body: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRootUID))},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Body: []byte("hosts: files dns\n")},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Body: caBundle},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: NonRootUID},
	}
}

// Options shape a binary image.
type Options struct {
	// Entrypoint defaults to the binary's path in the image.
	Entrypoint []string
	Args       []string
	Env        []string
	// Root runs the image as root; the default is the non-root user.
	Root bool
	// ExtraLayers come after the binary layer (e.g. kodata, a tool closure).
	ExtraLayers []v1.Layer
	// BinaryPath is where the binary goes; default /ko-app/<name>, as ko.
	BinaryPath string
	// Labels become config labels.
	Labels map[string]string
}

// FromBinary builds the image of one static binary.
func FromBinary(binaryPath, binaryName string, o Options) (v1.Image, error) {
	ca, err := os.ReadFile(hostCABundle)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle for the image base (install ca-certificates): %w", err)
	}
	bin, err := os.ReadFile(binaryPath)
	if err != nil {
		return nil, err
	}
	inImage := o.BinaryPath
	if inImage == "" {
		inImage = "/ko-app/" + binaryName
	}
	base, err := Layer(BaseFiles(ca))
	if err != nil {
		return nil, err
	}
	binLayer, err := Layer([]File{{Path: inImage, Mode: 0o755, Body: bin}})
	if err != nil {
		return nil, err
	}
	entry := o.Entrypoint
	if entry == nil {
		entry = []string{inImage}
	}
	user := fmt.Sprint(NonRootUID)
	if o.Root {
		user = "0"
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/ko-app", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}, o.Env...)
	return Assemble(append([]v1.Layer{base, binLayer}, o.ExtraLayers...), v1.Config{
		Entrypoint: entry,
		Cmd:        o.Args,
		Env:        env,
		User:       user,
		WorkingDir: "/",
		Labels:     o.Labels,
	})
}

// Assemble stacks layers on an empty image with cfg, with fixed timestamps
// and OCI media types.
func Assemble(layers []v1.Layer, cfg v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{CreatedBy: "lampyr image builder", Created: v1.Time{Time: epoch}}})
		if err != nil {
			return nil, err
		}
	}
	img, err := mutate.Config(img, cfg)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	return mutate.ConfigFile(img, cf)
}

// WriteTarball writes img as a docker-archive (loadable by `docker load` and
// by containerd's import) tagged ref.
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
