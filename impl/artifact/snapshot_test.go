package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
)

// Build packs with zstd; a snapshot packed with gzip (what Build made
// before) still fetches and unpacks; a layer of any other media type is
// refused with both accepted types named.
func TestSnapshotLayerTypes(t *testing.T) {
	reg := startRegistry(t)
	dir := handlerDir(t)
	img, err := Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := img.Manifest()
	if got := string(m.Layers[0].MediaType); got != LayerMediaType || !strings.HasSuffix(got, "+zstd") {
		t.Fatalf("Build's layer media type %q, want %s", got, LayerMediaType)
	}
	gz, err := tarGz(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mt string
		layer    []byte
		refused  string
	}{
		{name: "zstd", mt: LayerMediaType},
		{name: "gzip", mt: LayerMediaTypeGzip, layer: gz},
		{name: "plain", mt: "application/vnd.lampyr.snapshot.layer.v1.tar", layer: gz, refused: "want exactly one layer of media type " + LayerMediaType + " or " + LayerMediaTypeGzip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := img
			if tc.layer != nil {
				if up, err = FromLayerOfType(cfg, tc.layer, tc.mt); err != nil {
					t.Fatal(err)
				}
			}
			ref, err := Push(context.Background(), up, reg+"/lampyr/types:"+tc.name)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := Fetch(context.Background(), ref.String())
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("Fetch = %v, want an error containing %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "root")
			if err := snap.Unpack(out); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(out, "app", "index")); err != nil || string(b) != "<h1>hi</h1>" {
				t.Fatalf("unpacked symlink target: %q %v", b, err)
			}
		})
	}
}

func zstdOf(t *testing.T, window int, name string, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithWindowSize(window), zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(zero)) {
		tw.Write(zero[:min(left, int64(len(zero)))])
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// A zstd bomb meets the unpacked-size limit as a gzip bomb does; a frame
// declaring a window above zstdWindow (which the decoder would allocate
// before the first byte) is refused.
func TestZstdLimits(t *testing.T) {
	l := Limits{UnpackedBytes: 8 << 20}.withDefaults()
	var le *LimitError
	bomb := zstdOf(t, zstdWindow, "bomb", 64<<20)
	t.Logf("zstd bomb: %d bytes compressed", len(bomb))
	out := t.TempDir()
	if err := untarZstd(bomb, out, l); !errors.As(err, &le) || le.Limit != "UnpackedBytes" {
		t.Fatalf("zstd bomb: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("the bomb left %d entries", len(ents))
	}
	wide := zstdOf(t, 64<<20, "f", 12<<20)
	if err := untarZstd(wide, t.TempDir(), DefaultLimits); err == nil || !errors.Is(err, zstd.ErrWindowSizeExceeded) {
		t.Fatalf("a 64 MiB window: %v, want %v", err, zstd.ErrWindowSizeExceeded)
	}
	if err := untarZstd(zstdOf(t, zstdWindow, "f", 1<<10), t.TempDir(), DefaultLimits); err != nil {
		t.Fatalf("an 8 MiB window: %v", err)
	}
}

// A fetch pings the registry once, not before each of its three reads
// (manifest, config, layer): a round trip each on a new Revision's start.
func TestFetchPingsOnce(t *testing.T) {
	var mu sync.Mutex
	var pings, reads int
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if r.URL.Path == "/v2/" {
			pings++
		} else if r.Method == http.MethodGet {
			reads++
		}
		mu.Unlock()
		reg.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	img, err := Build(handlerDir(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Push(context.Background(), img, ln.Addr().String()+"/lampyr/pings:v1")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	pings, reads = 0, 0
	mu.Unlock()
	snap, err := Fetch(context.Background(), ref.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Unpack(filepath.Join(t.TempDir(), "root")); err != nil {
		t.Fatal(err)
	}
	if _, err := FetchConfig(context.Background(), ref.String()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if pings != 2 || reads != 5 {
		t.Fatalf("Fetch+Unpack and FetchConfig: %d pings and %d reads, want 1 ping each and 3 + 2 reads", pings, reads)
	}
}

// The layer is unpacked as it streams in, and its digest is still the
// registry's word for nothing: a registry (or a path to it) that serves
// other, well-formed bytes for the layer's digest gets an error naming
// the mismatch, not an unpacked tree.
func TestUnpackVerifiesTheStreamedLayer(t *testing.T) {
	dir := handlerDir(t)
	img, err := Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "app", "static", "index.html"), []byte("<h1>not what was pushed</h1>"), 0o644)
	other, err := Build(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	layerOf := func(i interface{ Manifest() (*v1.Manifest, error) }) v1.Hash {
		m, err := i.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		return m.Layers[0].Digest
	}
	want, swap := layerOf(img), layerOf(other)
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var tamper bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tamper && strings.HasSuffix(r.URL.Path, "/blobs/"+want.String()) {
			r.URL.Path = strings.TrimSuffix(r.URL.Path, want.String()) + swap.String()
		}
		reg.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ref, err := Push(context.Background(), img, ln.Addr().String()+"/lampyr/tamper:v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Push(context.Background(), other, ln.Addr().String()+"/lampyr/tamper:other"); err != nil {
		t.Fatal(err)
	}
	tamper = true
	snap, err := Fetch(context.Background(), ref.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Unpack(filepath.Join(t.TempDir(), "root")); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Fatalf("unpacking a layer served with other bytes: %v", err)
	}
}
