// Package picture tells images from other bytes and rasterises SVG to PNG
// in pure Go (oksvg and rasterx), for readers that take raster images
// only: the major model APIs accept PNG, JPEG, GIF and WebP, not SVG.
//
// The SVG comes from a tenant's code and is hostile: the input, the number
// of elements (<use> expansions counted), their nesting and the raster are
// bounded, <use> inside <defs> (which the parser expands recursively) is
// refused, dashes are
// drawn solid (a hair-thin dash pattern costs a segment per dash), and a
// panic of the rasteriser is an error. SVGToPNG is safe for concurrent use.
package picture

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math"
	"strings"

	"github.com/srwiley/oksvg"
	"github.com/srwiley/rasterx"
)

// Bounds of the work SVGToPNG does.
const (
	MaxInput    = 2 << 20 // bytes of SVG
	MaxSide     = 1024    // pixels of the PNG's longer side
	maxElements = 3000    // elements, <use> expansions counted
	maxDepth    = 256     // element nesting
	// maxStops bounds the gradient stops: the rasteriser walks a
	// gradient's stops for every pixel a path filled with it covers.
	maxStops = 256
	// maxWork bounds paths × pixels: each path may cover the whole
	// raster, so a drawing of many paths is drawn smaller.
	maxWork = 1 << 27
	minSide = 64
	// maxLineWidth bounds a stroke, in pixels: a segment's cost grows
	// with the area its stroke covers.
	maxLineWidth = 32
)

// ErrNotSVG is an input that is not an SVG document.
var ErrNotSVG = errors.New("not an SVG document")

// SVGToPNG draws svg as a PNG whose longer side is at most MaxSide pixels
// (the SVG's own size when smaller; less for a drawing of many paths), on
// a transparent background. Strokes are at most maxLineWidth wide.
func SVGToPNG(svg []byte) (out []byte, err error) {
	if len(svg) > MaxInput {
		return nil, fmt.Errorf("the SVG is %d bytes, over the %d the rasteriser takes", len(svg), MaxInput)
	}
	stops, err := check(svg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("the rasteriser failed on this SVG: %v", p)
		}
	}()
	icon, err := oksvg.ReadIconStream(bytes.NewReader(svg), oksvg.IgnoreErrorMode)
	if err != nil {
		return nil, fmt.Errorf("the SVG cannot be parsed: %w", err)
	}
	vw, vh := icon.ViewBox.W, icon.ViewBox.H
	if vw == 0 && vh == 0 {
		// No width, height or viewBox: a browser's default size.
		vw, vh = 300, 150
		icon.ViewBox.W, icon.ViewBox.H = vw, vh
	}
	if !(vw > 0 && vh > 0) || math.IsInf(vw, 0) || math.IsInf(vh, 0) {
		return nil, fmt.Errorf("the SVG's size (%g×%g) cannot be drawn", vw, vh)
	}
	if len(icon.SVGPaths) > maxElements {
		return nil, fmt.Errorf("the SVG has %d paths (at most %d)", len(icon.SVGPaths), maxElements)
	}
	segments := 0
	for i := range icon.SVGPaths {
		segments += len(icon.SVGPaths[i].Path) / 3
	}
	// A pixel of a path costs the stops of its gradient, if it has one:
	// counted as if every path walked all of them.
	cost := len(icon.SVGPaths) * (1 + stops)
	w, h := size(vw, vh, cost, segments)
	if float64(cost)*float64(w)*float64(h) > 2*maxWork {
		// Even the smallest raster (minSide) would cost too much.
		return nil, fmt.Errorf("the SVG is too costly to draw (%d paths, %d gradient stops)", len(icon.SVGPaths), stops)
	}
	for i := range icon.SVGPaths {
		p := &icon.SVGPaths[i]
		p.Dash = nil
		if !(p.LineWidth <= maxLineWidth) {
			p.LineWidth = maxLineWidth
		}
	}
	icon.SetTarget(0, 0, float64(w), float64(h))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	scanner := rasterx.NewScannerGV(w, h, img, img.Bounds())
	icon.Draw(rasterx.NewDasher(w, h, scanner), 1)
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// size is the raster for a vw×vh drawing of n paths of segments in all:
// its own size, at most MaxSide on the longer side, and within maxWork
// for both a path's cost (its raster's area) and a segment's (the rows
// its edges cross, four edges for a stroked one); at least 1.
func size(vw, vh float64, n, segments int) (int, int) {
	scale := math.Min(1, MaxSide/math.Max(vw, vh))
	if n > 0 {
		if limit := float64(maxWork) / float64(n); vw*vh*scale*scale > limit {
			scale = math.Sqrt(limit / (vw * vh))
		}
	}
	if segments > 0 {
		if limit := float64(maxWork) / float64(4*segments); math.Max(vw, vh)*scale > limit {
			scale = limit / math.Max(vw, vh)
		}
	}
	if long := math.Max(vw, vh) * scale; long < minSide && math.Max(vw, vh) >= minSide {
		scale = minSide / math.Max(vw, vh)
	}
	w := int(math.Max(1, math.Round(vw*scale)))
	h := int(math.Max(1, math.Round(vh*scale)))
	return min(w, MaxSide), min(h, MaxSide)
}

