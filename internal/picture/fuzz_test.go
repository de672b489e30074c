package picture

import (
	"bytes"
	"image/png"
	"testing"
)

// FuzzSVGToPNG: any bytes end in a PNG within MaxSide or an error, never
// a panic or a hang.
func FuzzSVGToPNG(f *testing.F) {
	for _, s := range []string{
		`<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="5" height="5"/></svg>`,
		`<svg width="20" height="10"><defs><path id="m" d="M0 0 L1 1"/></defs><use xlink:href="#m" x="3"/></svg>`,
		`<svg viewBox="0 0 10 10"><path d="M0 0 C 1 2 3 4 5 6 Q 1 1 2 2 A 3 3 0 1 1 9 9 Z" stroke="red" stroke-dasharray="1,2"/></svg>`,
		`<svg><linearGradient id="g"><stop offset="0"/></linearGradient><circle r="4" fill="url(#g)"/></svg>`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := SVGToPNG(b)
		if err != nil {
			return
		}
		img, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("not a PNG: %v", err)
		}
		if s := img.Bounds().Size(); s.X > MaxSide || s.Y > MaxSide || s.X < 1 || s.Y < 1 {
			t.Fatalf("a %v PNG", s)
		}
	})
}

// FuzzSniff: any bytes are an image or not, never a panic.
func FuzzSniff(f *testing.F) {
	f.Add([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"))
	f.Add([]byte(`<?xml version="1.0"?><svg/>`))
	f.Add([]byte("GIF89a"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if img, ok := Sniff(b); ok && img.MIME == "" {
			t.Fatal("an image without a type")
		}
	})
}
