// Package terminal holds Quro's resident shells: a shell over pipes that
// agents drive command by command (Shell), and a PTY for people and
// interactive programs (PTY).
//
// Shell framing. Each command is sent to a resident interactive bash on its
// standard input, wrapped so that the command runs in a subshell — a child
// process — that first closes every descriptor but stdin (the commands' own
// input pipe), stdout, stderr and the state socket. When the subshell has
// exited, the resident shell writes "<nonce>:<exit>:<marker>\x00" to file
// descriptor 3, the status channel, which no command's process holds.
// Completion and exit code come only from that record: the exit code is the
// subshell's real exit status. The resident shell never runs user code, and
// it runs from an execute-only copy of bash (see sealed.go), so it is not
// dumpable: a command (same uid) cannot reach its descriptors or memory
// through /proc, and neither can it reach those of the command subshells,
// which are forks of it.
//
// Shell state (cwd, variables, functions, aliases, options, traps, umask)
// is carried from one subshell to the next as an opaque blob: the subshell
// dumps it to the state socket (fd 6) when the command ends, the server
// keeps it and puts it in a memfd (fd 7) that the next subshell reads and
// evaluates before the command. The resident shell never evaluates it (see
// records.go for which blob counts, and shelllib.go for the dump).
//
// A Shell runs one command at a time and is safe for concurrent use: a
// second Exec while a command runs waits in line for it, in arrival order
// and at most its own timeout (queue.go). Its life (idle, starting,
// ready, running, closing, closed) is the state machine of lifecycle.go;
// Close returns once no call is in flight in it, and a call that raced
// with it gets ErrClosed. While a command runs, the shell looks every
// 100 ms whether it waits for input, over the processes of its own box
// only (procfs.go).
package terminal

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	// ErrBusy means the shell is still running a command (a BusyError
	// or an InputError says which, and for how long).
	ErrBusy = errors.New("the session's shell is still running a command")
	// ErrNotRunning means there is no command to send input to or to wait for.
	ErrNotRunning = errors.New("no command is running in the session's shell")
	// ErrClosed means the shell was closed (its session was destroyed).
	ErrClosed = errors.New("the shell was closed")
	// ErrInvalid marks bad input (a NUL byte in a command).
	ErrInvalid = errors.New("invalid argument")
	// ErrStart means a session shell did not come up: its process was
	// made but did not answer its setup (a start past the sandbox's start
	// bound), exited, or could not be written to. The next command starts
	// it again.
	ErrStart = errors.New("the session's shell did not start")
	// ErrNoBash means the box has no bash, which the session shell needs.
	ErrNoBash = errors.New("the session shell needs bash, and this box has none: install it (apt-get install bash) or use the terminal (PTY), which runs sh")
)

// DefaultGrace is how long a command has to stop on a soft interrupt
// (SIGINT: its subshell's exit) before the shell is killed and recreated;
// the resident shell's own work after it has the start bound (interrupt).
const DefaultGrace = 1200 * time.Millisecond

// ShellOptions configure a Shell.
type ShellOptions struct {
	Sandbox *sandbox.Sandbox
	// Workspace is the working directory and HOME; TmpDir is TMPDIR.
	Workspace, TmpDir string
	// Network is the session's network policy; Rootfs the directory of
	// its root filesystem ("" for the host userland).
	Network, Rootfs string
	// OutputsDir receives full outputs that were cut.
	OutputsDir string
	// Cwd to start in (a previous session's last directory); default Workspace.
	Cwd string
	// Env returns the session's variables; called before each command so a
	// new value applies from the next command on.
	Env func() map[string]string
	// OnCwd is called when a command leaves the shell in a new directory.
	OnCwd func(cwd string)
	// Grace for the command's stop before the hard interrupt
	// (DefaultGrace).
	Grace time.Duration
	// MaxOutput bytes of output kept in a result (12 KiB); SpillLimit bytes
	// kept on disk (256 MiB).
	MaxOutput  int
	SpillLimit int64
	// Scrollback receives everything the shell prints, for log export.
	Scrollback *Ring
	// StartTimeout bounds a shell's start, its setup included (0: the
	// sandbox's start bound, sandbox.Options.StartTimeout).
	StartTimeout time.Duration
}

// ExecOptions tune one command.
type ExecOptions struct {
	Timeout time.Duration // 0: 30 s
	// Split keeps stderr apart instead of merging it into Output.
	Split bool
}

