//go:build !slim

package python

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/runcode"
)

// The rich forms of a plain run (one representation per value) with the
// embedded Python, which has no matplotlib, pandas or PIL: the real
// libraries are tested in a Debian rootfs (internal/app/plots_test.go).

// pngHead is a PNG signature and IHDR chunk of a 1×1 image: enough for the
// worker's signature check.
const pngHead = `b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"`

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestDisplayEveryReprForm(t *testing.T) {
	code := `class Md:
    def _repr_markdown_(self): return "# title"
class Jpeg:
    def _repr_jpeg_(self): return b"\xff\xd8\xff\xe0jfif"
class Latex:
    def _repr_latex_(self): return r"$\alpha$"
class Json:
    def _repr_json_(self): return {"a": [1, 2]}
class JsonText:
    def _repr_json_(self): return '{"b": 3}'
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/svg+xml": "<svg/>", "text/plain": "B"}
class HtmlAndMd:
    def _repr_html_(self): return "<i>h</i>"
    def _repr_markdown_(self): return "*m*"
class Anything:
    def __getattr__(self, name): return lambda *a: "made up " + name
    def __repr__(self): return "Anything()"
display(Md(), Jpeg(), Latex(), Json(), JsonText(), Bundle(), HtmlAndMd(), Anything())`
	r := run(t, testEng, newSession(t), code)
	if r.ExitCode != 0 {
		t.Fatalf("stderr %q", r.err)
	}
	want := []runcode.Artifact{
		{Kind: "markdown", MIME: "text/markdown", Data: "# title"},
		{Kind: "jpeg", MIME: "image/jpeg", Data: b64("\xff\xd8\xff\xe0jfif")},
		{Kind: "latex", MIME: "text/latex", Data: `$\alpha$`},
		{Kind: "json", MIME: "application/json", Data: `{"a": [1, 2]}`},
		{Kind: "json", MIME: "application/json", Data: `{"b": 3}`},
		{Kind: "svg", MIME: "image/svg+xml", Data: "<svg/>"},
		{Kind: "html", MIME: "text/html", Data: "<i>h</i>"},
	}
	checkArtifacts(t, r, want)
	// An object that makes up every attribute has no rich form.
	if r.out != "Anything()\n" {
		t.Errorf("stdout %q", r.out)
	}
	if !strings.HasSuffix(r.Artifacts[1].Name, ".jpg") || !strings.HasSuffix(r.Artifacts[0].Name, ".md") {
		t.Errorf("names %q %q", r.Artifacts[0].Name, r.Artifacts[1].Name)
	}
}

func checkArtifacts(t *testing.T, r ran, want []runcode.Artifact) {
	t.Helper()
	if len(r.Artifacts) != len(want) {
		t.Fatalf("%d artifacts %+v, want %d; notes %q stderr %q", len(r.Artifacts), r.Artifacts, len(want), r.Notes, r.err)
	}
	for i, w := range want {
		a := r.Artifacts[i]
		if a.Kind != w.Kind || a.MIME != w.MIME || a.Data != w.Data || a.Name == "" {
			t.Errorf("artifact %d: %+v, want %+v", i, a, w)
		}
	}
}

