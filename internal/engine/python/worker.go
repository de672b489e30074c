package python

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// workerSource is the worker's Python side, written into a directory of
// its own on first use (see ensureWorkerDir).
//
//go:embed worker/quro_worker.py
var workerSource []byte

const workerModule = "quro_worker"

// workerFlushInterval is how often a worker flushes its buffered stdout
// while a run is in progress: the most a printed line waits before it
// reaches the run's sink (see quro_worker.py). Zero: no flush thread, only
// the flushes at the events (a test knob, to see those alone).
var workerFlushInterval = 20 * time.Millisecond

// maxFrame bounds a reply frame (artifacts included). The worker caps a
// run's artifacts and rich results at 32 Mi characters (_RICH_MAX), which
// its JSON encoder (ensure_ascii) may write as up to 12 bytes each
// (an astral character as two \uXXXX escapes): legit frames can approach
// this, so the bytes stay bounded here and the decoded shape below.
const maxFrame = 256 << 20

// What a reply frame may hold, checked in Go whatever the worker module
// says (the session's code owns the interpreter: it can replace _send or
// raise _ARTIFACT_MAX/_RICH_MAX). Decoding JSON amplifies: "{}" is two
// bytes of a frame and tens of bytes of the decoded value, so the
// containers and values of a frame are counted before it is decoded.
const (
	maxFrameContainers = 1 << 16 // objects and arrays, at any depth
	maxFrameValues     = 1 << 20 // elements of all of them (commas + containers)
	maxFrameArtifacts  = 256
	maxFrameResults    = 256
	maxFrameNotes      = 64
	maxFrameNoteBytes  = 64 << 10
	maxFrameKilled     = 4096
	// The worker's 32 Mi characters of artifacts and results, at most 4
	// bytes each in UTF-8.
	maxFrameData = 4 * (32 << 20)
)

// errBadFrame is a reply frame refused for its size or shape: the worker
// that sent it is given up (its pipe closed), as a dead one is.
var errBadFrame = errors.New("refused reply frame")

// frame is a message of the worker protocol (see quro_worker.py).
type frame struct {
	Op        string             `json:"op"`
	ID        int                `json:"id,omitempty"`
	Pid       int                `json:"pid,omitempty"`
	Version   string             `json:"version,omitempty"`
	Status    string             `json:"status,omitempty"`
	ExitCode  int                `json:"exit_code,omitempty"`
	Artifacts []runcode.Artifact `json:"artifacts,omitempty"`
	Killed    []killedProc       `json:"killed,omitempty"`
	Notes     []string           `json:"notes,omitempty"`
	Error     string             `json:"error,omitempty"`
	// Code-context runs (runcode.ContextRun).
	Results []runcode.RichResult `json:"results,omitempty"`
	Exc     *runcode.Exception   `json:"exc,omitempty"`
	Count   int                  `json:"count,omitempty"`
}

type killedProc struct {
	Pid int    `json:"pid"`
	Cmd string `json:"cmd"`
}

// worker is one resident interpreter process.
type worker struct {
	proc    *sandbox.Process
	pid     int
	req     *os.File      // requests, our end
	rep     *os.File      // replies, our end: read by the goroutine that holds the worker
	repBuf  *bufio.Reader // over rep: a reply's header and body in one read
	out     *stream
	err     *stream
	done    chan struct{} // closed when the process has exited and been reaped
	exit    sandbox.Exit
	drain   time.Duration
	runs    int
	env     map[string]string // session variables last sent
	started time.Time
	refused error            // why a reply frame was refused (the worker was given up)
	sb      *sandbox.Sandbox // the one it runs in: where its box shows a TMPDIR
}

// workerConfig is what startWorker needs from the engine.
type workerConfig struct {
	python    string
	flags     []string // the interpreter's, before -c
	rootfs    string   // the userland the box shows (sandbox.Spec.Rootfs), or ""
	readOnly  []string // the interpreter's tree (if not in the userland) and workerDir
	workerDir string
	limits    *sandbox.Limits
	drain     time.Duration
}

