// Package node runs JavaScript and TypeScript on Node.js in a resident
// worker per session, spawned in the session's box like the resident
// Python worker: run_code's lang "node", and the code contexts of
// languages javascript and typescript (E2B's JS/TS contexts) where the
// session's userland has node. QuickJS (internal/engine/js) stays the
// engine of run_code's "js" and "ts" and the fallback where there is no
// node.
//
// The worker's JavaScript side is worker/quro_node_worker.js, embedded in
// the binary and given to node as its -e program (so no path of the host
// is shown to the box or named in a traceback). It reads one JSON request
// a line from fd 3 and writes one JSON reply a line to fd 4; fd 1 and 2
// are pipes read by the server, and after each run the worker writes the
// run's random sync token to both, so the server knows it has all of that
// run's output. Everything the worker sends is read as hostile (the code
// it runs owns the process): lines are bounded and decoded strictly.
//
// Runs of one session are serialised; runs of different sessions proceed
// in parallel. A run that times out or is canceled kills the worker (its
// contexts' state is lost, and the next run says so). Stop ends a
// session's worker; Close all of them.
package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	qtranspile "github.com/quro-dev/quro/internal/transpile"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

//go:embed worker/quro_node_worker.js
var workerSource string

// maxReply bounds a reply line from the worker (a value's text is cut at
// 100,000 characters by the worker; the session's code may send anything).
const maxReply = 16 << 20

// maxBetween bounds the output kept from between runs (a timer that
// printed after its run ended): it goes to the next run.
const maxBetween = 64 << 10

// drainGrace is how long a run's output may lag behind its reply (a
// process the code started that holds the pipe) before it is given up.
const drainGrace = 2 * time.Second

// Engine is the Node engine. The zero value is not usable: use New.
type Engine struct {
	sb     *sandbox.Sandbox
	rootfs func(name string) (string, error)

	ctx    context.Context // the workers' lifetime
	cancel context.CancelFunc

	mu     sync.Mutex
	slots  map[string]*slot
	closed bool
}

// New returns the engine. rootfs finds a session's rootfs directory by its
// name (nil: sessions on a rootfs get no Node).
func New(sb *sandbox.Sandbox, rootfs func(name string) (string, error)) *Engine {
	ctx, cancel := context.WithCancel(context.Background())
	return &Engine{sb: sb, rootfs: rootfs, ctx: ctx, cancel: cancel, slots: map[string]*slot{}}
}

// Name identifies the engine.
func (e *Engine) Name() string { return "node/resident" }

// Probe passes: whether node is there depends on the session's userland
// (HostProbe says for the host's).
func (e *Engine) Probe(ctx context.Context) error { return nil }

// HostProbe reports whether the host's userland, which session boxes
// show, has node.
func (e *Engine) HostProbe(ctx context.Context) error {
	_, err := e.sb.LookPath("node")
	return err
}

// ForContexts is the engine for the chains of "js" and "ts": it runs code
// contexts (E2B's JS/TS contexts) and steps aside for other runs, which
// stay on QuickJS.
func (e *Engine) ForContexts() runcode.Engine { return contextsOnly{e} }

type contextsOnly struct{ e *Engine }

func (c contextsOnly) Name() string                        { return c.e.Name() }
func (c contextsOnly) Probe(ctx context.Context) error     { return c.e.Probe(ctx) }
func (c contextsOnly) HostProbe(ctx context.Context) error { return c.e.HostProbe(ctx) }
func (c contextsOnly) DropContext(ctx context.Context, session, id string) error {
	return c.e.DropContext(ctx, session, id)
}
func (c contextsOnly) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	if req.Context == nil || req.Context.ID == "" {
		return nil, runcode.ErrStepAside
	}
	return c.e.Run(ctx, req)
}

// slot is one session's place in the registry.
type slot struct {
	sem  chan struct{} // held by the run (or drop) in progress
	mu   sync.Mutex    // guards the fields below
	w    *worker
	lost string // why the state is gone, said by the next run
	// The code context of the run in progress and its cancel.
	runCtx    string
	cancelRun context.CancelCauseFunc
}

