// Package artifact builds, pushes, fetches and verifies Lampyr snapshot
// artifacts and sealed-template artifacts (docs/contracts.md §6).
//
// A snapshot artifact is an OCI image manifest with its own artifact type,
// config media type and layer media type, so no container runtime mistakes it
// for a runnable image. It is addressed by the digest of its manifest and
// every consumer verifies that digest, the config digest and the layer digest
// before using a byte of it. `ly build` calls Build and Push; the Lampyr
// Revision reconciler and fiberd call Fetch.
package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// Media and artifact types of a snapshot artifact. The layer is a tar,
// compressed with zstd (what Build makes) or gzip (what Build made before:
// such snapshots keep working). zstd because a fiberd unpacks the layer
// between a spare Home's claim and the Revision's readiness: gunzip of the
// 14.6 MB bench handler took 130 ms on a 2-vCPU machine, zstd 25-30 ms
// (issue 32; docs/performance.md).
const (
	SnapshotArtifactType = "application/vnd.lampyr.snapshot.v1"
	ConfigMediaType      = "application/vnd.lampyr.snapshot.config.v1+json"
	LayerMediaType       = "application/vnd.lampyr.snapshot.layer.v1.tar+zstd"
	LayerMediaTypeGzip   = "application/vnd.lampyr.snapshot.layer.v1.tar+gzip"
)

// snapshotLayerTypes are the layer media types a snapshot may carry.
var snapshotLayerTypes = []string{LayerMediaType, LayerMediaTypeGzip}

// zstdWindow is the window Build compresses with and the largest an
// unpack accepts: a zstd frame may declare a window of up to 3.75 TiB,
// which the decoder would allocate before writing a byte.
const zstdWindow = 8 << 20

// ConfigAPIVersion versions the Config JSON.
const ConfigAPIVersion = "lampyr.dev/snapshot/v1"

// Config is the snapshot's start-up contract and helper facts: everything
// besides the files that fiberd needs to start a fiber of the handler.
type Config struct {
	APIVersion string `json:"apiVersion"`
	// Entrypoint is the handler's command line; Entrypoint[0] is an absolute
	// path inside the layer.
	Entrypoint []string `json:"entrypoint"`
	// Port the handler listens on (it also receives it as $PORT).
	Port int32 `json:"port"`
	// Protocol is http1 (default) or h2c.
	Protocol string `json:"protocol,omitempty"`
	// Readiness: the fiber is ready when the port accepts connections and,
	// if ReadinessPath is set, GET ReadinessPath answers 2xx, within
	// StartupTimeoutSeconds (default 10).
	StartupTimeoutSeconds int32  `json:"startupTimeoutSeconds,omitempty"`
	ReadinessPath         string `json:"readinessPath,omitempty"`
	// Runtime names the language runtime and version the handler was built
	// with, e.g. {"name":"go","version":"go1.26.8"}.
	Runtime Runtime `json:"runtime"`
	// AdapterVersion is the .lampyr-adapter version `ly build` used.
	AdapterVersion string `json:"adapterVersion,omitempty"`
	// HelperVersion is the lampyr-helper protocol the snapshot expects.
	HelperVersion string `json:"helperVersion,omitempty"`
	// User is the non-root "uid[:gid]" the handler runs as inside its
	// fiber's user namespace (an image's USER); empty: 65534.
	User string `json:"user,omitempty"`
}

