// This file is the system tier of the Python chain: the host's python3, run
// once per call under the sandbox.

package python

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/quro-dev/quro/internal/limitbuf"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// System runs code with the python3 found in the sandbox PATH, as
// `python3 -I -u -` with the code on stdin: no argument-size limit, no
// temporary file, and input() meets end-of-file instead of hanging.
type System struct {
	sb *sandbox.Sandbox
}

// NewSystem returns the system-python3 engine.
func NewSystem(sb *sandbox.Sandbox) *System { return &System{sb: sb} }

// Name implements runcode.Engine.
func (s *System) Name() string { return "python/system" }

// Probe finds python3 and checks that it starts. The check is the
// server's own run of the host's python3 (no user code), so it goes
// through sandbox.RunHelper like every program the server runs for
// itself: its process group is killed as a whole when ctx ends. Its
// verdict is kept for the process, by the program's path (the server's
// PATH found it; nothing a session chose enters it): a Runner asks once
// per App, and a process that makes several Apps (a test binary) starts
// the host's python3 for it once. A probe that ctx cut short gives no
// verdict and is not kept.
func (s *System) Probe(ctx context.Context) error {
	path, err := s.sb.LookPath("python3")
	if err != nil {
		return fmt.Errorf("python3 not found (Debian: apt-get install python3): %w", err)
	}
	if v, ok := systemProbes.Load(path); ok {
		return v.(probeVerdict).err
	}
	out := &limitbuf.Buffer{Max: 4096}
	err = sandbox.RunHelper(ctx, &sandbox.Helper{Path: path, Args: []string{"-I", "-c", "import sys; print(sys.version.split()[0])"},
		Stdout: out, Stderr: out})
	if err != nil {
		err = fmt.Errorf("%s does not start: %v: %s", path, err, strings.TrimSpace(out.String()))
	}
	if ctx.Err() == nil {
		systemProbes.Store(path, probeVerdict{err})
	}
	return err
}

// systemProbes holds System.Probe's verdicts of this process by the
// python3's path.
var systemProbes sync.Map

// probeVerdict is one kept verdict (err nil: it starts).
type probeVerdict struct{ err error }

// Run implements runcode.Engine.
func (s *System) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if i := strings.IndexByte(req.Code, 0); i >= 0 {
		// Python reading a script from stdin would silently stop at the NUL;
		// say what Python says for source with NUL bytes instead.
		fmt.Fprintf(req.Stderr, "SyntaxError: source code cannot contain null bytes (first at line %d)\n", strings.Count(req.Code[:i], "\n")+1)
		return &runcode.Result{ExitCode: 1}, nil
	}
	spec := runcode.ProcessSpec(req, "python3", "-I", "-u", "-")
	spec.Stdin = strings.NewReader(req.Code)
	exit, err := s.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runcode.ExitResult(exit, req.Timeout), nil
}