// startWorker starts an interpreter through the sandbox and waits for its
// hello. lifetime bounds the process (its group is killed when it ends);
// ctx bounds only the wait for the hello.
func startWorker(ctx, lifetime context.Context, sb *sandbox.Sandbox, cfg workerConfig, spare bool, dir, home, tmp string, env map[string]string, network string) (*worker, error) {
	var parent, child []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	pipe := os.Pipe
	reqR, reqW, err1 := pipe()
	repR, repW, err2 := pipe()
	outR, outW, err3 := pipe()
	errR, errW, err4 := pipe()
	parent = append(parent, reqW, repR, outR, errR)
	child = append(child, reqR, repW, outW, errW)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll(parent)
		closeAll(child)
		return nil, err
	}
	// Both at their box paths (BoxPlaces) when sb's runs start in a box.
	dirJSON, _ := json.Marshal(boxPath(sb, cfg.workerDir))
	// The session's variables are in the environment already; the worker
	// learns their names (a JSON list of strings is a Python literal), so the
	// first run need not send them.
	keys := slices.Sorted(maps.Keys(env))
	if keys == nil {
		keys = []string{}
	}
	keysJSON, _ := json.Marshal(keys)
	boot := fmt.Sprintf("import sys; sys.path.insert(0, %s); import %s as w; del sys.path[0]; w.main(%s, %d)",
		dirJSON, workerModule, keysJSON, workerFlushInterval.Milliseconds())
	spec := &sandbox.Spec{
		Args:       append(append([]string{boxPath(sb, cfg.python)}, cfg.flags...), "-c", boot),
		Dir:        dir,
		Home:       home,
		Network:    network, // the session's, as for every process of its box
		TmpDir:     tmp,
		Env:        env,
		Limits:     cfg.limits,
		Rootfs:     cfg.rootfs,
		ReadOnly:   cfg.readOnly,
		Stdout:     outW,
		Stderr:     errW,
		ExtraFiles: []*os.File{reqR, repW}, // fd 3 and fd 4
	}
	p, err := sb.Start(lifetime, spec)
	closeAll(child)
	if err != nil {
		closeAll(parent)
		return nil, err
	}
	w := &worker{
		proc:    p,
		pid:     p.Pid(),
		req:     reqW,
		rep:     repR,
		repBuf:  bufio.NewReaderSize(repR, 4<<10), // a reply past it is read through
		out:     newStream(outR),
		err:     newStream(errR),
		done:    make(chan struct{}),
		drain:   cfg.drain,
		started: time.Now(),
		sb:      sb,
	}
	if !spare {
		w.env = nonNil(maps.Clone(env))
	}
	go w.out.read()
	go w.err.read()
	go func() {
		w.exit = p.Wait()
		reqW.Close()
		close(w.done)
		// The reply pipe ends when the worker's end closes; a process that
		// inherited it without close-on-exec (a C-level fork) may hold it
		// open: a read still waiting after the drain grace is ended.
		time.AfterFunc(w.drain, func() { repR.Close() })
	}()
	f, err := w.await(ctx)
	switch {
	case err == nil && f.Op == "hello":
		return w, nil
	case ctx.Err() != nil:
		w.kill()
		<-w.done
		return nil, ctx.Err()
	case err == nil:
		w.kill()
		return nil, fmt.Errorf("the Python worker did not start: %s", w.startFailure(f.Error))
	default:
		w.kill()
		why := "" // the pipe's end: the exit status says the rest
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, os.ErrClosed) {
			why = err.Error() // a refused frame
		}
		return nil, fmt.Errorf("the Python worker did not start: %s", w.startFailure(why))
	}
}

// await reads the next reply, or gives up when ctx ends.
func (w *worker) await(ctx context.Context) (frame, error) {
	stop := context.AfterFunc(ctx, func() { w.rep.SetReadDeadline(time.Now()) })
	f, err := w.readFrame()
	if !stop() {
		// ctx ended and a read deadline is (about to be) set: the caller
		// gives the worker up.
		return frame{}, ctx.Err()
	}
	return f, err
}

