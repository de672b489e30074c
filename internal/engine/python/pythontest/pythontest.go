// Package pythontest names the embedded Python that the tests of every
// package share, so that a test process does not extract and byte-compile
// the interpreter again (seconds of CPU). Processes that prepare it at the
// same moment are safe: the engine's preparation holds its flocks
// (internal/flock) and renames each finished tree into place whole.
package pythontest

import (
	"os"
	"path/filepath"

	"github.com/quro-dev/quro/internal/engine/python"
)

// Env names the shared install root instead of <tmp>/quro-test-python:
// the fuzz run (test/fuzz/run.sh) gives its targets a temporary directory
// of their own, removed after each, and keeps the interpreter where the
// tests find it.
const Env = "QURO_TEST_PYTHON"

// Root is the shared install root: $QURO_TEST_PYTHON, else
// <tmp>/quro-test-python.
func Root() string {
	if d := os.Getenv(Env); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "quro-test-python")
}

// Options are the engine options of a test's App: the shared install root.
func Options() *python.EmbeddedOptions {
	return &python.EmbeddedOptions{InstallRoot: Root()}
}
