//go:build !slim

package python

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/progress"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// Embedded is tier 1 of the Python chain: CPython shipped inside the quro
// binary, extracted once under the data directory, and run as a resident
// worker process per session, so that a run is a message rather than a
// process start. A session's globals persist between its runs; a timeout
// interrupts the code (KeyboardInterrupt) instead of killing the worker.
//
// Workers start lazily, one per session, through the sandbox (or at the
// session's creation with Prestart); without session boxes one spare is
// kept warm for the next new session. With session boxes a spare worker
// lives in a spare session's box (StartSpare): the App keeps those. The
// registry of workers, runs, timeouts, Reset, Stop and code contexts are
// the pool's, which the rootfs's python3 shares (RootfsWorker). All
// methods are safe for concurrent use. Close stops every worker.
type Embedded struct {
	pool    // its mu also guards the spare's fields
	dataDir string

	prepMu sync.Mutex
	prep   *preparation // the latest; replaced when it failed

	spare    *worker
	spareOn  chan struct{} // closed when the spare being started is ready or failed
	spareDir string
	spareErr error

	started   chan struct{} // closed when a worker of this engine first started (markStarted)
	startedMu sync.Once
}

// NewEmbedded returns the embedded-CPython engine. Nothing is extracted or
// started until the first Probe, Warm or Run. opts may be nil.
func NewEmbedded(dataDir string, sb *sandbox.Sandbox, opts *EmbeddedOptions) *Embedded {
	o := opts.withDefaults(sb)
	if sb.SessionBoxes() {
		// A spare worker would run in a box of its own, and a session's
		// worker belongs in the session's box: the spare is a whole spare
		// session instead (StartSpare).
		o.NoSpare = true
	}
	e := &Embedded{pool: newPool(sb, o, "the embedded Python engine"), dataDir: dataDir, started: make(chan struct{})}
	e.startFor = e.claim
	return e
}

// ErrRootfsSession is the embedded tier stepping aside for a session that
// runs on a rootfs.
var ErrRootfsSession = fmt.Errorf("the rootfs tier answers (%w)", runcode.ErrStepAside)

// Name implements runcode.Engine.
func (e *Embedded) Name() string { return "python/embedded" }

// Probe checks that a worker starts (it is kept as the spare). On a data
// directory where the interpreter is not prepared yet, it starts that in
// the background and returns nil at once: the preparation takes 10 s or
// more on a busy machine, and a probe's deadline must neither cut it nor
// rank this tier as unavailable for the server's life. Runs wait for it,
// reporting progress (see progress.With).
func (e *Embedded) Probe(ctx context.Context) error {
	p := e.preparation()
	select {
	case <-p.done:
		if p.err != nil {
			return p.err
		}
		return e.Warm(ctx)
	default:
		return nil
	}
}

