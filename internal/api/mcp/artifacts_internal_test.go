package mcp

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/internal/runcode"
)

// TestArtifactMIMEIsTheKinds: an artifact's MIME field comes from the box
// (its code can forge the worker's reply); an embedded resource gets the
// media type of the artifact's kind, never that field.
func TestArtifactMIMEIsTheKinds(t *testing.T) {
	r := &runcode.Result{Session: "s", Artifacts: []runcode.Artifact{
		{Kind: "text", MIME: "text/html", Name: "a.txt", Data: "<script>x</script>"},
		{Kind: "json", MIME: "application/x-msdownload", Name: "b.json", Data: "{}"},
		{Kind: "markdown", MIME: "text/html; charset=evil", Name: "c.md", Data: "# x"},
		{Kind: "weird", MIME: "application/javascript", Name: "d", Data: "alert(1)"},
		{Kind: "html", MIME: "image/png", Name: "e.html", Data: "<p>"},
	}}
	want := []string{"text/plain", "application/json", "text/markdown", "text/plain", "text/html"}
	out, _ := artifacts(r)
	if len(out) != len(want) {
		t.Fatalf("%d contents", len(out))
	}
	for i, c := range out {
		er, ok := c.(*mcp.EmbeddedResource)
		if !ok || er.Resource.MIMEType != want[i] {
			t.Fatalf("artifact %d (%s, MIME %q): %#v", i, r.Artifacts[i].Kind, r.Artifacts[i].MIME, c)
		}
	}
}

// TestRichResultImages: a rich run's PNG and SVG forms reach the model as
// image content (the SVG rasterised and kept as a resource); more SVGs
// than maxRasters stay resources, with a note.
func TestRichResultImages(t *testing.T) {
	svg := `<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10"><rect width="5" height="5"/></svg>`
	r := &runcode.Result{Session: "s", Results: []runcode.RichResult{
		{Data: map[string]any{"text/plain": "a", "image/png": "iVBORw0KGgo="}},
		{Main: true, Data: map[string]any{"text/plain": "b", "image/svg+xml": svg, "text/html": "<p>"}},
	}}
	out, notes := artifacts(r)
	if len(out) != 3 || len(notes) != 0 {
		t.Fatalf("%d contents, notes %q", len(out), notes)
	}
	if im, ok := out[0].(*mcp.ImageContent); !ok || im.MIMEType != "image/png" || string(im.Data) != "\x89PNG\r\n\x1a\n" {
		t.Errorf("the PNG: %#v", out[0])
	}
	if er, ok := out[1].(*mcp.EmbeddedResource); !ok || er.Resource.MIMEType != "image/svg+xml" || er.Resource.Text != svg {
		t.Errorf("the SVG: %#v", out[1])
	}
	if im, ok := out[2].(*mcp.ImageContent); !ok || im.MIMEType != "image/png" {
		t.Errorf("the SVG rasterised: %#v", out[2])
	}

	r = &runcode.Result{Session: "s"}
	for range maxRasters + 2 {
		r.Artifacts = append(r.Artifacts, runcode.Artifact{Kind: "svg", Name: "x.svg", Data: svg})
	}
	out, notes = artifacts(r)
	if len(out) != 2*maxRasters+2 || len(notes) != 1 || !strings.Contains(notes[0], "only the first 4 SVG images") {
		t.Errorf("%d contents, notes %q", len(out), notes)
	}
}
