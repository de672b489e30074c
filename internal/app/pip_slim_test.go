//go:build slim

package app

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
)

// TestPipSlimBuild: a build without the embedded Python has no pip either;
// install_packages {manager: pip} says so and what to do (not an internal
// error to retry).
func TestPipSlimBuild(t *testing.T) {
	a := newApp(t, nil)
	_, err := call(t, a, "install_packages", InstallPackagesInput{Manager: "pip", Packages: []string{"six"}})
	if capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "-tags slim") || !strings.Contains(err.Error(), "python3-pip") {
		t.Fatalf("install_packages pip in a slim build: %v, want unavailable saying the build has no embedded Python and what to use", err)
	}
}
