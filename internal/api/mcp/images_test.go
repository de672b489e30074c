package mcp_test

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
	"net/http"
	"strings"
	"testing"
)

// pngSize decodes c, image content that must be a PNG, to its size.
func pngSize(t *testing.T, c content) (w, h int) {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(c.Data)
	if c.Type != "image" || c.MIMEType != "image/png" || err != nil {
		t.Fatalf("not PNG image content: %+v (%v)", c, err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the image is no PNG: %v", err)
	}
	return img.Bounds().Dx(), img.Bounds().Dy()
}

// TestImagesReachTheModel: what a model cannot read as text reaches it
// as image content through the Go SDK client: read_file of a PNG (told
// by its bytes, not its name) and of an SVG, and run_code's SVG,
// rasterised, beside the SVG itself; a hostile SVG is kept as SVG and
// the text says why it is not an image.
func TestImagesReachTheModel(t *testing.T) {
	a := newApp(t)
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, nil), http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewRGBA(image.Rect(0, 0, 40, 30))); err != nil {
		t.Fatal(err)
	}
	svg := `<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100"><rect width="50" height="50" fill="red"/></svg>`
	for _, f := range []struct{ path, content, encoding string }{
		{"plot.dat", base64.StdEncoding.EncodeToString(b.Bytes()), "base64"},
		{"fig.svg", svg, ""},
		{"fake.png", "not an image", ""},
	} {
		if o, err := callTool(t, cs, "write_file", map[string]any{"path": f.path, "content": f.content, "encoding": f.encoding}); err != nil || o.IsError {
			t.Fatalf("write_file %s: %v %+v", f.path, err, o)
		}
	}
	read := func(path string) *outcome {
		t.Helper()
		o, err := callTool(t, cs, "read_file", map[string]any{"path": path})
		if err != nil || o.IsError || len(o.Content) == 0 || o.Content[0].Type != "text" {
			t.Fatalf("read_file %s: %v %+v", path, err, o)
		}
		return o
	}

	o := read("plot.dat")
	if len(o.Content) != 2 || strings.Contains(o.Content[0].Text, b64Head(b.Bytes())) ||
		!strings.Contains(o.Content[0].Text, "a 40×30 PNG image") || o.Structured["media_type"] != "image/png" {
		t.Fatalf("read_file of a PNG: %+v", o)
	}
	if w, h := pngSize(t, o.Content[1]); w != 40 || h != 30 {
		t.Errorf("the PNG read is %d×%d", w, h)
	}

	o = read("fig.svg")
	if len(o.Content) != 2 || !strings.Contains(o.Content[0].Text, "<rect") {
		t.Fatalf("read_file of an SVG: %+v", o)
	}
	if w, h := pngSize(t, o.Content[1]); w != 200 || h != 100 {
		t.Errorf("the SVG read rasterised to %d×%d, want 200×100", w, h)
	}

	if o = read("fake.png"); len(o.Content) != 1 || o.Structured["media_type"] != nil {
		t.Errorf("a text file named .png: %+v", o)
	}

	if embeddedPython {
		// A value shown as a page (a DataFrame) keeps its text beside it.
		code := "class Frame:\n    def _repr_html_(self): return '<table/>'\n    def __repr__(self): return '   a\\n0  1'\nFrame()"
		o, err := callTool(t, cs, "run_code", map[string]any{"code": code})
		if err != nil || o.IsError || len(o.Content) != 2 || !strings.Contains(o.Content[0].Text, "   a\n0  1") ||
			o.Content[1].Resource == nil || o.Content[1].Resource.MIMEType != "text/html" {
			t.Fatalf("a frame: %v %+v", err, o)
		}
	}

	hostile := `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" viewBox="0 0 10 10">` +
		`<defs><g id="a"><use xlink:href="#a"/></g></defs><use xlink:href="#a"/></svg>`
	o, err = callTool(t, cs, "run_code", map[string]any{"lang": "svg", "code": hostile})
	if err != nil || o.IsError || len(o.Content) != 2 || o.Content[1].Type != "resource" ||
		!strings.Contains(o.Content[0].Text, "is not shown as an image") || !strings.Contains(o.Content[0].Text, "attached as SVG") {
		t.Fatalf("a hostile SVG: %v %+v", err, o)
	}
}

func b64Head(b []byte) string { return base64.StdEncoding.EncodeToString(b)[:16] }
