//go:build slim

package python

import (
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// embeddedInBuild: the slim build has no embedded Python.
const embeddedInBuild = false

// contractEmbedded is the slim build's stand-in, whose Probe fails with
// ErrNotInBuild: the contract suite skips it saying so.
func contractEmbedded(t *testing.T, sb *sandbox.Sandbox) *Embedded {
	return NewEmbedded(t.TempDir(), sb, nil)
}