func (e *Engine) slot(id string, make bool) (*slot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("the Node engine is closed")
	}
	s := e.slots[id]
	if s == nil && make {
		s = &slot{sem: make1()}
		e.slots[id] = s
	}
	return s, nil
}

func make1() chan struct{} { return make(chan struct{}, 1) }

// userland finds node in the session's userland: the program as the box
// names it and the rootfs directory to run it in ("" for the host's), or
// why there is none.
func (e *Engine) userland(sess *session.Session) (prog, dir string, err error) {
	if name := sess.Rootfs; name != "" {
		if e.rootfs == nil {
			return "", "", rootfs.ErrNoEngineRootfs(name)
		}
		dir, err := e.rootfs(name)
		if err != nil {
			return "", "", err
		}
		prog, ok := rootfs.LookPath(dir, "node", "nodejs")
		if !ok {
			return "", "", fmt.Errorf("the session's rootfs %q has no node (install_packages {manager: apt, packages: [nodejs]} adds it)", name)
		}
		return prog, dir, nil
	}
	if _, err := e.sb.LookPath("node"); err != nil {
		return "", "", fmt.Errorf("the host's userland has no node: %w", err)
	}
	return "node", "", nil
}

// Run runs req in its session's worker, starting one when it has none.
func (e *Engine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	prog, dir, err := e.userland(req.Session)
	if err != nil {
		return nil, err
	}
	code := req.Code
	if req.Lang == "ts" || esmSyntax.MatchString(code) {
		if code, err = transpile(ctx, code, req.Lang == "ts"); err != nil {
			var ce *cellError
			var le *qtranspile.Error
			if !errors.As(err, &ce) && !errors.As(err, &le) {
				return nil, err
			}
			return transpileFailure(req, err), nil
		}
	}
	s, err := e.slot(req.Session.ID, true)
	if err != nil {
		return nil, err
	}
	// It waits for another run for at most its timeout.
	wctx, wcancel := withTimeout(ctx, req.Timeout)
	select {
	case s.sem <- struct{}{}:
		wcancel()
	case <-wctx.Done():
		wcancel()
		return &runcode.Result{ExitCode: -1, Interrupted: true, TimedOut: errors.Is(wctx.Err(), context.DeadlineExceeded),
			Error: fmt.Sprintf("this run waited for another run of this session's Node worker and did not start (%v): call again when it is done", wctx.Err())}, nil
	}
	defer func() { <-s.sem }()
	var notes []string
	s.mu.Lock()
	if s.lost != "" {
		notes, s.lost = append(notes, s.lost), ""
	}
	w := s.w
	s.mu.Unlock()
	if w != nil && !w.alive() {
		notes = append(notes, fmt.Sprintf("the session's Node worker had exited since the last run (%s); the state of its JavaScript contexts is lost", w.exitText()))
		w = nil
	}
	if w == nil {
		if w, err = e.start(ctx, req.Session, prog, dir); err != nil {
			return nil, fmt.Errorf("starting the Node worker: %w", err)
		}
		s.mu.Lock()
		s.w = w
		s.mu.Unlock()
	}
	// The run's timeout counts from here, the worker started: a first
	// run's worker start is not the code's time.
	ctx, cancel := withTimeout(ctx, req.Timeout)
	defer cancel()
	var ctxID string
	cwd := sandbox.HomeUser
	rich := false
	var env map[string]string
	if c := req.Context; c != nil {
		ctxID, rich, env = c.ID, c.Rich, c.Env
		if c.Dir != "" {
			cwd = c.Dir
		}
		if c.ID != "" {
			// A restart or removal of the context interrupts this run.
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			s.mu.Lock()
			s.runCtx, s.cancelRun = c.ID, cancel
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				s.runCtx, s.cancelRun = "", nil
				s.mu.Unlock()
			}()
		}
	}
	res, usable := w.run(ctx, runRequest{Op: "run", Ctx: ctxID, Cwd: cwd, Code: code, Rich: rich, Env: env}, req)
	if !usable {
		w.kill()
		<-w.done
		s.mu.Lock()
		if s.w == w {
			s.w = nil
		}
		s.mu.Unlock()
	}
	res.Notes = append(notes, res.Notes...)
	return res, nil
}

