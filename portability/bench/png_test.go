package bench

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func writePNG(t *testing.T, path string, w, h, contentTo int) {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.White)
		}
	}
	for y := 0; y < contentTo; y++ {
		img.Set(w/2, y, color.Black)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, img); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func pngHeight(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.Height
}

func TestTrimPNG(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "short.png")
	writePNG(t, p, 40, 1000, 300)
	h, clipped, err := TrimPNG(p, 20)
	if err != nil || clipped || h != 320 {
		t.Fatalf("TrimPNG = %d, %v, %v; want 320 rows (300 of content + 20), not clipped", h, clipped, err)
	}
	if got := pngHeight(t, p); got != 320 {
		t.Errorf("file is %d rows high, want 320", got)
	}
	// Content down to the last row (in the middle column; the
	// bottom-right pixel is the background): the page may go on below.
	p = filepath.Join(dir, "long.png")
	writePNG(t, p, 40, 500, 500)
	h, clipped, err = TrimPNG(p, 20)
	if err != nil || !clipped || h != 500 {
		t.Fatalf("TrimPNG = %d, %v, %v; want the 500 rows kept, clipped", h, clipped, err)
	}
}
