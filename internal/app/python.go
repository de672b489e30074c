package app

import (
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// PythonChain builds run_code's Python tiers in order: the embedded CPython
// (a resident worker per session; a stand-in that is never available in a
// -tags slim build), python3 in the session's rootfs (for sessions that
// have one), the system python3, and the gpython subset. The
// embedded engine is returned too, so that the session manager can call its
// Reset/Stop and the App can Close it.
func PythonChain(dataDir string, sb *sandbox.Sandbox, opts *python.EmbeddedOptions) ([]runcode.Engine, *python.Embedded) {
	emb := python.NewEmbedded(dataDir, sb, opts)
	rfs := python.NewRootfs(sb, rootfs.New(rootfs.DirIn(dataDir)))
	return []runcode.Engine{emb, rfs, python.NewSystem(sb), python.NewGPython(sb)}, emb
}