// Warm extracts the interpreter (once per data directory; see prepare) and
// starts the spare worker, waiting until it is ready.
func (e *Embedded) Warm(ctx context.Context) error {
	if _, err := e.prepare(ctx); err != nil {
		return err
	}
	if e.opts.NoSpare {
		w, err := e.start(ctx, nil)
		if err != nil {
			return err
		}
		w.kill()
		<-w.done
		return nil
	}
	select {
	case <-e.fillSpare():
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.spare == nil && e.spareErr != nil {
		return e.spareErr
	}
	return nil
}

// Installed reports where the interpreter is extracted and whether this
// engine extracted it (false: an existing tree was reused). Extracts first.
func (e *Embedded) Installed(ctx context.Context) (dir string, extracted bool, err error) {
	if _, err := e.prepare(ctx); err != nil {
		return "", false, err
	}
	p := e.preparation()
	return p.inst.Dir, p.inst.Extracted, nil
}

// BoxDirs are the directories of <root>/python a session box shows
// read-only (sandbox.Options.BoxReadOnlyNow), and no other entry of it:
// the interpreter tree (with its python3/pip shims and its .pth naming
// pip), pip's directory and the worker module's. The tree and pip's
// directory are given once this engine's preparation has succeeded, and
// before that only when an earlier preparation completed them and this
// one's walk found them intact (BoxDirs starts the preparation and waits
// for that walk): the preparation renames a missing, damaged or older-layout one into place,
// and nothing of this server does after it, so a bind taken then shows
// the directory the server's runs use. The worker module's
// directory is given once it is complete (see completeWorkerDir).
func (e *Embedded) BoxDirs() []string {
	root := e.root()
	var dirs []string
	e.prepMu.Lock()
	p := e.prep
	e.prepMu.Unlock()
	if p == nil {
		p = e.preparation()
	}
	wait := time.NewTimer(checkWait)
	defer wait.Stop()
	select {
	case <-p.done:
	case <-p.checked:
	case <-wait.C:
	case <-e.ctx.Done():
	}
	if isDone(p.done) {
		if p.err == nil {
			dirs = append(dirs, p.inst.Dir, PipDir(root))
		}
	} else if isDone(p.checked) && p.checkedTree != "" {
		// Before this server's preparation has ended (it runs in the
		// background from the start), the tree and pip directory an
		// earlier preparation finished are shown once the preparation
		// has walked them (intact, trustedTree) and found them as they
		// were left: else a box made in the server's first moments
		// lacks them, and while it is busy every Python run of its
		// session goes to a box of its own (another /tmp, pid and
		// network namespace). A completion marker alone is no check
		// that nobody else could have written them since; the box waits
		// for that walk (milliseconds) rather than walking them again.
		// One the preparation finds otherwise (it then prepares them
		// again), or a preparation waiting for another process (pip's
		// directory being written), leaves the box without them.
		dirs = append(dirs, p.checkedTree, PipDir(root))
	}
	if d, ok := completeWorkerDir(root); ok {
		dirs = append(dirs, d)
	}
	return dirs
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// checkWait bounds how long BoxDirs waits for the preparation's check of
// an earlier preparation's tree (milliseconds, unless the preparation
// waits for another process).
const checkWait = 2 * time.Second

// root is where the interpreter is extracted: EmbeddedOptions.InstallRoot,
// else the data directory.
func (e *Embedded) root() string {
	if e.opts.InstallRoot != "" {
		return e.opts.InstallRoot
	}
	return e.dataDir
}

// preparation is the one-time work before the first worker: extracting the
// interpreter into the data directory (once per directory, under a flock
// shared with other quro processes) and byte-compiling it. It runs once per
// engine, in the background, for every caller: whoever arrives while it
// runs waits for the same one and is told its progress.
type preparation struct {
	done chan struct{} // closed when cfg, inst and err are set
	cfg  *workerConfig
	inst *installation
	err  error

	// checked is closed once the preparation knows whether the tree
	// and pip's directory an earlier one left are intact and trusted
	// (checkedTree, the tree's directory) or are to be prepared again
	// (its first step: checkedTree ""), or it failed.
	checked     chan struct{}
	checkedOnce sync.Once
	checkedTree string

	mu    sync.Mutex
	msg   string // the latest progress message
	next  int
	subs  map[int]func(string)
	start time.Time
}

// newPreparation is a preparation that has just begun.
func newPreparation() *preparation {
	return &preparation{done: make(chan struct{}), checked: make(chan struct{}), start: time.Now()}
}

// markChecked closes p.checked, once: ok when the tree inst and pip's
// directory were found intact and trusted.
func (p *preparation) markChecked(inst *installation, ok bool) {
	p.checkedOnce.Do(func() {
		if ok && inst != nil && !inst.Extracted {
			p.checkedTree = inst.Dir
		}
		close(p.checked)
	})
}

// preparing is the start of every progress message.
const preparing = "preparing the embedded Python (first run on this data directory): "

// step turns the extraction's steps into messages, one per percent.
func (p *preparation) step(report func(string)) Step {
	var last string
	return func(stage string, done, total int64) {
		msg := preparing + stage
		if total > 0 {
			msg += fmt.Sprintf(" %d%%", done*100/total)
		}
		if msg == last {
			return
		}
		last = msg
		p.mu.Lock()
		defer p.mu.Unlock()
		p.msg = msg
		for _, f := range p.subs {
			f(msg)
		}
		if report != nil {
			report(msg)
		}
	}
}

// subscribe sends f the progress from now on (the latest message at once);
// after the returned cancel, f is not called again.
func (p *preparation) subscribe(f func(string)) (cancel func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs == nil {
		p.subs = map[int]func(string){}
	}
	id := p.next
	p.next++
	p.subs[id] = f
	if p.msg != "" {
		f(p.msg)
	}
	return func() {
		p.mu.Lock()
		delete(p.subs, id)
		p.mu.Unlock()
	}
}

// preparation returns the engine's preparation, starting it when none ran
// yet or the last one failed.
func (e *Embedded) preparation() *preparation {
	e.prepMu.Lock()
	defer e.prepMu.Unlock()
	if p := e.prep; p != nil {
		select {
		case <-p.done:
			if p.err == nil {
				return p
			}
		default:
			return p
		}
	}
	p := newPreparation()
	e.prep = p
	if !e.track() {
		p.err = errors.New("the embedded Python engine is closed")
		p.markChecked(nil, false)
		close(p.done)
		return p
	}
	go func() {
		defer e.wg.Done()
		cfg, inst, err := e.prepareOnce(e.ctx, p)
		p.markChecked(nil, false) // when it failed before knowing
		p.cfg, p.inst, p.err = cfg, inst, err
		if p.err == nil && p.inst.Extracted {
			p.step(e.opts.Status)(fmt.Sprintf("ready (%.1f s)", time.Since(p.start).Seconds()), 0, 0)
		}
		if p.err != nil {
			// Marked as naming host paths (the install root may be
			// the machine's cache): what a tenant reads of it (a run's
			// result, a classified error: hostpath.Tenant) names none;
			// its own text stays whole, for the operator's log.
			if e.ctx.Err() == nil {
				e.opts.Logger.Warn("preparing the embedded Python failed", "err", p.err)
				if e.opts.Status != nil {
					e.opts.Status(preparing + "failed: " + p.err.Error())
				}
			}
			p.err = hostpath.Error(p.err)
		}
		close(p.done)
		if p.err == nil && !e.opts.NoSpare {
			e.fillSpare()
		}
		if p.err == nil {
			e.afterFirstWorker(p.inst)
		}
	}()
	return p
}

// afterFirstWorker does the upkeep of the install root once the first
// worker has started, or pipCompileAfter after the preparation when none
// has, so that it does not take the CPU from the run that waited for the
// preparation: it byte-compiles pip (compilePip) and removes the
// directories of other builds that nobody uses (removeOldTrees). A
// failure is reported in the status line: pip then keeps compiling what
// it imports in memory, and an old directory stays.
func (e *Embedded) afterFirstWorker(inst *installation) {
	if !e.track() {
		return
	}
	go func() {
		defer e.wg.Done()
		t := time.NewTimer(pipCompileAfter)
		defer t.Stop()
		select {
		case <-e.started:
		case <-t.C:
		case <-e.ctx.Done():
			return
		}
		// The server's log has it whole (Status is a terminal's
		// progress line, nil when the server has none).
		report := func(what string, err error) {
			if err == nil || e.ctx.Err() != nil {
				return
			}
			e.opts.Logger.Warn(what, "err", err)
			if e.opts.Status != nil {
				e.opts.Status(what + ": " + err.Error())
			}
		}
		if pipDir := PipDir(e.root()); !pipCompiled(pipDir) {
			report("pip of the embedded Python", compilePip(e.ctx, inst, pipDir))
		}
		_, err := removeOldTrees(e.root(), e.ownDirs())
		report("removing the embedded Python of other quro builds", err)
	}()
}

// ownDirs are the directories of the install root this engine uses: the
// interpreter's tree, pip's and the worker module's.
func (e *Embedded) ownDirs() []string {
	root := e.root()
	dirs := []string{PipDir(root), workerDir(root)}
	if host, _ := ShimDirs(root); host != "" {
		dirs = append(dirs, filepath.Dir(host))
	}
	return dirs
}

// track counts a goroutine of the engine in its wait group (Close waits
// for it), unless the engine is closed: false, start none.
func (e *Embedded) track() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	return true
}

// pipCompileAfter is how long afterFirstWorker waits for a first worker.
const pipCompileAfter = 10 * time.Second

// prepare waits for the engine's preparation (see preparation), or for
// ctx; meanwhile its progress goes to ctx's progress reporter.
func (e *Embedded) prepare(ctx context.Context) (*workerConfig, error) {
	p := e.preparation()
	select {
	case <-p.done:
		return p.cfg, p.err
	default:
	}
	if f := progress.From(ctx); f != nil {
		defer p.subscribe(f)()
	}
	waited := time.Now()
	select {
	case <-p.done:
		return p.cfg, p.err
	case <-ctx.Done():
		p.mu.Lock()
		stage := strings.TrimPrefix(p.msg, preparing)
		p.mu.Unlock()
		if stage == "" {
			stage = "starting"
		}
		return nil, fmt.Errorf("%w; waited %s for it, at %q: %w", errPreparing,
			time.Since(waited).Round(time.Second), stage, ctx.Err())
	}
}

var _ runcode.Preparer = (*Embedded)(nil)

// Prepare implements runcode.Preparer: the runner waits for the
// preparation under its own budget before the run's starts. A session on
// a rootfs needs none (Run steps aside).
func (e *Embedded) Prepare(ctx context.Context, req *runcode.Request) error {
	if req.Session != nil && req.Session.Rootfs != "" {
		return nil
	}
	_, err := e.prepare(ctx)
	return err
}

// errPreparing is a run that ended while the interpreter was still being
// prepared.
var errPreparing = errors.New("the embedded Python is still being prepared (extracted and byte-compiled, once per data directory; it goes on in the background)")

func (e *Embedded) prepareOnce(ctx context.Context, p *preparation) (*workerConfig, *installation, error) {
	root := e.root()
	status := p.step(e.opts.Status)
	step := func(stage string, done, total int64) {
		p.markChecked(nil, false) // the tree or pip's is prepared again
		status(stage, done, total)
	}
	if e.opts.Progress != nil {
		status := step
		step = func(stage string, done, total int64) {
			if stage == stepExtracting {
				e.opts.Progress(done, total)
			}
			status(stage, done, total)
		}
	}
	// Held before anything is looked at, so that a server of another
	// build does not remove what this one uses or prepares.
	for _, d := range e.ownDirs() {
		if err := e.locks.hold(d); err != nil {
			return nil, nil, err
		}
	}
	inst, err := ensureInstalled(ctx, root, step)
	if err != nil {
		return nil, nil, err
	}
	p.markChecked(inst, true)
	wdir, err := ensureWorkerDir(ctx, root, func(ctx context.Context, dir, final string) error {
		// Byte-compiled by this interpreter, for its worker's start.
		if out, err := runHelper(ctx, nil, inst.Python, "-I", "-m", "compileall", "-q", "-s", dir, "-p", final, dir); err != nil {
			return fmt.Errorf("byte-compiling the worker: %v: %s", err, strings.TrimSpace(lastLines(string(out), 10)))
		}
		return nil
	}, func(dir string) bool {
		m, _ := filepath.Glob(filepath.Join(dir, "__pycache__", workerModule+".cpython-*.pyc"))
		return len(m) > 0
	})
	if err != nil {
		return nil, nil, err
	}
	spare := filepath.Join(e.dataDir, "python", "spare")
	if err := os.MkdirAll(spare, 0o755); err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	e.spareDir = spare
	e.mu.Unlock()
	return &workerConfig{
		python: inst.Python,
		// -E -P: isolated from the environment's PYTHON* variables and
		// the working directory (as -I, but without -s: the user site
		// under HOME, the workspace, is where pip installs); -S: the
		// worker does what site would (see _site), faster.
		flags:     []string{"-E", "-P", "-S", "-u", "-X", "utf8"},
		readOnly:  []string{inst.Dir, wdir}, // outside the host userland
		workerDir: wdir, limits: e.opts.Limits, drain: e.opts.DrainGrace,
	}, inst, nil
}

// start starts a worker bound to sess (nil: a spare).
func (e *Embedded) start(ctx context.Context, sess *session.Session) (*worker, error) {
	cfg, err := e.prepare(ctx)
	if err != nil {
		return nil, err
	}
	var w *worker
	if sess == nil {
		e.mu.Lock()
		dir := e.spareDir
		e.mu.Unlock()
		w, err = startWorker(ctx, e.ctx, e.sb, *cfg, true, dir, dir, dir, nil, sandbox.NetworkNone)
	} else {
		// The variables are in the process environment, and the worker is
		// told their names.
		w, err = startWorker(ctx, e.ctx, sess.Sandbox(e.sb), *cfg, false, sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env, sess.Network)
	}
	if err == nil {
		e.markStarted()
	}
	return w, err
}

// markStarted notes that a worker of the engine has started (see
// afterFirstWorker).
func (e *Embedded) markStarted() { e.startedMu.Do(func() { close(e.started) }) }

// fillSpare starts a spare worker in the background if none is there. The
// channel is closed when there is a spare or the attempt failed.
func (e *Embedded) fillSpare() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.spareOn != nil {
		return e.spareOn
	}
	done := make(chan struct{})
	if e.opts.NoSpare || e.closed || e.spare != nil {
		close(done)
		return done
	}
	e.spareOn = done
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		w, err := e.start(e.ctx, nil)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.spareOn = nil
		defer close(done)
		e.spareErr = err
		if err != nil {
			return
		}
		if e.closed {
			w.kill()
			return
		}
		e.spare = w
	}()
	return done
}

