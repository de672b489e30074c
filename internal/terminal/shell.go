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
// second Exec while a command runs gets ErrBusy.
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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	// ErrBusy: the shell is still running a command.
	ErrBusy = errors.New("the session's shell is still running a command")
	// ErrNotRunning: there is no command to send input to or to wait for.
	ErrNotRunning = errors.New("no command is running in the session's shell")
	// ErrClosed: the shell was closed (its session was destroyed).
	ErrClosed = errors.New("the shell is closed")
	// ErrInvalid marks bad input (a NUL byte in a command).
	ErrInvalid = errors.New("invalid argument")
	// ErrNoBash: the box has no bash, which the session shell needs.
	ErrNoBash = errors.New("the session shell needs bash, and this box has none: install it (apt-get install bash) or use the terminal (PTY), which runs sh")
)

// DefaultGrace is how long a soft interrupt (SIGINT) has before the shell is
// killed and recreated.
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
	// Grace before the hard interrupt (DefaultGrace).
	Grace time.Duration
	// MaxOutput bytes of output kept in a result (12 KiB); SpillLimit bytes
	// kept on disk (256 MiB).
	MaxOutput  int
	SpillLimit int64
	// Scrollback receives everything the shell prints, for log export.
	Scrollback io.Writer
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
	Cwd      string `json:"cwd" jsonschema:"the shell's working directory after the command"`
	Running  bool   `json:"running" jsonschema:"the command is still running (waiting for input, or detached after a timeout)"`
	// WaitingForInput: the command is blocked reading its standard input;
	// answer with send_input.
	WaitingForInput bool    `json:"waiting_for_input" jsonschema:"the command is blocked reading input; answer with send_input"`
	TimedOut        bool    `json:"timed_out" jsonschema:"the command hit its timeout and was interrupted"`
	TimeoutMS       int64   `json:"timeout_ms,omitempty" jsonschema:"the timeout the command hit, when timed_out"`
	Interrupted     bool    `json:"interrupted" jsonschema:"the command was interrupted"`
	InterruptStage  string  `json:"interrupt_stage,omitempty" jsonschema:"soft: SIGINT stopped it; hard: the shell was killed and recreated in the same directory"`
	ShellRestarted  bool    `json:"shell_restarted" jsonschema:"the shell died (exit, set -e, a crash) or was killed, and a new one was started in the last directory"`
	Truncated       bool    `json:"truncated" jsonschema:"output was cut; output_file keeps it whole"`
	OutputBytes     int64   `json:"output_bytes"`
	OutputFile      string  `json:"output_file,omitempty" jsonschema:"workspace-relative file with the full output, when cut or escaped"`
	Error           string  `json:"error" jsonschema:"a failure of the terminal itself, not of the command"`
	DurationMS      float64 `json:"duration_ms"`
}

// Text renders the result for a model.
func (r *Result) Text() string {
	var b strings.Builder
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
		b.WriteString("⏳ waiting for input: answer with send_input (\"\\u0003\" interrupts)\n")
	case r.Running:
		b.WriteString("⏳ still running\n")
	default:
		fmt.Fprintf(&b, "[exit %d] %s\n", r.ExitCode, r.Cwd)
	}
	switch {
	case r.Interrupted:
		b.WriteString(r.interruptText() + "\n")
	case r.ShellRestarted:
		b.WriteString("ℹ️ the shell was restarted in " + r.Cwd + "; shell variables and functions not set with set_session_env were lost\n")
	}
	return strings.TrimRight(b.String(), "\n")
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

// Shell is one resident shell.
type Shell struct {
	opts ShellOptions

	mu       sync.Mutex
	proc     *sandbox.Process
	cmdW     *os.File // the shell's standard input: framed commands
	inW      *os.File // the commands' standard input
	inInode  uint64
	out      *router
	errOut   *router
	outR     *os.File // parent ends of the output pipes, closed by Close
	errR     *os.File
	outDone  chan struct{} // closed when the output pipe reached end of file
	exited   chan struct{} // closed when proc has exited
	exitCode int
	cwd      string
	exported map[string]string
	state    string   // the last command's shell state, for the next one
	stateIn  *os.File // a memfd the next subshell reads it from (fd 7)
	cur      *run
	closed   bool
	restarts int
	lastExit int
	lastUsed time.Time
}

