package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func startRegistry(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func handlerDir(t *testing.T) string {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "app", "static"), 0o755)
	os.WriteFile(filepath.Join(dir, "app", "handler"), []byte("#!/bin/false\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "app", "static", "index.html"), []byte("<h1>hi</h1>"), 0o644)
	os.Symlink("static/index.html", filepath.Join(dir, "app", "index"))
	return dir
}

var cfg = Config{Entrypoint: []string{"/app/handler"}, Port: 8080, Runtime: Runtime{Name: "go", Version: "go1.26"}}

func TestBuildIsReproducibleAndRoundTrips(t *testing.T) {
	dir := handlerDir(t)
	a, err := Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(dir, "app", "handler"), later, later)
	b, err := Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("same files and config gave digests %s and %s", da, db)
	}
	reg := startRegistry(t)
	ref, err := Push(context.Background(), a, reg+"/lampyr/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	if ref.DigestStr() != da.String() {
		t.Fatalf("pushed ref %s, want digest %s", ref, da)
	}
	snap, err := Fetch(context.Background(), ref.String())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Config.Port != 8080 || snap.Config.HelperVersion != HelperProtocolVersion {
		t.Fatalf("config %+v", snap.Config)
	}
	if c, err := FetchConfig(context.Background(), ref.String()); err != nil || !reflect.DeepEqual(c, snap.Config) {
		t.Fatalf("FetchConfig = %+v, %v; want %+v", c, err, snap.Config)
	}
	if _, err := FetchConfig(context.Background(), reg+"/lampyr/hello:v1"); err == nil || !strings.Contains(err.Error(), "digest-pinned") {
		t.Fatalf("FetchConfig of a tag: %v", err)
	}
	out := filepath.Join(t.TempDir(), "root")
	if err := snap.Unpack(out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "app", "index")); err != nil || string(b) != "<h1>hi</h1>" {
		t.Fatalf("unpacked symlink target: %q %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(out, "app", "handler")); fi == nil || fi.Mode()&0o111 == 0 {
		t.Fatal("entrypoint lost its executable bit")
	}
}

