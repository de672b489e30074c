package terminal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
)

// The life of a Shell is an explicit state machine. Every change of state
// goes through setStateLocked, which refuses a transition the table below
// does not list and wakes everyone waiting on the shell; who may touch the
// shell's process follows from the state:
//
//	idle ──▶ starting ──▶ ready ◀──▶ running
//	  ▲         │           │           │
//	  └─────────┴───────────┴───────────┘   (the process ended / failed to start)
//	every one of them ──▶ closing ──▶ closed
//
// starting: the call that moved the shell there starts its process (no lock
// held) and is the only one to publish it. running: one command owns the
// process; its collector (collect) ends the run, restarts a shell that died,
// and moves back to ready. closing and closed only ever go forward: once
// Close began, no transition leads back to a usable shell, so a start or a
// restart that finishes after it kills what it made instead of publishing
// it. closed is reached when the process is gone and no call is in flight.

// ShellState is where a Shell is in its life.
type ShellState int

const (
	// StateIdle means no shell process (not started yet, or it ended between
	// commands); the next command starts one.
	StateIdle ShellState = iota
	// StateStarting means a shell process is being started.
	StateStarting
	// StateReady means the shell process waits for a command.
	StateReady
	// StateRunning means a command runs.
	StateRunning
	// StateClosing means Close began; new calls are refused and those in flight
	// are ending.
	StateClosing
	// StateClosed means the process is gone and no call is in flight.
	StateClosed
)

var stateNames = [...]string{"idle", "starting", "ready", "running", "closing", "closed"}

func (st ShellState) String() string {
	if st >= 0 && int(st) < len(stateNames) {
		return stateNames[st]
	}
	return fmt.Sprintf("ShellState(%d)", int(st))
}

// transitions lists the states each state may move to.
var transitions = [...][]ShellState{
	StateIdle:     {StateStarting, StateClosing},
	StateStarting: {StateReady, StateIdle, StateClosing},
	StateReady:    {StateRunning, StateIdle, StateClosing},
	StateRunning:  {StateReady, StateIdle, StateClosing},
	StateClosing:  {StateClosed},
	StateClosed:   nil,
}

// setStateLocked moves the shell to st if its state allows it, wakes every
// waiter, and reports whether it did. s.mu is held.
func (s *Shell) setStateLocked(st ShellState) bool {
	if !slices.Contains(transitions[s.state], st) {
		return false
	}
	s.state = st
	if st == StateClosing {
		close(s.closing)
	}
	s.broadcastLocked()
	return true
}

// broadcastLocked wakes every waitLocked.
func (s *Shell) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitLocked waits until ok holds (checked with s.mu held; released while
// waiting) or ctx ends.
func (s *Shell) waitLocked(ctx context.Context, ok func() bool) error {
	for !ok() {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			return context.Cause(ctx)
		}
		s.mu.Lock()
	}
	return nil
}

// State reports where the shell is in its life.
func (s *Shell) State() ShellState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// enterLocked counts a call in flight, or refuses it once Close began.
// Every successful enterLocked is paired with a leave.
func (s *Shell) enterLocked() error {
	if s.state >= StateClosing {
		return ErrClosed
	}
	s.calls++
	return nil
}

// leave ends a call counted by enterLocked.
func (s *Shell) leave() {
	s.mu.Lock()
	s.calls--
	if s.calls == 0 {
		s.broadcastLocked()
	}
	s.mu.Unlock()
}

// shellProc is one resident bash and its plumbing. A Shell has at most one
// at a time (s.sp), replaced as a whole when it ends.
type shellProc struct {
	proc     *sandbox.Process
	cmdW     *os.File // the shell's standard input: framed commands
	inW      *os.File // the commands' standard input
	inInode  uint64   // the inode of the commands' input pipe
	out      *router
	errOut   *router
	outR     *os.File      // parent ends of the output pipes
	errR     *os.File      //
	outDone  chan struct{} // closed when the output pipe reached end of file
	exited   chan struct{} // closed when proc has exited
	exitCode int           // set before exited is closed
	stateIn  *os.File      // a memfd the next subshell reads the state from (fd 7)
	goW      *os.File      // the waiting subshell's go pipe (fd 8): a line starts it

	// Under the Shell's mu:
	exported map[string]string // the variables exported to this process
	blob     string            // the last command's shell state, for the next one
}

func (sp *shellProc) alive() bool {
	select {
	case <-sp.exited:
		return false
	default:
		return true
	}
}

// release closes the server's writing ends (the process is gone or going).
func (sp *shellProc) release() {
	sp.cmdW.Close()
	sp.inW.Close()
	sp.stateIn.Close()
	sp.goW.Close()
}

