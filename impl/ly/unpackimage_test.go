package ly

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"lampyr.dev/serving/impl/artifact"
)

// Regression tests of `ly image-snapshot`'s unpacking of images it did not
// build (issue 31 §6): it uses fiberd's hardened unpacker now. Each layer is
// written as given, names uncleaned, as a hostile image would be.

type imageEntry struct {
	name string
	typ  byte
	link string
	body string
}

func reg(name, body string) imageEntry         { return imageEntry{name: name, typ: tar.TypeReg, body: body} }
func sym(name, to string) imageEntry           { return imageEntry{name: name, typ: tar.TypeSymlink, link: to} }
func hard(name, to string) imageEntry          { return imageEntry{name: name, typ: tar.TypeLink, link: to} }
func dirEntry(name string) imageEntry          { return imageEntry{name: name, typ: tar.TypeDir} }
func special(name string, typ byte) imageEntry { return imageEntry{name: name, typ: typ} }

// imageOf is an image whose layers, bottom first, hold es.
func imageOf(t *testing.T, layers ...[]imageEntry) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, es := range layers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range es {
			h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Format: tar.FormatPAX}
			if e.typ == tar.TypeReg {
				h.Size = int64(len(e.body))
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			io.WriteString(tw, e.body)
		}
		tw.Close()
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// outside is a directory beside the unpack root holding keep ("k"); no
// test may change it or create pwned in it.
func outside(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "keep"), []byte("k"), 0o644)
	return d
}

func untouched(t *testing.T, out string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(out, "pwned")); err == nil {
		t.Errorf("the unpack wrote %q to %s, outside its root", b, filepath.Join(out, "pwned"))
	}
	if b, err := os.ReadFile(filepath.Join(out, "keep")); err != nil || string(b) != "k" {
		t.Errorf("outside/keep = %q, %v: the unpack changed a file outside its root", b, err)
	}
}

func unpackTo(t *testing.T, img v1.Image, l artifact.Limits) (string, []string, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	dropped, err := unpackImage(img, root, l)
	return root, dropped, err
}

