package render

import (
	"context"
	"fmt"
	"strings"

	"github.com/alecthomas/chroma/v2"
	chtml "github.com/alecthomas/chroma/v2/formatters/html"
	"github.com/alecthomas/chroma/v2/lexers"
	"github.com/alecthomas/chroma/v2/styles"

	"github.com/quro-dev/quro/internal/runcode"
)

// Code shows source of a language Quro does not run as a syntax-highlighted
// page, and says plainly that it was not run.
type Code struct{}

// Shows implements runcode.Shower: the code is shown, not run.
func (Code) Shows() {}

// Name is the engine's name in a run's result.
func (Code) Name() string { return "render/code" }

// Probe reports the engine available: it is pure Go and needs nothing.
func (Code) Probe(context.Context) error { return nil }

// lexerNames maps run_code language names to chroma lexer names.
var lexerNames = map[string]string{
	"cpp": "c++", "csharp": "c#", "objc": "objective-c",
}

// Run renders req.Code, in req.Lang, as a highlighted page.
func (Code) Run(_ context.Context, req *runcode.Request) (*runcode.Result, error) {
	name := req.Lang
	if n, ok := lexerNames[name]; ok {
		name = n
	}
	lexer := lexers.Get(name)
	if lexer == nil {
		lexer = lexers.Fallback
	}
	lexer = chroma.Coalesce(lexer)
	it, err := lexer.Tokenise(nil, req.Code)
	if err != nil {
		return nil, fmt.Errorf("highlight %s: %w", req.Lang, err)
	}
	var b strings.Builder
	f := chtml.New(chtml.Standalone(true), chtml.WithLineNumbers(true), chtml.TabWidth(4))
	if err := f.Format(&b, styles.Get("github"), it); err != nil {
		return nil, fmt.Errorf("highlight %s: %w", req.Lang, err)
	}
	lines := strings.Count(strings.TrimRight(req.Code, "\n"), "\n") + 1
	return &runcode.Result{
		Notes: []string{fmt.Sprintf("%s code was not compiled or run: Quro shows it highlighted (%d lines); the next note says why.", req.Lang, lines)},
		Artifacts: []runcode.Artifact{{
			Kind: "html", MIME: "text/html", Name: "code.html", Data: b.String(),
		}},
	}, nil
}
