// This file is tier 2 of the Python chain (docs/architecture.md, "The
// Python worker"): python3 inside the session's Debian rootfs (see
// internal/rootfs), with the rootfs's userland in place of the host's: as a
// resident worker per session for run_code (RootfsWorker), and once per
// call for python_run (Rootfs.RunIn).

package python

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// ErrNoRootfs is the engine-level failure of a session that runs on the
// host userland: the chain goes on to the next tier.
var ErrNoRootfs = errors.New("the session has no rootfs (create it with --rootfs NAME)")

// Rootfs runs code with the python3 of the session's rootfs, as
// `python3 -I -u -` with the code on stdin, like System: one process per
// run, no state. It is python_run's path (RunIn), and run_code's tier after
// RootfsWorker: a rootfs whose python3 cannot run the worker (one older
// than the worker needs, or whose user site breaks its start) still runs
// the code in the rootfs rather than on the host's python3.
type Rootfs struct {
	sb *sandbox.Sandbox
	m  *rootfs.Manager
}

// NewRootfs returns the rootfs-python3 engine over the rootfs directories
// of m.
func NewRootfs(sb *sandbox.Sandbox, m *rootfs.Manager) *Rootfs { return &Rootfs{sb: sb, m: m} }

// Name implements runcode.Engine.
func (r *Rootfs) Name() string { return "python/rootfs-oneshot" }

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
	res, err := r.RunIn(ctx, name, req, ViaStdin)
	if err != nil {
		return nil, err
	}
	res.Notes = append(res.Notes, "ran in rootfs "+name)
	return res, nil
}

// Via is how RunIn hands the code to python3.
type Via int

const (
	// ViaStdin runs `python3 -I -u -` with the code on stdin: no size
	// limit, and input() meets end-of-file (run_code).
	ViaStdin Via = iota
	// ViaArg runs `python3 -I -u -c CODE`: the code is one argument, so
	// the kernel limits it to 128 KiB (python_run's documented form).
	ViaArg
)

// RunIn runs req.Code with the python3 of the rootfs name, which the
// caller has found ready (it need not be the session's own: python_run
// falls back to "default"), in req.Session's box: its workspace as working
// directory and HOME, its tmp directory, variables, network policy, uid and
// binds, with the rootfs's userland in place of the host's. The output goes
// to req's writers; ctx bounds the run (req.Timeout is the budget it
// reports). How the process ended becomes a runcode.Result by
// runcode.ExitResult (timeout, cancel, memory limit, signal); the error is
// the sandbox's, e.g. a *sandbox.StartError when python3 cannot start.
//
// This is the one way code runs on a rootfs's python3: run_code's tier 2
// (Run) and python_run both come here.
func (r *Rootfs) RunIn(ctx context.Context, name string, req *runcode.Request, via Via) (*runcode.Result, error) {
	if res := refuseNUL(req); res != nil {
		// Python would stop reading a script on stdin at the NUL, and an
		// argument cannot carry one.
		return res, nil
	}
	var spec *sandbox.Spec
	if via == ViaArg {
		spec = runcode.ProcessSpec(req, "python3", "-I", "-u", "-c", req.Code)
	} else {
		spec = runcode.ProcessSpec(req, "python3", "-I", "-u", "-")
		spec.Stdin = strings.NewReader(req.Code)
	}
	spec.Rootfs = r.m.Path(name)
	exit, err := r.sb.Run(ctx, spec)
	if err != nil {
		return nil, err
	}
	return runcode.ExitResult(exit, req.Timeout), nil
}

// refuseNUL answers a run whose code has a NUL byte as Python 3.12+ does
// (3.11's compile says "source code string cannot contain null bytes",
// a ValueError), or returns nil.
func refuseNUL(req *runcode.Request) *runcode.Result {
	i := strings.IndexByte(req.Code, 0)
	if i < 0 {
		return nil
	}
	fmt.Fprintf(req.Stderr, "SyntaxError: source code cannot contain null bytes (first at line %d)\n", strings.Count(req.Code[:i], "\n")+1)
	return &runcode.Result{ExitCode: 1}
}

// rootfsPython is the interpreter of a rootfs session: Debian's python3.
const rootfsPython = "/usr/bin/python3"

// hasPython reports whether the rootfs at dir has rootfsPython, resolving
// its links as the box does (rootfs.Stat).
func hasPython(dir string) bool {
	fi, err := rootfs.Stat(dir, rootfsPython)
	return err == nil && fi.Mode().IsRegular()
}

