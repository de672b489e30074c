package picture

import (
	"bytes"
	"errors"
	"fmt"
	"image/png"
	"strings"
	"testing"
)

func decode(t *testing.T, b []byte) (w, h int) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	return img.Bounds().Dx(), img.Bounds().Dy()
}

func TestConvert(t *testing.T) {
	svg := `<?xml version="1.0" encoding="utf-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="200pt" height="100pt" viewBox="0 0 200 100">
<rect x="0" y="0" width="100" height="100" fill="#ff0000"/>
<path d="M 0 50 L 200 50" stroke="#0000ff" stroke-width="2" stroke-dasharray="3.7,1.6"/>
</svg>`
	b, err := SVGToPNG([]byte(svg))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if s := img.Bounds().Size(); s.X != 200 || s.Y != 100 {
		t.Fatalf("size %v, want 200×100", s)
	}
	if r, g, _, a := img.At(20, 20).RGBA(); r < 0xf000 || g > 0x1000 || a < 0xf000 {
		t.Errorf("pixel (20,20) is %v, want red", img.At(20, 20))
	}
	if _, _, _, a := img.At(180, 20).RGBA(); a != 0 {
		t.Errorf("pixel (180,20) is %v, want transparent", img.At(180, 20))
	}
}

// TestHostileSVG: what a tenant's code can make costs bounded work and
// ends in a PNG of bounded size or an error, never a crash.
func TestHostileSVG(t *testing.T) {
	deep := strings.Repeat("<g>", 5000) + strings.Repeat("</g>", 5000)
	many := strings.Repeat(`<rect width="1000000" height="1000000"/>`, maxElements+1)
	// A gradient's stops are walked per pixel of every path filled with it.
	gradient := func(stops, rects int) string {
		var b strings.Builder
		b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="1000"><defs><linearGradient id="g">`)
		for i := range stops {
			fmt.Fprintf(&b, `<stop offset="%g" stop-color="#%06x"/>`, float64(i)/float64(stops), i*977)
		}
		b.WriteString(`</linearGradient></defs>`)
		b.WriteString(strings.Repeat(`<rect width="1000" height="1000" fill="url(#g)"/>`, rects))
		return b.String() + `</svg>`
	}
	cases := []struct {
		name, svg string
		err       string // "" when a PNG is expected
	}{
		{"huge size", `<svg xmlns="http://www.w3.org/2000/svg" width="1e9" height="5e8" viewBox="0 0 1e9 5e8"><rect width="1e9" height="5e8" fill="red"/></svg>`, ""},
		{"infinite size", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1e400 10"><rect width="5" height="5"/></svg>`, ""},
		{"negative size", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 -5 10"><rect width="5" height="5"/></svg>`, "cannot be drawn"},
		{"no size", `<svg xmlns="http://www.w3.org/2000/svg"><rect width="5" height="5"/></svg>`, ""},
		{"deep nesting", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10">` + deep + `</svg>`, "deep"},
		{"many elements", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10">` + many + `</svg>`, "elements"},
		{"recursive use", `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" viewBox="0 0 10 10"><defs><g id="a"><use xlink:href="#a"/></g></defs><use xlink:href="#a"/></svg>`, "<use> inside <defs>"},
		{"use fan-out", `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" viewBox="0 0 10 10"><defs><g id="a">` +
			strings.Repeat(`<rect width="10" height="10"/>`, 1000) + `</g></defs>` + strings.Repeat(`<use xlink:href="#a"/>`, 100) + `</svg>`, "elements"},
		{"hair-thin dashes", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><path d="M0 0 L 10000000 10000000" stroke="black" stroke-dasharray="0.0001"/></svg>`, ""},
		{"too big", `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><!--` + strings.Repeat("x", MaxInput) + `--></svg>`, "over"},
		{"other encoding", `<?xml version="1.0" encoding="iso-8859-1"?><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"/>`, "not UTF-8"},
		{"not svg", `<html><body/></html>`, "not an SVG"},
		{"not xml", `<svg viewBox="0 0 10 10"><rect`, "not well-formed"},
		{"many gradient stops", gradient(1500, 1400), "gradient stops"},
		{"costly gradient", gradient(maxStops, 1400), "too costly"},
		{"a gradient", gradient(16, 4), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := SVGToPNG([]byte(c.svg))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w, h := decode(t, b); w > MaxSide || h > MaxSide || w < 1 || h < 1 {
				t.Fatalf("a %d×%d PNG", w, h)
			}
		})
	}
	if _, err := SVGToPNG([]byte("<html/>")); !errors.Is(err, ErrNotSVG) {
		t.Errorf("a page: %v", err)
	}
}