// Result is the outcome of a command (or of the wait after send_input).
type Result struct {
	Output   string `json:"output" jsonschema:"what the command printed (stdout and stderr merged in order unless split)"`
	Stderr   string `json:"stderr,omitempty" jsonschema:"stderr, only when split was asked for"`
	ExitCode int    `json:"exit_code" jsonschema:"the command's exit status (from the shell, never guessed from text); -1 while still running"`
	Cwd      string `json:"cwd" jsonschema:"the shell's working directory after the command (the workspace is /home/user)"`
	Running  bool   `json:"running" jsonschema:"the command is still running (waiting for input, or detached after a timeout)"`
	// WaitingForInput: the command is blocked reading its standard input;
	// answer with send_input.
	WaitingForInput bool `json:"waiting_for_input" jsonschema:"the command is blocked reading input; answer with send_input"`
	// Abandoned is the command that waited for input, unanswered, and was
	// interrupted for this one.
	Abandoned      string  `json:"abandoned,omitempty" jsonschema:"a command left waiting for input, interrupted so that this one could run"`
	TimedOut       bool    `json:"timed_out" jsonschema:"the command hit its timeout and was interrupted"`
	OOMKilled      bool    `json:"oom_killed,omitempty" jsonschema:"the kernel killed the command for want of memory; the text names the limit reached"`
	OOM            string  `json:"oom,omitempty" jsonschema:"which memory limit was reached, when oom_killed"`
	TimeoutMS      int64   `json:"timeout_ms,omitempty" jsonschema:"the timeout the command hit, when timed_out"`
	Interrupted    bool    `json:"interrupted" jsonschema:"the command was interrupted"`
	InterruptStage string  `json:"interrupt_stage,omitempty" jsonschema:"soft: SIGINT stopped it; hard: the shell was killed and recreated in the same directory"`
	ShellRestarted bool    `json:"shell_restarted" jsonschema:"the shell died (exit, set -e, a crash) or was killed, and a new one was started in the last directory"`
	Truncated      bool    `json:"truncated" jsonschema:"output was cut; output_file keeps it whole"`
	OutputBytes    int64   `json:"output_bytes"`
	OutputFile     string  `json:"output_file,omitempty" jsonschema:"workspace-relative file with the full output, when cut or escaped"`
	Error          string  `json:"error" jsonschema:"a failure of the terminal itself, not of the command"`
	DurationMS     float64 `json:"duration_ms"`

	// stalled: the command stopped on SIGINT (its subshell exited), but
	// the resident shell's work after it outlasted its bound, and the
	// hard stage came (Text).
	stalled bool
}

// Text renders the result for a model.
func (r *Result) Text() string {
	var b strings.Builder
	if r.Abandoned != "" {
		b.WriteString("ℹ️ interrupted " + r.Abandoned + ", which waited for input, to run this\n")
	}
	if r.Error != "" {
		b.WriteString("⚠️ error: " + r.Error + "\n")
	}
	if r.Output != "" {
		b.WriteString(r.Output)
		if !strings.HasSuffix(r.Output, "\n") {
			b.WriteByte('\n')
		}
		if r.OutputFile != "" {
			fmt.Fprintf(&b, "(full output, %d bytes: %s)\n", r.OutputBytes, r.OutputFile)
		}
	}
	if r.Stderr != "" {
		b.WriteString("⚠️ stderr:\n" + r.Stderr)
		if !strings.HasSuffix(r.Stderr, "\n") {
			b.WriteByte('\n')
		}
	}
	switch {
	case r.WaitingForInput:
		b.WriteString("⏳ waiting for input: answer with send_input; the next terminal_exec interrupts it\n")
	case r.Running:
		b.WriteString("⏳ still running\n")
	default:
		fmt.Fprintf(&b, "[exit %d]%s\n", r.ExitCode, shortCwd(r.Cwd))
	}
	if r.OOMKilled {
		b.WriteString("⚠️ killed: out of memory: " + r.OOM + "\n")
	}
	switch {
	case r.Interrupted:
		b.WriteString(r.interruptText() + "\n")
	case r.ShellRestarted:
		b.WriteString("ℹ️ the shell was restarted in " + r.Cwd + "; shell variables and functions not set with set_session_env were lost\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// shortCwd is the trailer's directory: nothing for the workspace
// itself, "~/a/b" inside it, the path elsewhere.
func shortCwd(cwd string) string {
	switch {
	case cwd == "" || cwd == hostpath.Home:
		return ""
	case strings.HasPrefix(cwd, hostpath.Home+"/"):
		return " ~" + cwd[len(hostpath.Home):]
	}
	return " " + cwd
}

// interruptText says why the command stopped, how (SIGINT, or killed
// with the shell), and what of the shell's state survived.
func (r *Result) interruptText() string {
	what := "⏹️ interrupted"
	if r.TimedOut {
		what = "⏱️ timed out"
		if r.TimeoutMS > 0 {
			what += " after " + (time.Duration(r.TimeoutMS) * time.Millisecond).String()
		}
	}
	lost := "; shell variables and functions not set with set_session_env were lost"
	switch {
	case r.InterruptStage == "hard" && r.stalled:
		return what + ": the command stopped on SIGINT (Ctrl-C), but its shell did not finish its own work after it (the status record) in time, so the shell was killed and rebuilt in " + r.Cwd +
			" (its directory before this command)" + lost
	case r.InterruptStage == "hard":
		return what + ": the command did not stop on SIGINT, so it was killed and the shell rebuilt in " + r.Cwd +
			" (its directory before this command)" + lost
	case r.ShellRestarted:
		return what + ": the command was sent SIGINT (Ctrl-C) and its shell did not survive; a new one was started in " + r.Cwd + lost
	case r.InterruptStage == "soft":
		return what + ": the command was stopped with SIGINT (Ctrl-C); the shell kept its directory " + r.Cwd +
			" and the variables the command set"
	}
	return what
}

// Shell is one resident shell. Its life is the state machine of
// lifecycle.go.
type Shell struct {
	opts ShellOptions

	mu      sync.Mutex
	state   ShellState
	changed chan struct{} // closed and replaced on every change (waitLocked)
	closing chan struct{} // closed when the shell moves to closing
	calls   int           // calls in flight and run collectors; closed waits for none
	sp      *shellProc    // the process, when there is one
	cur     *run          // the command running (state running)
	queue   []*ticket     // the calls waiting for the shell, in arrival order (queue.go)
	last    *run          // the last command, until a waiter took its result

	cwd      string
	restarts int
	lastExit int
	lastUsed time.Time

	closeOnce sync.Once
}

// run is one command in flight.
type run struct {
	sp           *shellProc // the process it runs in
	nonce, token string
	out, errOut  *runcode.Capture
	start        time.Time
	status       chan struct{} // closed when the status record (or shell death) arrived
	halted       chan struct{} // closed when the command's subshell has exited, or with status
	haltOnce     sync.Once
	synced       chan struct{} // closed when the output sync token was seen
	errSynced    chan struct{}
	exitCode     int
	died         bool
	once         sync.Once
	oom          sandbox.OOMMark // the box's OOM counters when the command started
	command      string          // how errors name it (quoteCommand)

	// Under the Shell's mu: the callers waiting for its end, and whether
	// the last of them returned because it waits for input (queue.go).
	waiters  int
	awaiting bool
	// strandedAt is when the last call that waited for it returned
	// saying that it waits for input; abandoned, that a later command
	// interrupts it for its own run (queue.go).
	strandedAt time.Time
	abandoned  bool

	// The state stream (see records.go).
	stateNonce  string
	smu         sync.Mutex
	marker      string        // from the status record
	last        *stateEvent   // the last state with stateNonce
	started     bool          // the subshell said hello: the command's prologue ran
	subshell    int           // the host pid that said it (the kernel's, SO_PASSCRED)
	ends        []markedState // end markers seen before the status record
	final       *stateEvent   // the state before the end marker
	stateSynced chan struct{}
	stateOnce   sync.Once

	intrMu      sync.Mutex // held for a whole interrupt; collect waits on it
	interrupted bool
	stage       string
	restarted   bool
	stalled     bool // the hard stage came after the command stopped (its post-work's bound)
	// notRun: the hard stage found the command's go line still unread
	// in its pipe once the shell was gone (goPending): its subshell never
	// took the command up, so nothing of it ran.
	notRun bool

	// Set by collect before done is closed.
	done      chan struct{}
	res       *Result
	closed    bool // it ended because the shell was closed
	delivered bool // a waiter returned its result (the Shell's mu)
}

// NewShell returns a shell; the process starts on first use.
func NewShell(opts ShellOptions) *Shell {
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = 12 << 10
	}
	if opts.SpillLimit <= 0 {
		opts.SpillLimit = 256 << 20
	}
	if opts.Env == nil {
		opts.Env = func() map[string]string { return nil }
	}
	cwd := opts.Cwd
	if cwd == "" {
		cwd = opts.Workspace
	}
	if opts.Sandbox != nil && opts.Sandbox.ShowsHome() {
		// The box shows the workspace at /home/user too: the shell works
		// there, so that pwd, $PWD and $HOME name it as every result does.
		cwd = hostpath.InHome(opts.Workspace, cwd)
	}
	return &Shell{opts: opts, cwd: cwd, changed: make(chan struct{}), closing: make(chan struct{})}
}

// Status is a snapshot of the shell's state.
type Status struct {
	Alive    bool      `json:"alive"`
	Busy     bool      `json:"busy"`
	Cwd      string    `json:"cwd"`
	LastExit int       `json:"last_exit"`
	Restarts int       `json:"restarts"`
	LastUsed time.Time `json:"last_used"`
	Pid      int       `json:"pid,omitempty"`
}

// Status reports the shell's state.
func (s *Shell) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Busy: s.state == StateRunning, Cwd: s.cwd, LastExit: s.lastExit, Restarts: s.restarts, LastUsed: s.lastUsed}
	if s.sp != nil && s.sp.alive() {
		st.Alive, st.Pid = true, s.sp.proc.Pid()
	}
	return st
}

