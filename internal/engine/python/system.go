// This file is the system tier of the Python chain: the host's python3, run
// once per call under the sandbox.

package python

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

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

// Probe finds python3 and checks that it starts.
func (s *System) Probe(ctx context.Context) error {
	path, err := s.sb.LookPath("python3")
	if err != nil {
		return fmt.Errorf("python3 not found (Debian: apt-get install python3): %w", err)
	}
	out, err := exec.CommandContext(ctx, path, "-I", "-c", "import sys; print(sys.version.split()[0])").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s does not start: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

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
