package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// This file is the one tar unpacker of the tree: fiberd unpacks snapshot
// layers with it (Snapshot.Unpack) and `ly image-snapshot` unpacks image
// layers with it (UnpackLayers with ImageLayers). Both read tars someone
// else wrote, as a privileged or at least trusted process, so every entry is
// held to the same rules:
//
//   - a name is cleaned as an absolute path, so "a", "/a", "./a" and
//     "x/../a" are one path, never above the root;
//   - a path appears once per layer (a second "a" is refused, not silently
//     written over the first);
//   - nothing is written through a symlink: not below one (a parent that is
//     a symlink refuses the entry), not at one (files are created with
//     O_EXCL after an earlier layer's entry is removed, never opened);
//   - hard links point at a regular file already in the tree, and only when
//     the caller allows them; device nodes and FIFOs are refused or dropped;
//   - entry count, unpacked bytes and name lengths are bounded before a byte
//     of the entry is written.

// UnpackOptions say what an unpack accepts beyond a snapshot layer, which
// (the zero value) is a single tar of directories, regular files and
// symlinks, unpacked within DefaultLimits.
type UnpackOptions struct {
	// Limits bound the unpack (zero fields: DefaultLimits). Entries counts
	// the tar entries read over all layers; UnpackedBytes bounds the
	// regular files' bytes the tree holds at any time (a file an upper
	// layer replaces or deletes no longer counts; a hard link counts its
	// file again, as a snapshot made from the tree holds a copy).
	Limits Limits
	// ImageLayers applies the layers as an OCI image's (image-spec
	// layer.md): an entry of a later layer replaces an earlier layer's
	// entry at the same path, ".wh.<name>" deletes <name> of earlier
	// layers and ".wh..wh..opq" empties its directory of earlier layers'
	// entries. Without it a layer may not replace anything and whiteout
	// names are ordinary names.
	ImageLayers bool
	// HardLinks accepts hard links to a regular file already in the tree
	// (made as hard links inside the tree); otherwise they are refused.
	HardLinks bool
	// DropSpecial skips device nodes and FIFOs, listing them in
	// Unpacked.Dropped, instead of refusing the unpack.
	DropSpecial bool
}

// Unpacked says what an unpack wrote.
type Unpacked struct {
	// Entries is the number of tar entries read.
	Entries int
	// Bytes is the regular files' bytes the tree holds.
	Bytes int64
	// Dropped are the paths of the device nodes and FIFOs skipped
	// (UnpackOptions.DropSpecial), in the order met.
	Dropped []string
}

// LayerOpener opens one uncompressed tar layer; UnpackLayers opens each
// only when it gets to it, and closes it once its tar ends: an error from
// Close (e.g. the layer's digest did not match) fails the unpack.
type LayerOpener func() (io.ReadCloser, error)

// whiteout prefixes (OCI image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Unpack extracts the snapshot's files under dir (which must not exist or be
// empty), within the limits it was fetched with: unpacked bytes, entry
// count, path and symlink target length (a gzip bomb stops at the header
// that declares too much). Duplicate paths, entries escaping dir or below or
// at a symlink, hard links and special files are refused.
func (s *Snapshot) Unpack(dir string) error {
	return s.UnpackContext(context.Background(), dir)
}

// UnpackContext is Unpack, reading the layer from the registry within ctx.
// The layer is unpacked as it arrives and its digest checked at its end:
// on a mismatch the error says so, and dir (which then holds bytes that
// are not the snapshot's) is the caller's to remove, as after any error.
func (s *Snapshot) UnpackContext(ctx context.Context, dir string) error {
	_, err := UnpackLayers(dir, []LayerOpener{func() (io.ReadCloser, error) {
		blob, err := openBlob(ctx, s.Ref.Context(), s.layer, s.opts)
		if err != nil {
			return nil, err
		}
		dec, err := decompress(string(s.layer.MediaType), blob)
		if err != nil {
			blob.rc.Close()
			return nil, err
		}
		return verifiedLayer{dec, blob}, nil
	}}, UnpackOptions{Limits: s.limits.withDefaults()})
	return err
}

