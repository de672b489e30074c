package app

import (
	"context"

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// PythonChain builds run_code's Python tiers in order: the embedded CPython
// (a resident worker per session; a stand-in that is never available in a
// -tags slim build), the python3 of the session's rootfs (for sessions
// that have one; a resident worker per session too, in every build, then
// once per run if that worker cannot start), the system python3, and the
// gpython subset. The two worker engines are
// returned too, so that the session manager can call their Reset/Stop and
// the App can Close them.
func PythonChain(dataDir string, sb *sandbox.Sandbox, opts *python.EmbeddedOptions) ([]runcode.Engine, *python.Embedded, *python.RootfsWorker) {
	emb := python.NewEmbedded(dataDir, sb, opts)
	m := rootfs.New(rootfs.DirIn(dataDir))
	rfs := python.NewRootfsWorker(dataDir, sb, m, opts)
	// After the rootfs's worker, the rootfs's python3 once per run: when
	// the worker cannot start there, the code still runs in the rootfs.
	once := python.NewRootfs(sb, m)
	return []runcode.Engine{emb, rfs, once, python.NewSystem(sb), python.NewGPython(sb)}, emb, rfs
}

// resetPython gives session s a fresh interpreter in whichever worker
// engine runs its Python.
func (a *App) resetPython(ctx context.Context, s *session.Session) error {
	if s.Rootfs != "" {
		return a.PythonRootfs.Reset(ctx, s.ID)
	}
	return a.Python.Reset(ctx, s.ID)
}

// stopPython ends the Python workers of session id (destroyed).
func (a *App) stopPython(id string) {
	a.Python.Stop(id)
	a.PythonRootfs.Stop(id)
}