// UserIDs parses User: uid and gid (gid defaults to uid); 0, 0 when unset.
func (c *Config) UserIDs() (uid, gid uint32, err error) {
	if c.User == "" {
		return 0, 0, nil
	}
	u, g, hasG := strings.Cut(c.User, ":")
	parse := func(s string) (uint32, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 || n >= 65536 {
			return 0, fmt.Errorf("user %q: want numeric non-root ids below 65536 (uid[:gid]); a fiber never runs its handler as root", c.User)
		}
		return uint32(n), nil
	}
	if uid, err = parse(u); err != nil {
		return 0, 0, err
	}
	gid = uid
	if hasG {
		if gid, err = parse(g); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

// Runtime identifies the handler's runtime.
type Runtime struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// Limits bound what fetching and unpacking an artifact may cost its
// consumer (fiberd holds the compressed layer in memory and writes the
// unpacked files to its Home's volume). A tenant chooses the artifact, so
// every size a manifest or tar header declares is checked against these
// before a byte of it is read or written. Errors are *LimitError.
type Limits struct {
	// LayerBytes bounds the compressed layer (and a template's sealed blob).
	LayerBytes int64
	// ConfigBytes bounds the config blob.
	ConfigBytes int64
	// UnpackedBytes bounds the sum of the regular files' sizes unpacked.
	UnpackedBytes int64
	// Entries bounds the number of tar entries.
	Entries int
	// PathBytes bounds an entry's name and a symlink's target.
	PathBytes int
}

// DefaultLimits are fiberd's defaults (flags --max-snapshot-bytes,
// --max-unpacked-bytes, --max-snapshot-entries): a Go or Node handler's
// snapshot is 5-60 MiB compressed.
var DefaultLimits = Limits{
	LayerBytes:    256 << 20,
	ConfigBytes:   64 << 10,
	UnpackedBytes: 1 << 30,
	Entries:       100000,
	PathBytes:     1024,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.LayerBytes > 0 {
		d.LayerBytes = l.LayerBytes
	}
	if l.ConfigBytes > 0 {
		d.ConfigBytes = l.ConfigBytes
	}
	if l.UnpackedBytes > 0 {
		d.UnpackedBytes = l.UnpackedBytes
	}
	if l.Entries > 0 {
		d.Entries = l.Entries
	}
	if l.PathBytes > 0 {
		d.PathBytes = l.PathBytes
	}
	return d
}

// LimitError says which limit an artifact exceeds.
type LimitError struct {
	// Limit is the field of Limits, e.g. "UnpackedBytes".
	Limit string
	// What exceeded it.
	What     string
	Max, Got int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %d exceeds the %s limit of %d (artifact.Limits.%s); refusing the artifact", e.What, e.Got, limitNames[e.Limit], e.Max, e.Limit)
}

var limitNames = map[string]string{
	"LayerBytes":    "compressed layer size",
	"ConfigBytes":   "config size",
	"UnpackedBytes": "unpacked size",
	"Entries":       "entry count",
	"PathBytes":     "path length",
}

// HelperProtocolVersion is the helper protocol this tree's lampyr-helper speaks.
const HelperProtocolVersion = "v1"

// Validate checks a config; errors name the field.
func (c *Config) Validate() error {
	var errs []string
	if c.APIVersion != ConfigAPIVersion {
		errs = append(errs, fmt.Sprintf("apiVersion %q: want %q", c.APIVersion, ConfigAPIVersion))
	}
	if len(c.Entrypoint) == 0 || !path.IsAbs(c.Entrypoint[0]) {
		errs = append(errs, "entrypoint: want an absolute path inside the artifact, e.g. [\"/app/handler\"]")
	}
	if c.Port <= 0 || c.Port > 65535 {
		errs = append(errs, fmt.Sprintf("port %d: want 1-65535", c.Port))
	}
	switch c.Protocol {
	case "", "http1", "h2c":
	default:
		errs = append(errs, fmt.Sprintf("protocol %q: want http1 or h2c", c.Protocol))
	}
	if c.ReadinessPath != "" && !strings.HasPrefix(c.ReadinessPath, "/") {
		errs = append(errs, fmt.Sprintf("readinessPath %q: want an absolute path such as /healthz", c.ReadinessPath))
	}
	if c.StartupTimeoutSeconds < 0 {
		errs = append(errs, "startupTimeoutSeconds: must not be negative")
	}
	if c.Runtime.Name == "" {
		errs = append(errs, "runtime.name: required (e.g. go, node, python)")
	}
	if _, _, err := c.UserIDs(); err != nil {
		errs = append(errs, err.Error())
	}
	if c.HelperVersion != "" && c.HelperVersion != HelperProtocolVersion {
		errs = append(errs, fmt.Sprintf("helperVersion %q: this fiberd's helper speaks %q; rebuild the artifact with a matching `ly build`", c.HelperVersion, HelperProtocolVersion))
	}
	if len(errs) > 0 {
		return errors.New("invalid snapshot config: " + strings.Join(errs, "; "))
	}
	return nil
}

// Build makes a snapshot artifact from the files under dir. The layer is
// reproducible: entries sorted, timestamps and owners zeroed, so the same
// files and config always give the same digest.
func Build(dir string, cfg Config) (v1.Image, error) {
	if cfg.APIVersion == "" {
		cfg.APIVersion = ConfigAPIVersion
	}
	if cfg.HelperVersion == "" {
		cfg.HelperVersion = HelperProtocolVersion
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layer, err := tarZstd(dir)
	if err != nil {
		return nil, fmt.Errorf("packing %s: %w", dir, err)
	}
	entry := strings.TrimPrefix(cfg.Entrypoint[0], "/")
	if fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(entry))); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("entrypoint %q: want an executable regular file under %s", cfg.Entrypoint[0], dir)
	}
	rawCfg, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return newImage(SnapshotArtifactType, ConfigMediaType, rawCfg, LayerMediaType, layer, map[string]string{
		"org.opencontainers.image.title": "lampyr snapshot",
	})
}

