package session

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneSpecBuilder: a run in a session is built from the session
// (Session.Spec, Session.Sandbox) and nowhere else: no non-test code
// outside this package and the sandbox scopes a run to a session by hand
// (sandbox.Sandbox.ForSession, or a sandbox.Spec literal that sets UID,
// Session or Binds).
func TestOneSpecBuilder(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	for _, root := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (strings.HasSuffix(p, "internal/session") || strings.HasSuffix(p, "internal/sandbox") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			n++
			ast.Inspect(f, func(node ast.Node) bool {
				switch x := node.(type) {
				case *ast.SelectorExpr:
					if x.Sel.Name == "ForSession" && !strings.Contains(p, "api/insession") {
						t.Errorf("%s: ForSession: build the session's runs with Session.Sandbox or Session.Spec", fset.Position(x.Pos()))
					}
				case *ast.CompositeLit:
					sel, ok := x.Type.(*ast.SelectorExpr)
					if !ok || sel.Sel.Name != "Spec" {
						return true
					}
					if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "sandbox" {
						return true
					}
					for _, e := range x.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							if k, ok := kv.Key.(*ast.Ident); ok && (k.Name == "UID" || k.Name == "Session" || k.Name == "Binds") {
								t.Errorf("%s: a sandbox.Spec scoped to a session by hand (%s): start from Session.Spec", fset.Position(kv.Pos()), k.Name)
							}
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n < 100 {
		t.Fatalf("scanned only %d files", n)
	}
}
