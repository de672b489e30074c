// Package soak gates the soak tests: those whose property is a count of
// repetitions (10,000 commands leave no goroutine or file behind) rather
// than a behaviour, and that take minutes on a loaded machine. They run
// under `make test-soak`, which sets QURO_SOAK=1 and runs only tests named
// TestSoak*; `make test` skips them and runs a smaller count of the same
// check instead, so the property is still tested there.
package soak

import (
	"os"
	"testing"
)

// Env is the environment variable that enables the soak tests.
const Env = "QURO_SOAK"

// Enabled reports whether the soak tests run (QURO_SOAK is set).
func Enabled() bool { return os.Getenv(Env) != "" }

// Skip skips t unless QURO_SOAK is set; a soak test calls it first.
func Skip(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skip("soak test: run by make test-soak (QURO_SOAK=1)")
	}
}
