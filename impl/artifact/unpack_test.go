package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Regression tests of the snapshot unpacker fiberd runs (Snapshot.Unpack):
// hostile tars a tenant can put in a snapshot artifact.

// entry is one tar entry of a test layer.
type entry struct {
	name string
	typ  byte
	link string // symlink or hard link target
	body string // regular file content
}

func file(name, body string) entry   { return entry{name: name, typ: tar.TypeReg, body: body} }
func dir(name string) entry          { return entry{name: name, typ: tar.TypeDir} }
func symlink(name, to string) entry  { return entry{name: name, typ: tar.TypeSymlink, link: to} }
func hardlink(name, to string) entry { return entry{name: name, typ: tar.TypeLink, link: to} }
func device(name string) entry       { return entry{name: name, typ: tar.TypeChar} }

// tarOf is an uncompressed tar of es, in order, as written (no cleaning).
func tarOf(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body)), Format: tar.FormatPAX}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipOf(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	gz.Write(tarOf(t, es...))
	gz.Close()
	return buf.Bytes()
}

// outsideFile is a path outside every unpack root that no test may write.
func outsideFile(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "pwned")
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); err == nil {
		b, _ := os.ReadFile(p)
		t.Fatalf("the unpack wrote %s (%q), outside its root", p, b)
	}
}

func TestUnpackRefusesWritesThroughAPlantedSymlink(t *testing.T) {
	for _, name := range []string{"a", "/a", "./a", "b/../a"} {
		t.Run(name, func(t *testing.T) {
			outside := outsideFile(t)
			root := filepath.Join(t.TempDir(), "root")
			err := untarGz(gzipOf(t, symlink("a", outside), file(name, "evil")), root, DefaultLimits)
			if err == nil {
				t.Fatal("a file written at a symlink an earlier entry planted was accepted")
			}
			mustNotExist(t, outside)
			if l, _ := os.Readlink(filepath.Join(root, "a")); l != outside {
				t.Errorf("a = %q, want the symlink left as it was", l)
			}
		})
	}
	// Below the symlink: a directory entry and a file in it.
	outside := t.TempDir()
	err := untarGz(gzipOf(t, symlink("d", outside), dir("d/"), file("d/f", "evil")), filepath.Join(t.TempDir(), "root"), DefaultLimits)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("writing below a planted symlink: %v, want a refusal naming the symlink", err)
	}
	mustNotExist(t, filepath.Join(outside, "f"))
}

func TestUnpackRefusesDuplicatePaths(t *testing.T) {
	for _, second := range []string{"a", "/a", "./a", "x/../a", "//a"} {
		t.Run(second, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			err := untarGz(gzipOf(t, file("a", "first"), file(second, "second")), root, DefaultLimits)
			if err == nil || !strings.Contains(err.Error(), "duplicate path /a") {
				t.Fatalf("a, then %s: %v, want a refusal naming the duplicate path", second, err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "a")); string(b) != "first" {
				t.Errorf("a = %q, want the first entry's content untouched", b)
			}
		})
	}
	// A symlink after a file of the same name would turn it into a link.
	err := untarGz(gzipOf(t, file("a", "x"), symlink("/a", "/etc/passwd")), t.TempDir(), DefaultLimits)
	if err == nil || !strings.Contains(err.Error(), "duplicate path") {
		t.Fatalf("file then symlink at /a: %v", err)
	}
	// A directory named twice, or after an entry below it, is fine.
	root := t.TempDir()
	if err := untarGz(gzipOf(t, dir("d/"), dir("./d"), file("e/f", "x"), dir("e/")), root, DefaultLimits); err != nil {
		t.Fatalf("directories named twice: %v", err)
	}
}

func TestUnpackLimitsEntriesSizeAndPaths(t *testing.T) {
	l := Limits{UnpackedBytes: 10, Entries: 3, PathBytes: 16}.withDefaults()
	var le *LimitError
	for _, tc := range []struct {
		name  string
		es    []entry
		limit string
	}{
		{"four entries", []entry{file("a", ""), file("b", ""), file("c", ""), file("d", "")}, "Entries"},
		{"eleven bytes in two files", []entry{file("a", "123456"), file("b", "78901")}, "UnpackedBytes"},
		{"a 17-byte name", []entry{file(strings.Repeat("a/", 8)+"b", "")}, "PathBytes"},
		{"a 17-byte symlink target", []entry{symlink("s", strings.Repeat("../", 5)+"xy")}, "PathBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := untarGz(gzipOf(t, tc.es...), t.TempDir(), l); !errors.As(err, &le) || le.Limit != tc.limit {
				t.Fatalf("untarGz = %v, want the %s limit", err, tc.limit)
			}
		})
	}
	// Exactly at every limit is fine.
	if err := untarGz(gzipOf(t, file("a", "12345"), file("b", "67890"), symlink("s", strings.Repeat("x", 16))), t.TempDir(), l); err != nil {
		t.Fatalf("at the limits: %v", err)
	}
}

func TestUnpackRefusesHardLinksAndDevices(t *testing.T) {
	for _, tc := range []struct {
		name string
		es   []entry
	}{
		{"hard link out of the tree", []entry{hardlink("l", "../../../../etc/passwd")}},
		{"hard link to an absolute path", []entry{hardlink("l", "/etc/passwd")}},
		{"hard link inside the tree", []entry{file("f", "x"), hardlink("l", "f")}},
		{"character device", []entry{device("dev/null")}},
		{"block device", []entry{{name: "sda", typ: tar.TypeBlock}}},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			err := untarGz(gzipOf(t, tc.es...), root, DefaultLimits)
			if err == nil || !strings.Contains(err.Error(), "only files, directories and symlinks are allowed") {
				t.Fatalf("untarGz = %v, want a refusal", err)
			}
			last := tc.es[len(tc.es)-1].name
			if _, err := os.Lstat(filepath.Join(root, last)); err == nil {
				t.Errorf("%s was created", last)
			}
		})
	}
}

// TestSnapshotUnpackIsStrict: the snapshot unpacker never replaces; the
// same layer applied twice (or a tree already there) is refused by name.
func TestSnapshotUnpackIsStrict(t *testing.T) {
	layer := gzipOf(t, file("a", "x"))
	root := t.TempDir()
	if err := untarGz(layer, root, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if err := untarGz(layer, root, DefaultLimits); err == nil || !strings.Contains(err.Error(), "a regular file is already at /a") {
		t.Fatalf("a second unpack over the tree: %v", err)
	}
	// Whiteout names are ordinary names in a snapshot.
	if err := untarGz(gzipOf(t, file(".wh.a", "x")), root, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); err != nil {
		t.Errorf("a snapshot's .wh.a deleted a: %v", err)
	}
}

// TestUnpackErrorsNameNoHostPath: a refusal reaches the tenant (fiberd's
// load error, the grant's status), so it names the entry, not the
// directory fiberd unpacks into.
func TestUnpackErrorsNameNoHostPath(t *testing.T) {
	root := filepath.Join(t.TempDir(), "state", "root")
	for _, es := range [][]entry{
		{file("a/b", "x"), file("a/b/c", "y")},
		{file("a", "x"), dir("a/")},
	} {
		err := untarGz(gzipOf(t, es...), root, DefaultLimits)
		if err == nil || strings.Contains(err.Error(), root) || strings.Contains(err.Error(), "state") {
			t.Errorf("untarGz = %v, want a refusal that does not name %s", err, root)
		}
		os.RemoveAll(root)
	}
}