// RootfsWorker is run_code's tier 2: the python3 of the session's rootfs as
// a resident worker per session, through the same protocol and pool as the
// embedded CPython (state kept between runs, a timeout interrupts with
// KeyboardInterrupt and keeps the state, display() artifacts, code
// contexts, idle stop, Reset). The worker runs in the session's box with
// the rootfs's userland, site enabled (Debian's dist-packages, apt's
// python3-* packages, and the user site under HOME, the workspace, where
// pip --user installs) and the environment's PYTHON* variables ignored
// (-E; the processes it starts see them). The worker module comes from
// its own read-only directory (ensureWorkerDir). No spares: a rootfs
// session's worker starts on its first run.
type RootfsWorker struct {
	pool
	m    *rootfs.Manager
	root string // the worker module goes under root/python

	dirMu sync.Mutex
	dir   string // the worker module's directory, once written
}

// NewRootfsWorker returns the rootfs tier over the rootfs directories of
// m, keeping its worker module under dataDir (or opts.InstallRoot, as the
// embedded interpreter). opts may be nil; NoSpare is implied.
func NewRootfsWorker(dataDir string, sb *sandbox.Sandbox, m *rootfs.Manager, opts *EmbeddedOptions) *RootfsWorker {
	o := opts.withDefaults(sb)
	o.NoSpare = true
	r := &RootfsWorker{pool: newPool(sb, o, "the rootfs Python engine"), m: m, root: cmp.Or(o.InstallRoot, dataDir)}
	r.startFor = r.start
	return r
}

// Name implements runcode.Engine.
func (r *RootfsWorker) Name() string { return "python/rootfs" }

// Probe implements runcode.Engine, as Rootfs.Probe: the session's rootfs
// is checked on every run.
func (r *RootfsWorker) Probe(ctx context.Context) error {
	if !r.sb.Boxed() {
		return errors.New("needs the bubblewrap box to show a rootfs (Debian: apt-get install bubblewrap)")
	}
	return nil
}

// Run implements runcode.Engine (and, with DropContext, ContextEngine). A
// session without a rootfs, whose rootfs is not installed, or whose rootfs
// has no python3, is an engine-level failure, so that the chain falls
// through to the host's python3.
func (r *RootfsWorker) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if req.Session == nil {
		return nil, errors.New("no session")
	}
	name := req.Session.Rootfs
	if name == "" {
		return nil, ErrNoRootfs
	}
	if !r.m.Ready(name) {
		return nil, fmt.Errorf("rootfs %q is not installed (quro rootfs install %s)", name, name)
	}
	if res := refuseNUL(req); res != nil {
		return res, nil
	}
	if !hasPython(r.m.Path(name)) {
		return nil, fmt.Errorf("rootfs %q has no %s (install_packages python3 adds it)", name, rootfsPython)
	}
	return r.run(ctx, req)
}

// Prestart starts the worker of sess, a session on a rootfs that has
// python3, in the background (see Embedded.Prestart); nothing happens for
// another session.
func (r *RootfsWorker) Prestart(sess *session.Session) {
	if sess.Rootfs == "" || !r.m.Ready(sess.Rootfs) || !hasPython(r.m.Path(sess.Rootfs)) {
		return
	}
	r.prestart(sess, nil)
}

// Close stops every worker and waits for them.
func (r *RootfsWorker) Close() error {
	r.close(nil)
	return nil
}

// start starts sess's worker in its box.
func (r *RootfsWorker) start(ctx context.Context, sess *session.Session) (*worker, error) {
	dir, err := r.workerDir(ctx)
	if err != nil {
		return nil, err
	}
	cfg := workerConfig{
		python: rootfsPython,
		// Not -I (-s: no user site; -S: no site at all, so no
		// dist-packages): -E only, the environment's PYTHONPATH,
		// PYTHONHOME, PYTHONSTARTUP... do not reach the worker.
		flags:     []string{"-E", "-u", "-X", "utf8"},
		rootfs:    r.m.Path(sess.Rootfs),
		readOnly:  []string{dir},
		workerDir: dir, limits: r.opts.Limits, drain: r.opts.DrainGrace,
	}
	return startWorker(ctx, r.ctx, r.sb.ForSession(sess.ID, sess.UID, sess.Binds()), cfg, false,
		sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env, sess.Network)
}

// workerDir writes the worker module once (see ensureWorkerDir).
func (r *RootfsWorker) workerDir(ctx context.Context) (string, error) {
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.dir != "" {
		return r.dir, nil
	}
	dir, err := ensureWorkerDir(ctx, r.root, nil, nil)
	if err != nil {
		return "", fmt.Errorf("writing the Python worker module: %w", err)
	}
	r.dir = dir
	return dir, nil
}