func TestDisplayBytesWithMime(t *testing.T) {
	code := `import base64
png = ` + pngHead + `
display(png, mime="image/png")
display(base64.b64encode(png).decode(), mime="image/png")
display(b"<p>hi</p>", mime="text/html")
display('{"x": 1}', mime="application/json")
display({"image/png": base64.b64encode(png).decode(), "text/plain": "a dot"}, raw=True)
display({"text/plain": "only text"}, raw=True)
display(png, mime="image/png", display_id="ignored")`
	s := newSession(t)
	r := run(t, testEng, s, code)
	if r.ExitCode != 0 {
		t.Fatalf("stderr %q", r.err)
	}
	png := "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
	checkArtifacts(t, r, []runcode.Artifact{
		{Kind: "png", MIME: "image/png", Data: b64(png)},
		{Kind: "png", MIME: "image/png", Data: b64(png)},
		{Kind: "html", MIME: "text/html", Data: "<p>hi</p>"},
		{Kind: "json", MIME: "application/json", Data: `{"x": 1}`},
		{Kind: "png", MIME: "image/png", Data: b64(png)},
		{Kind: "png", MIME: "image/png", Data: b64(png)},
	})
	if r.out != "only text\n" {
		t.Errorf("stdout %q", r.out)
	}

	// Bad input: a clear error the code can act on, and the session goes on.
	for code, want := range map[string]string{
		`display(b"GIF89a", mime="image/png")`:       "is not a PNG image",
		`display(b"\x89PNG", mime="image/jpeg")`:     "is not a JPEG image",
		`display("not base64!", mime="image/png")`:   "must be base64",
		`display(b"x", mime="application/x-evil")`:   "mime 'application/x-evil' is not one of",
		`display(b"{", mime="application/json")`:     "is not JSON",
		`display([1], raw=True)`:                     "takes a dict",
		`display(1, mimetype="image/png")`:           "unexpected keyword argument 'mimetype'",
		`display(object(), mime="image/png")`:        "must be bytes",
		`display({"image/png": b"GIF8"}, raw=True)`:  "is not a PNG image",
		`display(b"x", mime=b"image/png")`:           "mime must be a str",
		`display({}, raw=True)`:                      "the bundle is empty",
		`display(object(), mime="application/json")`: "cannot be JSON",
	} {
		r := run(t, testEng, s, code)
		if r.ExitCode == 0 || !strings.Contains(r.err, want) || len(r.Artifacts) != 0 {
			t.Errorf("%s: exit %d, stderr %q, artifacts %d; want an error with %q", code, r.ExitCode, r.err, len(r.Artifacts), want)
		}
	}
	if r := run(t, testEng, s, "print('still here')"); r.out != "still here\n" {
		t.Errorf("after the errors: %q", r.out)
	}
}

// A _repr_*_ that raises never breaks the run: the next form, or the text
// repr, is shown, and a note names the method that failed.
func TestReprErrorsFallBack(t *testing.T) {
	code := `class BadHtml:
    def _repr_html_(self): raise RuntimeError("no html today")
    def _repr_png_(self): return ` + pngHead + `
class AllBad:
    def _repr_html_(self): raise ValueError("broken")
    def _repr_json_(self): return {1, 2}
    def __repr__(self): return "AllBad()"
class BadBundle:
    def _repr_mimebundle_(self, **kw): raise TypeError("nope")
    def _repr_markdown_(self): return "md"
class BadRepr:
    def _repr_html_(self): raise KeyError("k")
    def __repr__(self): raise ValueError("no repr")
display(BadHtml(), AllBad(), BadBundle(), BadRepr())
print("after")
AllBad()`
	r := run(t, testEng, newSession(t), code)
	if r.ExitCode != 0 {
		t.Fatalf("exit %d stderr %q", r.ExitCode, r.err)
	}
	if len(r.Artifacts) != 2 || r.Artifacts[0].Kind != "png" || r.Artifacts[1].Kind != "markdown" {
		t.Fatalf("artifacts %+v", r.Artifacts)
	}
	if want := "AllBad()\n<repr failed: ValueError: no repr>\nafter\nAllBad()\n"; r.out != want {
		t.Errorf("stdout %q, want %q", r.out, want)
	}
	for _, n := range []string{
		"a BadHtml's _repr_html_() failed (RuntimeError: no html today)",
		"an AllBad's _repr_html_() failed (ValueError: broken)",
		"an AllBad's json form is not valid (TypeError",
		"a BadBundle's _repr_mimebundle_() failed (TypeError: nope)",
		"a BadRepr's _repr_html_() failed (KeyError",
	} {
		if !hasNote(r, n) {
			t.Errorf("no note %q in %q", n, r.Notes)
		}
	}
	// The same notes in a rich run; the bundle keeps the forms that work.
	rr := runCtx(t, context.Background(), newSession(t), runcode.ContextRun{ID: "x", Rich: true}, code)
	if rr.Exception != nil || len(rr.Results) != 5 {
		t.Fatalf("exception %+v results %+v", rr.Exception, rr.Results)
	}
	if d := rr.Results[0].Data; d["image/png"] == nil || d["text/html"] != nil {
		t.Errorf("BadHtml's bundle %+v", d)
	}
	if d := rr.Results[3].Data; d["text/plain"] != "<repr failed: no repr>" || len(d) != 1 {
		t.Errorf("BadRepr's bundle %+v", d)
	}
	if !hasNote(rr, "a BadHtml's _repr_html_() failed") {
		t.Errorf("rich notes %q", rr.Notes)
	}
}

