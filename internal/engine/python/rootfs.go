// This file is tier 2 of the Python chain (docs/architecture.md, "The
// Python worker"): python3 inside the session's Debian rootfs (see
// internal/rootfs), with the rootfs's userland in place of the host's: as a
// resident worker per session for run_code (RootfsWorker), and once per
// call for python_run (Rootfs.RunIn).

package python

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// ErrNoRootfs is the engine-level failure of a session that runs on the
// host userland: the chain goes on to the next tier.
var ErrNoRootfs = fmt.Errorf("the session has no rootfs (create it with --rootfs NAME) (%w)", runcode.ErrStepAside)

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
func (r *Rootfs) Probe(ctx context.Context) error { return boxProbe(r.sb) }

// boxProbe is the probe of both rootfs engines: a rootfs needs the box.
func boxProbe(sb *sandbox.Sandbox) error {
	if !sb.Boxed() {
		return errors.New("needs the bubblewrap box to show a rootfs (Debian: apt-get install bubblewrap)")
	}
	return nil
}

// sessionRootfs returns the name of sess's rootfs when it is installed, or
// the engine-level error of both rootfs engines (the chain falls through).
func sessionRootfs(m *rootfs.Manager, sess *session.Session) (string, error) {
	name := sess.Rootfs
	if name == "" {
		return "", ErrNoRootfs
	}
	if !m.Ready(name) {
		return "", fmt.Errorf("rootfs %q is not installed (quro rootfs install %s)", name, name)
	}
	return name, nil
}

// Run implements runcode.Engine. A session without a rootfs, or whose
// rootfs is not installed, is an engine-level failure, so that the chain
// falls through to the host's python3.
func (r *Rootfs) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	name, err := sessionRootfs(r.m, req.Session)
	if err != nil {
		return nil, err
	}
	res, err := r.RunIn(ctx, name, req, ViaStdin)
	if err != nil {
		return nil, err
	}
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

	failMu sync.Mutex
	failed map[string]startFailure // by session id
}

// NewRootfsWorker returns the rootfs tier over the rootfs directories of
// m, keeping its worker module under dataDir (or opts.InstallRoot, as the
// embedded interpreter). opts may be nil; NoSpare is implied.
func NewRootfsWorker(dataDir string, sb *sandbox.Sandbox, m *rootfs.Manager, opts *EmbeddedOptions) *RootfsWorker {
	o := opts.withDefaults(sb)
	o.NoSpare = true
	r := &RootfsWorker{pool: newPool(sb, o, "the rootfs Python engine"), m: m, root: cmp.Or(o.InstallRoot, dataDir), failed: map[string]startFailure{}}
	r.startFor = r.start
	return r
}

// Name implements runcode.Engine.
func (r *RootfsWorker) Name() string { return "python/rootfs" }

// Probe implements runcode.Engine, as Rootfs.Probe: the session's rootfs
// is checked when its worker starts.
func (r *RootfsWorker) Probe(ctx context.Context) error { return boxProbe(r.sb) }

// Run implements runcode.Engine (and, with DropContext, ContextEngine). A
// session without a rootfs, whose rootfs is not installed, or whose rootfs
// has no python3 (checked when its worker starts), is an engine-level
// failure, so that the chain falls through: to the one-shot python3 of the
// rootfs, then the host's. So is a session whose worker could not start
// on an earlier run, until reset_python or a change of the rootfs or of
// the session's user site (see startKey): its runs go straight to the
// one-shot python3 rather than pay a failed start each.
func (r *RootfsWorker) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if req.Session == nil {
		return nil, errors.New("no session")
	}
	if req.Session.Rootfs == "" {
		return nil, ErrNoRootfs
	}
	if res := refuseNUL(req); res != nil {
		return res, nil
	}
	if err := r.failedBefore(req.Session); err != nil {
		return nil, err
	}
	return r.run(ctx, req)
}

// startFailure is a session's failed worker start, remembered.
type startFailure struct {
	why string // the start's error
	key string // startKey when it failed
}

// failedBefore returns the error of sess's remembered failed start, or nil
// when there is none or what it depended on changed.
func (r *RootfsWorker) failedBefore(sess *session.Session) error {
	r.failMu.Lock()
	f, ok := r.failed[sess.ID]
	r.failMu.Unlock()
	if !ok {
		return nil
	}
	if startKey(r.m, sess) != f.key {
		r.forget(sess.ID)
		return nil
	}
	return fmt.Errorf("the rootfs's python3 could not start the session's worker on an earlier run (%s); runs go to python3 once per run until reset_python, or a change of the rootfs or of the session's user site", f.why)
}

// forget drops the session's remembered failed start.
func (r *RootfsWorker) forget(id string) {
	r.failMu.Lock()
	delete(r.failed, id)
	r.failMu.Unlock()
}