// Done is closed when the current shell process has exited (a closed
// channel if none runs).
func (s *Shell) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sp == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return s.sp.exited
}

// stateSocket returns the two ends of the state stream: a Unix stream
// socket whose reading end (the server's) receives each writer's
// credentials.
func stateSocket() (r, w *os.File, err error) {
	mine, theirs, err := sandbox.CredSocketPair()
	if err != nil {
		return nil, nil, err
	}
	// Only the box writes; the box only writes.
	if err := syscall.Shutdown(mine, syscall.SHUT_WR); err != nil {
		syscall.Close(mine)
		syscall.Close(theirs)
		return nil, nil, fmt.Errorf("state socket: shutdown: %w", err)
	}
	if err := syscall.SetNonblock(mine, true); err != nil {
		syscall.Close(mine)
		syscall.Close(theirs)
		return nil, nil, fmt.Errorf("state socket: %w", err)
	}
	return os.NewFile(uintptr(mine), "state"), os.NewFile(uintptr(theirs), "state"), nil
}

// memfd returns an anonymous, seekable in-memory file.
func memfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openPipes opens n pipes, or none.
func openPipes(n int) ([][2]*os.File, error) {
	var ps [][2]*os.File
	for i := 0; i < n; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			for _, p := range ps {
				p[0].Close()
				p[1].Close()
			}
			return nil, err
		}
		ps = append(ps, [2]*os.File{r, w})
	}
	return ps, nil
}

// noBash refuses to start without bash. There is no fallback to sh: a
// POSIX sh can neither dump its functions nor run a command apart from the
// status channel the way the protocol needs. The box is still started
// with "bash", so that the sandbox reports (and counts) the start failure
// as it sees it; should it start after all, it is killed at once, since it
// would not be the sealed copy.
func (s *Shell) noBash() error {
	proc, err := s.opts.Sandbox.Start(context.Background(), &sandbox.Spec{
		Args: []string{"bash", "--version"}, Dir: s.opts.Workspace, Home: s.opts.Workspace, TmpDir: s.opts.TmpDir,
		Network: s.opts.Network, Rootfs: s.opts.Rootfs,
	})
	if err == nil {
		killProc(proc)
		proc.Wait()
		return ErrNoBash
	}
	return fmt.Errorf("%w (%v)", ErrNoBash, err)
}