// check reads svg's elements before the parser does: an <svg> root, the
// nesting and the number of elements bounded, each <use> counted as the
// elements of the definition it expands to (as the parser finds it: an
// element of <defs> with an id and the id-less ones after it), and no
// <use> or <defs> inside <defs>, and at most maxStops gradient stops,
// which it returns.
func check(svg []byte) (stops int, err error) {
	d := xml.NewDecoder(bytes.NewReader(svg))
	// UTF-8 only: under another encoding the parser would read other
	// elements than these checks.
	d.CharsetReader = func(label string, _ io.Reader) (io.Reader, error) {
		return nil, fmt.Errorf("the SVG's encoding %q is not UTF-8", label)
	}
	fail := func(err error) (int, error) { return 0, err }
	depth, defsDepth, elements := 0, 0, 0
	defs := map[string]int{} // definition id → its elements
	def := ""                // the definition being read
	root := false
	for {
		t, err := d.RawToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("the SVG is not well-formed XML: %w", err))
		}
		switch t := t.(type) {
		case xml.StartElement:
			if depth == 0 && !root {
				if t.Name.Local != "svg" {
					return fail(ErrNotSVG)
				}
				root = true
			}
			depth++
			elements++
			if depth > maxDepth {
				return fail(fmt.Errorf("the SVG nests elements %d deep (at most %d)", depth, maxDepth))
			}
			if t.Name.Local == "stop" {
				if stops++; stops > maxStops {
					return fail(fmt.Errorf("the SVG has over %d gradient stops", maxStops))
				}
			}
			switch {
			case defsDepth > 0 && (t.Name.Local == "use" || t.Name.Local == "defs"):
				return fail(fmt.Errorf("the SVG has <%s> inside <defs>, which the rasteriser does not take", t.Name.Local))
			case t.Name.Local == "defs":
				defsDepth, def = depth, ""
			case defsDepth > 0:
				if id := attr(t, "id"); id != "" {
					def = id
					defs[def] = 0
				}
				if def != "" {
					defs[def]++
				}
			case t.Name.Local == "use":
				elements += defs[strings.TrimPrefix(attr(t, "href"), "#")]
			}
		case xml.EndElement:
			if depth == defsDepth {
				defsDepth = 0
			}
			depth--
		}
		if elements > maxElements {
			return fail(fmt.Errorf("the SVG has over %d elements (a <use> counted as the elements it draws)", maxElements))
		}
	}
	if !root {
		return fail(ErrNotSVG)
	}
	return stops, nil
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
