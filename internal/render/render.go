// Package render holds run_code's rendering engines: languages that are
// shown rather than executed (HTML, JSON, CSS, XML, SVG) and source code of
// compiled languages, highlighted but not run. Each engine is pure Go and
// starts no process; the HTML it produces escapes every piece of input text.
package render

import (
	"context"
	"fmt"
	"html"
	"io"
	"strings"

	"github.com/quro-dev/quro/internal/runcode"
)

// page wraps body in a small standalone HTML document.
func page(title, style, body string) string {
	return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + html.EscapeString(title) +
		"</title><style>" + baseStyle + style + "</style></head><body>\n" + body + "\n</body></html>\n"
}

const baseStyle = `body{font:14px/1.45 system-ui,sans-serif;margin:12px;color:#1f2328}
.tree,.tree details{margin-left:1em}.tree summary{cursor:pointer}
.k{color:#0550ae}.s{color:#0a3069}.n{color:#953800}.b{color:#8250df}.z{color:#6e7781}
.tag{color:#116329}.attr{color:#0550ae}`

// userError reports a problem with the user's input as a normal result:
// the message on stderr and exit code 1.
func userError(w io.Writer, format string, a ...any) *runcode.Result {
	fmt.Fprintf(w, format+"\n", a...)
	return &runcode.Result{ExitCode: 1}
}

// lineCol converts a byte offset in src to 1-based line and column (in runes).
func lineCol(src string, off int64) (line, col int) {
	if off > int64(len(src)) {
		off = int64(len(src))
	}
	before := src[:off]
	line = strings.Count(before, "\n") + 1
	lineStart := strings.LastIndexByte(before, '\n') + 1
	col = len([]rune(before[lineStart:])) + 1
	return line, col
}

// excerpt shows the source line with a caret under the column.
func excerpt(src string, line, col int) string {
	lines := strings.Split(src, "\n")
	if line < 1 || line > len(lines) {
		return ""
	}
	l := lines[line-1]
	r := []rune(l)
	if len(r) > 120 {
		start := max(0, col-60)
		end := min(len(r), start+120)
		r = r[start:end]
		col -= start
	}
	return "  " + string(r) + "\n  " + strings.Repeat(" ", max(0, col-1)) + "^"
}

// HTML returns the given page as an artifact.
type HTML struct{}

// Shows implements runcode.Shower: the code is shown, not run.
func (HTML) Shows() {}

// Name is the engine's name in a run's result.
func (HTML) Name() string { return "render/html" }

// Probe reports the engine available: it is pure Go and needs nothing.
func (HTML) Probe(context.Context) error { return nil }

// Run returns req.Code as an HTML artifact.
func (HTML) Run(_ context.Context, req *runcode.Request) (*runcode.Result, error) {
	return &runcode.Result{Artifacts: []runcode.Artifact{{
		Kind: "html", MIME: "text/html", Name: "page.html", Data: req.Code,
	}}}, nil
}
