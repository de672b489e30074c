package mcp

import (
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