// bashPath returns the host path of the sealed bash for this shell's box.
func (s *Shell) bashPath() (string, error) {
	src := "/usr/bin/bash"
	if s.opts.Rootfs == "" {
		p, err := s.opts.Sandbox.LookPath("bash")
		if err != nil {
			return "", ErrNoBash
		}
		src = p
	} else if _, err := os.Stat(filepath.Join(s.opts.Rootfs, src)); err != nil {
		src = "/bin/bash"
	}
	p, err := sealedBash(s.opts.Rootfs, src)
	if err != nil && errors.Is(err, os.ErrNotExist) {
		return "", ErrNoBash
	}
	return p, err
}

// readStatus reads the status records and hands each to the command whose
// nonce it carries.
func (s *Shell) readStatus(rd io.ReadCloser) {
	defer rd.Close()
	readChunks(rd, maxStatusChunk, func(chunk []byte, overflow bool) {
		rec, ok := parseStatus(chunk)
		if overflow || !ok {
			return
		}
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		if cur == nil || cur.nonce != rec.nonce {
			return
		}
		cur.smu.Lock()
		if cur.marker == "" {
			cur.marker = rec.marker
			for _, e := range cur.ends {
				if e.marker == rec.marker {
					cur.syncState(e.state)
				}
			}
		}
		cur.smu.Unlock()
		cur.finish(func() { cur.exitCode = rec.code })
	})
}

// readState reads the state socket (see records.go). Every read carries
// the writer's pid (SO_PASSCRED), and the kernel never glues the bytes of
// two writers into one read: only the resident shell's bytes (it says
// hello first, before any command) and the current subshell's (which says
// hello with the command's state nonce before any user code runs) count.
// The command's other processes — background jobs that know the nonce —
// write into the void.
func (s *Shell) readState(sp *shellProc, f *os.File, hello string) {
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
	rpid := 0
	rsp := splitter{max: maxHeaderChunk}
	var cur *run
	cpid := 0
	csp := splitter{max: maxStateBlob + 1}
	var cp stateParser
	for {
		var n, oobn int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), buf, oob, syscall.MSG_DONTWAIT)
			return rerr != syscall.EAGAIN
		})
		if err != nil || (rerr != nil && rerr != syscall.EINTR) || (n == 0 && rerr == nil) {
			return
		}
		pid := senderPid(oob[:oobn])
		data := buf[:n]
		if pid <= 0 {
			continue
		}
		if rpid == 0 {
			if !bytes.HasPrefix(data, []byte(hello)) {
				continue
			}
			rpid, data = pid, data[len(hello):]
		}
		s.mu.Lock()
		c := s.cur
		s.mu.Unlock()
		if c == nil || c.sp != sp {
			continue // no command, or one of another process of the shell
		}
		if pid == rpid {
			rsp.feed(data, func(chunk []byte, overflow bool) {
				var p stateParser
				if ev := p.feed(chunk, overflow); ev != nil && ev.kind == 'E' {
					c.endMarker(ev.marker)
				}
			})
			continue
		}
		if c != cur {
			cur, cpid, csp, cp = c, 0, splitter{max: maxStateBlob + 1}, stateParser{}
		}
		if cpid == 0 {
			h := "\x00H" + c.stateNonce + "\x00"
			if !bytes.HasPrefix(data, []byte(h)) {
				continue
			}
			cpid, data = pid, data[len(h):]
			c.smu.Lock()
			c.started, c.subshell = true, pid
			c.smu.Unlock()
		}
		if pid != cpid {
			continue
		}
		csp.feed(data, func(chunk []byte, overflow bool) {
			if ev := cp.feed(chunk, overflow); ev != nil && ev.kind == 'S' && ev.nonce == c.stateNonce {
				c.smu.Lock()
				c.last = ev
				c.smu.Unlock()
			}
		})
	}
}

// senderPid returns the pid in an SCM_CREDENTIALS message, or 0.
func senderPid(oob []byte) int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if cred, err := syscall.ParseUnixCredentials(&m); err == nil {
			return int(cred.Pid)
		}
	}
	return 0
}

// endMarker takes an end marker written by the resident shell.
func (r *run) endMarker(m string) {
	r.smu.Lock()
	defer r.smu.Unlock()
	if r.marker != "" {
		if m == r.marker {
			r.syncState(r.last)
		}
		return
	}
	// Before the status record: keep the latest few.
	r.ends = append(r.ends, markedState{m, r.last})
	if len(r.ends) > 64 {
		r.ends = r.ends[1:]
	}
}

type markedState struct {
	marker string
	state  *stateEvent
}

// syncState fixes the command's state; smu is held.
func (r *run) syncState(st *stateEvent) {
	r.stateOnce.Do(func() {
		r.final = st
		close(r.stateSynced)
	})
}

func (r *run) finish(set func()) {
	r.once.Do(func() {
		set()
		close(r.status)
	})
	r.halt()
}

// halt notes that the command's processes are gone: its subshell has
// exited (sandbox.WatchPid), or the command ended.
func (r *run) halt() {
	r.haltOnce.Do(func() { close(r.halted) })
}

