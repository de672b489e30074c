package render

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/runcode"
)

type out struct {
	res            *runcode.Result
	stdout, stderr string
}

func render(t *testing.T, e runcode.Engine, lang, code string) out {
	t.Helper()
	var so, se bytes.Buffer
	res, err := e.Run(context.Background(), &runcode.Request{Code: code, Lang: lang, Stdout: &so, Stderr: &se})
	if err != nil {
		t.Fatalf("%s: engine error %v", lang, err)
	}
	return out{res, so.String(), se.String()}
}

func artifact(t *testing.T, res *runcode.Result, kind string) runcode.Artifact {
	t.Helper()
	for _, a := range res.Artifacts {
		if a.Kind == kind {
			return a
		}
	}
	t.Fatalf("no %s artifact in %+v", kind, res.Artifacts)
	return runcode.Artifact{}
}

func TestJSONValid(t *testing.T) {
	o := render(t, JSON{}, "json", `{"b": 1.50, "a": [true, null, "<script>alert(1)</script>"]}`)
	want := "{\n  \"b\": 1.50,\n  \"a\": [\n    true,\n    null,\n    \"<script>alert(1)</script>\"\n  ]\n}\n"
	if o.stdout != want || o.res.ExitCode != 0 {
		t.Fatalf("stdout:\n%s\nwant:\n%s", o.stdout, want)
	}
	tree := artifact(t, o.res, "html").Data
	if strings.Contains(tree, "<script>alert") {
		t.Error("a string from the document reached the page unescaped")
	}
	if !strings.Contains(tree, "&lt;script&gt;") || !strings.Contains(tree, "<details") {
		t.Errorf("tree does not show the data:\n%s", tree)
	}
	// key order is kept as written
	if strings.Index(tree, `&#34;b&#34;`) > strings.Index(tree, `&#34;a&#34;`) {
		t.Error("key order changed")
	}
}

func TestJSONInvalidSaysWhere(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"{\n  \"a\": 1,\n  \"b\": tru\n}", "line 3, column 11"},
		{`{"a": 1,}`, "line 1, column 9"},
		{"[1, 2", "line 1, column 6: unexpected end of input"},
		{"", "line 1, column 1: unexpected end of input"},
		{`{"a":1} {"b":2}`, "line 1, column 9: unexpected data after the top-level value"},
		{"{\"é\": x}", "line 1, column 7"},
	} {
		o := render(t, JSON{}, "json", tc.src)
		if o.res.ExitCode != 1 || !strings.Contains(o.stderr, tc.want) {
			t.Errorf("%q: exit %d stderr %q; want %q", tc.src, o.res.ExitCode, o.stderr, tc.want)
		}
		if o.stdout != "" || len(o.res.Artifacts) != 0 {
			t.Errorf("%q: invalid JSON produced output", tc.src)
		}
	}
}

func TestXML(t *testing.T) {
	o := render(t, XML{}, "xml", `<?xml version="1.0"?><root a="1"><item>x &amp; &lt;y&gt;</item><!-- c --></root>`)
	if o.res.ExitCode != 0 || !strings.Contains(o.stdout, "root element <root>") {
		t.Fatalf("%+v %q %q", o.res, o.stdout, o.stderr)
	}
	tree := artifact(t, o.res, "html").Data
	if !strings.Contains(tree, "x &amp; &lt;y&gt;") {
		t.Errorf("text not escaped in tree:\n%s", tree)
	}
	for _, tc := range []struct{ src, want string }{
		{"<a>\n<b></a>", "line 2"},
		{"<a></a><b></b>", "more than one root element"},
		{"just text", "no root element"},
		{"<a x=1></a>", "invalid XML at line 1"},
	} {
		o := render(t, XML{}, "xml", tc.src)
		if o.res.ExitCode != 1 || !strings.Contains(o.stderr, tc.want) {
			t.Errorf("%q: exit %d stderr %q; want %q", tc.src, o.res.ExitCode, o.stderr, tc.want)
		}
	}
}