// run is one command in flight.
type run struct {
	nonce, token string
	out, errOut  *runcode.Capture
	start        time.Time
	status       chan struct{} // closed when the status record (or shell death) arrived
	synced       chan struct{} // closed when the output sync token was seen
	errSynced    chan struct{}
	exitCode     int
	died         bool
	once         sync.Once

	// The state stream (see records.go).
	stateNonce  string
	smu         sync.Mutex
	marker      string        // from the status record
	last        *stateEvent   // the last state with stateNonce
	ends        []markedState // end markers seen before the status record
	final       *stateEvent   // the state before the end marker
	stateSynced chan struct{}
	stateOnce   sync.Once

	intrMu      sync.Mutex // held for a whole interrupt; complete waits on it
	interrupted bool
	stage       string
	restarted   bool
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
	return &Shell{opts: opts, cwd: cwd}
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
	st := Status{Alive: s.aliveLocked(), Busy: s.cur != nil, Cwd: s.cwd, LastExit: s.lastExit, Restarts: s.restarts, LastUsed: s.lastUsed}
	if st.Alive {
		st.Pid = s.proc.Pid()
	}
	return st
}

func (s *Shell) aliveLocked() bool {
	if s.proc == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Done is closed when the current shell process has exited (a closed
// channel if none runs).
func (s *Shell) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return s.exited
}

// Start starts the shell process if it is not running.
func (s *Shell) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked()
}