// Rich outputs are bounded: one over _ARTIFACT_MAX (16 MiB) is left out
// with a note and the value is shown as text; the run's total is bounded
// too (32 MiB), so a reply never nears the frame limit that would end
// the worker. The session goes on either way.
func TestRichOutputSizeBounds(t *testing.T) {
	t.Parallel()
	code := `class Big:
    def __init__(self, n): self.n = n
    def _repr_svg_(self): return "<svg>" + "x" * self.n + "</svg>"
    def __repr__(self): return "Big(%d)" % self.n
display(Big(17 << 20))
for i in range(5):
    display(Big(7 << 20))
display(b"\x89PNG\r\n\x1a\n" + bytes(13 << 20), mime="image/png")
print("done")`
	s := newSession(t)
	r := run(t, testEng, s, code)
	if r.ExitCode != 0 {
		t.Fatalf("exit %d stderr %q", r.ExitCode, r.err)
	}
	// 4 of 7 MiB fit in 32 MiB; the 5th and the 13 MiB PNG (17.3 MiB in
	// base64) do not.
	if len(r.Artifacts) != 4 {
		t.Fatalf("%d artifacts; notes %q", len(r.Artifacts), r.Notes)
	}
	if want := "Big(17825792)\nBig(7340032)\n<image/png, 13.0 MiB>\ndone\n"; r.out != want {
		t.Errorf("stdout %q, want %q", r.out, want)
	}
	if !hasNote(r, "the svg of a Big is 17.0 MiB, over the 16.0 MiB limit of one rich output; it was left out") ||
		!hasNote(r, "the svg of a Big was left out: the run's rich outputs reached their 32.0 MiB limit") ||
		!hasNote(r, "the png of <image/png, 13.0 MiB> is 17.3 MiB, over the 16.0 MiB limit") {
		t.Errorf("notes %q", r.Notes)
	}
	// The bound is per run.
	if r := run(t, testEng, s, "display(Big(7 << 20))"); len(r.Artifacts) != 1 || len(r.Notes) != 0 {
		t.Errorf("next run: %d artifacts, notes %q", len(r.Artifacts), r.Notes)
	}
}