// DropContext forgets context id of session: a run in it is stopped (the
// worker with it), else the worker drops the context's REPL.
func (e *Engine) DropContext(ctx context.Context, sessionID, id string) error {
	s, err := e.slot(sessionID, false)
	if s == nil || err != nil {
		return nil
	}
	s.mu.Lock()
	if s.runCtx == id && s.cancelRun != nil {
		s.cancelRun(runcode.ErrContextRestarted)
	}
	s.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	s.mu.Lock()
	w := s.w
	s.mu.Unlock()
	if w == nil || !w.alive() {
		return nil
	}
	if err := w.drop(ctx, id); err != nil {
		w.kill()
		<-w.done
		s.mu.Lock()
		s.w, s.lost = nil, "the session's Node worker was stopped when a context's removal failed ("+err.Error()+"); the state of its JavaScript contexts is lost"
		s.mu.Unlock()
	}
	return nil
}

// Stop ends session's worker (the session is destroyed): the run in
// progress is stopped.
func (e *Engine) Stop(sessionID string) {
	e.mu.Lock()
	s := e.slots[sessionID]
	delete(e.slots, sessionID)
	e.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	w := s.w
	s.mu.Unlock()
	if w != nil {
		w.kill()
		<-w.done
		// The box is gone with the session: nothing else holds the pipe.
		w.rep.Close()
	}
}

// Sessions is how many sessions have a live worker.
func (e *Engine) Sessions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.slots {
		s.mu.Lock()
		if s.w != nil && s.w.alive() {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// Close stops every worker.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	ids := make([]string, 0, len(e.slots))
	for id := range e.slots {
		ids = append(ids, id)
	}
	e.mu.Unlock()
	e.cancel()
	for _, id := range ids {
		e.Stop(id)
	}
	return nil
}

// esmSyntax finds import and export statements (as internal/engine/js
// does): such JavaScript is turned into CommonJS by esbuild first.
var esmSyntax = regexp.MustCompile(`(?m)^[ \t]*(import[ \t]*[\w{*'"]|export[ \t]+(default|const|let|var|function|class|async|\{|\*))`)

// transpile strips TypeScript's types (ts) and turns import/export into
// require (CommonJS); a cell with top-level await keeps its syntax, which
// the worker's REPL runs. esbuild runs in a child process
// (internal/transpile): a source it refuses is a *cellError, its crash or
// timeout a *transpile.Error.
func transpile(ctx context.Context, src string, ts bool) (string, error) {
	r, err := qtranspile.Transform(ctx, &qtranspile.Request{Src: src, File: "<cell>", TS: ts, Target: qtranspile.ESNext})
	if err != nil {
		return "", err
	}
	if len(r.Errors) > 0 {
		return "", &cellError{qtranspile.ErrorText("<cell>", r.Errors)}
	}
	return r.Code, nil
}

// cellError is a cell esbuild refused.
type cellError struct{ text string }

func (e *cellError) Error() string { return e.text }

// transpileFailure is the result of code esbuild refused (a SyntaxError)
// or could not compile (an Error).
func transpileFailure(req *runcode.Request, err error) *runcode.Result {
	name := "SyntaxError"
	if !errors.As(err, new(*cellError)) {
		name = "Error"
	}
	exc := &runcode.Exception{Name: name, Value: err.Error(), Traceback: name + ": " + err.Error()}
	if req.Context != nil && req.Context.Rich {
		return &runcode.Result{Exception: exc}
	}
	_, _ = io.WriteString(req.Stderr, exc.Traceback+"\n")
	return &runcode.Result{ExitCode: 1}
}

// start starts a worker for sess in its box and waits for its hello.
func (e *Engine) start(ctx context.Context, sess *session.Session, prog, rootfsDir string) (*worker, error) {
	var parent, child []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	reqR, reqW, err1 := os.Pipe()
	repR, repW, err2 := os.Pipe()
	outR, outW, err3 := os.Pipe()
	errR, errW, err4 := os.Pipe()
	parent = append(parent, reqW, repR, outR, errR)
	child = append(child, reqR, repW, outW, errW)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll(parent)
		closeAll(child)
		return nil, err
	}
	spec := sess.Spec(prog, "--stack-trace-limit=50", "-e", workerSource)
	spec.Rootfs = rootfsDir
	spec.Stdout, spec.Stderr = outW, errW
	spec.ExtraFiles = []*os.File{reqR, repW} // fd 3 and fd 4
	p, err := e.sb.Start(e.ctx, spec)
	closeAll(child)
	if err != nil {
		closeAll(parent)
		return nil, err
	}
	w := &worker{
		proc: p, req: reqW, rep: repR,
		out: newStream(), err: newStream(),
		replies: make(chan reply, 1), done: make(chan struct{}),
		env: maps.Clone(sess.Env),
	}
	go w.out.read(outR)
	go w.err.read(errR)
	go w.readReplies()
	go func() {
		w.exit = p.Wait()
		reqW.Close()
		close(w.done)
		// A process the code started may hold the reply pipe open.
		time.AfterFunc(drainGrace, func() { repR.Close() })
	}()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case r, ok := <-w.replies:
		if ok && r.Op == "hello" {
			return w, nil
		}
		w.kill()
		<-w.done
		return nil, fmt.Errorf("the Node worker did not start: %s", w.startFailure())
	case <-wait.Done():
		w.kill()
		<-w.done
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errors.New("the Node worker did not answer within 30 s of its start")
	}
}

