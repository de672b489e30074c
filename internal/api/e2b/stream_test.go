package e2b_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestAccessPathImportsNoDomainPackage: internal/api/e2b reaches the
// domain only through the controller (capability calls): it imports no
// domain package, only the controller, the capability types, the REST
// error table and runcode's context hooks (WithOutput, WithStarted).
func TestAccessPathImportsNoDomainPackage(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const internal = "github.com/quro-dev/quro/internal/"
	allowed := map[string]bool{"capability": true, "controller": true, "runcode": true, "api/rest": true, "version": true}
	for _, imp := range pkg.Imports {
		rest, ok := strings.CutPrefix(imp, internal)
		if !ok || allowed[rest] || strings.HasPrefix(rest, "api/e2b/") {
			continue
		}
		t.Errorf("internal/api/e2b imports %s: an access path calls capabilities through the controller, never a domain package", imp)
	}
}