func TestUnpackImageNeverWritesThroughAPlantedSymlink(t *testing.T) {
	t.Run("a file at a symlink of the same layer", func(t *testing.T) {
		out := outside(t)
		_, _, err := unpackTo(t, imageOf(t, []imageEntry{sym("a", filepath.Join(out, "pwned")), reg("/a", "evil")}), artifact.Limits{})
		if err == nil || !strings.Contains(err.Error(), "duplicate path /a") {
			t.Errorf("unpack = %v, want a refusal naming the duplicate path", err)
		}
		untouched(t, out)
	})
	t.Run("a hard link at a symlink of the same layer", func(t *testing.T) {
		out := outside(t)
		_, _, err := unpackTo(t, imageOf(t, []imageEntry{sym("b", filepath.Join(out, "pwned")), reg("f", "evil"), hard("/b", "f")}), artifact.Limits{})
		if err == nil || !strings.Contains(err.Error(), "duplicate path /b") {
			t.Errorf("unpack = %v, want a refusal naming the duplicate path", err)
		}
		untouched(t, out)
	})
	t.Run("an upper layer's symlink over a lower layer's file", func(t *testing.T) {
		out := outside(t)
		root, _, err := unpackTo(t, imageOf(t, []imageEntry{reg("a", "evil")}, []imageEntry{sym("/a", filepath.Join(out, "pwned"))}), artifact.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		untouched(t, out)
		if l, _ := os.Readlink(filepath.Join(root, "a")); l != filepath.Join(out, "pwned") {
			t.Errorf("a = %q, want the upper layer's symlink", l)
		}
	})
	t.Run("a file below a symlink", func(t *testing.T) {
		out := outside(t)
		_, _, err := unpackTo(t, imageOf(t, []imageEntry{sym("etc", out)}, []imageEntry{reg("etc/pwned", "evil")}), artifact.Limits{})
		if err == nil || !strings.Contains(err.Error(), `below symlink "etc"`) {
			t.Errorf("unpack = %v, want a refusal naming the symlink", err)
		}
		untouched(t, out)
	})
}

func TestUnpackImageDuplicatePaths(t *testing.T) {
	for _, second := range []string{"a", "/a", "./a", "x/../a"} {
		t.Run("a and "+second+" in one layer", func(t *testing.T) {
			root, _, err := unpackTo(t, imageOf(t, []imageEntry{reg("a", "one"), reg(second, "two")}), artifact.Limits{})
			if err == nil || !strings.Contains(err.Error(), "duplicate path /a") {
				t.Errorf("unpack = %v, want a refusal naming the duplicate path", err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "one" {
				t.Errorf("a = %q, want the first entry untouched", b)
			}
		})
	}
	// Across layers the upper one wins, however either spells the path.
	for _, names := range [][2]string{{"/a", "a"}, {"a", "/a"}, {"./a", "a"}} {
		t.Run("lower "+names[0]+", upper "+names[1], func(t *testing.T) {
			root, _, err := unpackTo(t, imageOf(t, []imageEntry{reg(names[0], "lower")}, []imageEntry{reg(names[1], "upper")}), artifact.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "upper" {
				t.Errorf("a = %q, want the upper layer's", b)
			}
		})
	}
}

func TestUnpackImageLimits(t *testing.T) {
	var le *artifact.LimitError
	for _, tc := range []struct {
		name   string
		l      artifact.Limits
		layers [][]imageEntry
		limit  string
	}{
		{"entry count", artifact.Limits{Entries: 3}, [][]imageEntry{{reg("a", ""), reg("b", "")}, {reg("c", ""), reg("d", "")}}, "Entries"},
		{"unpacked size", artifact.Limits{UnpackedBytes: 10}, [][]imageEntry{{reg("a", "123456")}, {reg("b", "78901")}}, "UnpackedBytes"},
		{"unpacked size through hard links", artifact.Limits{UnpackedBytes: 10}, [][]imageEntry{{reg("a", "123456"), hard("b", "a")}}, "UnpackedBytes"},
		{"path length", artifact.Limits{PathBytes: 16}, [][]imageEntry{{reg(strings.Repeat("a/", 8)+"b", "")}}, "PathBytes"},
		{"symlink target length", artifact.Limits{PathBytes: 16}, [][]imageEntry{{sym("s", strings.Repeat("../", 6))}}, "PathBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := unpackTo(t, imageOf(t, tc.layers...), tc.l); !errors.As(err, &le) || le.Limit != tc.limit {
				t.Errorf("unpack = %v, want the %s limit", err, tc.limit)
			}
		})
	}
}

func TestUnpackImageHardLinks(t *testing.T) {
	out := outside(t)
	for _, target := range []string{"../../../../../../" + filepath.Join(out, "keep"), filepath.Join(out, "keep"), "s", "d/keep"} {
		t.Run("to "+target, func(t *testing.T) {
			_, _, err := unpackTo(t, imageOf(t, []imageEntry{sym("s", filepath.Join(out, "keep")), sym("d", out), hard("l", target)}), artifact.Limits{})
			if err == nil {
				t.Error("a hard link to a file outside the tree was accepted")
			}
			untouched(t, out)
		})
	}
	// A link to a lower layer's file is made (the flattened stream the old
	// untar read listed it before its target).
	root, _, err := unpackTo(t, imageOf(t, []imageEntry{reg("bin/sh", "sh")}, []imageEntry{hard("bin/bash", "/bin/sh")}), artifact.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "bin", "bash")); string(b) != "sh" {
		t.Errorf("bin/bash = %q, want bin/sh's content", b)
	}
}

func TestUnpackImageDropsDeviceNodes(t *testing.T) {
	root, dropped, err := unpackTo(t, imageOf(t,
		[]imageEntry{reg("dev/console", "a file"), special("dev/sda", tar.TypeBlock)},
		[]imageEntry{special("dev/null", tar.TypeChar), special("/dev/console", tar.TypeChar), special("run/fifo", tar.TypeFifo)},
	), artifact.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/sda", "/dev/null", "/dev/console", "/run/fifo"}; !reflect.DeepEqual(dropped, want) {
		t.Errorf("dropped %v, want %v", dropped, want)
	}
	for _, p := range []string{"dev/sda", "dev/null", "dev/console", "run/fifo"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s exists; a dropped node (or the file it replaces) must not", p)
		}
	}
}

func TestUnpackImageWhiteouts(t *testing.T) {
	root, _, err := unpackTo(t, imageOf(t,
		[]imageEntry{dirEntry("cache/"), reg("cache/old", "x"), reg("etc/gone", "x"), reg("etc/kept", "k")},
		[]imageEntry{reg("cache/.wh..wh..opq", ""), reg("cache/new", "n"), reg("etc/.wh.gone", "")},
	), artifact.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"cache/old": false, "cache/new": true, "etc/gone": false, "etc/kept": true} {
		if _, err := os.Lstat(filepath.Join(root, p)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", p, err == nil, want)
		}
	}
}
