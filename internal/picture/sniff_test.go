package picture

import (
	"bytes"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"
)

func encoded(t *testing.T, enc func(*bytes.Buffer, image.Image) error, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := enc(&b, image.NewRGBA(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSniff(t *testing.T) {
	pngOf := func(b *bytes.Buffer, m image.Image) error { return png.Encode(b, m) }
	jpegOf := func(b *bytes.Buffer, m image.Image) error { return jpeg.Encode(b, m, nil) }
	gifOf := func(b *bytes.Buffer, m image.Image) error { return gif.Encode(b, m, nil) }
	cases := []struct {
		name string
		data []byte
		want string // "" for no image
	}{
		{"png", encoded(t, pngOf, 3, 2), "a 3×2 PNG image"},
		{"jpeg", encoded(t, jpegOf, 5, 4), "a 5×4 JPEG image"},
		{"gif", encoded(t, gifOf, 7, 6), "a 7×6 GIF image"},
		{"too wide", encoded(t, pngOf, maxPixels+1, 1), ""},
		{"cut png", encoded(t, pngOf, 3, 2)[:12], ""},
		{"svg", []byte("\ufeff<?xml version=\"1.0\"?>\n<!-- a plot -->\n<!DOCTYPE svg>\n<svg xmlns=\"http://www.w3.org/2000/svg\"/>"), "an SVG image"},
		{"html", []byte("<html><svg/></html>"), ""},
		{"text", []byte("just text <svg>"), ""},
	}
	for _, c := range cases {
		img, ok := Sniff(c.data)
		if got := img.String(); (c.want == "") == ok || ok && got != c.want {
			t.Errorf("%s: %v %q, want %q", c.name, ok, got, c.want)
		}
	}
}
