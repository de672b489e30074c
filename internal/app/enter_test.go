package app

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
)

// TestEveryCapabilityNamingASessionEntersIt: a capability whose input has
// a session field declares how it uses that session (InSession), so the
// controller enters it — on every access path — before the handler runs.
// get_audit_log's session is a filter of the log, not a session it uses.
func TestEveryCapabilityNamingASessionEntersIt(t *testing.T) {
	a := newApp(t, nil)
	filters := map[string]bool{"get_audit_log": true}
	n := 0
	for _, c := range a.Controller.Registry().List() {
		_, names := c.InputSchema.Properties["session"]
		switch {
		case names && !filters[c.Name] && c.Use == capability.UseNone:
			t.Errorf("%s names a session but does not declare how it uses it (InSession)", c.Name)
		case (!names || filters[c.Name]) && c.Use != capability.UseNone:
			t.Errorf("%s declares InSession(%s) but its input names no session", c.Name, c.Use)
		case c.Use != capability.UseNone:
			n++
		}
	}
	if n < 40 {
		t.Errorf("only %d capabilities enter a session", n)
	}
}

// TestNoHandlerEntersASessionByHand: the package's non-test code never
// looks a caller's session up (Sessions.Get) nor enters one
// (Life.EnterSession): the controller does, from the capability's
// declaration. The exceptions: the status's default session, and
// get_audit_log's session filter (audit.go), which names one of the
// caller's sessions to pick its entries and uses nothing of it (the
// registry test above lists it as a filter).
func TestNoHandlerEntersASessionByHand(t *testing.T) {
	lookups := map[string]bool{"audit.go": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "Sessions" && sel.Sel.Name == "Get" && !lookups[f] ||
				sel.Sel.Name == "EnterSession" {
				t.Errorf("%s: %s enters a session by hand; declare the capability InSession instead", fset.Position(n.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
}