// The plt.show() hook with the embedded Python, which has no matplotlib:
// a stand-in package in the workspace (the real one is tested in the sci
// rootfs, internal/app/plots_test.go). It checks the import machinery:
// show is replaced when pyplot is loaded, the open figures are shown and
// closed, and the worker never imports matplotlib itself.
func TestPyplotShowHook(t *testing.T) {
	s := newSession(t)
	files := map[string]string{
		"matplotlib/__init__.py": "rcParams = {'savefig.format': 'png'}\n",
		"matplotlib/_pylab_helpers.py": `class Gcf:
    figs = {}
    @classmethod
    def get_all_fig_managers(cls):
        return list(cls.figs.values())
`,
		"matplotlib/figure.py": `class Canvas:
    def __init__(self, fig): self.figure = fig
class Figure:
    def __init__(self, n): self.n = n; self.canvas = Canvas(self)
    def savefig(self, f, format=None, bbox_inches=None):
        f.write(b"\x89PNG\r\n\x1a\n" + bytes([self.n]))
    def __repr__(self): return "<Figure %d>" % self.n
`,
		"matplotlib/pyplot.py": `from matplotlib._pylab_helpers import Gcf
from matplotlib.figure import Figure
def figure():
    f = Figure(len(Gcf.figs) + 1)
    Gcf.figs[f.n] = f  # a figure manager: it has the canvas
    return f
def close(fig):
    Gcf.figs.pop(fig.n, None)
def get_fignums():
    return sorted(Gcf.figs)
def show():
    print("the real show ran")
`,
	}
	for name, body := range files {
		p := filepath.Join(s.Workspace(), name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if r := run(t, testEng, s, "import sys\nprint('matplotlib' in sys.modules)"); r.out != "False\n" || len(r.Artifacts) != 0 {
		t.Fatalf("the worker imported matplotlib: %q", r.out)
	}
	r := run(t, testEng, s, "import matplotlib.pyplot as plt\nplt.figure(); plt.figure()\nplt.show()\nprint(plt.get_fignums(), plt.show.__name__)\nplt.figure()")
	if r.out != "[] show\n" || len(r.Artifacts) != 3 {
		t.Fatalf("stdout %q, %d artifacts, stderr %q", r.out, len(r.Artifacts), r.err)
	}
	for i, a := range r.Artifacts {
		if a.Kind != "png" || a.Data != b64("\x89PNG\r\n\x1a\n"+string(rune(i%2+1))) {
			t.Errorf("artifact %d: %+v", i, a)
		}
	}
	// The figure left open was shown at the end of the run, and closed.
	if r := run(t, testEng, s, "plt.get_fignums()"); r.out != "[]\n" || len(r.Artifacts) != 0 {
		t.Errorf("after the run: %q %d", r.out, len(r.Artifacts))
	}
}

// TestArtifactKeepsTheText: a value shown as a page (a DataFrame's HTML)
// carries its text repr too, for a reader that cannot read the page; an
// object's default repr says nothing and is left out, and a long one is cut.
func TestArtifactKeepsTheText(t *testing.T) {
	code := `class Frame:
    def _repr_html_(self): return "<table><tr><td>1</td></tr></table>"
    def __repr__(self): return "   a\n0  1"
class Bare:
    def _repr_html_(self): return "<p>bare</p>"
class Long:
    def _repr_html_(self): return "<p>long</p>"
    def __repr__(self): return "x" * 10000
class Raw:
    pass
display({"text/html": "<b>r</b>", "text/plain": "raw text"}, raw=True)
display(Bare(), Long())
Frame()`
	r := run(t, testEng, newSession(t), code)
	if r.ExitCode != 0 || len(r.Artifacts) != 4 {
		t.Fatalf("exit %d stderr %q artifacts %+v", r.ExitCode, r.err, r.Artifacts)
	}
	raw, bare, long, frame := r.Artifacts[0], r.Artifacts[1], r.Artifacts[2], r.Artifacts[3]
	if raw.Text != "raw text" || bare.Text != "" {
		t.Errorf("raw %q, bare %q", raw.Text, bare.Text)
	}
	if frame.Kind != "html" || frame.Text != "   a\n0  1" {
		t.Errorf("the frame: %+v", frame)
	}
	if len(long.Text) > 4100 || !strings.Contains(long.Text, "characters cut") {
		t.Errorf("a long repr: %d characters", len(long.Text))
	}
	if txt := r.Text(); !strings.Contains(txt, "   a\n0  1") {
		t.Errorf("the reply text misses the frame's text:\n%s", txt)
	}
}

// The worker reads and writes its protocol's JSON, and rich values', with
// the C codec alone: the json package (which imports re and compiles its
// patterns, 1.3 MiB a worker) is not imported by a run, a rich result or a
// display of JSON, and the values and errors are json's.
func TestWorkerJSONWithoutTheJSONPackage(t *testing.T) {
	code := `import sys
class J:
    def _repr_json_(self): return {"a": [1, 2.5, None, True, "\u00e9<"]}
display(J())
display('{"b": [3]}', mime="application/json")
print(sorted(m for m in ("json", "json.decoder", "json.encoder") if m in sys.modules))
for bad in ('{"b": 3', '', '[1] x'):
    try:
        display(bad, mime="application/json")
    except ValueError as e:
        print(e)`
	r := run(t, testEng, newSession(t), code)
	if r.ExitCode != 0 {
		t.Fatalf("stderr %q", r.err)
	}
	want := "[]\n" +
		"display(): the data given as application/json is not JSON (Expecting ',' delimiter: line 1 column 8 (char 7))\n" +
		"display(): the data given as application/json is not JSON (Expecting value (char 0))\n" +
		"display(): the data given as application/json is not JSON (Extra data (char 4))\n"
	if r.out != want {
		t.Errorf("stdout %q, want %q (the first line lists the json modules imported)", r.out, want)
	}
	checkArtifacts(t, r, []runcode.Artifact{
		{Kind: "json", MIME: "application/json", Data: `{"a": [1, 2.5, null, true, "\u00e9<"]}`},
		{Kind: "json", MIME: "application/json", Data: `{"b": [3]}`},
	})
}