// worker is one resident node process.
type worker struct {
	proc     *sandbox.Process
	req      *os.File // requests, our end
	rep      *os.File // replies, our end (read by readReplies)
	out, err *stream
	replies  chan reply // closed when the reply pipe ends or a reply is refused
	refusedM sync.Mutex
	refusedE error // why a reply was refused
	done     chan struct{}
	exit     sandbox.Exit
	nextID   int
	env      map[string]string // the session's variables the worker has
}

// runRequest is a request to the worker.
type runRequest struct {
	Op    string            `json:"op"`
	ID    int               `json:"id"`
	Ctx   string            `json:"ctx"`
	Cwd   string            `json:"cwd,omitempty"`
	Code  string            `json:"code,omitempty"`
	Token string            `json:"token,omitempty"`
	Rich  bool              `json:"rich,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// The session's variables when they changed since the worker last
	// had them (set_session_env after it started): set, and dropped.
	SEnv  map[string]string `json:"senv,omitempty"`
	SDrop []string          `json:"sdrop,omitempty"`
}

// reply is a reply from the worker, as hostile as the code it ran.
type reply struct {
	Op      string               `json:"op"`
	ID      int                  `json:"id"`
	Version string               `json:"version"`
	Count   int                  `json:"count"`
	Results []runcode.RichResult `json:"results"`
	Exc     *runcode.Exception   `json:"exc"`
}

func (w *worker) setRefused(err error) {
	w.refusedM.Lock()
	w.refusedE = err
	w.refusedM.Unlock()
}

func (w *worker) refused() error {
	w.refusedM.Lock()
	defer w.refusedM.Unlock()
	return w.refusedE
}

func (w *worker) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

func (w *worker) kill() { w.proc.Kill() }

func (w *worker) exitText() string {
	x := w.exit
	switch {
	case x.OOMKilled:
		return x.OOM.Reason()
	case x.Signal != 0:
		return fmt.Sprintf("killed by signal %d (%s)", int(x.Signal), x.Signal)
	}
	return fmt.Sprintf("exit status %d", x.Code)
}

// startFailure says why a worker ended before its hello, with the end of
// what it wrote to stderr.
func (w *worker) startFailure() string {
	<-w.done
	msg := w.exitText()
	if w.refused() != nil {
		msg = w.refused().Error() + "; " + msg
	}
	if t := strings.TrimSpace(string(w.err.held())); t != "" {
		lines := strings.Split(t, "\n")
		if len(lines) > 8 {
			lines = lines[len(lines)-8:]
		}
		msg += ": " + strings.Join(lines, "\n")
	}
	return msg
}

// readReplies decodes reply lines until the pipe ends or one is refused.
func (w *worker) readReplies() {
	defer close(w.replies)
	sc := bufio.NewScanner(w.rep)
	sc.Buffer(make([]byte, 64<<10), maxReply)
	for sc.Scan() {
		var r reply
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil || dec.More() {
			w.setRefused(fmt.Errorf("refused reply from the Node worker: not one reply object (%v)", err))
			return
		}
		if err := r.check(); err != nil {
			w.setRefused(err)
			return
		}
		w.replies <- r
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		w.setRefused(fmt.Errorf("refused reply from the Node worker: %w", err))
	}
}

// check bounds a decoded reply.
func (r *reply) check() error {
	switch {
	case r.Op != "hello" && r.Op != "done" && r.Op != "dropped":
		return fmt.Errorf("refused reply from the Node worker: unknown op %.40q", r.Op)
	case len(r.Results) > 1:
		return fmt.Errorf("refused reply from the Node worker: %d results (at most 1)", len(r.Results))
	}
	for _, rr := range r.Results {
		if len(rr.Data) != 1 {
			return errors.New("refused reply from the Node worker: a result must hold text/plain alone")
		}
		if _, ok := rr.Data["text/plain"].(string); !ok {
			return errors.New("refused reply from the Node worker: a result's text/plain must be a string")
		}
	}
	return nil
}

func (w *worker) send(r runRequest) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.req.Write(append(b, '\n'))
	return err
}

// await waits for the reply to request id.
func (w *worker) await(ctx context.Context, id int) (reply, error) {
	for {
		select {
		case r, ok := <-w.replies:
			if !ok {
				if w.refused() != nil {
					return reply{}, w.refused()
				}
				return reply{}, io.EOF
			}
			if r.ID == id {
				return r, nil
			}
		case <-ctx.Done():
			return reply{}, context.Cause(ctx)
		}
	}
}

// drop asks the worker to forget context id.
func (w *worker) drop(ctx context.Context, id string) error {
	w.nextID++
	if err := w.send(runRequest{Op: "drop", ID: w.nextID, Ctx: id}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := w.await(ctx, w.nextID)
	return err
}

// run runs one request; usable says whether the worker may run again.
func (w *worker) run(ctx context.Context, rq runRequest, req *runcode.Request) (*runcode.Result, bool) {
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	w.nextID++
	rq.ID = w.nextID
	rq.Token = "\x00quro-sync-" + hex.EncodeToString(tok[:]) + "\x00"
	if rq.Op == "run" && req.Session != nil && !maps.Equal(req.Session.Env, w.env) {
		rq.SEnv = maps.Clone(req.Session.Env)
		for k := range w.env {
			if _, ok := req.Session.Env[k]; !ok {
				rq.SDrop = append(rq.SDrop, k)
			}
		}
		w.env = maps.Clone(req.Session.Env)
	}
	outDone := w.out.begin(req.Stdout, []byte(rq.Token))
	errDone := w.err.begin(req.Stderr, []byte(rq.Token))
	defer w.out.end()
	defer w.err.end()
	if err := w.send(rq); err != nil {
		return &runcode.Result{ExitCode: -1, Error: "the Node worker did not take the run: " + err.Error()}, false
	}
	r, err := w.await(ctx, rq.ID)
	if err != nil {
		// Stopped (timeout, cancel, a restart of the context) or the
		// worker died: either way it is killed, and what it wrote kept.
		w.kill()
		<-w.done
		w.out.waitEOF(drainGrace)
		w.err.waitEOF(drainGrace)
		res := &runcode.Result{ExitCode: -1}
		switch {
		case errors.Is(err, runcode.ErrContextRestarted):
			// The restart the caller asked for, though it took the
			// worker (a busy loop takes no signal): said as the Python
			// and JS engines say it, with what it cost.
			res.Interrupted = true
			res.Error = runcode.ErrContextRestarted.Error() + "; the session's Node worker was stopped, and the state of its JavaScript contexts (variables, modules loaded) is lost"
			res.Exception = runcode.RestartedException()
		case errors.Is(err, context.DeadlineExceeded):
			res.TimedOut, res.Interrupted = true, true
			res.Error = fmt.Sprintf("timed out after %s; the session's Node worker was stopped, and the state of its JavaScript contexts (variables, modules loaded) is lost (output so far is kept)", req.Timeout.Round(time.Millisecond))
		case ctx.Err() != nil:
			res.Interrupted = true
			res.Error = "canceled by the caller; the session's Node worker was stopped, and the state of its JavaScript contexts is lost"
		default:
			res.Error = "the session's Node worker ended during the run (" + w.exitText() + "); the state of its JavaScript contexts is lost"
			if w.refused() != nil {
				res.Error = w.refused().Error() + "; the worker was stopped and the state of its JavaScript contexts is lost"
			}
			res.OOMKilled = w.exit.OOMKilled
		}
		return res, false
	}
	usable := true
	for _, d := range []chan struct{}{outDone, errDone} {
		select {
		case <-d:
		case <-w.done:
			usable = false
		case <-time.After(drainGrace):
			// The token never came on a stream: the code took it over
			// (closed fd 1, say). The worker is not trusted again.
			usable = false
		}
	}
	res := &runcode.Result{ExecutionCount: r.Count}
	if req.Context != nil && req.Context.Rich {
		res.Results, res.Exception = r.Results, r.Exc
	} else if r.Exc != nil {
		res.ExitCode = 1
	}
	if !usable {
		res.Notes = append(res.Notes, "the run's output did not end as the worker's protocol says (the code closed or took over stdout or stderr?); the session's Node worker was stopped, and the state of its JavaScript contexts is lost")
	}
	return res, usable
}

// stream is the reading end of the worker's stdout or stderr: a run's
// output goes to its sink up to the run's token; output between runs is
// kept (bounded) for the next.
type stream struct {
	mu      sync.Mutex
	sink    io.Writer // the run's, nil between runs
	token   []byte
	found   chan struct{}
	pending []byte
	eof     chan struct{}
}

func newStream() *stream { return &stream{eof: make(chan struct{})} }

func (s *stream) read(f *os.File) {
	defer close(s.eof)
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			s.mu.Lock()
			s.pending = append(s.pending, buf[:n]...)
			s.flushLocked()
			s.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// flushLocked passes what is pending to the sink: up to the token (the
// run's output is all there), else all but a tail that may begin it.
func (s *stream) flushLocked() {
	if s.sink == nil {
		if len(s.pending) > maxBetween {
			s.pending = append([]byte(nil), s.pending[len(s.pending)-maxBetween:]...)
		}
		return
	}
	if i := bytes.Index(s.pending, s.token); i >= 0 {
		_, _ = s.sink.Write(s.pending[:i])
		s.pending = append([]byte(nil), s.pending[i+len(s.token):]...)
		s.sink = nil
		close(s.found)
		return
	}
	keep := 0
	for k := min(len(s.token)-1, len(s.pending)); k > 0; k-- {
		if bytes.HasSuffix(s.pending, s.token[:k]) {
			keep = k
			break
		}
	}
	if n := len(s.pending) - keep; n > 0 {
		_, _ = s.sink.Write(s.pending[:n])
		s.pending = append(s.pending[:0], s.pending[n:]...)
	}
}

// begin sends the stream to sink until token; the channel is closed when
// the token came.
func (s *stream) begin(sink io.Writer, token []byte) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sink, s.token, s.found = sink, token, make(chan struct{})
	s.flushLocked()
	return s.found
}

// end ends the run's part: what is pending stays for the next.
func (s *stream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink != nil {
		_, _ = s.sink.Write(s.pending)
		s.pending = s.pending[:0]
	}
	s.sink = nil
}

// waitEOF waits (at most d) for the pipe's end after the worker died.
func (s *stream) waitEOF(d time.Duration) {
	select {
	case <-s.eof:
	case <-time.After(d):
	}
}

// held is what the stream keeps (a worker that died before its hello).
func (s *stream) held() []byte {
	s.waitEOF(drainGrace)
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.pending...)
}

// withTimeout is ctx bounded by d when d > 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
