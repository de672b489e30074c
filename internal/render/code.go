package render

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/alecthomas/chroma/v2"
	chtml "github.com/alecthomas/chroma/v2/formatters/html"

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
	lexer := highlighting().lexers.Get(name)
	if lexer == nil {
		lexer = highlighting().fallback
	}
	lexer = chroma.Coalesce(lexer)
	it, err := lexer.Tokenise(nil, req.Code)
	if err != nil {
		return nil, fmt.Errorf("highlight %s: %w", req.Lang, err)
	}
	var b strings.Builder
	f := chtml.New(chtml.Standalone(true), chtml.WithLineNumbers(true), chtml.TabWidth(4))
	if err := f.Format(&b, highlighting().style, it); err != nil {
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

// chromaFS holds chroma's definitions of the lexers and the style that
// pages use (chroma/README.md).
//
//go:embed chroma/lexers/*.xml chroma/styles/github.xml
var chromaFS embed.FS

type highlighter struct {
	lexers   *chroma.LexerRegistry
	fallback chroma.Lexer
	style    *chroma.Style
}

// highlighting is built on the first highlighted page, not in package
// initialisation: chroma's own lexers and styles packages parse every
// definition they have when a process starts, and every quro process that
// runs the whole initialisation (each CLI command, and in a box the esbuild
// child of each TS/JS transform and the pip, apt-get and sudo stand-ins)
// would pay that for a page only the server renders.
var highlighting = sync.OnceValue(func() *highlighter {
	reg := chroma.NewLexerRegistry()
	paths, err := fs.Glob(chromaFS, "chroma/lexers/*.xml")
	if err != nil {
		panic(err)
	}
	var goTemplate chroma.Lexer
	for _, path := range paths {
		l := chroma.MustNewXMLLexer(chromaFS, path)
		if path == "chroma/lexers/go_template.xml" {
			// Go's raw strings are lexed as a text template, as in chroma.
			goTemplate = l.SetConfig(&chroma.Config{Name: "Go Text Template", Aliases: []string{"go-text-template"}})
		}
		reg.Register(l)
	}
	reg.Register(goLexer(goTemplate))
	f, err := chromaFS.Open("chroma/styles/github.xml")
	if err != nil {
		panic(err)
	}
	defer f.Close()
	return &highlighter{
		lexers: reg,
		// chroma's lexers.Fallback.
		fallback: chroma.MustNewLexer(&chroma.Config{Name: "fallback", Filenames: []string{"*"}, Priority: -1}, func() chroma.Rules {
			return chroma.Rules{"root": []chroma.Rule{{Pattern: `.+`, Type: chroma.Text}, {Pattern: `\n`, Type: chroma.Text}}}
		}),
		style: chroma.MustNewXMLStyle(f),
	}
})