// FromLayer makes a snapshot artifact of an already packed layer (a
// gzipped tar), unchecked: for tests and the hostile-tenant suite, which
// need artifacts `ly build` would never make (a gzip bomb, a symlinked
// mount point).
func FromLayer(cfg Config, layer []byte) (v1.Image, error) {
	return FromLayerOfType(cfg, layer, LayerMediaTypeGzip)
}

// FromLayerOfType is FromLayer with the layer's media type
// (LayerMediaType: a zstd tar, LayerMediaTypeGzip: a gzipped tar).
func FromLayerOfType(cfg Config, layer []byte, layerMT string) (v1.Image, error) {
	if cfg.APIVersion == "" {
		cfg.APIVersion = ConfigAPIVersion
	}
	rawCfg, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return newImage(SnapshotArtifactType, ConfigMediaType, rawCfg, layerMT, layer, nil)
}

// GzipBomb is a layer holding the files of dir (as Build packs them) plus
// one file of size zero bytes at name: it compresses about 1000:1.
func GzipBomb(dir, name string, size int64) ([]byte, error) {
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	if dir != "" {
		packed, err := tarGz(dir)
		if err != nil {
			return nil, err
		}
		zr, err := gzip.NewReader(bytes.NewReader(packed))
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := io.Copy(tw, tr); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(zero)) {
		if _, err := tw.Write(zero[:min(left, int64(len(zero)))]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarGz packs dir deterministically into a gzipped tar (the format before
// zstd; tests and GzipBomb).
func tarGz(dir string) ([]byte, error) {
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := tarInto(gz, dir); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarZstd packs dir deterministically into a zstd-compressed tar: one
// encoder goroutine, a fixed level and window, so the same tree always
// gives the same bytes (and the snapshot the same digest).
func tarZstd(dir string) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(zstdWindow))
	if err != nil {
		return nil, err
	}
	if err := tarInto(zw, dir); err != nil {
		zw.Close()
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarInto writes dir as a tar to w, deterministically. Only regular files,
// directories and symlinks are kept: device nodes or sockets have no place
// in a snapshot.
func tarInto(w io.Writer, dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			return fmt.Errorf("%s: only regular files, directories and symlinks can go into a snapshot", rel)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// manifest is an OCI image manifest with artifactType, which this
// go-containerregistry version's v1.Manifest lacks.
type manifest struct {
	SchemaVersion int64             `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        v1.Descriptor     `json:"config"`
	Layers        []v1.Descriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// image is a single-layer OCI artifact with a raw config blob.
type image struct {
	manifest []byte
	config   []byte
	cfgMT    types.MediaType
	layer    v1.Layer
	layerDig v1.Hash
}

func newImage(artifactType, configMT string, config []byte, layerMT string, layer []byte, ann map[string]string) (v1.Image, error) {
	l := static.NewLayer(layer, types.MediaType(layerMT))
	ld, _ := l.Digest()
	cd, cs, _ := v1.SHA256(bytes.NewReader(config))
	m := manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  artifactType,
		Config:        v1.Descriptor{MediaType: types.MediaType(configMT), Size: cs, Digest: cd},
		Layers:        []v1.Descriptor{{MediaType: types.MediaType(layerMT), Size: int64(len(layer)), Digest: ld}},
		Annotations:   ann,
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&image{manifest: raw, config: config, cfgMT: types.MediaType(configMT), layer: l, layerDig: ld})
}

func (i *image) RawConfigFile() ([]byte, error)      { return i.config, nil }
func (i *image) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (i *image) RawManifest() ([]byte, error)        { return i.manifest, nil }
func (i *image) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.layerDig {
		return i.layer, nil
	}
	cd, _, _ := v1.SHA256(bytes.NewReader(i.config))
	if h == cd {
		return static.NewLayer(i.config, i.cfgMT), nil
	}
	return nil, fmt.Errorf("blob %s not in this artifact", h)
}

// Push writes img to ref (a tag or repository) and returns the digest-pinned
// reference consumers must use.
func Push(ctx context.Context, img v1.Image, ref string, opts ...remote.Option) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("artifact reference %q: %w", ref, err)
	}
	if err := remote.Write(r, img, append(opts, remote.WithContext(ctx))...); err != nil {
		return name.Digest{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	return r.Context().Digest(d.String()), nil
}

// Snapshot is a fetched snapshot artifact: its manifest and config
// verified; its layer is read, verified and unpacked by Unpack.
type Snapshot struct {
	Ref    name.Digest
	Config Config
	// layer describes the layer (LayerMediaType or LayerMediaTypeGzip),
	// read from the registry with opts when unpacked.
	layer v1.Descriptor
	opts  []remote.Option
	// limits it was fetched with; Unpack applies them too.
	limits Limits
}

// Digest is the verified manifest digest.
func (s *Snapshot) Digest() string { return s.Ref.DigestStr() }

// ParseDigestRef parses a reference that must be pinned by digest.
func ParseDigestRef(ref string) (name.Digest, error) {
	d, err := name.NewDigest(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("reference %q must be digest-pinned (repo@sha256:<64 hex>): %w", ref, err)
	}
	return d, nil
}

// Fetch pulls the snapshot artifact ref's manifest and config (ref must
// be digest-pinned) and verifies the manifest digest, the media types, the
// config digest and the layer's declared size, within DefaultLimits. The
// layer itself is read by Unpack, which verifies its digest as it streams
// it (a new Revision's Home unpacks while the layer arrives).
func Fetch(ctx context.Context, ref string, opts ...remote.Option) (*Snapshot, error) {
	return FetchWithLimits(ctx, ref, DefaultLimits, opts...)
}

// FetchWithLimits is Fetch within l (zero fields: DefaultLimits); the
// snapshot's Unpack applies l as well.
func FetchWithLimits(ctx context.Context, ref string, l Limits, opts ...remote.Option) (*Snapshot, error) {
	l = l.withDefaults()
	d, err := ParseDigestRef(ref)
	if err != nil {
		return nil, err
	}
	opts = sharedPuller(ctx, opts)
	manifest, cfg, err := fetchManifestConfig(ctx, d, SnapshotArtifactType, ConfigMediaType, snapshotLayerTypes, l, opts)
	if err != nil {
		return nil, err
	}
	desc := manifest.Layers[0]
	if desc.Size < 0 || desc.Size > l.LayerBytes {
		return nil, &LimitError{Limit: "LayerBytes", What: "blob " + desc.Digest.String() + " (size declared by the manifest)", Max: l.LayerBytes, Got: desc.Size}
	}
	s := &Snapshot{Ref: d, layer: desc, opts: opts, limits: l}
	dec := json.NewDecoder(bytes.NewReader(cfg))
	if err := dec.Decode(&s.Config); err != nil {
		return nil, fmt.Errorf("snapshot %s: config is not valid JSON: %w", ref, err)
	}
	if err := s.Config.Validate(); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	return s, nil
}

// fetchVerified pulls a single-layer artifact by digest and checks every
// digest and media type itself rather than trusting the transport.
// FetchConfig pulls only the manifest and config of the snapshot artifact
// ref (digest-pinned), verified as Fetch does: enough to seal its template
// without downloading the files.
func FetchConfig(ctx context.Context, ref string, opts ...remote.Option) (Config, error) {
	var c Config
	d, err := ParseDigestRef(ref)
	if err != nil {
		return c, err
	}
	m, cfg, err := fetchManifestConfig(ctx, d, SnapshotArtifactType, ConfigMediaType, snapshotLayerTypes, DefaultLimits, sharedPuller(ctx, opts))
	if err != nil {
		return c, err
	}
	_ = m
	if err := json.Unmarshal(cfg, &c); err != nil {
		return c, fmt.Errorf("%s: config: %w", ref, err)
	}
	return c, c.Validate()
}

// sharedPuller adds one puller to opts, for the manifest and blob reads of
// one artifact: each remote call would otherwise ping the registry and set
// up its transport again (a round trip each, on a new Revision's start).
func sharedPuller(ctx context.Context, opts []remote.Option) []remote.Option {
	p, err := remote.NewPuller(append(slices.Clone(opts), remote.WithContext(ctx))...)
	if err != nil {
		return opts // each call reports the options' error itself
	}
	return append(slices.Clone(opts), remote.Reuse(p))
}

func fetchVerified(ctx context.Context, d name.Digest, artifactType, configMT string, layerMTs []string, l Limits, opts []remote.Option) (*manifest, []byte, []byte, error) {
	opts = sharedPuller(ctx, opts)
	m, cfg, err := fetchManifestConfig(ctx, d, artifactType, configMT, layerMTs, l, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	layer, err := fetchBlob(ctx, d.Context(), m.Layers[0], "LayerBytes", l.LayerBytes, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	return m, cfg, layer, nil
}

func fetchManifestConfig(ctx context.Context, d name.Digest, artifactType, configMT string, layerMTs []string, l Limits, opts []remote.Option) (*manifest, []byte, error) {
	desc, err := remote.Get(d, append(opts, remote.WithContext(ctx))...)
	if err != nil {
		return nil, nil, fmt.Errorf("fetching %s: %w", d, err)
	}
	if got := "sha256:" + sha256Hex(desc.Manifest); got != d.DigestStr() {
		return nil, nil, fmt.Errorf("%s: registry returned a manifest with digest %s; refusing it", d, got)
	}
	var m manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return nil, nil, fmt.Errorf("%s: manifest: %w", d, err)
	}
	if m.ArtifactType != artifactType || string(m.Config.MediaType) != configMT {
		return nil, nil, fmt.Errorf("%s is not a %s (artifactType %q, config media type %q); was it built by `ly build`?", d, artifactType, m.ArtifactType, m.Config.MediaType)
	}
	if len(m.Layers) != 1 || !slices.Contains(layerMTs, string(m.Layers[0].MediaType)) {
		return nil, nil, fmt.Errorf("%s: want exactly one layer of media type %s", d, strings.Join(layerMTs, " or "))
	}
	repo := d.Context()
	cfg, err := fetchBlob(ctx, repo, m.Config, "ConfigBytes", l.ConfigBytes, opts)
	if err != nil {
		return nil, nil, err
	}
	return &m, cfg, nil
}

// fetchBlob reads a blob of the size its descriptor declares, which must be
// within max (the Limits field limit): a manifest may declare anything.
func fetchBlob(ctx context.Context, repo name.Repository, desc v1.Descriptor, limit string, max int64, opts []remote.Option) ([]byte, error) {
	if desc.Size < 0 || desc.Size > max {
		return nil, &LimitError{Limit: limit, What: "blob " + desc.Digest.String() + " (size declared by the manifest)", Max: max, Got: desc.Size}
	}
	l, err := remote.Layer(repo.Digest(desc.Digest.String()), append(opts, remote.WithContext(ctx))...)
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", desc.Digest, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, desc.Size+1))
	if err != nil {
		return nil, fmt.Errorf("reading blob %s: %w", desc.Digest, err)
	}
	if int64(len(b)) != desc.Size || "sha256:"+sha256Hex(b) != desc.Digest.String() {
		return nil, fmt.Errorf("blob %s: content does not match its digest/size; refusing it", desc.Digest)
	}
	return b, nil
}

// openBlob streams a blob of the size its descriptor declares; the reader
// fails at the end (or as soon as it runs past the size) when the bytes
// are not the descriptor's: the transport is not trusted for that either.
func openBlob(ctx context.Context, repo name.Repository, desc v1.Descriptor, opts []remote.Option) (*verifyingReader, error) {
	l, err := remote.Layer(repo.Digest(desc.Digest.String()), append(slices.Clone(opts), remote.WithContext(ctx))...)
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", desc.Digest, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetching blob %s: %w", desc.Digest, err)
	}
	return &verifyingReader{rc: rc, h: sha256.New(), desc: desc}, nil
}

// verifyingReader hashes what it reads; finish reads the rest of the blob
// (a decompressor may stop short of the end) and compares size and digest.
type verifyingReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	n    int64
	desc v1.Descriptor
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.desc.Size {
		return n, v.mismatch()
	}
	return n, err
}

func (v *verifyingReader) mismatch() error {
	return fmt.Errorf("blob %s: content does not match its digest/size; refusing it", v.desc.Digest)
}

// finish verifies the whole blob and closes the connection.
func (v *verifyingReader) finish() error {
	defer v.rc.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(v, v.desc.Size+1-v.n)); err != nil {
		return fmt.Errorf("reading blob %s: %w", v.desc.Digest, err)
	}
	if v.n != v.desc.Size || "sha256:"+hex.EncodeToString(v.h.Sum(nil)) != v.desc.Digest.String() {
		return v.mismatch()
	}
	return nil
}

func sha256Hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
