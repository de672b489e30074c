// Package proc keeps the background processes of sessions: programs an
// agent (or an E2B client) starts in a session's box, that outlive the
// call that started them, with a pid, an optional tag, a stdin pipe or a
// pseudo-terminal, and output fanned out to every viewer attached.
//
// Every process is started through internal/sandbox, in the session's
// box, as every other run; this package only keeps the table, the pipes
// and the viewers. A session has at most DefaultMax live processes (or
// its Start.Limits), a tenant at most Start.Limits.Tenant over all its
// sessions; a process leaves the table, and stops counting, when it ends.
package proc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/quro-dev/quro/internal/sandbox"
)

// Errors of the table; internal/controller/errors.go classifies them.
var (
	// ErrNotFound: no live process of the session has that pid or tag
	// (it never ran there, or it has ended).
	ErrNotFound = errors.New("no such process")
	// ErrTooMany: the session or its tenant runs its maximum of
	// processes (a *LimitError says which), or a process has its maximum
	// of viewers.
	ErrTooMany = errors.New("too many processes")
	// ErrInvalid: a request the process cannot take (input to a process
	// without stdin, a resize of one without a terminal, a bad signal).
	ErrInvalid = errors.New("invalid process request")
	// ErrNoProgram: the program the caller named is not in the box (not
	// in its PATH, no such file, not an executable file): nothing
	// started, and a retry would not start it either.
	ErrNoProgram = errors.New("no such program")
	// ErrLagged: a viewer read the output too slowly and was detached
	// (the process runs on).
	ErrLagged = errors.New("output reader fell behind")
	// ErrClosed: the session's processes were ended (destroyed session,
	// server stopping).
	ErrClosed = errors.New("the session's processes were ended")
)

// DefaultMax is how many processes a session may run at once.
const DefaultMax = 64

// Limits are how many live processes a start may find: of its session
// (0: the table's DefaultMax) and of its tenant, over all the tenant's
// sessions (0: no limit). Negative: no limit.
type Limits struct {
	Session int
	Tenant  int
}

// LimitError is a start refused because its session or its tenant runs
// its limit of processes. It wraps ErrTooMany.
type LimitError struct {
	Scope string // "session" or "tenant"
	Count int    // the processes it runs (and starts under way)
	Limit int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: the %s already runs %d background processes (its limit is %d)", ErrTooMany, e.Scope, e.Count, e.Limit)
}

// Unwrap makes errors.Is(err, ErrTooMany) true.
func (e *LimitError) Unwrap() error { return ErrTooMany }

// DefaultQueue is how many bytes of output a viewer may lag behind
// before it is detached.
const DefaultQueue = 1 << 20

// maxQueuedChunks bounds the chunks queued for one viewer, however small.
const maxQueuedChunks = 4096

// MaxViewers is how many viewers a process may have at once.
const MaxViewers = 16

// MaxTag is the longest tag, in bytes.
const MaxTag = 256

// inputTimeout bounds a write to a process's stdin or terminal that the
// process does not read.
const inputTimeout = 10 * time.Second

// Config is what a process runs, as the caller asked for it.
type Config struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// Size is a terminal's size.
type Size struct {
	Cols int `json:"cols" jsonschema:"columns"`
	Rows int `json:"rows" jsonschema:"rows"`
}

// Start describes a process to start.
type Start struct {
	Config
	Tag string
	// Tenant owns the session: its processes are counted together
	// against Limits.Tenant.
	Tenant string
	Limits Limits
	// Dir is the working directory as the box sees it ("": the spec's
	// Dir); Config.Cwd is only what the caller asked for, as reported.
	Dir string
	// Stdin keeps a pipe to the process's stdin open (SendInput,
	// CloseStdin); else its stdin is /dev/null.
	Stdin bool
	// PTY, when set, runs the process on a new pseudo-terminal of that
	// size: its output is the terminal's (stream "pty"), input goes to
	// the terminal.
	PTY *Size
	// Timeout kills the process when it passes, counted from its start
	// (0: never).
	Timeout time.Duration
}