// stop kills the process and what it runs, closes the server's ends (the
// readers too when final: a process that escaped the group must not keep
// them alive) and waits until the process has exited.
func (sp *shellProc) stop(final bool) {
	killProc(sp.proc)
	sp.release()
	if final {
		sp.outR.Close()
		sp.errR.Close()
	}
	<-sp.exited
}

// Start starts the shell process if it is not running.
func (s *Shell) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enterLocked(); err != nil {
		return err
	}
	defer func() {
		s.calls--
		if s.calls == 0 {
			s.broadcastLocked()
		}
	}()
	for {
		switch s.state {
		case StateRunning:
			return nil
		case StateReady:
			if s.sp.alive() {
				return nil
			}
			s.dropLocked()
		default:
			if err := s.prepareLocked(context.Background()); err != nil {
				return err
			}
		}
	}
}

// claimLocked makes the shell run a command: it starts the process if
// needed and moves the shell to running. The caller is a counted call.
func (s *Shell) claimLocked(ctx context.Context) error {
	for {
		switch s.state {
		case StateRunning:
			return ErrBusy
		case StateReady:
			if !s.sp.alive() {
				// It ended between commands, before its end was seen.
				s.dropLocked()
				continue
			}
			s.setStateLocked(StateRunning)
			return nil
		default:
			if err := s.prepareLocked(ctx); err != nil {
				return err
			}
		}
	}
}

// prepareLocked moves an idle shell to ready by starting its process, waits
// for a start in progress, and refuses a closing shell.
func (s *Shell) prepareLocked(ctx context.Context) error {
	switch s.state {
	case StateClosing, StateClosed:
		return ErrClosed
	case StateStarting:
		return s.waitLocked(ctx, func() bool { return s.state != StateStarting })
	case StateIdle:
		s.setStateLocked(StateStarting)
		cwd := s.cwd
		s.mu.Unlock()
		sp, err := s.spawn(cwd)
		s.mu.Lock()
		if err != nil {
			if !s.setStateLocked(StateIdle) {
				return ErrClosed
			}
			return err
		}
		if !s.setStateLocked(StateReady) {
			// Closed while starting: what was started goes.
			s.mu.Unlock()
			sp.stop(true)
			s.mu.Lock()
			return ErrClosed
		}
		s.sp = sp
	}
	return nil
}

// dropLocked forgets a process that ended while the shell was ready.
func (s *Shell) dropLocked() {
	if s.sp != nil {
		s.sp.release()
		s.sp = nil
	}
	s.setStateLocked(StateIdle)
}

// processEnded is told when sp has exited: a ready shell becomes idle, and
// a command running in it ends as a death.
func (s *Shell) processEnded(sp *shellProc) {
	s.mu.Lock()
	cur := s.cur
	if cur != nil && cur.sp != sp {
		cur = nil
	}
	if s.sp == sp && s.state == StateReady {
		s.dropLocked()
	}
	s.mu.Unlock()
	if cur != nil {
		cur.finish(func() { cur.died, cur.exitCode = true, sp.exitCode })
	}
}

// Close kills the shell and everything it started, and returns once no
// call is in flight in it any more (closed). Safe to call more than once
// and from any goroutine.
func (s *Shell) Close() {
	s.mu.Lock()
	s.setStateLocked(StateClosing) // refused when closing already
	s.mu.Unlock()
	s.closeOnce.Do(s.teardown)
	s.mu.Lock()
	_ = s.waitLocked(context.Background(), func() bool { return s.state == StateClosed }) // Background: it fails only on cancellation
	s.mu.Unlock()
}

