// This file is tier 2 of the Python chain (SPEC §2): python3 inside the
// session's Debian rootfs (see internal/rootfs), run once per call under
// the sandbox with the rootfs's userland in place of the host's.

package python

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// ErrNoRootfs is the engine-level failure of a session that runs on the
// host userland: the chain goes on to the next tier.
var ErrNoRootfs = errors.New("the session has no rootfs (create it with --rootfs NAME)")

// Rootfs runs code with the python3 of the session's rootfs, as
// `python3 -I -u -` with the code on stdin, like System.
type Rootfs struct {
	sb *sandbox.Sandbox
	m  *rootfs.Manager
}

// NewRootfs returns the rootfs-python3 engine over the rootfs directories
// of m.
func NewRootfs(sb *sandbox.Sandbox, m *rootfs.Manager) *Rootfs { return &Rootfs{sb: sb, m: m} }

// Name implements runcode.Engine.
func (r *Rootfs) Name() string { return "python/rootfs" }

// Probe reports the engine available when the sandbox can show a rootfs
// (a bubblewrap box). Whether the session's rootfs is installed is checked
// on every run instead: the runner probes an engine only once, and a rootfs
// installed while the server runs must be used without a restart.
func (r *Rootfs) Probe(ctx context.Context) error {
	if !r.sb.Boxed() {
		return errors.New("needs the bubblewrap box to show a rootfs (Debian: apt-get install bubblewrap)")
	}
	return nil
}

// Run implements runcode.Engine. A session without a rootfs, or whose
// rootfs is not installed, is an engine-level failure, so that the chain
// falls through to the host's python3.
func (r *Rootfs) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	name := req.Session.Rootfs
	if name == "" {
		return nil, ErrNoRootfs
	}
	if !r.m.Ready(name) {
		return nil, fmt.Errorf("rootfs %q is not installed (quro rootfs install %s)", name, name)
	}
	if i := strings.IndexByte(req.Code, 0); i >= 0 {
		fmt.Fprintf(req.Stderr, "SyntaxError: source code cannot contain null bytes (first at line %d)\n", strings.Count(req.Code[:i], "\n")+1)
		return &runcode.Result{ExitCode: 1}, nil
	}
	spec := runcode.ProcessSpec(req, "python3", "-I", "-u", "-")
	spec.Rootfs = r.m.Path(name)
	spec.Stdin = strings.NewReader(req.Code)
	exit, err := r.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	res := runcode.ExitResult(exit, req.Timeout)
	res.Notes = append(res.Notes, "ran in rootfs "+name)
	return res, nil
}
