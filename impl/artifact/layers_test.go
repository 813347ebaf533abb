package artifact

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Tests of UnpackLayers with OCI image semantics, as `ly image-snapshot`
// uses it on images it did not build.

var imageOptions = UnpackOptions{ImageLayers: true, HardLinks: true, DropSpecial: true}

func layersOf(t *testing.T, layers ...[]entry) []LayerOpener {
	t.Helper()
	var out []LayerOpener
	for _, es := range layers {
		b := tarOf(t, es...)
		out = append(out, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	}
	return out
}

func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	got := map[string]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			got[rel] = "-> " + l
		case d.IsDir():
			got[rel+"/"] = ""
		default:
			b, _ := os.ReadFile(p)
			got[rel] = string(b)
		}
		return nil
	})
	return got
}

func TestUnpackLayersAppliesOCISemantics(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	u, err := UnpackLayers(root, layersOf(t,
		[]entry{
			dir("etc/"), file("etc/motd", "old"), file("etc/gone", "x"),
			dir("cache/"), file("cache/a", "aa"), dir("cache/sub/"), file("cache/sub/b", "bb"),
			symlink("lib", "usr/lib"), file("bin/sh", "sh"), device("dev/null"),
		},
		[]entry{
			file("/etc/motd", "new"), file("etc/.wh.gone", ""),
			file("cache/kept", "k"), file("cache/.wh..wh..opq", ""), dir("cache/sub/"),
			file("lib", "now a file"), hardlink("bin/bash", "/bin/sh"),
		},
	), imageOptions)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"etc/": "", "etc/motd": "new",
		"cache/": "", "cache/kept": "k", "cache/sub/": "",
		"lib": "now a file", "bin/": "", "bin/sh": "sh", "bin/bash": "sh", "dev/": "",
	}
	if got := readTree(t, root); !reflect.DeepEqual(got, want) {
		t.Errorf("tree\n got %v\nwant %v", got, want)
	}
	if !reflect.DeepEqual(u.Dropped, []string{"/dev/null"}) {
		t.Errorf("dropped %v, want [/dev/null]", u.Dropped)
	}
	// new + k + "now a file" + sh + sh (the link counts again).
	if want := int64(3 + 1 + 10 + 2 + 2); u.Bytes != want {
		t.Errorf("bytes %d, want %d (replaced and deleted files no longer count)", u.Bytes, want)
	}
}

func TestUnpackLayersNeverWritesThroughSymlinks(t *testing.T) {
	outside := t.TempDir()
	pwned := filepath.Join(outside, "pwned")
	os.WriteFile(filepath.Join(outside, "keep"), []byte("k"), 0o644)
	for _, tc := range []struct {
		name   string
		layers [][]entry
		refuse string // empty: the upper entry replaces the symlink
	}{
		{"file at a symlink of a lower layer", [][]entry{{symlink("a", pwned)}, {file("/a", "evil")}}, ""},
		{"hard link at a symlink of a lower layer", [][]entry{{symlink("a", pwned), file("f", "evil")}, {hardlink("./a", "f")}}, ""},
		{"file at a symlink of the same layer", [][]entry{{symlink("a", pwned), file("/a", "evil")}}, "duplicate path"},
		{"file below a symlink", [][]entry{{symlink("d", outside)}, {file("d/pwned", "evil")}}, "below symlink"},
		{"hard link to a file through a symlink", [][]entry{{symlink("d", outside), hardlink("l", "d/keep")}}, "below symlink"},
		{"hard link to a symlink", [][]entry{{symlink("s", filepath.Join(outside, "keep")), hardlink("l", "s")}}, "not a regular file"},
		{"hard link out of the tree", [][]entry{{hardlink("l", "../../../../../"+filepath.Join(outside, "keep"))}}, "not a regular file"},
		{"whiteout below a symlink", [][]entry{{symlink("d", outside)}, {file("d/.wh.keep", "")}}, "below symlink"},
		{"opaque whiteout below a symlink", [][]entry{{symlink("d", outside)}, {file("d/.wh..wh..opq", "")}}, "below symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			_, err := UnpackLayers(root, layersOf(t, tc.layers...), imageOptions)
			if tc.refuse == "" && err != nil {
				t.Fatalf("UnpackLayers = %v", err)
			}
			if tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)) {
				t.Fatalf("UnpackLayers = %v, want a refusal (%s)", err, tc.refuse)
			}
			mustNotExist(t, pwned)
			if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "k" {
				t.Fatalf("outside/keep = %q, %v: the unpack changed a file outside its root", b, err)
			}
			if tc.refuse == "" {
				if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "evil" {
					t.Errorf("a = %q, want the upper layer's file in place of the symlink", b)
				}
			}
		})
	}
}

func TestUnpackLayersLimits(t *testing.T) {
	var le *LimitError
	l := Limits{UnpackedBytes: 10, Entries: 4, PathBytes: 16}
	for _, tc := range []struct {
		name   string
		layers [][]entry
		limit  string
	}{
		{"entries over all layers", [][]entry{{file("a", ""), file("b", "")}, {file("c", ""), file("d", ""), file("e", "")}}, "Entries"},
		{"bytes", [][]entry{{file("a", "123456")}, {file("b", "78901")}}, "UnpackedBytes"},
		{"hard links count their file again", [][]entry{{file("a", "123456"), hardlink("b", "a")}}, "UnpackedBytes"},
		{"name length", [][]entry{{file(strings.Repeat("a/", 8)+"b", "")}}, "PathBytes"},
		{"hard link target length", [][]entry{{hardlink("l", strings.Repeat("../", 6))}}, "PathBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := imageOptions
			o.Limits = l
			if _, err := UnpackLayers(t.TempDir(), layersOf(t, tc.layers...), o); !errors.As(err, &le) || le.Limit != tc.limit {
				t.Fatalf("UnpackLayers = %v, want the %s limit", err, tc.limit)
			}
		})
	}
	// A file an upper layer replaces or deletes no longer counts.
	o := imageOptions
	o.Limits = l
	if _, err := UnpackLayers(t.TempDir(), layersOf(t, []entry{file("a", "123456")}, []entry{file("a", "1234567890")}), o); err != nil {
		t.Errorf("a replaced file still counted: %v", err)
	}
	if _, err := UnpackLayers(t.TempDir(), layersOf(t, []entry{file("d/a", "123456")}, []entry{file(".wh.d", ""), file("b", "1234567")}), o); err != nil {
		t.Errorf("a deleted directory's files still counted: %v", err)
	}
}

func TestUnpackLayersRefusesWhatItWasNotAskedToAccept(t *testing.T) {
	if _, err := UnpackLayers(t.TempDir(), layersOf(t, []entry{file("a", "x")}, []entry{file("a", "y")}), UnpackOptions{}); err == nil || !strings.Contains(err.Error(), "layer 2") {
		t.Errorf("a replacement without ImageLayers: %v, want a refusal naming layer 2", err)
	}
	if _, err := UnpackLayers(t.TempDir(), layersOf(t, []entry{device("null")}), UnpackOptions{ImageLayers: true}); err == nil {
		t.Error("a device node without DropSpecial was accepted")
	}
	if _, err := UnpackLayers(t.TempDir(), layersOf(t, []entry{file("f", "x"), hardlink("l", "f")}), UnpackOptions{ImageLayers: true}); err == nil {
		t.Error("a hard link without HardLinks was accepted")
	}
}
