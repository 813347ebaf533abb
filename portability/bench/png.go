package bench

import (
	"fmt"
	"image"
	"image/png"
	"os"
)

// TrimPNG cuts the blank tail off a screenshot: Chromium's headless
// --screenshot captures the whole window, which is sized for the longest
// report, so a short one (the scale or footprint spec alone) came out with
// thousands of blank pixels below it. The rows below the last one that
// differs from the bottom-right pixel's colour go, but for margin pixels.
// It reports the height kept, and whether the page may have gone on below
// the window (content reaching the last row).
func TrimPNG(path string, margin int) (height int, clipped bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", path, err)
	}
	b := img.Bounds()
	bg := img.At(b.Max.X-1, b.Max.Y-1)
	br, bgg, bb, ba := bg.RGBA()
	last := b.Min.Y - 1
	for y := b.Max.Y - 1; y >= b.Min.Y && last < b.Min.Y; y-- {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			if r != br || g != bgg || bl != bb || a != ba {
				last = y
				break
			}
		}
	}
	if last == b.Max.Y-1 {
		return b.Dy(), true, nil
	}
	keep := min(b.Max.Y, last+1+margin)
	if last < b.Min.Y {
		keep = min(b.Max.Y, b.Min.Y+margin)
	}
	sub, ok := img.(interface {
		SubImage(r image.Rectangle) image.Image
	})
	if !ok {
		return b.Dy(), false, nil
	}
	out, err := os.CreateTemp("", "report-*.png")
	if err != nil {
		return 0, false, err
	}
	defer os.Remove(out.Name())
	if err := png.Encode(out, sub.SubImage(image.Rect(b.Min.X, b.Min.Y, b.Max.X, keep))); err != nil {
		out.Close()
		return 0, false, err
	}
	if err := out.Close(); err != nil {
		return 0, false, err
	}
	if err := os.Rename(out.Name(), path); err != nil {
		return 0, false, err
	}
	return keep - b.Min.Y, false, nil
}