func (s *Shell) startLocked() error {
	if s.closed {
		return ErrClosed
	}
	if s.aliveLocked() {
		return nil
	}
	s.stopLocked()
	bash, err := s.bashPath()
	if errors.Is(err, ErrNoBash) {
		return s.noBash()
	}
	if err != nil {
		return err
	}
	// stdin (framed commands), the commands' input (fd 4), status records
	// (fd 3), split stderr (fd 5), the state stream (fd 6), and one output
	// pipe for fd 1 and 2, which keeps their interleaving exactly as
	// written.
	p, err := openPipes(5)
	if err != nil {
		return err
	}
	stateR, stateW, err := stateSocket()
	var stateIn *os.File
	if err == nil {
		stateIn, err = memfd("quro-shell-state")
		if err != nil {
			stateR.Close()
			stateW.Close()
		}
	}
	if err != nil {
		for _, pp := range p {
			pp[0].Close()
			pp[1].Close()
		}
		return err
	}
	cmdR, cmdW := p[0][0], p[0][1]
	inR, inW := p[1][0], p[1][1]
	statusR, statusW := p[2][0], p[2][1]
	errR, errW := p[3][0], p[3][1]
	outR, outW := p[4][0], p[4][1]
	var st syscall.Stat_t
	syscall.Fstat(int(inR.Fd()), &st)

	s.out = &router{scroll: s.opts.Scrollback}
	s.errOut = &router{scroll: s.opts.Scrollback}
	args := []string{bash, "--norc", "--noprofile", "--noediting", "-i"}
	env := maps.Clone(s.opts.Env())
	if env == nil {
		env = map[string]string{}
	}
	env["PS1"], env["PS2"], env["PS4"] = "", "", ""
	proc, err := s.opts.Sandbox.Start(context.Background(), &sandbox.Spec{
		Args: args, Dir: s.opts.Workspace, Home: s.opts.Workspace, TmpDir: s.opts.TmpDir,
		Network: s.opts.Network, Rootfs: s.opts.Rootfs,
		Env:    env,
		Stdin:  cmdR,
		Stdout: outW, Stderr: outW,
		// fd 3: status records; fd 4: the commands' input; fd 5: split
		// stderr; fd 6: the state stream; fd 7: the state to restore.
		ExtraFiles: []*os.File{statusW, inR, errW, stateW, stateIn},
		ReadOnly:   []string{bash},
	})
	cmdR.Close()
	statusW.Close()
	inR.Close()
	errW.Close()
	outW.Close()
	stateW.Close()
	if err != nil {
		cmdW.Close()
		inW.Close()
		statusR.Close()
		errR.Close()
		outR.Close()
		stateR.Close()
		stateIn.Close()
		return err
	}
	s.proc, s.cmdW, s.inW, s.inInode = proc, cmdW, inW, st.Ino
	s.exited = make(chan struct{})
	s.exported = map[string]string{}
	s.state, s.stateIn = "", stateIn
	for k, v := range env {
		s.exported[k] = v
	}
	exited := s.exited
	go s.readStatus(statusR)
	hello := "\x00R" + randomHex(16) + "\x00"
	go s.readState(stateR, hello)
	s.outR, s.errR = outR, errR
	out, errOut := s.out, s.errOut
	go func() {
		defer errR.Close()
		io.Copy(errOut, errR)
	}()
	outDone := make(chan struct{})
	s.outDone = outDone
	go func() {
		defer close(outDone)
		defer outR.Close()
		io.Copy(out, outR)
	}()
	go func() {
		e := proc.Wait()
		s.mu.Lock()
		s.exitCode = e.Code
		cur := s.cur
		s.mu.Unlock()
		close(exited)
		if cur != nil {
			cur.finish(func() { cur.died, cur.exitCode = true, e.Code })
		}
	}()
	// The first framed command sets the shell up and goes to the last cwd.
	setup := "set +H; set +o history 2>/dev/null; unset HISTFILE; trap - INT\n"
	setup += "builtin printf '" + octalEscape(hello) + "' >&6\n"
	setup += "cd -- " + shellQuote(s.cwd) + " 2>/dev/null || cd\n"
	delim := "QURO_" + randomHex(16)
	setup += "IFS= read -r -d '' __quro_lib <<'" + delim + "' || :\n" + shellLib + delim + "\n"
	setup += shellBaseline
	// Wait until the shell has read the setup, so that what it prints on
	// start (job-control warnings) is not taken for a command's output.
	token := "\x00QS" + randomHex(16) + "\x00"
	setup += "printf '" + octalEscape(token) + "'\n"
	ready := make(chan struct{})
	s.out.attach(nil, token, ready)
	if _, err := io.WriteString(cmdW, setup); err != nil {
		return fmt.Errorf("shell setup: %w", err)
	}
	select {
	case <-ready:
	case <-exited:
		return fmt.Errorf("the shell exited while starting (code %d)", s.exitCodeAfter(exited))
	case <-time.After(10 * time.Second):
		return errors.New("the shell did not start within 10 s")
	}
	s.out.detach()
	return nil
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
	syscall.Shutdown(mine, syscall.SHUT_WR)
	syscall.SetNonblock(mine, true)
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

// exitCodeAfter reads the exit code once exited is closed.
func (s *Shell) exitCodeAfter(exited chan struct{}) int {
	<-exited
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitCode
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
func (s *Shell) readState(f *os.File, hello string) {
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
		if c == nil {
			continue
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
	if s.cur != nil {
		s.mu.Unlock()
		return nil, ErrBusy
	}
	if err := s.startLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	r := &run{
		nonce: randomHex(16), token: "\x00QS" + randomHex(16) + "\x00", stateNonce: randomHex(16),
		start:  time.Now(),
		status: make(chan struct{}), synced: make(chan struct{}), errSynced: make(chan struct{}),
		stateSynced: make(chan struct{}),
	}
	id := time.Now().UTC().Format("20060102-150405.000000") + "-" + randomHex(4)
	r.out = runcode.NewCapture(s.opts.MaxOutput, filepath.Join(s.opts.OutputsDir, "term-"+id+".out"), s.opts.SpillLimit).Within(s.opts.Workspace).Observed(ctx, "stdout")
	if opts.Split {
		r.errOut = runcode.NewCapture(s.opts.MaxOutput, filepath.Join(s.opts.OutputsDir, "term-"+id+".err"), s.opts.SpillLimit).Within(s.opts.Workspace).Observed(ctx, "stderr")
		s.errOut.attach(r.errOut, r.token, r.errSynced)
	} else {
		close(r.errSynced)
	}
	s.out.attach(r.out, r.token, r.synced)
	s.cur = r
	s.lastUsed = r.start
	script := s.frame(command, r, opts.Split)
	w := s.cmdW
	// The subshell reads the state from fd 7, a memfd it shares with the
	// resident shell (a regular file: bash reads it in blocks, where a
	// pipe costs one read per byte). Only this server writes it, between
	// commands; the subshell closes it before any user code runs.
	err := s.stateIn.Truncate(0)
	if err == nil {
		_, err = s.stateIn.WriteAt([]byte(s.state), 0)
	}
	if err == nil {
		_, err = s.stateIn.Seek(0, io.SeekStart)
	}
	s.mu.Unlock()
	if err != nil {
		r.finish(func() { r.died, r.exitCode = true, -1 })
		return s.wait(ctx, r, timeout)
	}

	if _, err := io.WriteString(w, script); err != nil {
		// The shell died before it could read the command.
		r.finish(func() { r.died, r.exitCode = true, -1 })
	}
	return s.wait(ctx, r, timeout)
}

// frame wraps command for the resident shell: load it and the last state
// verbatim through quoted heredocs (the resident shell only stores them),
// run the subshell, then write the state stream's end marker, the sync
// token to the output and the status record to fd 3.
func (s *Shell) frame(command string, r *run, split bool) string {
	var b strings.Builder
	heredoc := func(name, text string) {
		delim := "QURO_" + randomHex(16)
		for strings.Contains(text, delim) {
			delim = "QURO_" + randomHex(16)
		}
		b.WriteString("IFS= read -r -d '' " + name + " <<'" + delim + "' || :\n")
		b.WriteString(text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteByte('\n')
		}
		b.WriteString(delim + "\n")
	}
	heredoc("__quro_c", command)
	// The subshell: drop every descriptor but its stdin (the commands'
	// input), stdout, stderr and the state stream before anything else
	// runs in it — with exec, which keeps no saved copies.
	b.WriteString("(\nIFS= builtin read -r -d '' -u 7 __quro_s\nexec 0<&4")
	if split {
		b.WriteString(" 2>&5")
	}
	b.WriteString("\nfor __quro_f in /proc/self/fd/*; do __quro_f=${__quro_f##*/}; case $__quro_f in 0|1|2|6) ;; *) exec {__quro_f}>&- ;; esac; done\n")
	b.WriteString("__quro_n=" + r.stateNonce + "; builtin printf '\\0H%s\\0' \"$__quro_n\" >&6\n")
	b.WriteString("builtin cd -- " + shellQuote(s.cwd) + " 2>/dev/null || :\n")
	b.WriteString("builtin trap __quro_int INT\n")
	b.WriteString("builtin eval \"$__quro_s\" 2>/dev/null; builtin unset __quro_s\n")
	b.WriteString("builtin eval \"$__quro_lib\"; builtin trap __quro_exit EXIT\n")
	env := s.opts.Env()
	keys := slices.Sorted(maps.Keys(env))
	for _, k := range keys {
		if !validName(k) {
			continue
		}
		if old, ok := s.exported[k]; !ok || old != env[k] {
			b.WriteString("builtin export " + k + "=" + shellQuote(env[k]) + " 2>/dev/null || :\n")
		}
	}
	for k := range s.exported {
		if _, ok := env[k]; !ok && validName(k) && !strings.HasPrefix(k, "PS") {
			b.WriteString("builtin unset " + k + " 2>/dev/null || :\n")
		}
	}
	s.exported = maps.Clone(env)
	if s.exported == nil {
		s.exported = map[string]string{}
	}
	b.WriteString("builtin eval \"$__quro_c\"\n__quro_dump k $? \"$@\"\n)\n")
	// Back in the resident shell. The marker is drawn only now, after the
	// subshell exited: nothing the command left behind can know it.
	b.WriteString("__quro_e=$?\n")
	b.WriteString("__quro_m=${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}; builtin printf '\\0E%s\\0' \"$__quro_m\" >&6\n")
	tok := octalEscape(r.token)
	b.WriteString("builtin printf '" + tok + "'\n")
	if split {
		b.WriteString("builtin printf '" + tok + "' >&5\n")
	}
	b.WriteString("builtin printf '%s:%d:%s\\000' " + r.nonce + " \"$__quro_e\" \"$__quro_m\" >&3\n")
	return b.String()
}

// wait waits for r to finish, time out, or block on input.
func (s *Shell) wait(ctx context.Context, r *run, timeout time.Duration) (*Result, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	// While a command runs, look every so often whether it is blocked
	// reading its input (a prompt) — the one thing that looks like a hang.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	blockedTicks := 0
	for {
		select {
		case <-r.status:
			return s.complete(r), nil
		case <-ctx.Done():
			s.interrupt(r)
			res := s.complete(r)
			res.Error = "canceled by the caller; the command was interrupted"
			return res, nil
		case <-timer.C:
			s.interrupt(r)
			res := s.complete(r)
			res.TimedOut, res.TimeoutMS = true, timeout.Milliseconds()
			return res, nil
		case <-tick.C:
			if s.waitingForInput() {
				blockedTicks++
			} else {
				blockedTicks = 0
			}
			if blockedTicks >= 2 {
				return s.partial(r, true), nil
			}
		}
	}
}

// Wait waits for the running command after send_input.
func (s *Shell) Wait(ctx context.Context, timeout time.Duration) (*Result, error) {
	s.mu.Lock()
	r := s.cur
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
// turned into the two-stage interrupt here).
func (s *Shell) SendInput(data string) error {
	s.mu.Lock()
	r, w := s.cur, s.inW
	s.mu.Unlock()
	if r == nil {
		return ErrNotRunning
	}
	if data == "\x03" {
		s.interrupt(r)
		return nil
	}
	_, err := io.WriteString(w, data)
	return err
}

// partial reports a command that is still running, with its output so far
// (the capture keeps collecting).
func (s *Shell) partial(r *run, waiting bool) *Result {
	s.mu.Lock()
	cwd := s.cwd
	s.mu.Unlock()
	return &Result{
		Output: r.out.Snapshot(), ExitCode: -1, Cwd: cwd, Running: true, WaitingForInput: waiting,
		OutputBytes: r.out.Len(), DurationMS: ms(time.Since(r.start)),
	}
}

// complete finishes r once its status arrived (or the shell died): drain
// its output up to the sync token, restart a dead shell, build the result.
func (s *Shell) complete(r *run) *Result {
	<-r.status
	r.intrMu.Lock()
	res := &Result{ExitCode: r.exitCode, Interrupted: r.interrupted, InterruptStage: r.stage, ShellRestarted: r.restarted}
	r.intrMu.Unlock()
	if r.died {
		// The shell is gone and the sandbox killed its group: what it
		// printed last is still in the pipe until end of file.
		s.mu.Lock()
		done := s.outDone
		s.mu.Unlock()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
	}
	var st *stateEvent
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
		case <-time.After(2 * time.Second):
		}
		r.smu.Lock()
		st = r.final
		r.smu.Unlock()
	}
	s.mu.Lock()
	s.out.detach()
	s.errOut.detach()
	switch {
	case r.died:
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
		s.state = st.blob
		if st.cwd != s.cwd {
			s.cwd = st.cwd
			if s.opts.OnCwd != nil {
				defer s.opts.OnCwd(st.cwd)
			}
		}
	}
	if r.died || st == nil || st.big || st.exited {
		res.ShellRestarted = true
		s.restarts++
		if !r.died {
			s.stopLocked()
		}
		if err := s.startLocked(); err != nil {
			res.Error = "the shell died and could not be restarted: " + err.Error()
		}
	}
	res.Cwd = s.cwd
	s.lastExit = res.ExitCode
	s.cur = nil
	s.mu.Unlock()
	v := r.out.Finish()
	res.Output, res.OutputBytes, res.Truncated = v.Text, v.Bytes, v.Cut
	res.OutputFile = relTo(s.opts.Workspace, v.File)
	if r.errOut != nil {
		ev := r.errOut.Finish()
		res.Stderr = ev.Text
		res.Truncated = res.Truncated || ev.Cut
	}
	res.DurationMS = ms(time.Since(r.start))
	return res
}

// interrupt stops r in two stages: SIGINT to the shell's process group, then
// after the grace period the shell is killed (its status arrives as a death
// and complete restarts it in the last directory).
func (s *Shell) interrupt(r *run) {
	s.mu.Lock()
	proc := s.proc
	exited := s.exited
	s.mu.Unlock()
	if proc == nil {
		return
	}
	r.intrMu.Lock()
	defer r.intrMu.Unlock()
	if r.interrupted {
		return
	}
	r.interrupted = true
	// ^C to the shell's own group (in the box, never bubblewrap's); after
	// the grace the shell is killed.
	if !proc.Interrupt(syscall.SIGINT, 0, s.opts.Grace, r.status) && !r.died {
		r.stage = "soft"
		return
	}
	r.stage = "hard"
	r.restarted = true
	killProc(proc)
	<-exited
	<-r.status
}

// waitingForInput reports whether a process of the shell's group is blocked
// reading the commands' input pipe.
func (s *Shell) waitingForInput() bool {
	s.mu.Lock()
	proc, ino := s.proc, s.inInode
	s.mu.Unlock()
	if proc == nil || ino == 0 {
		return false
	}
	pgid := proc.Group()
	if pgid <= 0 {
		return false
	}
	return blockedOnPipe(pgid, ino)
}

// Close kills the shell and everything it started.
func (s *Shell) Close() {
	s.mu.Lock()
	s.closed = true
	s.stopLocked()
	s.mu.Unlock()
}

func (s *Shell) stopLocked() {
	if s.proc == nil {
		return
	}
	killProc(s.proc)
	s.cmdW.Close()
	s.inW.Close()
	s.stateIn.Close()
	if s.closed {
		// Nothing more will be read: a process that escaped the group
		// must not keep the readers alive.
		s.outR.Close()
		s.errR.Close()
	}
	exited := s.exited
	s.mu.Unlock()
	<-exited
	s.mu.Lock()
	s.proc = nil
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
	scroll io.Writer
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

// blockedOnPipe reports whether a process in the process group pgid sits in
// read(2) on the pipe with inode ino.
func blockedOnPipe(pgid int, ino uint64) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := fmt.Sprintf("pipe:[%d]", ino)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so cut at ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) || f[0] != "S" {
			continue
		}
		sc, err := os.ReadFile("/proc/" + e.Name() + "/syscall")
		if err != nil {
			continue
		}
		sf := strings.Fields(string(sc))
		if len(sf) < 2 || !readSyscalls[sf[0]] {
			continue
		}
		fd, err := strconv.ParseInt(strings.TrimPrefix(sf[1], "0x"), 16, 64)
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); err == nil && link == want {
			return true
		}
	}
	return false
}

// readSyscalls are the read(2)-family syscall numbers as /proc/PID/syscall
// shows them.
var readSyscalls = map[string]bool{}

func init() {
	switch runtime.GOARCH {
	case "amd64":
		readSyscalls = map[string]bool{"0": true, "17": true, "19": true} // read, pread64, readv
	case "arm64":
		readSyscalls = map[string]bool{"63": true, "65": true, "67": true}
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
