package artifact

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkUnpack unpacks a snapshot of one Go binary (this test binary,
// a handler's size) from each layer format: what a claimed spare Home
// does before its Revision is Ready. go test -bench Unpack -count 6
// alternates the two sub-benchmarks within one run.
func BenchmarkUnpack(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	os.MkdirAll(filepath.Join(dir, "app"), 0o755)
	src, err := os.Open(exe)
	if err != nil {
		b.Fatal(err)
	}
	dst, _ := os.OpenFile(filepath.Join(dir, "app", "handler"), os.O_CREATE|os.O_WRONLY, 0o755)
	n, _ := io.Copy(dst, src)
	src.Close()
	dst.Close()
	gz, err := tarGz(dir)
	if err != nil {
		b.Fatal(err)
	}
	zs, err := tarZstd(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range []struct {
		name, mt string
		layer    []byte
	}{{"gzip", LayerMediaTypeGzip, gz}, {"zstd", LayerMediaType, zs}} {
		b.Run(f.name, func(b *testing.B) {
			b.SetBytes(n)
			b.ReportMetric(float64(len(f.layer))/(1<<20), "layer-MiB")
			for i := 0; i < b.N; i++ {
				out := filepath.Join(b.TempDir(), "root")
				if err := untar(f.mt, f.layer, out, DefaultLimits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