// startFailure describes why a worker died before its hello, with what it
// wrote to stderr.
func (w *worker) startFailure(msg string) string {
	<-w.done
	var b strings.Builder
	if msg != "" {
		b.WriteString(msg + "; ")
	}
	fmt.Fprintf(&b, "exit status %d", w.exit.Code)
	if p := w.err.pendingText(); p != "" {
		b.WriteString(": " + lastLines(p, 8))
	}
	return b.String()
}

// readFrame reads the next reply frame. An error means the worker is gone
// (its end of the pipe closed, or the pipe was closed after its death) or
// a deadline ended the wait.
func (w *worker) readFrame() (frame, error) {
	var head [4]byte
	if _, err := io.ReadFull(w.repBuf, head[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n > maxFrame {
		return frame{}, w.refuse(fmt.Errorf("%w: reply frame of %d bytes (at most %d)", errBadFrame, n, maxFrame))
	}
	// Grow the body as bytes arrive: a box that announces 256 MiB and
	// sends nothing must not make the server reserve 256 MiB.
	var buf bytes.Buffer
	if m, err := io.CopyN(&buf, w.repBuf, int64(n)); err != nil {
		if errors.Is(err, io.EOF) && m < int64(n) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	body := buf.Bytes()
	if err := scanFrame(body); err != nil {
		return frame{}, w.refuse(err)
	}
	var f frame
	if err := json.Unmarshal(body, &f); err != nil {
		f = frame{Op: "error", Error: "bad frame from the worker: " + err.Error()}
	}
	if err := f.check(); err != nil {
		return frame{}, w.refuse(err)
	}
	return f, nil
}

// refuse gives up the worker after a refused frame: its reply pipe is
// closed (its next write fails, the run finds no reply and the worker is
// reaped or killed as a dead one), and why is kept for the run's note.
func (w *worker) refuse(err error) error {
	w.rep.Close()
	w.refused = err
	return err
}

// scanFrame counts a frame's JSON containers and values without decoding
// it (a state machine aware of strings and their escapes; a frame that is
// not JSON is left to the decoder).
func scanFrame(b []byte) error {
	var containers, commas int
	inStr, esc := false, false
	for _, c := range b {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			containers++
		case ',':
			commas++
		}
	}
	if containers > maxFrameContainers {
		return fmt.Errorf("%w: %d JSON objects and arrays in one reply frame (at most %d)", errBadFrame, containers, maxFrameContainers)
	}
	if commas+containers > maxFrameValues {
		return fmt.Errorf("%w: %d JSON values in one reply frame (at most %d)", errBadFrame, commas+containers, maxFrameValues)
	}
	return nil
}

// check bounds a decoded frame's lists and the data they carry.
func (f *frame) check() error {
	switch {
	case len(f.Artifacts) > maxFrameArtifacts:
		return fmt.Errorf("%w: %d artifacts (at most %d)", errBadFrame, len(f.Artifacts), maxFrameArtifacts)
	case len(f.Results) > maxFrameResults:
		return fmt.Errorf("%w: %d rich results (at most %d)", errBadFrame, len(f.Results), maxFrameResults)
	case len(f.Notes) > maxFrameNotes:
		return fmt.Errorf("%w: %d notes (at most %d)", errBadFrame, len(f.Notes), maxFrameNotes)
	case len(f.Killed) > maxFrameKilled:
		return fmt.Errorf("%w: %d killed processes (at most %d)", errBadFrame, len(f.Killed), maxFrameKilled)
	}
	for _, n := range f.Notes {
		if len(n) > maxFrameNoteBytes {
			return fmt.Errorf("%w: a note of %d bytes (at most %d)", errBadFrame, len(n), maxFrameNoteBytes)
		}
	}
	data := 0
	for _, a := range f.Artifacts {
		data += len(a.Data) + len(a.Name) + len(a.MIME) + len(a.Kind) + len(a.Text)
	}
	for _, r := range f.Results {
		for k, v := range r.Data {
			data += len(k)
			if s, ok := v.(string); ok {
				data += len(s)
			}
		}
	}
	if data > maxFrameData {
		return fmt.Errorf("%w: %s of artifacts and rich results (at most %s)", errBadFrame, runcode.HumanBytes(int64(data)), runcode.HumanBytes(maxFrameData))
	}
	return nil
}

func (w *worker) send(v any) error { return w.sendPayload(v, nil) }

// sendPayload sends v as a frame's JSON; a non-nil payload follows it
// after a newline as raw bytes (JSON never holds a raw newline).
func (w *worker) sendPayload(v any, payload []byte) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	n := len(body)
	if payload != nil {
		n += 1 + len(payload)
	}
	if n > math.MaxUint32 {
		return errors.New("the request is too large for the worker protocol")
	}
	buf := make([]byte, 4, 4+n)
	binary.BigEndian.PutUint32(buf, uint32(n))
	buf = append(buf, body...)
	if payload != nil {
		buf = append(buf, '\n')
		buf = append(buf, payload...)
	}
	_, err = w.req.Write(buf)
	return err
}

// sendRun sends the compact form of a run request that leaves the
// variables as they are: "R<id> <token>\n<code>" (the token has neither
// spaces nor newlines).
func (w *worker) sendRun(id int, token []byte, code string) error {
	head := strconv.AppendInt([]byte("\x00\x00\x00\x00R"), int64(id), 10)
	head = append(head, ' ')
	head = append(head, token...)
	head = append(head, '\n')
	n := len(head) - 4 + len(code)
	if n > math.MaxUint32 {
		return errors.New("the request is too large for the worker protocol")
	}
	buf := make([]byte, 0, len(head)+len(code))
	buf = append(buf, head...)
	buf = append(buf, code...)
	binary.BigEndian.PutUint32(buf, uint32(n))
	_, err := w.req.Write(buf)
	return err
}

// runMsg is a run request's JSON; the code follows as the payload.
type runMsg struct {
	Op    string `json:"op"`
	ID    int    `json:"id"`
	Token string `json:"token"`
	Env   any    `json:"env,omitempty"` // a map[string]string, even empty, or nil: unchanged
	// A code-context run (see quro_worker.py).
	CX   bool              `json:"cx,omitempty"` // a context run: the reply has its count and results
	Ctx  *string           `json:"ctx,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	WS   string            `json:"ws,omitempty"`
	Rich bool              `json:"rich,omitempty"`
	Renv map[string]string `json:"renv,omitempty"`
}

func (w *worker) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

// kill ends the worker's whole process group.
func (w *worker) kill() {
	if w.alive() {
		w.proc.Kill()
	}
}

// bind makes a spare worker the session's: its directory and variables.
func (w *worker) bind(ctx context.Context, dir, home, tmp string, env map[string]string) error {
	// The directory, HOME and TMPDIR as the box shows them (the workspace
	// at /home/user, sandbox.BoxTmp), never their host paths, which the
	// box does not show.
	msg := map[string]any{"op": "bind", "cwd": w.sb.ViewPath(dir),
		"base": map[string]string{"HOME": w.sb.ViewPath(home), "TMPDIR": w.sb.TmpPath(tmp, tmp)}, "env": nonNil(env)}
	if err := w.send(msg); err != nil {
		return err
	}
	f, err := w.await(ctx)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return errors.New("the Python worker exited while taking the session")
	case f.Op != "bound":
		return fmt.Errorf("the Python worker did not take the session (%s)", f.Error)
	}
	w.env = nonNil(maps.Clone(env))
	return nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// runOptions are the engine's knobs a run needs.
type runOptions struct {
	grace time.Duration // from SIGINT to kill when the code does not stop
}

// run runs req in the worker. usable is false when the worker is gone
// (exited, crashed or killed) and must be replaced.
func (w *worker) run(ctx context.Context, req *runcode.Request, env map[string]string, o runOptions) (res *runcode.Result, usable bool) {
	w.runs++
	token := []byte("\x1equro-sync-" + randomHex(16) + "\x1e")
	res = &runcode.Result{}
	if n := w.out.begin(req.Stdout, token); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the first %s of stdout were written between runs (by a thread or process of an earlier run)", runcode.HumanBytes(n)))
	}
	if n := w.err.begin(req.Stderr, token); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the first %s of stderr were written between runs (by a thread or process of an earlier run)", runcode.HumanBytes(n)))
	}
	msg := w.runMessage(req, env, token)
	var reply *frame
	in := &interruption{over: make(chan struct{}), settled: make(chan struct{}), exited: make(chan struct{})}
	var sendErr error
	if msg.Env == nil && req.Context == nil {
		sendErr = w.sendRun(msg.ID, token, req.Code)
	} else {
		sendErr = w.sendPayload(msg, []byte(req.Code))
	}
	interrupted := false
	if err := sendErr; err == nil {
		stop := w.interruptWhenDone(ctx, in, o.grace)
		// The reply is read here, not handed over by another goroutine.
		reply = w.awaitDone(in)
		interrupted = !stop()
	}
	in.finish()
	if interrupted {
		// The interrupter kills the worker before it records that it
		// did: its word is waited for, or a kill reads as a crash.
		<-in.exited
	}
	if in.sent && reply != nil {
		// A boxed worker's SIGINT goes through the box's init, which may
		// send it after the worker replied: it would then land in the
		// next run, which nobody interrupted. The run ends once every
		// SIGINT sent for it has been sent by kill(2) (and the worker,
		// reading the next request, finds it pending and drops it, as
		// between runs). Bounded by the grace: a box that does not
		// answer in that time (frozen by a pause) is left as before.
		sctx, cancel := context.WithTimeout(context.Background(), o.grace+time.Second)
		_ = w.proc.SignalsDelivered(sctx)
		cancel()
	}
	if reply == nil {
		w.reap()
	}
	detached := w.waitStreams(reply != nil)
	if detached {
		res.Notes = append(res.Notes, "a process of the run kept its output open; output after the run ended was not read")
	}

	res.TimedOut = in.timedOut()
	res.Interrupted = in.sent
	if reply != nil {
		replyResult(res, reply, in, req)
		return res, true
	}
	w.deathResult(res, in, req, o)
	return res, false
}

// runMessage is the run request for req; it carries the session's
// variables when they changed since the last run (w.env is then updated),
// and the context's settings when req runs in one.
func (w *worker) runMessage(req *runcode.Request, env map[string]string, token []byte) runMsg {
	msg := runMsg{Op: "run", ID: w.runs, Token: string(token)}
	if w.env == nil || !maps.Equal(env, w.env) {
		// Sent even when empty: the worker then drops the old variables.
		msg.Env = nonNil(env)
		w.env = nonNil(maps.Clone(env))
	}
	if c := req.Context; c != nil {
		if c.ID != "" {
			msg.Ctx = &c.ID
			msg.Cwd = c.Dir
			msg.WS = w.sb.ViewPath(req.Session.Workspace())
		}
		msg.CX = true
		msg.Rich = c.Rich
		msg.Renv = c.Env
	}
	return msg
}

// interruption is what a run's interrupter did: it is a goroutine that
// exists only once the run's ctx ended. Its fields are set by it and read
// when the run is over, under mu.
type interruption struct {
	mu         sync.Mutex
	finished   bool
	sent       bool  // a SIGINT was sent
	escalated  bool  // the code did not stop within the grace: the worker was killed
	stopped    bool  // the worker said the code stopped (its "stopped" frame)
	unfinished bool  // the code stopped but the worker did not finish the run within finishGrace: killed
	cause      error // why ctx ended
	over       chan struct{}
	settled    chan struct{} // closed at the "stopped" frame or the run's end: no more SIGINT
	exited     chan struct{} // closed when the interrupter returns
}

// finishGrace is the least time the worker has, once the code of an
// interrupted run stopped, to finish the run (format the exception:
// the first one imports traceback, ~50 ms of CPU, seconds in a box
// starved at load). The code's own grace ends when it stops; what the
// worker runs next may still call the code's (an exception's __str__),
// so this is bounded too. A variable for the tests.
var finishGrace = 10 * time.Second

// interruptWhenDone interrupts the current run when ctx ends; stop
// disarms it.
func (w *worker) interruptWhenDone(ctx context.Context, in *interruption, grace time.Duration) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		defer close(in.exited)
		in.mu.Lock()
		if in.finished {
			in.mu.Unlock()
			return
		}
		in.sent, in.cause = true, context.Cause(ctx)
		in.mu.Unlock()
		// A SIGINT that lands before the worker has read the run
		// request finds no run to interrupt and is dropped: it is
		// repeated (as a person presses ^C again) until the code
		// stopped; after the grace the worker is killed (the reply
		// pipe ends with it).
		if w.proc.Interrupt(syscall.SIGINT, interruptRepeat, grace, in.settled) {
			in.mu.Lock()
			in.escalated = true
			in.mu.Unlock()
			return
		}
		// The code stopped (or the run ended): the worker finishes the
		// run, bounded on its own.
		t := time.NewTimer(max(grace, finishGrace))
		defer t.Stop()
		select {
		case <-in.over:
		case <-t.C:
			in.mu.Lock()
			if !in.finished {
				in.unfinished = true
				w.proc.Kill()
			}
			in.mu.Unlock()
		}
	})
}

// codeStopped records the worker's word that the code of the interrupted
// run stopped: the SIGINTs and the grace end there.
func (in *interruption) codeStopped() {
	in.mu.Lock()
	if !in.stopped && !in.finished {
		in.stopped = true
		close(in.settled)
	}
	in.mu.Unlock()
}

// finish marks the run over.
func (in *interruption) finish() {
	in.mu.Lock()
	if !in.stopped {
		close(in.settled)
	}
	in.finished = true
	close(in.over) // under mu: no interrupt after the run is finished
	in.mu.Unlock()
}

func (in *interruption) timedOut() bool {
	return in.sent && errors.Is(in.cause, context.DeadlineExceeded)
}

// awaitDone reads replies until the current run's "done", or nil when the
// reply pipe ends or a frame is refused; a "stopped" of the run is passed
// to in.
func (w *worker) awaitDone(in *interruption) *frame {
	for {
		f, err := w.readFrame()
		if err != nil {
			return nil
		}
		if f.ID == w.runs {
			switch f.Op {
			case "done":
				return &f
			case "stopped":
				in.codeStopped()
			}
		}
	}
}

// reap waits for a worker that is gone to be reaped, killing it if need be,
// before the output it left in the pipes is read (bounded: an escaped
// process may hold them). In a box, bubblewrap passes the worker's exit
// status on and the box's pid namespace ends with it: killing bubblewrap
// first would replace the status with its own SIGKILL. It gets the drain
// grace.
func (w *worker) reap() {
	if !w.proc.Boxed() {
		w.kill()
		<-w.done
		return
	}
	t := time.NewTimer(w.drain)
	select {
	case <-w.done:
	case <-t.C:
		w.kill()
		<-w.done
	}
	t.Stop()
}

// replyResult fills res from the worker's reply to the run.
func replyResult(res *runcode.Result, reply *frame, in *interruption, req *runcode.Request) {
	res.ExitCode = reply.ExitCode
	res.Artifacts = reply.Artifacts
	res.Notes = append(res.Notes, reply.Notes...)
	res.Results = reply.Results
	res.Exception = reply.Exc
	res.ExecutionCount = reply.Count
	for _, k := range reply.Killed {
		res.Notes = append(res.Notes, fmt.Sprintf("process %d (%s) was still running when the run ended; it was killed", k.Pid, k.Cmd))
	}
	switch {
	case in.timedOut():
		res.Error = fmt.Sprintf("timed out after %s: the code was interrupted with KeyboardInterrupt; the session keeps its variables", req.Timeout.Round(time.Millisecond))
	case in.sent && errors.Is(in.cause, runcode.ErrContextRestarted):
		res.Error = runcode.ErrContextRestarted.Error()
		res.Exception = runcode.RestartedException()
	case in.sent:
		res.Error = "canceled by the caller: the code was interrupted with KeyboardInterrupt; the session keeps its variables"
	case reply.Status == "exit":
		res.Notes = append(res.Notes, fmt.Sprintf("the code called sys.exit(%d); the worker caught SystemExit and the session keeps its variables", reply.ExitCode))
	}
}

// deathResult fills res for a run with no reply: the worker died or was
// killed.
func (w *worker) deathResult(res *runcode.Result, in *interruption, req *runcode.Request, o runOptions) {
	e := w.exit
	res.ExitCode = e.Code
	lost := "the session's variables and imports are lost; the next run starts a fresh interpreter"
	if w.refused != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("the Python worker's reply was refused (%v): the worker was stopped; %s", w.refused, lost))
	}
	switch {
	case in.unfinished:
		res.Error = fmt.Sprintf("the code stopped after KeyboardInterrupt, but the Python worker did not finish the run within %s: it was killed; %s",
			max(o.grace, finishGrace), lost)
		if errors.Is(in.cause, runcode.ErrContextRestarted) {
			res.Error = runcode.ErrContextRestarted.Error() + "; " + res.Error
			res.Exception = runcode.RestartedException()
		}
	case in.escalated && in.timedOut():
		res.Error = fmt.Sprintf("timed out after %s and the code did not stop within %s of KeyboardInterrupt: the Python worker was killed; %s",
			req.Timeout.Round(time.Millisecond), o.grace, lost)
	case in.escalated && errors.Is(in.cause, runcode.ErrContextRestarted):
		// A restart that had to kill the worker is still the restart the
		// caller asked for (E2B's client waits for its ContextRestarting
		// error; at load a SIGINT can be handled past the grace).
		res.Error = fmt.Sprintf("%s; the code did not stop within %s of KeyboardInterrupt: the Python worker was killed; %s", runcode.ErrContextRestarted, o.grace, lost)
		res.Exception = runcode.RestartedException()
	case in.escalated:
		res.Error = fmt.Sprintf("canceled, and the code did not stop within %s of KeyboardInterrupt: the Python worker was killed; %s", o.grace, lost)
	case e.OOMKilled && e.Signal == syscall.SIGKILL:
		res.OOMKilled = true
		res.Notes = append(res.Notes, fmt.Sprintf("the Python worker was killed: %s; %s", e.OOM.Reason(), lost))
	case e.Signal != 0:
		res.Notes = append(res.Notes, fmt.Sprintf("the Python worker was killed by signal %d (%s); %s", int(e.Signal), e.Signal, lost))
	default:
		res.Notes = append(res.Notes, fmt.Sprintf("the Python worker process exited with status %d (os._exit() or a fatal error); %s", e.Code, lost))
	}
}

// waitStreams waits until both output streams reached the run's sync token
// (or their end). After a reply the tokens are already in the pipes; after a
// death the wait is bounded by the drain grace. It reports whether a stream
// had to be cut off.
func (w *worker) waitStreams(replied bool) bool {
	var timeout <-chan time.Time
	if !replied {
		t := time.NewTimer(w.drain)
		defer t.Stop()
		timeout = t.C
	}
	cut := false
	for _, s := range []*stream{w.out, w.err} {
		select {
		case <-s.synced():
		case <-timeout:
			cut = true
		case <-w.done:
			if replied {
				// Died right after replying: its output ends with the pipe.
				t := time.NewTimer(w.drain)
				select {
				case <-s.synced():
				case <-t.C:
					cut = true
				}
				t.Stop()
			} else {
				select {
				case <-s.synced():
				case <-timeout:
					cut = true
				}
			}
		}
		s.detach()
	}
	return cut
}

// stream routes one of the worker's output pipes: to the current run's
// writer up to that run's sync token, and into a small bounded buffer
// between runs (shown at the start of the next run).
type stream struct {
	f *os.File

	mu      sync.Mutex
	sink    io.Writer
	token   []byte
	sync    chan struct{}
	eof     bool
	pending []byte
	dropped int64
}

const maxPending = 64 << 10

func newStream(f *os.File) *stream {
	s := &stream{f: f, sync: make(chan struct{})}
	close(s.sync)
	return s
}

// begin starts a run: output goes to sink until token. It returns how
// many bytes written between runs were handed to sink first.
func (s *stream) begin(sink io.Writer, token []byte) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sink == nil {
		sink = io.Discard
	}
	s.sink, s.token, s.sync = sink, token, make(chan struct{})
	n := int64(len(s.pending)) + s.dropped
	if len(s.pending) > 0 {
		_, _ = sink.Write(s.pending) // the run's output sink: nowhere else to report a failed write
	}
	if s.dropped > 0 {
		fmt.Fprintf(sink, "\n[%s more written between runs were dropped]\n", runcode.HumanBytes(s.dropped))
	}
	s.pending, s.dropped = nil, 0
	if s.eof {
		s.token = nil
		close(s.sync)
	}
	return n
}

func (s *stream) synced() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sync
}

// detach stops writing to the run's sink: nothing reaches it after Run.
func (s *stream) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sink = nil
	if s.token != nil {
		s.token = nil
		close(s.sync)
	}
}

func (s *stream) pendingText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.pending)
}

// Read sizes of a stream: it starts small and grows (by four) while reads
// fill it, up to large, and goes back to small after a read that found
// little, so an idle worker's two streams hold 2 × 4 KiB instead of
// 2 × 64 KiB. slack is room for a token prefix carried to the next read.
const (
	streamSmall = 4 << 10
	streamLarge = 64 << 10
	streamSlack = 256
)

func (s *stream) read() {
	defer s.f.Close()
	chunk := streamSmall
	buf := make([]byte, chunk+streamSlack)
	carry := 0
	for {
		n, err := s.f.Read(buf[carry : carry+chunk])
		if n > 0 {
			carry = s.feed(buf, carry+n)
		}
		if next := nextChunk(chunk, n); next != chunk && err == nil {
			chunk = next
			nb := make([]byte, chunk+streamSlack)
			copy(nb, buf[:carry])
			buf = nb
		}
		if err != nil {
			s.mu.Lock()
			s.eof = true
			if carry > 0 {
				s.emit(buf[:carry])
			}
			if s.token != nil {
				s.token = nil
				close(s.sync)
			}
			s.mu.Unlock()
			return
		}
	}
}

// nextChunk is the read size after a read of n bytes into chunk.
func nextChunk(chunk, n int) int {
	switch {
	case n == chunk && chunk < streamLarge:
		return min(chunk*4, streamLarge)
	case n < streamSmall/2 && chunk > streamSmall:
		return streamSmall
	}
	return chunk
}

// feed handles buf[:n] and returns how many bytes it moved to the front of
// buf to be looked at again with the next read (a possible token prefix).
func (s *stream) feed(buf []byte, n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	data := buf[:n]
	if s.token == nil {
		s.emit(data)
		return 0
	}
	if i := bytes.Index(data, s.token); i >= 0 {
		s.emit(data[:i])
		rest := data[i+len(s.token):]
		s.token, s.sink = nil, nil
		close(s.sync)
		s.emit(rest)
		return 0
	}
	keep := tokenPrefixAtEnd(data, s.token)
	s.emit(data[:n-keep])
	copy(buf, data[n-keep:])
	return keep
}

// tokenPrefixAtEnd is the length of the longest end of data that is a
// proper prefix of token: the bytes that must wait for the next read. Any
// other output is passed on at once.
func tokenPrefixAtEnd(data, token []byte) int {
	from := max(len(data)-(len(token)-1), 0)
	for j := from; j < len(data); j++ {
		if data[j] == token[0] && bytes.HasPrefix(token, data[j:]) {
			return len(data) - j
		}
	}
	return 0
}

// emit writes p to the run's sink, or keeps it for the next run. Called
// with s.mu held.
func (s *stream) emit(p []byte) {
	if len(p) == 0 {
		return
	}
	if s.sink != nil {
		_, _ = s.sink.Write(p) // as in begin
		return
	}
	room := maxPending - len(s.pending)
	if room > len(p) {
		room = len(p)
	}
	s.pending = append(s.pending, p[:room]...)
	s.dropped += int64(len(p) - room)
}

// interruptRepeat is how often the SIGINT of a timeout is repeated while
// the run has not ended.
const interruptRepeat = 250 * time.Millisecond
