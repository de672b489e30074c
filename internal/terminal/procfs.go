package terminal

import (
	"strings"

	"github.com/quro-dev/quro/internal/sandbox"
)

func inside(p, dir string) bool {
	return p != "" && (p == dir || strings.HasPrefix(p, dir+"/"))
}

// killProc kills a sandboxed process and its process group (the sandbox
// owns how).
func killProc(p *sandbox.Process) { p.Kill() }