// verifiedLayer closes the decompressor, then verifies the whole blob
// (also after an unpack error: the rest read is bounded by the size the
// manifest declared, itself within LayerBytes).
type verifiedLayer struct {
	io.ReadCloser
	blob *verifyingReader
}

func (v verifiedLayer) Close() error {
	v.ReadCloser.Close()
	return v.blob.finish()
}

// decompress opens a layer of media type mt. A zstd decoder runs on the
// calling goroutine only and refuses a frame whose window exceeds
// zstdWindow (the window is allocated up front); the unpacked size is
// bounded by the unpacker's limits, for zstd as for gzip.
func decompress(mt string, r io.Reader) (io.ReadCloser, error) {
	if mt == LayerMediaTypeGzip {
		gz, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("snapshot layer: %w", err)
		}
		return gz, nil
	}
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdWindow))
	if err != nil {
		return nil, fmt.Errorf("snapshot layer: %w", err)
	}
	return zstdCloser{zr}, nil
}

func untarGz(layer []byte, dir string, l Limits) error {
	return untar(LayerMediaTypeGzip, layer, dir, l)
}

func untarZstd(layer []byte, dir string, l Limits) error {
	return untar(LayerMediaType, layer, dir, l)
}

// untar unpacks an in-memory layer of media type mt (tests).
func untar(mt string, layer []byte, dir string, l Limits) error {
	_, err := UnpackLayers(dir, []LayerOpener{func() (io.ReadCloser, error) {
		return decompress(mt, bytes.NewReader(layer))
	}}, UnpackOptions{Limits: l})
	return err
}

// zstdCloser is a zstd.Decoder as an io.ReadCloser (its Close returns
// nothing).
type zstdCloser struct{ *zstd.Decoder }

func (z zstdCloser) Close() error { z.Decoder.Close(); return nil }

// UnpackLayers extracts the uncompressed tar layers, in order, under dir
// (created if missing), by the rules of o and of this file's comment. On an
// error dir holds part of the tree; the caller removes it.
func UnpackLayers(dir string, layers []LayerOpener, o UnpackOptions) (*Unpacked, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	u := &unpacker{dir: dir, o: o, l: o.Limits.withDefaults()}
	for i, open := range layers {
		u.name = "snapshot layer"
		if o.ImageLayers || len(layers) > 1 {
			u.name = fmt.Sprintf("layer %d", i+1)
		}
		r, err := open()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u.name, err)
		}
		err = u.layer(r)
		// Close may say the layer did not verify (a digest checked at EOF).
		if cerr := r.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: %w", u.name, cerr)
		}
		if err != nil {
			return nil, err
		}
	}
	return &u.out, nil
}

type unpacker struct {
	dir  string
	o    UnpackOptions
	l    Limits
	name string // of the layer, for errors
	out  Unpacked
	// seen maps the cleaned paths this layer wrote, including the parents
	// it created or wrote below, to the entry name that wrote them.
	seen map[string]string
}

// unpackError is a refusal the unpacker words itself.
type unpackError struct{ error }

func (e *unpackError) Unwrap() error { return e.error }

func (u *unpacker) errorf(format string, args ...any) error {
	return &unpackError{fmt.Errorf(u.name+": "+format, args...)}
}

// entryError words a file system error of the entry name without the host
// path it happened at (fiberd's state directory is nobody's business).
func (u *unpacker) entryError(name string, err error) error {
	var le *LimitError
	var ue *unpackError
	if errors.As(err, &le) || errors.As(err, &ue) {
		return err
	}
	var pe *fs.PathError
	var lk *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = fmt.Errorf("%s: %w", pe.Op, pe.Err)
	case errors.As(err, &lk):
		err = fmt.Errorf("%s: %w", lk.Op, lk.Err)
	}
	return u.errorf("entry %q: %w", name, err)
}

func (u *unpacker) layer(r io.Reader) error {
	u.seen = map[string]string{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return u.errorf("%w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.entryError(hdr.Name, err)
		}
	}
}