func TestFetchVerifies(t *testing.T) {
	reg := startRegistry(t)
	img, _ := Build(handlerDir(t), cfg)
	ref, err := Push(context.Background(), img, reg+"/lampyr/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	// A tag is not enough: consumers only take digests.
	if _, err := Fetch(context.Background(), reg+"/lampyr/hello:v1"); err == nil || !strings.Contains(err.Error(), "digest-pinned") {
		t.Fatalf("fetch by tag: %v", err)
	}
	// A digest the registry does not have.
	bad := ref.Context().Digest("sha256:" + strings.Repeat("1", 64)).String()
	if _, err := Fetch(context.Background(), bad); err == nil {
		t.Fatal("fetch of an unknown digest succeeded")
	}
	// A sealed-template artifact is not a snapshot.
	tref, err := PushTemplate(context.Background(), []byte("sealed"), reg+"/lampyr/templates", "demo", "hello-00001", "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(context.Background(), tref.String()); err == nil || !strings.Contains(err.Error(), "ly build") {
		t.Fatalf("fetching a template as a snapshot: %v", err)
	}
	sealed, tc, err := FetchTemplate(context.Background(), tref.String())
	if err != nil || string(sealed) != "sealed" || tc.Revision != "hello-00001" || tc.Namespace != "demo" {
		t.Fatalf("FetchTemplate: %q %+v %v", sealed, tc, err)
	}
	// The template is tagged with the namespace and Revision name.
	tag, _ := name.NewTag(reg + "/lampyr/templates:demo.hello-00001")
	if d, err := remote.Head(tag); err != nil || d.Digest.String() != tref.DigestStr() {
		t.Fatalf("tag demo.hello-00001: %v %v", d, err)
	}
}

func TestBuildRejects(t *testing.T) {
	dir := handlerDir(t)
	for field, c := range map[string]Config{
		"entrypoint": {Entrypoint: []string{"handler"}, Port: 8080, Runtime: Runtime{Name: "go"}},
		"port":       {Entrypoint: []string{"/app/handler"}, Port: 0, Runtime: Runtime{Name: "go"}},
		"protocol":   {Entrypoint: []string{"/app/handler"}, Port: 8080, Protocol: "grpc", Runtime: Runtime{Name: "go"}},
		"runtime":    {Entrypoint: []string{"/app/handler"}, Port: 8080},
	} {
		if _, err := Build(dir, c); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v should name the field", field, err)
		}
	}
	if _, err := Build(dir, Config{Entrypoint: []string{"/app/missing"}, Port: 8080, Runtime: Runtime{Name: "go"}}); err == nil {
		t.Error("missing entrypoint accepted")
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	// A layer whose symlink would redirect a later file outside the root.
	dir := t.TempDir()
	os.Symlink("/tmp", filepath.Join(dir, "evil"))
	layer, err := tarGz(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Append an entry below the symlink by building a second tree.
	dir2 := t.TempDir()
	os.MkdirAll(filepath.Join(dir2, "evil"), 0o755)
	os.WriteFile(filepath.Join(dir2, "evil", "pwned"), []byte("x"), 0o644)
	layer2, _ := tarGz(dir2)
	out := t.TempDir()
	if err := untarGz(layer, out, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if err := untarGz(layer2, out, DefaultLimits); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("writing through a symlink: %v", err)
	}
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Fatal("unpack wrote outside its root")
	}
}

// GzipBomb is a layer of one file of n zero bytes: ~n/1000 compressed.
func gzipBomb(t *testing.T, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: n}); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(zero)) {
		tw.Write(zero[:min(left, int64(len(zero)))])
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func TestUnpackLimits(t *testing.T) {
	l := Limits{UnpackedBytes: 8 << 20, Entries: 10, PathBytes: 64}.withDefaults()
	var le *LimitError
	// A gzip bomb: 64 MiB of zeros in ~64 KiB; refused at the header,
	// before a byte is written.
	bomb := gzipBomb(t, 64<<20)
	t.Logf("bomb: %d bytes compressed", len(bomb))
	out := t.TempDir()
	if err := untarGz(bomb, out, l); !errors.As(err, &le) || le.Limit != "UnpackedBytes" || !strings.Contains(err.Error(), "unpacked size limit of 8388608") {
		t.Fatalf("gzip bomb: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("the bomb left %d entries", len(ents))
	}
	// Too many entries.
	dir := t.TempDir()
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), []byte("x"), 0o644)
	}
	many, _ := tarGz(dir)
	if err := untarGz(many, t.TempDir(), l); !errors.As(err, &le) || le.Limit != "Entries" {
		t.Fatalf("20 entries under a limit of 10: %v", err)
	}
	// A long symlink target.
	dir = t.TempDir()
	os.Symlink(strings.Repeat("a/", 100), filepath.Join(dir, "s"))
	long, _ := tarGz(dir)
	if err := untarGz(long, t.TempDir(), l); !errors.As(err, &le) || le.Limit != "PathBytes" {
		t.Fatalf("200-byte symlink target under a 64-byte limit: %v", err)
	}
}

// A manifest declaring a layer above the limit is refused before the
// layer is read.
func TestFetchLimits(t *testing.T) {
	reg := startRegistry(t)
	img, err := Build(handlerDir(t), Config{Entrypoint: []string{"/app/handler"}, Port: 8080, Runtime: Runtime{Name: "go"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Push(context.Background(), img, reg+"/lampyr/limits:v1")
	if err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if _, err := FetchWithLimits(context.Background(), ref.String(), Limits{LayerBytes: 10}); !errors.As(err, &le) || le.Limit != "LayerBytes" {
		t.Fatalf("10-byte layer limit: %v", err)
	}
	if _, err := FetchWithLimits(context.Background(), ref.String(), Limits{ConfigBytes: 10}); !errors.As(err, &le) || le.Limit != "ConfigBytes" {
		t.Fatalf("10-byte config limit: %v", err)
	}
	s, err := FetchWithLimits(context.Background(), ref.String(), Limits{UnpackedBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Unpack(t.TempDir()); !errors.As(err, &le) || le.Limit != "UnpackedBytes" {
		t.Fatalf("unpacking under a 10-byte limit: %v", err)
	}
}