// Event is a piece of output: Stream is "stdout", "stderr" or "pty".
type Event struct {
	Stream string
	Data   []byte
}

// End is how a process ended, in the words of E2B's envd (which are Go's
// os.ProcessState's): ExitCode is -1 when a signal killed it.
type End struct {
	ExitCode int    `json:"exit_code"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

// Info describes a live process.
type Info struct {
	Pid    int    `json:"pid"`
	Tag    string `json:"tag,omitempty"`
	Config Config `json:"config"`
	PTY    bool   `json:"pty,omitempty"`
	Stdin  bool   `json:"stdin,omitempty"`
}

// Table is the processes of every session. Safe for concurrent use.
type Table struct {
	max, queue int // DefaultMax, DefaultQueue (the tests' seam)

	mu       sync.Mutex
	sessions map[string]map[int]*Process // session id → pid → process
	ended    map[string][]*Process       // session id → its last keepEnded ended processes, oldest first
	pending  map[string]int              // starts under way per session
	tenants  map[string]int              // live processes and starts under way per tenant
	closed   bool
}

// New returns an empty table.
func New() *Table { return newTable(DefaultMax, DefaultQueue) }

func newTable(max, queue int) *Table {
	return &Table{max: max, queue: queue, sessions: map[string]map[int]*Process{}, ended: map[string][]*Process{}, pending: map[string]int{}, tenants: map[string]int{}}
}

// Process is a live (or just ended) process of a session.
type Process struct {
	t       *Table
	session string
	tenant  string
	pid     int
	tag     string
	config  Config
	tty     bool
	sp      *sandbox.Process

	inMu   sync.Mutex
	stdin  *os.File // the stdin pipe's write end, or nil
	master *os.File // the terminal's master side, or nil

	mu      sync.Mutex
	viewers map[*Viewer]struct{}
	out     ring // the latest output, for ReadOutput
	done    chan struct{}
	end     End
}

// Viewer receives a process's output from the moment it attached. Read C
// until it is closed: then Err says why when it fell behind (the process
// runs on), else the process ended (Process.End).
type Viewer struct {
	C      <-chan *Event
	c      chan *Event
	p      *Process
	lagged error // under p.mu: why it was detached for falling behind
	queued atomic.Int64
}

// Consumed tells that the reader of C is done with an event of n bytes:
// they no longer count against the viewer's queue.
func (v *Viewer) Consumed(n int) { v.queued.Add(-int64(n)) }

// Err is nil unless the viewer was detached for falling behind: then an
// ErrLagged that says how far (in bytes or in pieces of output).
func (v *Viewer) Err() error {
	v.p.mu.Lock()
	defer v.p.mu.Unlock()
	return v.lagged
}

// Detach stops v (its channel is closed).
func (v *Viewer) Detach() {
	v.p.mu.Lock()
	defer v.p.mu.Unlock()
	if _, ok := v.p.viewers[v]; ok {
		delete(v.p.viewers, v)
		close(v.c)
	}
}

// Pid is the process's pid as the processes of its session see it (the
// pid in the box's pid namespace; the host pid when the run has no box of
// its session).
func (p *Process) Pid() int { return p.pid }

// Done is closed when the process has ended and its output was delivered.
func (p *Process) Done() <-chan struct{} { return p.done }

// End is how the process ended (valid once Done is closed).
func (p *Process) End() End {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

// Info describes p.
func (p *Process) Info() Info {
	p.inMu.Lock()
	stdin := p.stdin != nil
	p.inMu.Unlock()
	return Info{Pid: p.pid, Tag: p.tag, Config: p.config, PTY: p.tty, Stdin: stdin}
}

// Attach adds a viewer that gets the output from now on (nothing of
// before is replayed). It fails with ErrNotFound when the process has
// already ended, ErrTooMany when it has MaxViewers.
func (p *Process) Attach() (*Viewer, error) {
	v, _, err := p.attach(false)
	return v, err
}

// AttachReplay is Attach that also returns what the process printed
// before (the last RingSize bytes, every stream merged), taken in the
// same step as the viewer is added: nothing is lost or seen twice between
// the two.
func (p *Process) AttachReplay() (*Viewer, []byte, error) { return p.attach(true) }

func (p *Process) attach(replay bool) (*Viewer, []byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return nil, nil, fmt.Errorf("%w: process %d has just ended", ErrNotFound, p.pid)
	default:
	}
	if len(p.viewers) >= MaxViewers {
		return nil, nil, fmt.Errorf("%w: process %d already has %d viewers (the limit); end one first", ErrTooMany, p.pid, MaxViewers)
	}
	var before []byte
	if replay {
		before = p.out.read(0).Data
	}
	return p.attachLocked(), before, nil
}

func (p *Process) attachLocked() *Viewer {
	// Pointers: the queue's buffer is allocated and cleared whole when a
	// viewer attaches (every E2B commands.run, every followed
	// start_process), 32 KiB of them against 160 KiB of Events.
	c := make(chan *Event, maxQueuedChunks)
	v := &Viewer{C: c, c: c, p: p}
	p.viewers[v] = struct{}{}
	return v
}

// emit hands a chunk to every viewer without waiting: a viewer whose
// queue is full (DefaultQueue bytes, or maxQueuedChunks pieces however
// small) is detached with the reason (Err), never the process nor the
// others slowed down.
func (p *Process) emit(stream string, b []byte) {
	if len(b) == 0 {
		return
	}
	ev := &Event{Stream: stream, Data: slices.Clone(b)} // shared by the viewers, which only read it
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.write(b)
	for v := range p.viewers {
		queued := v.queued.Add(int64(len(b)))
		if queued > int64(p.t.queue) {
			v.lagged = fmt.Errorf("%w: %s of process %d's output waited for this reader (at most %s may)",
				ErrLagged, size(queued), p.pid, size(int64(p.t.queue)))
		} else {
			select {
			case v.c <- ev:
				continue
			default:
			}
			v.lagged = fmt.Errorf("%w: %d pieces of process %d's output waited for this reader (at most %d may, however small)",
				ErrLagged, cap(v.c)+1, p.pid, cap(v.c))
		}
		delete(p.viewers, v)
		close(v.c)
	}
}

// size says n bytes in KiB, or in bytes under a KiB.
func size(n int64) string {
	if n < 1<<10 {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	return strconv.FormatInt(n>>10, 10) + " KiB"
}

// streamWriter is the sandbox's Stdout or Stderr of a process: it never
// blocks.
type streamWriter struct {
	p      *Process
	stream string
}

func (w streamWriter) Write(b []byte) (int, error) {
	w.p.emit(w.stream, b)
	return len(b), nil
}

// Start starts a process of session in sb (a sandbox of the session, see
// sandbox.Sandbox.ForSession) from base, a spec the caller filled with
// the session's directories, uid, variables, network and rootfs; Start
// sets its program, stdio and terminal. The process runs until it ends,
// is signaled, its timeout passes or its session's processes are ended:
// ctx only bounds the start. The returned viewer was attached before the
// process started, so it sees all of its output.
func (t *Table) Start(ctx context.Context, sb *sandbox.Sandbox, base *sandbox.Spec, session string, st *Start) (*Process, *Viewer, error) {
	if st.Cmd == "" {
		return nil, nil, fmt.Errorf("%w: cmd is empty: name the program to run (e.g. /bin/bash with args [\"-c\", \"…\"])", ErrInvalid)
	}
	if len(st.Tag) > MaxTag {
		return nil, nil, fmt.Errorf("%w: the tag is %d bytes; at most %d", ErrInvalid, len(st.Tag), MaxTag)
	}
	if st.PTY != nil {
		if err := checkSize(st.PTY.Cols, st.PTY.Rows); err != nil {
			return nil, nil, err
		}
	}
	if err := t.reserve(session, st.Tenant, st.Limits); err != nil {
		return nil, nil, err
	}
	defer t.unreserve(session, st.Tenant)

	spec, err := startSpec(base, st)
	if err != nil {
		return nil, nil, err
	}
	p := &Process{t: t, session: session, tenant: st.Tenant, tag: st.Tag, config: st.Config, tty: st.PTY != nil,
		viewers: map[*Viewer]struct{}{}, done: make(chan struct{})}
	v := p.attachLocked()
	closeAfter, master, err := p.stdio(&spec, st)
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	// A start that the caller gave up on still ends: the sandbox kills
	// what it started under runCtx alone.
	if err := ctx.Err(); err != nil {
		cancel()
		closeAll(closeAfter, master, p.stdin)
		return nil, nil, err
	}
	sp, err := sb.Start(runCtx, &spec)
	for _, f := range closeAfter {
		f.Close()
	}
	if err != nil {
		cancel()
		closeAll(nil, master, p.stdin)
		if errors.Is(err, sandbox.ErrInvalidSpec) {
			// What the caller chose does not fit (arguments or
			// variables too large, a bad variable).
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		if se := (*sandbox.StartError)(nil); errors.As(err, &se) && se.NoProgram {
			return nil, nil, noProgram{err}
		}
		return nil, nil, err
	}
	// The timeout is the process's: it counts from its start, not from
	// the making of the session's box (a 100 ms timeout failed the start
	// itself, "canceled while the sandbox was starting", on a loaded
	// machine). Its end kills the process through runCtx.
	if st.Timeout > 0 {
		timer := time.AfterFunc(st.Timeout, cancel)
		stopAll := cancel
		cancel = func() {
			timer.Stop()
			stopAll()
		}
	}
	p.sp, p.master = sp, master
	// Its pid in the box, as the sandbox knew it at the start: right even
	// when the program has ended already (/proc no longer names it then).
	p.pid = sp.BoxPid()
	if !t.register(p) {
		sp.Kill()
		go func() { sp.Wait(); cancel() }()
		closeAll(nil, master, p.stdin)
		return nil, nil, ErrClosed
	}
	go p.watch(cancel)
	return p, v, nil
}

// noProgram is a start error whose program is not in the box: it reads
// as the sandbox's text ("cannot start X: …") and is ErrNoProgram.
type noProgram struct{ err error }

func (e noProgram) Error() string   { return e.err.Error() }
func (e noProgram) Unwrap() []error { return []error{ErrNoProgram, e.err} }

// startSpec is base with st's program, working directory and variables.
func startSpec(base *sandbox.Spec, st *Start) (sandbox.Spec, error) {
	spec := *base
	spec.Args = append([]string{st.Cmd}, st.Args...)
	switch st.Dir {
	case "":
	case sandbox.HomeUser:
		// The default: the box enters it as cheaply as it can (its
		// init, or bubblewrap, when it shows the workspace there; its
		// sh otherwise).
		spec.StartsInHome = true
	default:
		// The working directory is entered inside the box, by the
		// box's own sh: the server never resolves a path the session
		// chose (Spec.Dir is the workspace, which the sandbox binds
		// and hands over).
		spec.Args = sandbox.EnterDirArgs(st.Dir, spec.Args)
	}
	env := map[string]string{}
	for k, v := range base.Env {
		env[k] = v
	}
	if err := sandbox.CheckEnv(st.Env); err != nil {
		return sandbox.Spec{}, fmt.Errorf("%w: environment: %v", ErrInvalid, err)
	}
	maps.Copy(env, st.Env)
	spec.Env = env
	return spec, nil
}

// stdio sets spec's stdin, stdout and stderr: a terminal's slave side
// when st asks for one (master is its other side), else the output
// streams of p and, when st asks for it, a pipe whose writing end is
// p.stdin. closeAfter are the child's ends, closed once it started.
func (p *Process) stdio(spec *sandbox.Spec, st *Start) (closeAfter []*os.File, master *os.File, err error) {
	if st.PTY != nil {
		m, slave, err := pty.Open()
		if err != nil {
			return nil, nil, err
		}
		if err := pty.Setsize(m, &pty.Winsize{Cols: uint16(st.PTY.Cols), Rows: uint16(st.PTY.Rows)}); err != nil {
			m.Close()
			slave.Close()
			return nil, nil, err
		}
		spec.Stdin, spec.Stdout, spec.Stderr, spec.TTY = slave, slave, slave, true
		if spec.Term == "" || spec.Term == "dumb" {
			spec.Term = "xterm-256color"
		}
		return []*os.File{slave}, m, nil
	}
	spec.Stdout = streamWriter{p, "stdout"}
	spec.Stderr = streamWriter{p, "stderr"}
	spec.Stdin = nil
	if st.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		spec.Stdin = r
		p.stdin = w
		return []*os.File{r}, nil, nil
	}
	return nil, nil, nil
}

// register adds the started p to its session's processes; false when the
// table is closed.
func (t *Table) register(p *Process) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	procs := t.sessions[p.session]
	if procs == nil {
		procs = map[int]*Process{}
		t.sessions[p.session] = procs
	}
	if procs[p.pid] != nil {
		// Two running processes with one pid in their boxes: boxes of
		// their own (each program is its box's pid 2, sandbox.BoxPid).
		// The table needs one handle per process: the host's.
		p.pid = p.sp.Pid()
	}
	procs[p.pid] = p
	t.tenants[p.tenant]++ // unreserve takes back the start's count
	return true
}

// watch reads p's terminal, if it has one, and waits for p to end: then
// it cancels p's run context (cancel), closes p's terminal and stdin, and
// finishes p in its table.
func (p *Process) watch(cancel context.CancelFunc) {
	var reading sync.WaitGroup
	if p.master != nil {
		reading.Add(1)
		go func() {
			defer reading.Done()
			p.readPTY()
		}()
	}
	e := p.sp.Wait()
	cancel()
	if p.master != nil {
		// The terminal's last output: read until its slave side is
		// closed everywhere (EIO), bounded for a child that keeps it.
		_ = p.master.SetReadDeadline(time.Now().Add(2 * time.Second))
		reading.Wait()
		p.master.Close()
	}
	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	p.t.finish(p, endOf(e))
}

func closeAll(fs []*os.File, more ...*os.File) {
	for _, f := range append(fs, more...) {
		if f != nil {
			f.Close()
		}
	}
}

func (p *Process) readPTY() {
	buf := make([]byte, 32<<10)
	for {
		n, err := p.master.Read(buf)
		if n > 0 {
			p.emit("pty", buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// finish records p's end, closes its viewers and takes it out of the table.
func (t *Table) finish(p *Process, e End) {
	t.mu.Lock()
	if procs := t.sessions[p.session]; procs[p.pid] == p {
		delete(procs, p.pid)
		if len(procs) == 0 {
			delete(t.sessions, p.session)
		}
		t.untenant(p.tenant)
	}
	ended := append(t.ended[p.session], p)
	t.ended[p.session] = ended[max(len(ended)-keepEnded, 0):]
	t.mu.Unlock()
	p.mu.Lock()
	p.end = e
	for v := range p.viewers {
		delete(p.viewers, v)
		close(v.c)
	}
	close(p.done)
	p.mu.Unlock()
}

// endOf says how a run ended as envd does (Go's ProcessState): "exit
// status N", or "signal: NAME" with exit code -1.
func endOf(e sandbox.Exit) End {
	if e.Signal != 0 {
		s := "signal: " + e.Signal.String()
		return End{ExitCode: -1, Status: s, Error: s}
	}
	if e.Code < 0 {
		return End{ExitCode: -1, Status: "the process could not be run", Error: "the process could not be run"}
	}
	s := "exit status " + strconv.Itoa(e.Code)
	end := End{ExitCode: e.Code, Exited: true, Status: s}
	if e.Code != 0 {
		end.Error = s
	}
	return end
}

// reserve counts a start of session (of tenant) under way, or refuses it
// with a *LimitError when the session or the tenant is at its limit.
func (t *Table) reserve(session, tenant string, lim Limits) error {
	if lim.Session == 0 {
		lim.Session = t.max
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if n := len(t.sessions[session]) + t.pending[session]; lim.Session > 0 && n >= lim.Session {
		return &LimitError{Scope: "session", Count: n, Limit: lim.Session}
	}
	if n := t.tenants[tenant]; lim.Tenant > 0 && n >= lim.Tenant {
		return &LimitError{Scope: "tenant", Count: n, Limit: lim.Tenant}
	}
	t.pending[session]++
	t.tenants[tenant]++
	return nil
}

// unreserve ends the count of a start (a started process counts on, as
// registered).
func (t *Table) unreserve(session, tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending[session]--; t.pending[session] <= 0 {
		delete(t.pending, session)
	}
	t.untenant(tenant)
}

// untenant counts one process (or start) of tenant less; under t.mu.
func (t *Table) untenant(tenant string) {
	if t.tenants[tenant]--; t.tenants[tenant] <= 0 {
		delete(t.tenants, tenant)
	}
}

// Count is how many processes session runs, and its tenant over all its
// sessions (starts under way included).
func (t *Table) Count(session, tenant string) (inSession, inTenant int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions[session]), t.tenants[tenant]
}

// Total is how many processes all sessions run (starts under way
// included).
func (t *Table) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.tenants {
		n += c
	}
	return n
}

// TenantCount is how many processes tenant runs over all its sessions
// (starts under way included).
func (t *Table) TenantCount(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tenants[tenant]
}

// Selector names a process: by pid, or by tag when Pid is 0.
type Selector struct {
	Pid int    `json:"pid,omitempty"`
	Tag string `json:"tag,omitempty"`
}

func (s Selector) String() string {
	if s.Pid == 0 && s.Tag != "" {
		return "tag " + strconv.Quote(s.Tag)
	}
	return "pid " + strconv.Itoa(s.Pid)
}

// Get returns the live process of session that sel names.
func (t *Table) Get(session string, sel Selector) (*Process, error) {
	if sel.Pid == 0 && sel.Tag == "" {
		return nil, fmt.Errorf("%w: name the process by pid or by tag", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	procs := t.sessions[session]
	if sel.Pid != 0 {
		if p := procs[sel.Pid]; p != nil {
			return p, nil
		}
	} else {
		pids := make([]int, 0, len(procs))
		for pid, p := range procs {
			if p.tag == sel.Tag {
				pids = append(pids, pid)
			}
		}
		if len(pids) > 0 {
			return procs[slices.Min(pids)], nil
		}
	}
	return nil, fmt.Errorf("%w: no running process with %s in this session (it has ended, or never ran here); list_processes lists them", ErrNotFound, sel)
}

// Find returns the process of session that sel names: a live one, else
// one of the last that ended (the newest that matches), whose output is
// still readable (ReadOutput).
func (t *Table) Find(session string, sel Selector) (*Process, error) {
	p, err := t.Get(session, sel)
	if !errors.Is(err, ErrNotFound) {
		return p, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ended := t.ended[session]
	for i := len(ended) - 1; i >= 0; i-- {
		if q := ended[i]; sel.Pid != 0 && q.pid == sel.Pid || sel.Pid == 0 && q.tag == sel.Tag {
			return q, nil
		}
	}
	return nil, fmt.Errorf("%w: no process with %s in this session, running or among its last %d ended (it ended before them, or never ran here)", ErrNotFound, sel, keepEnded)
}

// ReadOutput is what p printed (every stream merged) from offset since
// on, as far as its ring (the last RingSize bytes) still holds it.
func (p *Process) ReadOutput(since int64) Output {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.read(since)
}

// Ended reports whether p has ended (then End says how).
func (p *Process) Ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Sessions is how many sessions the table keeps processes or starts
// of (the leak tests' count).
func (t *Table) Sessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.sessions)
	for id := range t.pending {
		if t.sessions[id] == nil {
			n++
		}
	}
	for id := range t.ended {
		if t.sessions[id] == nil && t.pending[id] == 0 {
			n++
		}
	}
	return n
}

// List describes the live processes of session, by pid.
func (t *Table) List(session string) []Info {
	t.mu.Lock()
	procs := make([]*Process, 0, len(t.sessions[session]))
	for _, p := range t.sessions[session] {
		procs = append(procs, p)
	}
	t.mu.Unlock()
	out := make([]Info, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// SendInput writes b to the process's stdin, or to its terminal.
func (p *Process) SendInput(b []byte) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	f := p.stdin
	if p.master != nil {
		f = p.master
	}
	if f == nil {
		select {
		case <-p.done:
			return fmt.Errorf("%w: process %d has ended", ErrNotFound, p.pid)
		default:
		}
		return fmt.Errorf("%w: process %d has no stdin: it was started without stdin, or its stdin was closed (start it with stdin true to feed it)", ErrInvalid, p.pid)
	}
	if err := f.SetWriteDeadline(time.Now().Add(inputTimeout)); err != nil && !errors.Is(err, os.ErrNoDeadline) {
		return err
	}
	if _, err := f.Write(b); err != nil {
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("%w: process %d did not read its input for %s (its buffer is full)", ErrInvalid, p.pid, inputTimeout)
		case errors.Is(err, syscall.EPIPE), errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EIO):
			return fmt.Errorf("%w: process %d no longer reads its input (it closed its stdin or has ended)", ErrInvalid, p.pid)
		}
		return err
	}
	return nil
}

// CloseStdin closes the process's stdin pipe: it reads EOF. A stdin
// closed already, or never opened (the process reads EOF from the
// start), stays so: nothing to do, as E2B's envd answers it.
func (p *Process) CloseStdin() error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.master != nil {
		return fmt.Errorf("%w: process %d runs on a terminal, which has no stdin pipe to close: send ^D (\\x04) as input for EOF", ErrInvalid, p.pid)
	}
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// Signals that Signal sends, by name.
var Signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGQUIT": syscall.SIGQUIT, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGSTOP": syscall.SIGSTOP, "SIGCONT": syscall.SIGCONT,
}

// Signal sends sig to the process's process group.
func (p *Process) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	if sig == syscall.SIGKILL {
		p.sp.Kill()
		return
	}
	p.sp.Signal(sig)
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(cols, rows int) error {
	if err := checkSize(cols, rows); err != nil {
		return err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.master == nil {
		return fmt.Errorf("%w: process %d has no terminal to resize (start it with a pty)", ErrInvalid, p.pid)
	}
	return pty.Setsize(p.master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
}

func checkSize(cols, rows int) error {
	if cols <= 0 || rows <= 0 || cols > 1000 || rows > 1000 {
		return fmt.Errorf("%w: a terminal size must be between 1x1 and 1000x1000, not %dx%d", ErrInvalid, cols, rows)
	}
	return nil
}

// EndSession kills every process of session and waits until they have
// ended.
func (t *Table) EndSession(session string) {
	t.mu.Lock()
	procs := make([]*Process, 0, len(t.sessions[session]))
	for _, p := range t.sessions[session] {
		procs = append(procs, p)
	}
	t.mu.Unlock()
	for _, p := range procs {
		p.Signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		<-p.done
	}
	t.mu.Lock()
	delete(t.ended, session)
	t.mu.Unlock()
}

// Close kills every process of every session and refuses new ones.
func (t *Table) Close() {
	t.mu.Lock()
	t.closed = true
	var ids []string
	for id := range t.sessions {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.EndSession(id)
	}
	t.mu.Lock()
	clear(t.ended)
	t.mu.Unlock()
}