// Reset gives the session a fresh interpreter (see pool.Reset) and tries
// its worker's start again on the next run.
func (r *RootfsWorker) Reset(ctx context.Context, sessionID string) error {
	r.forget(sessionID)
	return r.pool.Reset(ctx, sessionID)
}

// Stop ends the session's worker (see pool.Stop) and forgets the session.
func (r *RootfsWorker) Stop(sessionID string) {
	r.forget(sessionID)
	r.pool.Stop(sessionID)
}

// openDirIn opens the directory rel beneath the directory fd dir,
// resolving links inside it (RESOLVE_IN_ROOT), never a magic link, and only
// a directory: O_DIRECTORY fails at once on a FIFO or a device the session
// put there, which a plain open would block on or act upon.
func openDirIn(dir int, rel string) (int, error) {
	return unix.Openat2(dir, rel, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NONBLOCK, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
}

// namesIn returns at most n names of the directory rel beneath dir (see
// openDirIn).
func namesIn(dir int, rel string, n int) ([]string, error) {
	fd, err := openDirIn(dir, rel)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	return f.Readdirnames(n)
}

// maxKeyEntries bounds the user-site entries startKey reads: a session
// with more only changes its key by the ones it reads.
const maxKeyEntries = 10000

// startKey sums up what a worker's start in sess depends on beyond the
// worker module: the rootfs (its marker, rewritten by install_packages;
// its python3) and the session's user sites, whose .pth and customize
// files run at start (the names of their entries, and the times of those
// files). The user site is the session's: it is read through os.Root in
// the workspace, never following a link out, and only hashed.
func startKey(m *rootfs.Manager, sess *session.Session) string {
	h := sha256.New()
	dir := m.Path(sess.Rootfs)
	for _, f := range []string{"/" + rootfs.Marker, rootfsPython} {
		if fi, err := rootfs.Stat(dir, f); err == nil {
			fmt.Fprintf(h, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	ws, err := unix.Open(sess.Workspace(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return hex.EncodeToString(h.Sum(nil))
	}
	defer unix.Close(ws)
	n := 0
	libs, _ := namesIn(ws, ".local/lib", maxKeyEntries)
	slices.Sort(libs)
	for _, l := range libs {
		if !strings.HasPrefix(l, "python") || n >= maxKeyEntries {
			continue
		}
		site := ".local/lib/" + l + "/site-packages"
		fd, err := openDirIn(ws, site)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), site)
		names, _ := f.Readdirnames(maxKeyEntries - n)
		n += len(names)
		slices.Sort(names)
		for _, name := range names {
			fmt.Fprintf(h, "%s/%s\n", site, name)
			if strings.HasSuffix(name, ".pth") || name == "usercustomize.py" || name == "sitecustomize.py" {
				var st unix.Stat_t
				if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
					fmt.Fprintf(h, "%d %d.%d\n", st.Size, st.Mtim.Sec, st.Mtim.Nsec)
				}
			}
		}
		f.Close()
	}
	return hex.EncodeToString(h.Sum(nil))
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

// start starts sess's worker in its box, once its rootfs is found ready
// and with python3. A start that fails otherwise than by ctx is
// remembered (see Run).
func (r *RootfsWorker) start(ctx context.Context, sess *session.Session) (*worker, error) {
	name, err := sessionRootfs(r.m, sess)
	if err != nil {
		return nil, unstartable{err}
	}
	if !hasPython(r.m.Path(name)) {
		return nil, unstartable{fmt.Errorf("rootfs %q has no %s (install_packages python3 adds it)", name, rootfsPython)}
	}
	key := startKey(r.m, sess)
	w, err := r.startIn(ctx, sess)
	if err != nil && ctx.Err() == nil && r.ctx.Err() == nil {
		r.failMu.Lock()
		r.failed[sess.ID] = startFailure{why: err.Error(), key: key}
		r.failMu.Unlock()
	}
	return w, err
}

// startIn starts the worker of sess, a session on a ready rootfs.
func (r *RootfsWorker) startIn(ctx context.Context, sess *session.Session) (*worker, error) {
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
	return startWorker(ctx, r.ctx, sess.Sandbox(r.sb), cfg, false,
		sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env, sess.Network)
}

// workerDir writes the worker module once (see ensureWorkerDir).
func (r *RootfsWorker) workerDir(ctx context.Context) (string, error) {
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.dir != "" {
		return r.dir, nil
	}
	if err := r.locks.hold(workerDir(r.root)); err != nil {
		return "", fmt.Errorf("writing the Python worker module: %w", err)
	}
	dir, err := ensureWorkerDir(ctx, r.root, nil, nil)
	if err != nil {
		return "", fmt.Errorf("writing the Python worker module: %w", err)
	}
	r.dir = dir
	return dir, nil
}
