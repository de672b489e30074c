package python

import (
	"github.com/quro-dev/quro/internal/sandbox"
)

// Where every box shows the embedded interpreter's directories
// (sandbox.Options.Places, BoxPlaces): mounted there read-only, not at
// their host paths, so that what the session's code reads of its Python
// (sys.executable, sys.prefix, sys.path, tracebacks into the standard
// library, pip's location, the worker module's __file__) names box
// paths only. Without a box (minimal isolation) they keep their host
// paths.
const (
	BoxTree   = sandbox.RunDir + "/python" // the interpreter's tree
	BoxPip    = sandbox.RunDir + "/pip"    // pip's directory (PipDir)
	BoxWorker = sandbox.RunDir + "/worker" // the worker module's directory
)

// boxPath is where a run of sb sees the host path p: its place when sb's
// runs start in a box and p is beneath one of its places, else p.
func boxPath(sb *sandbox.Sandbox, p string) string {
	at, _ := sb.BoxPath(p)
	return at
}