// Exec runs command and waits for it, its timeout, or a prompt for input.
func (s *Shell) Exec(ctx context.Context, command string, opts ExecOptions) (*Result, error) {
	if strings.IndexByte(command, 0) >= 0 {
		return nil, fmt.Errorf("%w: the command contains a NUL byte", ErrInvalid)
	}
	if strings.TrimSpace(command) == "" {
		return nil, fmt.Errorf("%w: the command is empty", ErrInvalid)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	defer s.leave()
	abandoned, err := s.lineUpLocked(ctx, timeout)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	// The shell is running: this command owns its process.
	sp := s.sp
	tokenHex := randomHex(16)
	r := &run{
		sp:    sp,
		nonce: randomHex(16), token: "\x00QS" + tokenHex + "\x00", stateNonce: randomHex(16),
		start:  time.Now(),
		status: make(chan struct{}), halted: make(chan struct{}), synced: make(chan struct{}), errSynced: make(chan struct{}),
		stateSynced: make(chan struct{}), done: make(chan struct{}),
		command: quoteCommand(command),
	}
	id := time.Now().UTC().Format("20060102-150405.000000") + "-" + randomHex(4)
	r.out = runcode.NewCapture(s.opts.MaxOutput, filepath.Join(s.opts.OutputsDir, "term-"+id+".out"), s.opts.SpillLimit).Within(s.opts.Workspace).Observed(ctx, "stdout")
	if opts.Split {
		r.errOut = runcode.NewCapture(s.opts.MaxOutput, filepath.Join(s.opts.OutputsDir, "term-"+id+".err"), s.opts.SpillLimit).Within(s.opts.Workspace).Observed(ctx, "stderr")
		sp.errOut.attach(r.errOut, r.token, r.errSynced)
	} else {
		close(r.errSynced)
	}
	sp.out.attach(r.out, r.token, r.synced)
	s.cur, s.last = r, r
	s.lastUsed = r.start
	r.oom = sp.proc.OOMMark()
	post := postLine(r.nonce, tokenHex, opts.Split)
	// The subshell reads the command and its state from fd 7, a memfd it
	// shares with the resident shell (a regular file: bash reads it in
	// blocks, where a pipe costs one read per byte). Only this server
	// writes it, between commands; the subshell closes it before any
	// user code runs. The subshell was forked before the command came
	// (subshellLine) and waits for a line on fd 8: the memfd is written
	// first, then the go.
	err = sp.stateIn.Truncate(0)
	if err == nil {
		_, err = sp.stateIn.WriteAt(s.stateFields(command, r, opts.Split), 0)
	}
	if err == nil {
		_, err = sp.stateIn.Seek(0, io.SeekStart)
	}
	// The collector ends the run whoever waits for it; it counts as a call
	// in flight, so that the shell is closed only once it is done.
	s.calls++
	go s.collect(r)
	s.mu.Unlock()
	if err == nil {
		_, err = sp.goW.Write([]byte{'\n'})
	}
	if err == nil {
		_, err = io.WriteString(sp.cmdW, post)
	}
	if err != nil {
		// The shell died (or was closed) before it could read the command.
		r.finish(func() { r.died, r.exitCode = true, -1 })
	}
	res, err := s.wait(ctx, r, timeout)
	if res != nil {
		res.Abandoned = abandoned
	}
	return res, err
}

// subshellLine is what the resident shell reads to fork the next
// command's subshell ahead of the command: at its setup and after each
// command whose shell goes on (collect). The subshell's prologue
// (shellPre, kept in the resident shell) waits for a line on fd 8, the go
// pipe only the server writes, then reads the command and its state from
// fd 7 and runs the command with eval. A fork costs milliseconds of page
// faults on some virtual machines (docs/RATIONALE.md): made between
// commands, it is not on a command's path.
const subshellLine = "(builtin eval \"$__quro_pre\"\nbuiltin eval \"$__quro_c\"\n__quro_dump k $? \"$@\"\n)\n"

// postLine is what the resident shell reads once the command's subshell
// has exited: __quro_post, which writes the state stream's end marker,
// the sync token to the output and the status record to fd 3, with the
// subshell's status. Nothing in it comes from the tenant: the nonce and
// the token are the server's own hex.
func postLine(nonce, tokenHex string, split bool) string {
	sp := "0"
	if split {
		sp = "1"
	}
	return "__quro_post $? " + nonce + " " + tokenHex + " " + sp + "\n"
}

// stateFields is what fd 7 holds for r, each field ended by a NUL (none
// holds one: a command with a NUL is refused, and the directory and the
// state come from NUL-framed records): the command verbatim, the state
// nonce, the directory, the exports and unsets of the session's
// variables that changed since the shell started (quoted here), "1" when
// stderr is split, and the last command's state.
func (s *Shell) stateFields(command string, r *run, split bool) []byte {
	var b bytes.Buffer
	field := func(v string) {
		b.WriteString(v)
		b.WriteByte(0)
	}
	// Ended by a newline, as a line typed in a terminal: a trailing
	// backslash continues onto nothing.
	if !strings.HasSuffix(command, "\n") {
		command += "\n"
	}
	field(command)
	field(r.stateNonce)
	field(s.cwd)
	var ev strings.Builder
	env := s.opts.Env()
	keys := slices.Sorted(maps.Keys(env))
	for _, k := range keys {
		if !validName(k) {
			continue
		}
		if old, ok := r.sp.exported[k]; !ok || old != env[k] {
			ev.WriteString("builtin export " + k + "=" + shellQuote(env[k]) + " || :\n")
		}
	}
	for k := range r.sp.exported {
		if _, ok := env[k]; !ok && validName(k) && !strings.HasPrefix(k, "PS") {
			ev.WriteString("builtin unset " + k + " || :\n")
		}
	}
	r.sp.exported = maps.Clone(env)
	if r.sp.exported == nil {
		r.sp.exported = map[string]string{}
	}
	field(ev.String())
	if split {
		field("1")
	} else {
		field("0")
	}
	field(r.sp.blob)
	return b.Bytes()
}

// wait waits for r to finish, time out, or block on input.
func (s *Shell) wait(ctx context.Context, r *run, timeout time.Duration) (*Result, error) {
	s.mu.Lock()
	r.waiters++
	r.awaiting = false
	s.mu.Unlock()
	blocked := false
	defer func() {
		s.mu.Lock()
		r.waiters--
		r.awaiting = blocked
		if blocked {
			r.strandedAt = time.Now()
		}
		s.broadcastLocked() // a call in line may be refused now (queue.go)
		s.mu.Unlock()
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	// While a command runs, look every so often whether it is blocked
	// reading its input (a prompt) — the one thing that looks like a hang.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	blockedTicks := 0
	for {
		select {
		case <-r.done:
			return s.result(r)
		case <-ctx.Done():
			s.interrupt(r)
			<-r.done
			if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
				// Canceled for a reason of the caller's (its session was
				// destroyed): that is the answer.
				s.deliver(r)
				return nil, fmt.Errorf("%w (the command was interrupted)", cause)
			}
			res, err := s.result(r)
			switch {
			case err != nil:
			case res.Error != "" && !res.Interrupted:
				res.Error = "canceled by the caller; " + res.Error // the command did not run
			default:
				res.Error = "canceled by the caller; the command was interrupted"
			}
			return res, err
		case <-timer.C:
			s.interrupt(r)
			<-r.done
			res, err := s.result(r)
			if err == nil {
				res.TimedOut, res.TimeoutMS = true, timeout.Milliseconds()
			}
			return res, err
		case <-tick.C:
			if r.sp.waitingForInput() {
				blockedTicks++
			} else {
				blockedTicks = 0
			}
			if blockedTicks >= 2 {
				blocked = true
				return s.partial(r, true), nil
			}
		}
	}
}

// result is r's result, once done, for one waiter (a copy).
func (s *Shell) result(r *run) (*Result, error) {
	s.deliver(r)
	if r.closed {
		return nil, fmt.Errorf("%w while the command ran (its session was destroyed, or the server is stopping)", ErrClosed)
	}
	res := *r.res
	return &res, nil
}

// deliver notes that a waiter returned r's end.
func (s *Shell) deliver(r *run) {
	s.mu.Lock()
	r.delivered = true
	s.mu.Unlock()
}

// Wait waits for the running command after send_input — or returns the
// end of the last one, if it ended since and no one has had it yet.
func (s *Shell) Wait(ctx context.Context, timeout time.Duration) (*Result, error) {
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	defer s.leave()
	r := s.cur
	if r == nil && s.last != nil && !s.last.delivered {
		r = s.last
	}
	s.mu.Unlock()
	if r == nil {
		return nil, ErrNotRunning
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return s.wait(ctx, r, timeout)
}

// SendInput writes data to the running command's standard input. "\x03"
// alone interrupts the command (pipes have no line discipline, so ^C is
// turned into the two-stage interrupt here). Input for a command that
// ended since its last result was read is dropped: Wait returns its end.
func (s *Shell) SendInput(data string) error {
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	defer s.leave()
	r := s.cur
	ended := r == nil && s.last != nil && !s.last.delivered
	s.mu.Unlock()
	if ended {
		return nil
	}
	if r == nil {
		return ErrNotRunning
	}
	if data == "\x03" {
		s.interrupt(r)
		return nil
	}
	s.mu.Lock()
	if r.abandoned {
		s.mu.Unlock()
		return fmt.Errorf("%w: the command that waited for input, %s, is being interrupted for another terminal_exec", ErrNotRunning, r.command)
	}
	r.awaiting = false // answered: a call in line waits for its end again
	s.mu.Unlock()
	if _, err := io.WriteString(r.sp.inW, data); err != nil {
		if s.State() >= StateClosing {
			return ErrClosed
		}
		return err
	}
	return nil
}

// partial reports a command that is still running, with its output so far
// (the capture keeps collecting).
func (s *Shell) partial(r *run, waiting bool) *Result {
	s.mu.Lock()
	cwd := s.cwd
	s.mu.Unlock()
	return s.shown(&Result{
		Output: r.out.Snapshot(), ExitCode: -1, Cwd: cwd, Running: true, WaitingForInput: waiting,
		OutputBytes: r.out.Len(), DurationMS: ms(time.Since(r.start)),
	})
}

// shown names the workspace /home/user in what a result shows: its cwd
// (the shell's own in a box, which starts there; the host path where no
// box binds it) and the paths in its output.
func (s *Shell) shown(res *Result) *Result {
	ws := s.opts.Workspace
	res.Cwd = hostpath.InHome(ws, res.Cwd)
	res.Output = hostpath.HomeText(ws, res.Output)
	res.Stderr = hostpath.HomeText(ws, res.Stderr)
	res.Error = hostpath.HomeText(ws, res.Error)
	return res
}

// collect ends r once its status arrived (or its shell died): drain its
// output up to the sync token, keep the state it handed back, restart a
// shell that died, and move the shell back to ready. It is the only one to
// end a run, whoever waits for it (Exec, Wait, or no one). It runs as a
// counted call.
func (s *Shell) collect(r *run) {
	defer s.leave()
	<-r.status
	sp := r.sp
	r.intrMu.Lock()
	res := &Result{ExitCode: r.exitCode, Interrupted: r.interrupted, InterruptStage: r.stage, ShellRestarted: r.restarted, stalled: r.stalled}
	notRun := r.notRun
	r.intrMu.Unlock()
	if r.died {
		// The shell is gone and the sandbox killed its group: what it
		// printed last is still in the pipe until end of file.
		select {
		case <-sp.outDone:
		case <-time.After(2 * time.Second):
		}
	}
	var st *stateEvent
	started := false
	newCwd := ""
	if !r.died {
		// The token follows the command's output; wait for it so that no
		// output is left in the pipe.
		for _, c := range []chan struct{}{r.synced, r.errSynced} {
			select {
			case <-c:
			case <-time.After(2 * time.Second):
				res.Error = "the command's output could not be synchronised; some output may appear with the next command"
			}
		}
		// The resident shell wrote the end marker before the status
		// record: it is in the state pipe already.
		select {
		case <-r.stateSynced:
			// The state stream was read up to the end marker: whether
			// the subshell said hello is known.
			r.smu.Lock()
			started = r.started
			r.smu.Unlock()
		case <-time.After(2 * time.Second):
			started = true // unknown: not claimed to have not run
		}
		r.smu.Lock()
		st = r.final
		r.smu.Unlock()
	}
	s.mu.Lock()
	sp.out.detach()
	sp.errOut.detach()
	switch {
	case r.died && notRun:
		// Interrupted (a timeout, a cancel, ^C) before its subshell read
		// the go line: that subshell was stopped (SIGSTOP from a process
		// an earlier command left behind) or never got the CPU. The hard
		// stage killed the shell; nothing of the command ran, and it was
		// not interrupted partway.
		res.ExitCode = -1
		res.Interrupted, res.InterruptStage = false, ""
		res.Error = "the command did not run: the shell's subshell that waits for the next command never took it up (stopped by a process an earlier command left running, or starved of CPU) before the call was interrupted; the shell was restarted in the last directory, and variables and functions not set with set_session_env were lost; call again"
	case r.died:
	case st == nil && !started:
		// The subshell forked for this command ended before its prologue
		// said hello: killed while it waited (by a process an earlier
		// command left behind). Nothing of the command ran.
		res.ExitCode = -1
		res.Error = "the command did not run: the shell's subshell that waits for the next command had ended (killed by a process an earlier command left running); the shell was restarted in the last directory, and variables and functions not set with set_session_env were lost; call again"
	case st == nil:
		// The subshell ended without its state (killed, or it closed the
		// state pipe): what it changed is lost, as if the shell had died.
		res.Error = "the command's subshell ended without handing back its state (killed, replaced by exec, or it exited under an EXIT trap of its own): the shell was restarted in the last directory, and variables and functions not set with set_session_env were lost"
	case st.big:
		res.Error = fmt.Sprintf("the shell state (variables, functions, aliases) grew over %d MiB and could not be kept; the shell was restarted", maxStateBlob>>20)
	case st.exited:
		// exit, or set -e: the command ended its shell, as it would in a
		// terminal; a new one starts in the last directory.
	default:
		sp.blob = st.blob
		if st.cwd != s.cwd {
			s.cwd = st.cwd
			newCwd = st.cwd
		}
	}
	if s.state == StateRunning && (r.died || st == nil || st.big || st.exited) {
		res.ShellRestarted = true
		s.restarts++
		s.sp = nil
		cwd := s.cwd
		s.mu.Unlock()
		sp.stop(false)
		nsp, err := s.spawn(cwd)
		s.mu.Lock()
		switch {
		case err != nil:
			res.Error = "the shell died and could not be restarted: " + err.Error()
		case s.state != StateRunning:
			// Closed meanwhile: the new shell goes too.
			s.mu.Unlock()
			nsp.stop(true)
			s.mu.Lock()
		default:
			s.sp = nsp
		}
	}
	if !res.ShellRestarted && s.state == StateRunning && s.sp == sp {
		// The next command's subshell, forked while this result goes
		// out. A shell that died meanwhile fails this write; the next
		// command finds it dead and starts a new one.
		_, _ = io.WriteString(sp.cmdW, subshellLine)
	}
	res.Cwd = s.cwd
	s.lastExit = res.ExitCode
	s.cur = nil
	switch {
	case s.state != StateRunning:
		r.closed = true
	case s.sp != nil:
		s.setStateLocked(StateReady)
	default:
		s.setStateLocked(StateIdle)
	}
	s.mu.Unlock()
	if newCwd != "" && s.opts.OnCwd != nil {
		// Before the result is out: who reads it may read the stored cwd.
		s.opts.OnCwd(newCwd)
	}
	v := r.out.Finish()
	res.Output, res.OutputBytes, res.Truncated = v.Text, v.Bytes, v.Cut
	res.OutputFile = relTo(s.opts.Workspace, v.File)
	if r.errOut != nil {
		ev := r.errOut.Finish()
		res.Stderr = ev.Text
		res.Truncated = res.Truncated || ev.Cut
	}
	res.DurationMS = ms(time.Since(r.start))
	// A command killed by SIGKILL (or a shell that died) while the kernel
	// OOM-killed in the box: the memory limit did it.
	if res.ExitCode == 128+int(syscall.SIGKILL) || r.died {
		if killed, oom := sp.proc.OOMSince(r.oom); killed {
			res.OOMKilled, res.OOM = true, oom.Reason()
		}
	}
	r.res = s.shown(res)
	close(r.done)
}

// interrupt stops r in two stages: SIGINT to the shell's process group,
// then, if the command is not over within the grace, the shell is killed
// (its status arrives as a death and collect restarts it in the last
// directory). The grace times the command: it ends when the command's
// subshell — the process that runs its code, and whose end means its
// foreground is over (bash waits for it) — has exited (r.halted, from
// the kernel: sandbox.WatchPid). The resident shell's work after it (the
// reap, the end marker, the status record) has a bound of its own, the
// shell's start bound: on a machine or a cgroup starved of CPU it
// outlasted the grace, and a command that had stopped was reported as
// not stopped and its shell rebuilt. A resident shell that stalls past
// that bound still gets the hard stage. The command's code cannot end
// the grace early but by ending.
func (s *Shell) interrupt(r *run) {
	proc := r.sp.proc
	r.intrMu.Lock()
	defer r.intrMu.Unlock()
	select {
	case <-r.status:
		return // ended already: no stray ^C for the shell
	default:
	}
	if r.interrupted {
		return
	}
	r.interrupted = true
	r.smu.Lock()
	sub := r.subshell
	r.smu.Unlock()
	if sub > 0 {
		stop := sandbox.WatchPid(sub, r.halt)
		defer stop()
	}
	// ^C to the shell's own group (in the box, never bubblewrap's); after
	// the grace the shell is killed.
	killed := proc.Interrupt(syscall.SIGINT, 0, s.opts.Grace, r.halted)
	if !killed {
		post := time.NewTimer(s.startBound())
		select {
		case <-r.status:
		case <-post.C:
			killed, r.stalled = true, true
		}
		post.Stop()
	}
	if !killed && !r.died {
		r.stage = "soft"
		return
	}
	r.stage = "hard"
	r.restarted = true
	killProc(proc)
	<-r.sp.exited
	// The shell and its group are gone (the sandbox kills the group
	// before it reports the shell's end): a go line still in its pipe
	// was never read, and nothing reads it any more. collect, which
	// closes the pipe, waits on intrMu.
	r.notRun = r.sp.goPending()
	<-r.status
}

// goPending reports whether the go pipe (fd 8) holds an unread byte: the
// go line of a command whose subshell has not read it. Only that
// subshell reads the pipe, as the first step of its prologue (shellPre),
// before its hello and before any user code; no command's process holds
// it (the prologue closes it, and the resident shell, a non-dumpable
// process, lends it to no one through /proc). Every command that leaves
// its go line unread restarts the shell, so a shell's pipe only ever
// holds the current command's. False when it cannot tell.
func (sp *shellProc) goPending() bool {
	rc, err := sp.goW.SyscallConn()
	if err != nil {
		return false
	}
	n, ierr := 0, error(nil)
	// FIONREAD (TIOCINQ) counts a pipe's unread bytes from either end.
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || ierr != nil {
		return false
	}
	return n > 0
}

// router hands the shell's output to the current command's capture and
// notices the sync token that ends it. Output between commands (from a
// background job) goes to the scrollback only.
type router struct {
	mu     sync.Mutex
	dst    *runcode.Capture
	token  []byte
	synced chan struct{}
	carry  []byte // a tail that may be the start of the token
	scroll *Ring
}

func (r *router) attach(c *runcode.Capture, token string, synced chan struct{}) {
	r.mu.Lock()
	r.dst, r.token, r.synced, r.carry = c, []byte(token), synced, nil
	r.mu.Unlock()
}

func (r *router) detach() {
	r.mu.Lock()
	if r.dst != nil && len(r.carry) > 0 {
		r.dst.Write(r.carry)
	}
	r.dst, r.token, r.synced, r.carry = nil, nil, nil, nil
	r.mu.Unlock()
}

func (r *router) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if r.token == nil {
		if r.scroll != nil {
			r.scroll.Write(p)
		}
		return n, nil
	}
	data := append(r.carry, p...)
	r.carry = nil
	if i := bytes.Index(data, r.token); i >= 0 {
		r.emit(data[:i])
		close(r.synced)
		rest := data[i+len(r.token):]
		r.token = nil
		// Anything after the token belongs to no command (background jobs).
		if len(rest) > 0 && r.scroll != nil {
			r.scroll.Write(rest)
		}
		return n, nil
	}
	// Keep back a suffix that could be the beginning of the token.
	keep := 0
	for k := min(len(r.token)-1, len(data)); k > 0; k-- {
		if bytes.HasPrefix(r.token, data[len(data)-k:]) {
			keep = k
			break
		}
	}
	r.emit(data[:len(data)-keep])
	r.carry = append([]byte(nil), data[len(data)-keep:]...)
	return n, nil
}

func (r *router) emit(p []byte) {
	if len(p) == 0 {
		return
	}
	if r.dst != nil {
		r.dst.Write(p)
	}
	if r.scroll != nil {
		r.scroll.Write(p)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// octalEscape writes s for printf's format string: every byte as \ooo.
func octalEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "\\%03o", s[i])
	}
	return b.String()
}

func validName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func relTo(base, p string) string {
	if p == "" {
		return ""
	}
	if rel, err := filepath.Rel(base, p); err == nil {
		return rel
	}
	return p
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
