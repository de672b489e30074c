package render

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"html"
	"io"
	"strings"

	"github.com/quro-dev/quro/internal/runcode"
)

// CSS checks that a stylesheet's braces, comments and strings are balanced
// and returns a preview page applying it to a set of sample elements.
type CSS struct{}

// Shows implements runcode.Shower: the code is shown, not run.
func (CSS) Shows() {}

// Name is the engine's name in a run's result.
func (CSS) Name() string { return "render/css" }

// Probe reports the engine available: it is pure Go and needs nothing.
func (CSS) Probe(context.Context) error { return nil }

// Run previews req.Code on sample elements.
func (CSS) Run(_ context.Context, req *runcode.Request) (*runcode.Result, error) {
	if err := checkCSS(req.Code); err != nil {
		return userError(req.Stderr, "%s", err), nil
	}
	// A stylesheet cannot close the <style> element it is placed in.
	css := strings.ReplaceAll(req.Code, "</", `<\/`)
	return &runcode.Result{Artifacts: []runcode.Artifact{{
		Kind: "html", MIME: "text/html", Name: "preview.html",
		Data: "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>CSS preview</title><style>" +
			css + "</style></head><body>\n" + cssSamples + "\n</body></html>\n",
	}}}, nil
}

const cssSamples = `<header><nav><a href="#">Home</a> <a href="#">About</a></nav></header>
<main class="container">
<h1>Heading 1</h1><h2>Heading 2</h2><h3>Heading 3</h3>
<p>A paragraph with <a href="#">a link</a>, <strong>strong</strong>, <em>emphasis</em> and <code>code</code>.</p>
<blockquote>A quotation.</blockquote>
<ul><li>First item</li><li>Second item</li></ul><ol><li>One</li><li>Two</li></ol>
<div class="box card">A div with classes box and card</div>
<p><button>Button</button> <button class="primary">Primary</button> <button disabled>Disabled</button></p>
<form><label>Text <input type="text" placeholder="input"></label>
<label><input type="checkbox" checked> Check</label>
<select><option>Option</option></select><textarea>Textarea</textarea></form>
<table><thead><tr><th>Name</th><th>Value</th></tr></thead><tbody><tr><td>a</td><td>1</td></tr><tr><td>b</td><td>2</td></tr></tbody></table>
<pre>preformatted text</pre>
</main>
<footer>Footer</footer>`

// checkCSS finds unbalanced braces, parentheses, brackets, strings and
// comments, and reports the first with its line and column.
func checkCSS(src string) error {
	type open struct {
		ch  byte
		off int
	}
	var stack []open
	pair := map[byte]byte{'}': '{', ')': '(', ']': '['}
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				return cssErr(src, i, "comment is not closed")
			}
			i += end + 3
		case c == '"' || c == '\'':
			j := i + 1
			for ; j < len(src) && src[j] != c && src[j] != '\n'; j++ {
				if src[j] == '\\' {
					j++
				}
			}
			if j >= len(src) || src[j] != c {
				return cssErr(src, i, "string is not closed")
			}
			i = j
		case c == '{' || c == '(' || c == '[':
			stack = append(stack, open{c, i})
		case c == '}' || c == ')' || c == ']':
			if len(stack) == 0 || stack[len(stack)-1].ch != pair[c] {
				return cssErr(src, i, fmt.Sprintf("unexpected %q", c))
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		return cssErr(src, stack[len(stack)-1].off, fmt.Sprintf("%q is never closed", stack[len(stack)-1].ch))
	}
	return nil
}

func cssErr(src string, off int, msg string) error {
	line, col := lineCol(src, int64(off))
	return fmt.Errorf("invalid CSS at line %d, column %d: %s\n%s", line, col, msg, excerpt(src, line, col))
}

// XML validates an XML document and shows it as a tree; an SVG document is
// also returned as an image. With SVGOnly (lang svg) the root must be <svg>.
type XML struct {
	SVGOnly bool
}

// Shows implements runcode.Shower: the code is shown, not run.
func (XML) Shows() {}

// Name is the engine's name in a run's result.
func (x XML) Name() string {
	if x.SVGOnly {
		return "render/svg"
	}
	return "render/xml"
}

// Probe reports the engine available: it is pure Go and needs nothing.
func (XML) Probe(context.Context) error { return nil }

// Run checks req.Code as XML (SVG with SVGOnly) and shows its tree.
func (x XML) Run(_ context.Context, req *runcode.Request) (*runcode.Result, error) {
	tree, root, err := xmlTree(req.Code)
	if err != nil {
		return userError(req.Stderr, "%s", err), nil
	}
	isSVG := root.Local == "svg"
	res := &runcode.Result{}
	if x.SVGOnly && !isSVG {
		return userError(req.Stderr, "not an SVG image: the root element is <%s>, expected <svg>", root.Local), nil
	}
	if isSVG {
		res.Artifacts = append(res.Artifacts, runcode.Artifact{Kind: "svg", MIME: "image/svg+xml", Name: "image.svg", Data: req.Code})
	}
	if !x.SVGOnly {
		res.Artifacts = append(res.Artifacts, runcode.Artifact{Kind: "html", MIME: "text/html", Name: "tree.html",
			Data: page("XML", "", `<div class="tree">`+tree+`</div>`)})
		fmt.Fprintf(req.Stdout, "well-formed XML, root element <%s>\n", root.Local)
	}
	return res, nil
}

// xmlTree parses src strictly and renders its elements as nested <details>.
func xmlTree(src string) (string, xml.Name, error) {
	dec := xml.NewDecoder(strings.NewReader(src))
	dec.Strict = true
	var (
		b     strings.Builder
		root  xml.Name
		depth int
		roots int
	)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var se *xml.SyntaxError
			if errors.As(err, &se) {
				off := dec.InputOffset()
				line, col := lineCol(src, off)
				if se.Line > 0 && se.Line != line {
					line, col = se.Line, 1
				}
				return "", root, fmt.Errorf("invalid XML at line %d, column %d: %s\n%s", line, col, se.Msg, excerpt(src, line, col))
			}
			return "", root, fmt.Errorf("invalid XML: %v", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
				if roots > 1 {
					line, col := lineCol(src, dec.InputOffset())
					return "", root, fmt.Errorf("invalid XML at line %d, column %d: more than one root element", line, col)
				}
				root = t.Name
			}
			depth++
			b.WriteString(`<details open><summary>&lt;<span class="tag">` + html.EscapeString(qname(t.Name)) + "</span>")
			for _, a := range t.Attr {
				b.WriteString(` <span class="attr">` + html.EscapeString(qname(a.Name)) + `</span>=<span class="s">"` + html.EscapeString(a.Value) + `"</span>`)
			}
			b.WriteString("&gt;</summary>")
		case xml.EndElement:
			depth--
			b.WriteString("</details>")
		case xml.CharData:
			if s := strings.TrimSpace(string(t)); s != "" {
				b.WriteString("<div>" + html.EscapeString(s) + "</div>")
			}
		case xml.Comment:
			b.WriteString(`<div class="z">&lt;!--` + html.EscapeString(string(t)) + "--&gt;</div>")
		}
	}
	if roots == 0 {
		return "", root, errors.New("invalid XML: no root element")
	}
	return b.String(), root, nil
}

func qname(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	// encoding/xml resolves prefixes to namespace URLs; show the local name
	// for the common SVG/XHTML namespaces and the URL otherwise.
	switch n.Space {
	case "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xhtml":
		return n.Local
	}
	return n.Space + ":" + n.Local
}