// CloseIfIdle closes the shell if its process waits for a command, no call
// is in flight and it was last used before cutoff; it reports whether it
// did. The check and the move to closing are one step: no command can
// start in between.
func (s *Shell) CloseIfIdle(cutoff time.Time) bool {
	s.mu.Lock()
	if s.state != StateReady || s.calls > 0 || !s.lastUsed.Before(cutoff) || !s.setStateLocked(StateClosing) {
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	s.Close()
	return true
}

// teardown runs once the shell is closing: kill the process, wait for the
// calls in flight (they end on their own once the process is gone), then
// closed.
func (s *Shell) teardown() {
	s.mu.Lock()
	sp := s.sp
	s.mu.Unlock()
	if sp != nil {
		sp.stop(true)
	}
	s.mu.Lock()
	_ = s.waitLocked(context.Background(), func() bool { return s.calls == 0 }) // Background: it fails only on cancellation
	s.sp = nil
	s.setStateLocked(StateClosed)
	s.mu.Unlock()
}

// spawn starts a resident shell in cwd and waits until it has read its
// setup. It touches nothing of s but its options: the caller publishes the
// process (or stops it).
func (s *Shell) spawn(cwd string) (*shellProc, error) {
	bash, err := s.bashPath()
	if errors.Is(err, ErrNoBash) {
		return nil, s.noBash()
	}
	if err != nil {
		return nil, err
	}
	f, err := openShellFiles()
	if err != nil {
		return nil, err
	}
	// Without the pipe's inode (Fstat failed: st.Ino stays 0),
	// waitingForInput says no: the input detection is off, nothing else.
	var st syscall.Stat_t
	_ = syscall.Fstat(int(f.inR.Fd()), &st)

	env := maps.Clone(s.opts.Env())
	if env == nil {
		env = map[string]string{}
	}
	env["PS1"], env["PS2"], env["PS4"] = "", "", ""
	spawned := time.Now()
	// The sealed copy by the path the box shows it at (SealedInBox when
	// the sandbox places it there), never its host path.
	inBox, _ := s.opts.Sandbox.BoxPath(bash)
	proc, err := s.opts.Sandbox.Start(context.Background(), &sandbox.Spec{
		Args: []string{inBox, "--norc", "--noprofile", "--noediting", "-i"},
		Dir:  s.opts.Workspace, Home: s.home(), TmpDir: s.opts.TmpDir,
		Network: s.opts.Network, Rootfs: s.opts.Rootfs,
		Env:    env,
		Stdin:  f.cmdR,
		Stdout: f.outW, Stderr: f.outW,
		// fd 3: status records; fd 4: the commands' input; fd 5: split
		// stderr; fd 6: the state stream; fd 7: the state to restore;
		// fd 8: the go pipe the waiting subshell reads a line from.
		ExtraFiles: []*os.File{f.statusW, f.inR, f.errW, f.stateW, f.stateIn, f.goR},
		ReadOnly:   []string{bash},
	})
	f.closeShellEnds()
	if err != nil {
		f.closeOurEnds()
		return nil, err
	}
	sp := &shellProc{
		proc: proc, cmdW: f.cmdW, inW: f.inW, inInode: st.Ino,
		out: &router{scroll: s.opts.Scrollback}, errOut: &router{scroll: s.opts.Scrollback},
		outR: f.outR, errR: f.errR, outDone: make(chan struct{}), exited: make(chan struct{}),
		stateIn: f.stateIn, goW: f.goW, exported: env,
	}
	hello := "\x00R" + randomHex(16) + "\x00"
	s.follow(sp, f.statusR, f.stateR, hello)
	if h := spawnedHook.Load(); h != nil {
		(*h)(proc)
	}
	if err := s.setUp(sp, cwd, hello, spawned); err != nil {
		sp.stop(true)
		return nil, err
	}
	return sp, nil
}

// shellFiles are the pipes of a resident shell, both ends: its stdin
// (framed commands), the commands' input (fd 4), status records (fd 3),
// split stderr (fd 5), the state stream (fd 6), the memfd it restores
// the state from (fd 7) and the go pipe of the subshell that waits for the
// next command (fd 8), and one output pipe for fd 1 and 2, which keeps
// their interleaving exactly as written.
type shellFiles struct {
	cmdR, cmdW       *os.File
	inR, inW         *os.File
	statusR, statusW *os.File
	errR, errW       *os.File
	outR, outW       *os.File
	stateR, stateW   *os.File
	stateIn          *os.File
	goR, goW         *os.File
}

func openShellFiles() (*shellFiles, error) {
	p, err := openPipes(6)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	return &shellFiles{
		cmdR: p[0][0], cmdW: p[0][1],
		inR: p[1][0], inW: p[1][1],
		statusR: p[2][0], statusW: p[2][1],
		errR: p[3][0], errW: p[3][1],
		outR: p[4][0], outW: p[4][1],
		stateR: stateR, stateW: stateW, stateIn: stateIn,
		goR: p[5][0], goW: p[5][1],
	}, nil
}

// closeShellEnds closes the ends the shell holds, once it started (or
// failed to).
func (f *shellFiles) closeShellEnds() {
	f.cmdR.Close()
	f.statusW.Close()
	f.inR.Close()
	f.errW.Close()
	f.outW.Close()
	f.stateW.Close()
	f.goR.Close()
}

// closeOurEnds closes the server's ends, when the shell did not start.
func (f *shellFiles) closeOurEnds() {
	f.cmdW.Close()
	f.inW.Close()
	f.statusR.Close()
	f.errR.Close()
	f.outR.Close()
	f.stateR.Close()
	f.stateIn.Close()
	f.goW.Close()
}

// follow starts the goroutines that read the started shell's status
// records, state stream (which opens with hello) and output, and the one
// that waits for its end.
func (s *Shell) follow(sp *shellProc, statusR, stateR *os.File, hello string) {
	go s.readStatus(statusR)
	go s.readState(sp, stateR, hello)
	go func() {
		defer sp.errR.Close()
		// Ends when the shell's side closes; the router never fails a
		// write, and the shell's end is what Wait reports.
		pump(sp.errOut, sp.errR)
	}()
	go func() {
		defer close(sp.outDone)
		defer sp.outR.Close()
		pump(sp.out, sp.outR) // as errR's copy
	}()
	go func() {
		e := sp.proc.Wait()
		sp.exitCode = e.Code
		close(sp.exited)
		s.processEnded(sp)
	}()
}

// pump copies src to dst until src ends or a write fails, as io.Copy
// does, but reads into a buffer sized on demand: 1 KiB, grown by four
// while reads fill it (to 32 KiB), back to 1 KiB after a read that found
// little. An idle shell's two pipes then hold 2 KiB, not io.Copy's
// 2 × 32 KiB.
func pump(dst io.Writer, src io.Reader) {
	const small, large = 1 << 10, 32 << 10
	buf := make([]byte, small)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
		switch {
		case n == len(buf) && len(buf) < large:
			buf = make([]byte, min(4*len(buf), large))
		case n < small/2 && len(buf) > small:
			buf = make([]byte, small)
		}
	}
}

