//go:build !slim

package python

import (
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// embeddedInBuild: this build has the embedded Python, so its contract
// must run.
const embeddedInBuild = true

// contractEmbedded is the package tests' shared embedded engine (extracted
// once per test binary by TestMain).
func contractEmbedded(t *testing.T, _ *sandbox.Sandbox) *Embedded { return testEng }
