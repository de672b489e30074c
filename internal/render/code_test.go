package render

import (
	"reflect"
	"testing"

	"github.com/alecthomas/chroma/v2"
	"github.com/alecthomas/chroma/v2/lexers"
	"github.com/alecthomas/chroma/v2/styles"
)

// The languages and aliases of internal/engine/toolchain's table: the
// ones that reach Code (a run_code language Quro shows when the session's
// userland has no toolchain for it).
var toolchainLangs = []string{"c", "h", "cpp", "c++", "cxx", "cc", "hpp", "java", "kotlin", "kt", "go", "golang",
	"rust", "rs", "csharp", "cs", "c#", "swift", "scala", "zig", "haskell", "hs", "dart", "objc", "objective-c",
	"fortran", "f90", "pascal", "ruby", "rb", "php", "perl", "pl", "lua", "r", "rscript", "julia", "jl"}

// A sample with what most lexers tell apart: comments, strings (Go's raw
// string is lexed as a template), numbers, keywords, calls, operators.
const lexSample = "// a comment\n/* block */ # hash\npackage main\nimport \"fmt\"\nfunc main() {\n\tx := `raw {{.A}}` + \"s\\\"q\" + 'c'\n" +
	"\tfor i := 0; i < 0x1F; i++ { fmt.Println(i * 2.5e3, x) }\n\treturn nil\n}\nclass A < B; def f(x) = x end\n"

// TestLexersResolveAsChroma: the registry Code builds on first use (from
// chroma's definitions copied in chroma/, so that no quro process parses
// all of chroma's at start) gives every toolchain language the lexer that
// chroma's own registry gives, and that lexer tokenises alike. A chroma
// upgrade that changes a definition fails here: copy the files again.
func TestLexersResolveAsChroma(t *testing.T) {
	t.Parallel()
	h := highlighting()
	for _, lang := range toolchainLangs {
		name := lang
		if n, ok := lexerNames[name]; ok {
			name = n
		}
		ours, theirs := h.lexers.Get(name), lexers.Get(name)
		if ours == nil || theirs == nil {
			if ours != theirs {
				t.Errorf("%s: ours %v, chroma's %v", lang, ours, theirs)
			}
			continue
		}
		if ours.Config().Name != theirs.Config().Name {
			t.Errorf("%s: lexer %q; chroma's %q", lang, ours.Config().Name, theirs.Config().Name)
			continue
		}
		if a, b := tokens(t, ours), tokens(t, theirs); !reflect.DeepEqual(a, b) {
			t.Errorf("%s (%s): %d tokens differ from chroma's %d", lang, ours.Config().Name, len(a), len(b))
		}
	}
	if a, b := tokens(t, h.fallback), tokens(t, lexers.Fallback); !reflect.DeepEqual(a, b) {
		t.Errorf("fallback: tokens differ from chroma's")
	}
	github := styles.Get("github")
	if github.Name != "github" || h.style.Name != github.Name {
		t.Errorf("style %q; chroma's %q", h.style.Name, github.Name)
	}
	for _, tt := range append(h.style.Types(), github.Types()...) {
		if h.style.Get(tt) != github.Get(tt) {
			t.Errorf("github style: %s is %v; chroma's %v", tt, h.style.Get(tt), github.Get(tt))
		}
	}
}

func tokens(t *testing.T, l chroma.Lexer) []chroma.Token {
	t.Helper()
	it, err := chroma.Coalesce(l).Tokenise(nil, lexSample)
	if err != nil {
		t.Fatalf("%s: %v", l.Config().Name, err)
	}
	return it.Tokens()
}