// claim returns a worker for sess: the spare, bound to it, or a new one.
func (e *Embedded) claim(ctx context.Context, sess *session.Session) (*worker, error) {
	e.mu.Lock()
	w := e.spare
	e.spare = nil
	e.mu.Unlock()
	e.fillSpare()
	if w != nil && w.alive() {
		if err := w.bind(ctx, sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env); err == nil {
			return w, nil
		}
		w.kill()
	}
	return e.start(ctx, sess)
}

// Run implements runcode.Engine.
func (e *Embedded) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if req.Session == nil {
		return nil, errors.New("no session")
	}
	if req.Session.Rootfs != "" {
		// The session chose a Debian userland (with its packages): the
		// rootfs tier answers, not the interpreter shipped in quro.
		return nil, fmt.Errorf("session runs on rootfs %q: %w", req.Session.Rootfs, ErrRootfsSession)
	}
	if _, err := e.prepare(ctx); errors.Is(err, errPreparing) {
		// Not an engine failure for the next tier to answer: the run
		// did not start, and a retry will find the interpreter ready.
		return &runcode.Result{ExitCode: -1, TimedOut: errors.Is(err, context.DeadlineExceeded),
			Error: err.Error() + "; this run did not start: run it again in a few seconds"}, nil
	} else if err != nil {
		return nil, err
	}
	return e.run(ctx, req)
}