func (u *unpacker) entry(hdr *tar.Header, body io.Reader) error {
	l := u.l
	if u.out.Entries++; u.out.Entries > l.Entries {
		return &LimitError{Limit: "Entries", What: u.name, Max: int64(l.Entries), Got: int64(u.out.Entries)}
	}
	if len(hdr.Name) > l.PathBytes {
		return &LimitError{Limit: "PathBytes", What: fmt.Sprintf("%s entry %.64q...", u.name, hdr.Name), Max: int64(l.PathBytes), Got: int64(len(hdr.Name))}
	}
	if len(hdr.Linkname) > l.PathBytes {
		return &LimitError{Limit: "PathBytes", What: fmt.Sprintf("%s link %q target", u.name, hdr.Name), Max: int64(l.PathBytes), Got: int64(len(hdr.Linkname))}
	}
	// Cleaning an absolute path drops every "..", so the path stays under
	// dir lexically; noSymlinkParents stops a symlink from redirecting it.
	clean := path.Clean("/" + hdr.Name)
	if clean == "/" {
		return nil
	}
	if err := u.noSymlinkParents(clean); err != nil {
		return err
	}
	if base := path.Base(clean); u.o.ImageLayers && strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(hdr.Name, clean)
	}
	isDir := hdr.Typeflag == tar.TypeDir
	if first, dup := u.seen[clean]; dup {
		// Only a directory may be named twice (an entry below it may have
		// created it already); anything else would silently overwrite.
		fi, err := os.Lstat(u.path(clean))
		if !isDir || err != nil || !fi.IsDir() {
			what := "an entry"
			if err == nil {
				what = kind(fi)
			}
			return u.errorf("entry %q: duplicate path %s (already %s, written by entry %q); refusing the layer", hdr.Name, clean, what, first)
		}
	}
	target := u.path(clean)
	if fi, err := os.Lstat(target); err == nil {
		switch {
		case isDir && fi.IsDir():
			// Lstat says a real directory: Chmod cannot follow a link.
			return os.Chmod(target, dirMode(hdr))
		case !u.o.ImageLayers:
			return u.errorf("entry %q: %s is already at %s; refusing to replace it", hdr.Name, kind(fi), clean)
		}
		// An earlier layer's entry: replaced, never written through.
		if err := u.remove(clean); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := u.mkdirParents(clean, hdr.Name); err != nil {
		return err
	}
	u.seen[clean] = hdr.Name
	switch hdr.Typeflag {
	case tar.TypeDir:
		return os.Mkdir(target, dirMode(hdr))
	case tar.TypeReg:
		if hdr.Size < 0 || u.out.Bytes+hdr.Size > l.UnpackedBytes {
			return &LimitError{Limit: "UnpackedBytes", What: fmt.Sprintf("%s (at entry %q)", u.name, hdr.Name), Max: l.UnpackedBytes, Got: u.out.Bytes + hdr.Size}
		}
		// O_EXCL: never through a symlink, never into an existing file.
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, u.fileMode(hdr))
		if err != nil {
			return err
		}
		// The header's size was checked; the reader yields no more.
		n, err := io.Copy(f, body)
		u.out.Bytes += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return nil
	case tar.TypeSymlink:
		return os.Symlink(hdr.Linkname, target)
	case tar.TypeLink:
		if !u.o.HardLinks {
			return u.errorf("entry %q is a hard link; only files, directories and symlinks are allowed", hdr.Name)
		}
		return u.hardLink(hdr, clean, target)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if u.o.DropSpecial {
			u.out.Dropped = append(u.out.Dropped, clean)
			return nil
		}
	}
	return u.errorf("entry %q has type %q; only files, directories and symlinks are allowed", hdr.Name, hdr.Typeflag)
}

func (u *unpacker) path(clean string) string { return filepath.Join(u.dir, filepath.FromSlash(clean)) }

// hardLink links target to the regular file the header names, which must
// already be in the tree and be reached through no symlink.
func (u *unpacker) hardLink(hdr *tar.Header, clean, target string) error {
	src := path.Clean("/" + hdr.Linkname)
	if err := u.noSymlinkParents(src); err != nil {
		return err
	}
	fi, err := os.Lstat(u.path(src))
	if err != nil || !fi.Mode().IsRegular() {
		return u.errorf("hard link %q -> %q: the target is not a regular file earlier in the tree; refusing the layer", hdr.Name, hdr.Linkname)
	}
	if u.out.Bytes+fi.Size() > u.l.UnpackedBytes {
		return &LimitError{Limit: "UnpackedBytes", What: fmt.Sprintf("%s (at hard link %q)", u.name, hdr.Name), Max: u.l.UnpackedBytes, Got: u.out.Bytes + fi.Size()}
	}
	// link(2) does not follow a symlink at the source, and Lstat said
	// regular file; the target does not exist (removed above).
	if err := os.Link(u.path(src), target); err != nil {
		return err
	}
	u.out.Bytes += fi.Size()
	return nil
}

