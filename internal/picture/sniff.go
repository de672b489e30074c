package picture

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image"
	_ "image/gif" // DecodeConfig's formats
	_ "image/jpeg"
	_ "image/png"
	"io"
	"net/http"

	_ "golang.org/x/image/webp"
)

// MaxImage bounds, in bytes, an image sent as it is to a model; the major
// model APIs take up to 5 MB an image.
const MaxImage = 5 << 20

// maxPixels bounds an image's side; the model APIs take up to 8000.
const maxPixels = 8000

// Image is what Sniff found in a file's bytes.
type Image struct {
	MIME          string // image/png, image/jpeg, image/gif, image/webp or image/svg+xml
	Width, Height int    // 0 for SVG
}

// Sniff tells an image from its bytes, never from a name: PNG, JPEG, GIF
// and WebP whose header decodes to a size within what model APIs take, or
// an SVG document (its first element <svg>). ok is false for anything
// else.
func Sniff(b []byte) (img Image, ok bool) {
	switch mime := http.DetectContentType(b); mime {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		c, _, err := image.DecodeConfig(bytes.NewReader(b))
		if err != nil || c.Width < 1 || c.Height < 1 || c.Width > maxPixels || c.Height > maxPixels {
			return Image{}, false
		}
		return Image{MIME: mime, Width: c.Width, Height: c.Height}, true
	}
	if isSVG(b) {
		return Image{MIME: "image/svg+xml"}, true
	}
	return Image{}, false
}

// String names the image for a model: "a 640×480 PNG image".
func (i Image) String() string {
	name := map[string]string{"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WebP"}[i.MIME]
	if name == "" {
		return "an SVG image"
	}
	return fmt.Sprintf("a %d×%d %s image", i.Width, i.Height, name)
}

// isSVG: b is XML whose first element is <svg>, within its first 64
// tokens (a prolog, comments, a doctype).
func isSVG(b []byte) bool {
	t := bytes.TrimLeft(b, "\ufeff \t\r\n")
	if len(t) == 0 || t[0] != '<' {
		return false
	}
	d := xml.NewDecoder(bytes.NewReader(t))
	d.CharsetReader = func(string, io.Reader) (io.Reader, error) { return nil, ErrNotSVG }
	for range 64 {
		tok, err := d.RawToken()
		if err != nil {
			return false
		}
		if se, ok := tok.(xml.StartElement); ok {
			return se.Name.Local == "svg"
		}
	}
	return false
}