// setUp sends the first framed command, which sets the shell up (its
// state stream announces itself with hello) and goes to cwd, and waits
// until the shell has read it, so that what it prints on start
// (job-control warnings) is not taken for a command's output.
func (s *Shell) setUp(sp *shellProc, cwd, hello string, spawned time.Time) error {
	setup := "set +H; set +o history 2>/dev/null; unset HISTFILE; trap - INT\n"
	setup += "builtin printf '" + octalEscape(hello) + "' >&6\n"
	setup += "cd -- " + shellQuote(cwd) + " 2>/dev/null || cd\n"
	delim := "QURO_" + randomHex(16)
	setup += shellLib
	setup += "IFS= read -r -d '' __quro_pre <<'" + delim + "' || :\n" + shellPre + delim + "\n"
	setup += shellPost
	setup += shellBaseline
	token := "\x00QS" + randomHex(16) + "\x00"
	setup += "printf '" + octalEscape(token) + "'\n"
	// The first command's subshell, forked now to wait for its go.
	setup += subshellLine
	ready := make(chan struct{})
	sp.out.attach(nil, token, ready)
	// The setup is the rest of the shell's start, bounded like every
	// start in a box: by the sandbox's start bound, from the spawn. A flat
	// 10 s once ended starts on a machine at a load of 100 with an
	// internal error that said nothing.
	bound := s.startBound()
	timer := time.NewTimer(time.Until(spawned.Add(bound)))
	defer timer.Stop()
	if _, err := io.WriteString(sp.cmdW, setup); err != nil {
		return fmt.Errorf("%w: writing its setup: %v", ErrStart, err)
	}
	select {
	case <-ready:
	case <-sp.exited:
		return fmt.Errorf("%w: it exited while starting (code %d)", ErrStart, sp.exitCode)
	case <-s.closing:
		return ErrClosed
	case <-timer.C:
		return fmt.Errorf("%w: bash did not answer its setup within %s of its start (the sandbox's start bound; the machine may be overloaded): the next command starts it again", ErrStart, bound)
	}
	sp.out.detach()
	return nil
}

// startBound is how long a shell's start (its box's start and its setup)
// may take: ShellOptions.StartTimeout, else the sandbox's start bound.
func (s *Shell) startBound() time.Duration {
	if s.opts.StartTimeout > 0 {
		return s.opts.StartTimeout
	}
	if s.opts.Sandbox == nil {
		return sandbox.DefaultStartTimeout
	}
	return s.opts.Sandbox.StartTimeout()
}

// spawnedHook, when set (tests), is called with the shell's process
// between its spawn and its setup.
var spawnedHook atomic.Pointer[func(*sandbox.Process)]

// home is the shell's HOME: /home/user in a box (which binds the
// workspace there), else the workspace's own path.
func (s *Shell) home() string {
	if s.opts.Sandbox != nil && s.opts.Sandbox.ShowsHome() {
		return sandbox.HomeUser
	}
	return s.opts.Workspace
}