// whiteout applies ".wh.<name>" or ".wh..wh..opq" at clean to what earlier
// layers left (image-spec: whiteouts hide lower layers only).
func (u *unpacker) whiteout(name, clean string) error {
	parent, base := path.Dir(clean), path.Base(clean)
	if base == whiteoutOpaque {
		fi, err := os.Lstat(u.path(parent))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return u.errorf("opaque whiteout %q: %s is %s, not a directory", name, parent, kind(fi))
		}
		return u.emptyOfEarlier(parent)
	}
	hidden := path.Join(parent, strings.TrimPrefix(base, whiteoutPrefix))
	if hidden == parent || strings.HasPrefix(path.Base(hidden), whiteoutPrefix) {
		return u.errorf("whiteout %q names no entry", name)
	}
	if _, ok := u.seen[hidden]; ok {
		return nil
	}
	return u.remove(hidden)
}

// emptyOfEarlier removes what is below dir and was not written by this
// layer, descending into the directories this layer wrote.
func (u *unpacker) emptyOfEarlier(dir string) error {
	ents, err := os.ReadDir(u.path(dir))
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		if _, ours := u.seen[p]; !ours {
			if err := u.remove(p); err != nil {
				return err
			}
		} else if e.Type().IsDir() {
			if err := u.emptyOfEarlier(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// remove deletes the entry at clean (a symlink itself, a directory with
// everything below it; nothing it points to), and stops counting its bytes.
func (u *unpacker) remove(clean string) error {
	p := u.path(clean)
	var freed int64
	err := filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				freed += fi.Size()
			}
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.RemoveAll(p); err != nil {
		return err
	}
	u.out.Bytes -= freed
	return nil
}

// mkdirParents creates the missing parents of clean (noSymlinkParents has
// checked those that exist) and marks them as this layer's.
func (u *unpacker) mkdirParents(clean, name string) error {
	for p := path.Dir(clean); p != "/"; p = path.Dir(p) {
		if _, ok := u.seen[p]; ok {
			break
		}
		u.seen[p] = name
	}
	return os.MkdirAll(filepath.Dir(u.path(clean)), 0o755)
}

// noSymlinkParents refuses clean when a directory above it, inside the
// tree, is a symlink or not a directory.
func (u *unpacker) noSymlinkParents(clean string) error {
	p := u.dir
	for _, part := range strings.Split(strings.TrimPrefix(path.Dir(clean), "/"), "/") {
		if part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return u.errorf("entry %q is below symlink %q; refusing to write through it", clean, strings.TrimPrefix(filepath.ToSlash(strings.TrimPrefix(p, u.dir)), "/"))
		}
		if !fi.IsDir() {
			return u.errorf("entry %q is below %q, which is %s", clean, strings.TrimPrefix(filepath.ToSlash(strings.TrimPrefix(p, u.dir)), "/"), kind(fi))
		}
	}
	return nil
}

// fileMode is the entry's permission bits (never setuid/setgid/sticky);
// an image's files are also made readable by their owner, so the snapshot
// built from the tree can read them back (an image may hold mode 0000
// files, e.g. /etc/shadow).
func (u *unpacker) fileMode(hdr *tar.Header) fs.FileMode {
	m := fs.FileMode(hdr.Mode).Perm()
	if u.o.ImageLayers {
		m |= 0o400
	}
	return m
}

// dirMode lets the unpacker (the directory's owner) write below it.
func dirMode(hdr *tar.Header) fs.FileMode { return fs.FileMode(hdr.Mode).Perm() | 0o700 }

func kind(fi fs.FileInfo) string {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return "a symlink"
	case fi.IsDir():
		return "a directory"
	case fi.Mode().IsRegular():
		return "a regular file"
	default:
		return "a special file"
	}
}