func TestSVG(t *testing.T) {
	svg := `<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>`
	o := render(t, XML{SVGOnly: true}, "svg", svg)
	if a := artifact(t, o.res, "svg"); a.Data != svg || a.MIME != "image/svg+xml" {
		t.Errorf("%+v", a)
	}
	// xml that happens to be SVG gets both views
	o = render(t, XML{}, "xml", svg)
	artifact(t, o.res, "svg")
	artifact(t, o.res, "html")
	o = render(t, XML{SVGOnly: true}, "svg", "<html></html>")
	if o.res.ExitCode != 1 || !strings.Contains(o.stderr, "root element is <html>") {
		t.Errorf("%q", o.stderr)
	}
}

func TestCSS(t *testing.T) {
	o := render(t, CSS{}, "css", "body { color: red; }\n/* } */ a::after { content: \"}\"; }")
	page := artifact(t, o.res, "html").Data
	if o.res.ExitCode != 0 || !strings.Contains(page, "color: red") || !strings.Contains(page, "<button") {
		t.Fatalf("%+v %q", o.res, o.stderr)
	}
	o = render(t, CSS{}, "css", "</style><script>alert(1)</script>{}")
	if strings.Contains(artifact(t, o.res, "html").Data, "</style><script>") {
		t.Error("stylesheet closed its <style> element")
	}
	for _, tc := range []struct{ src, want string }{
		{"a { color: red;\nb { }", `line 1, column 3: '{' is never closed`},
		{"a { }\n}", `line 2, column 1: unexpected '}'`},
		{"/* open", "comment is not closed"},
		{"a { content: \"x; }", "string is not closed"},
	} {
		o := render(t, CSS{}, "css", tc.src)
		if o.res.ExitCode != 1 || !strings.Contains(o.stderr, tc.want) {
			t.Errorf("%q: stderr %q; want %q", tc.src, o.stderr, tc.want)
		}
	}
}

func TestHTMLIsReturnedAsIs(t *testing.T) {
	o := render(t, HTML{}, "html", "<h1>hi</h1>")
	if a := artifact(t, o.res, "html"); a.Data != "<h1>hi</h1>" || a.MIME != "text/html" {
		t.Errorf("%+v", a)
	}
}

func TestCompiledCodeIsHighlightedAndSaysNotRun(t *testing.T) {
	for _, lang := range []string{"c", "cpp", "go", "rust", "java", "csharp", "kotlin"} {
		o := render(t, Code{}, lang, "int main() { return \"<b>\"; }\n")
		page := artifact(t, o.res, "html").Data
		if strings.Contains(page, "<b>") || !strings.Contains(page, "&lt;b&gt;") {
			t.Errorf("%s: source not escaped", lang)
		}
		if len(o.res.Notes) != 1 || !strings.Contains(o.res.Notes[0], "not compiled or run") {
			t.Errorf("%s: notes %v", lang, o.res.Notes)
		}
	}
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `[`, `"\u00e9"`, "{\"a\":1}\n{", "1e999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		var so, se bytes.Buffer
		res, err := JSON{}.Run(context.Background(), &runcode.Request{Code: src, Lang: "json", Stdout: &so, Stderr: &se})
		if err != nil {
			t.Fatalf("engine error on %q: %v", src, err)
		}
		if (res.ExitCode == 0) == (se.Len() > 0) {
			t.Fatalf("exit %d with stderr %q", res.ExitCode, se.String())
		}
	})
}

func FuzzXML(f *testing.F) {
	for _, s := range []string{`<a b="c">d</a>`, `<svg/>`, `<a>`, `<!-- -->`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		var so, se bytes.Buffer
		res, err := XML{}.Run(context.Background(), &runcode.Request{Code: src, Lang: "xml", Stdout: &so, Stderr: &se})
		if err != nil {
			t.Fatalf("engine error on %q: %v", src, err)
		}
		if (res.ExitCode == 0) == (se.Len() > 0) {
			t.Fatalf("exit %d with stderr %q", res.ExitCode, se.String())
		}
	})
}