// Close stops every worker, the spare included, and waits for them.
func (e *Embedded) Close() error {
	var spare *worker
	e.close(func() {
		spare = e.spare
		e.spare = nil
	})
	if spare != nil {
		<-spare.done
	}
	return nil
}

// Prestart starts sess's worker in the background when it has none, so
// that the session's first Python run finds it ready (the worker is
// spawned in the session's box like any other). A run that comes first
// waits for it instead of starting another. Nothing happens for a session
// on a rootfs (RootfsWorker.Prestart), or once the engine is closed.
func (e *Embedded) Prestart(sess *session.Session) {
	if sess.Rootfs != "" {
		return
	}
	e.prestart(sess, func(ctx context.Context) error {
		_, err := e.prepare(ctx)
		return err
	})
}

// KeepsSpares reports that StartSpare can start workers (not so in the
// slim build).
func (e *Embedded) KeepsSpares() bool { return true }

// StartSpare starts the worker of sess, a spare session (see
// session.SpareTenant), in the session's box like any session's worker,
// and waits until it is ready. It imports ahead what a first run needs,
// and no idle timer runs until Claimed: a spare waits however long it
// takes to be claimed. Session boxes make this the server's spare
// worker: the worker's directories, uid, box and network are its
// session's from the start, so it is never rebound.
func (e *Embedded) StartSpare(ctx context.Context, sess *session.Session) error {
	if sess.Rootfs != "" {
		return ErrRootfsSession
	}
	cfg, err := e.prepare(ctx)
	if err != nil {
		return err
	}
	s, err := e.slot(sess.ID)
	if err != nil {
		return err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.tookToStart()
	defer s.give()
	e.mu.Lock()
	gone := e.slots[sess.ID] != s // Stop ran meanwhile
	e.mu.Unlock()
	if gone {
		return errors.New("the spare session was stopped")
	}
	if s.w != nil {
		return nil
	}
	w, err := startWorker(ctx, e.ctx, sess.Sandbox(e.sb), *cfg, true,
		sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env, sess.Network)
	if err != nil {
		return err
	}
	e.markStarted()
	s.setWorker(w)
	return nil
}

// BindSpare checks, before spare session sess is claimed, that the worker
// StartSpare started is alive, answers and has run nothing, binding it to
// the session's directories and variables (a round trip through the
// worker). An error: the spare is unfit (its worker is then ended).
func (e *Embedded) BindSpare(ctx context.Context, sess *session.Session) error {
	e.mu.Lock()
	s := e.slots[sess.ID]
	e.mu.Unlock()
	if s == nil {
		return errors.New("the spare session has no worker")
	}
	select {
	case s.sem <- struct{}{}:
	default:
		return errors.New("the spare session's worker is in use")
	}
	s.took("the check of this session's spare Python")
	defer s.give()
	switch {
	case s.w == nil || !s.w.alive():
		return errors.New("the spare session's worker has exited")
	case s.w.runs > 0:
		return errors.New("the spare session's worker has run code")
	}
	if err := s.w.bind(ctx, sess.Workspace(), sess.Workspace(), sess.TmpDir(), sess.Env); err != nil {
		s.w.kill()
		return err
	}
	return nil
}
