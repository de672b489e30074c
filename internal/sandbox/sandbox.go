// Package sandbox is the only way Quro starts a process that runs user code.
//
// A Spec says what to run, where, with which session variables and limits;
// Start and Run turn it into a process that:
//   - runs in its own process group, killed as a group on timeout and when the
//     run ends, with a parent-death signal so it never outlives the server;
//   - sees a cleared environment: a fixed whitelist (PATH, HOME, LANG, TERM,
//     TMPDIR) plus the session's own variables, never the server's;
//   - starts in the session workspace;
//   - runs under rlimits applied by a re-exec'd child of the quro binary itself
//     (see init.go), which then execs the user program.
//
// Output is copied concurrently into the Spec's writers; the writers decide
// how much to keep in memory. A Sandbox is safe for concurrent use.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultPath is the PATH user code sees unless Options say otherwise.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options configure a Sandbox. The zero value is usable.
type Options struct {
	// Path is the PATH inside the sandbox; default DefaultPath.
	Path string
	// Limits replace DefaultLimits for specs that leave Limits zero.
	Limits *Limits
	// DrainGrace bounds how long Wait keeps reading output after the process
	// group was killed (a process that left the group may hold a pipe open).
	// Default 1s.
	DrainGrace time.Duration
}

// Sandbox starts isolated processes. Create it once with New.
type Sandbox struct {
	self       string
	path       string
	limits     Limits
	drainGrace time.Duration
}

// New returns a Sandbox. opts may be nil.
func New(opts *Options) (*Sandbox, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("sandbox: cannot find the quro executable to re-exec: %w", err)
	}
	s := &Sandbox{self: self, path: o.Path, limits: DefaultLimits(), drainGrace: o.DrainGrace}
	if s.path == "" {
		s.path = DefaultPath
	}
	if o.Limits != nil {
		s.limits = *o.Limits
	}
	if s.drainGrace <= 0 {
		s.drainGrace = time.Second
	}
	return s, nil
}

// Path is the PATH that user code sees.
func (s *Sandbox) Path() string { return s.path }

// Limits are the limits applied to specs that do not set their own.
func (s *Sandbox) Limits() Limits { return s.limits }

// Spec describes one sandboxed process.
type Spec struct {
	Args   []string          // program and arguments; Args[0] is looked up in the sandbox PATH
	Dir    string            // working directory (the session workspace); required
	Home   string            // HOME; default Dir
	TmpDir string            // TMPDIR; default Dir
	Term   string            // TERM; default "dumb"
	Env    map[string]string // session variables, layered over the whitelist
	Limits *Limits           // nil means the Sandbox's limits

	Stdin          io.Reader // nil means /dev/null
	Stdout, Stderr io.Writer // nil discards
	ExtraFiles     []*os.File

	// TTY makes Stdin (a terminal's slave side, an *os.File) the process's
	// controlling terminal, in a session of its own.
	TTY bool
}

// Exit describes how a sandboxed process ended.
type Exit struct {
	Code     int            // exit status; 128+signal when killed by a signal
	Signal   syscall.Signal // the signal that killed it, or 0
	TimedOut bool           // the context's deadline passed; the group was killed
	Canceled bool           // the context was canceled; the group was killed
	// Abandoned is set when a process that left the run's process group still
	// held the output open after the run ended; its later output was not read.
	Abandoned bool
	Duration  time.Duration
}

// StartError is an engine-level failure: the sandbox could not start the
// program (not found, not executable, a limit could not be applied).
type StartError struct {
	Program string
	Reason  string
}

func (e *StartError) Error() string {
	return fmt.Sprintf("cannot start %s: %s", e.Program, e.Reason)
}

// ErrInvalidSpec reports a Spec the caller should not have built.
var ErrInvalidSpec = errors.New("sandbox: invalid spec")

// Process is a started sandboxed process. Call Wait exactly once.
type Process struct {
	Cmd *exec.Cmd

	ctx     context.Context
	start   time.Time
	drain   time.Duration
	readers []*os.File // parent ends of output pipes, closed by Wait
	stdinW  *os.File
	pumps   sync.WaitGroup
	pumpErr error
	errMu   sync.Mutex
}

// Env builds the environment a spec's process sees.
func (s *Sandbox) env(spec *Spec) ([]string, error) {
	home, tmp, term := spec.Home, spec.TmpDir, spec.Term
	if home == "" {
		home = spec.Dir
	}
	if tmp == "" {
		tmp = spec.Dir
	}
	if term == "" {
		term = "dumb"
	}
	vars := map[string]string{
		"PATH":   s.path,
		"HOME":   home,
		"LANG":   "C.UTF-8",
		"TERM":   term,
		"TMPDIR": tmp,
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("%w: bad environment variable %q", ErrInvalidSpec, k)
		}
		vars[k] = v
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env, nil
}

// Start starts spec under ctx. When ctx is done the whole process group is
// killed. An error is either ErrInvalidSpec or a *StartError.
func (s *Sandbox) Start(ctx context.Context, spec *Spec) (*Process, error) {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, fmt.Errorf("%w: no program", ErrInvalidSpec)
	}
	if spec.Dir == "" {
		return nil, fmt.Errorf("%w: no working directory", ErrInvalidSpec)
	}
	env, err := s.env(spec)
	if err != nil {
		return nil, err
	}
	limits := s.limits
	if spec.Limits != nil {
		limits = *spec.Limits
	}

	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, &StartError{Program: spec.Args[0], Reason: err.Error()}
	}
	defer statusR.Close()
	statusFD := 3 + len(spec.ExtraFiles)

	args := append([]string{s.self, initArg, fmt.Sprint(statusFD), limits.encode(), "--"}, spec.Args...)
	cmd := exec.CommandContext(ctx, s.self)
	cmd.Args = args
	cmd.Env = env
	cmd.Dir = spec.Dir
	cmd.ExtraFiles = append(append([]*os.File(nil), spec.ExtraFiles...), statusW)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if spec.TTY {
		// A new session is also a new process group (pgid = pid).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	}
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = s.drainGrace

	p := &Process{Cmd: cmd, ctx: ctx, drain: s.drainGrace}
	var childEnds []*os.File
	closeAll := func() {
		for _, f := range childEnds {
			f.Close()
		}
		for _, f := range p.readers {
			f.Close()
		}
		if p.stdinW != nil {
			p.stdinW.Close()
		}
	}

	switch in := spec.Stdin.(type) {
	case nil:
	case *os.File:
		cmd.Stdin = in
	default:
		r, w, err := os.Pipe()
		if err != nil {
			statusW.Close()
			return nil, &StartError{Program: spec.Args[0], Reason: err.Error()}
		}
		childEnds = append(childEnds, r)
		cmd.Stdin = r
		p.stdinW = w
	}
	outputs := []struct {
		w   io.Writer
		dst *io.Writer
	}{{spec.Stdout, &cmd.Stdout}, {spec.Stderr, &cmd.Stderr}}
	var pumps []func()
	for _, o := range outputs {
		switch w := o.w.(type) {
		case nil:
		case *os.File:
			*o.dst = w
		default:
			r, wr, err := os.Pipe()
			if err != nil {
				statusW.Close()
				closeAll()
				return nil, &StartError{Program: spec.Args[0], Reason: err.Error()}
			}
			childEnds = append(childEnds, wr)
			p.readers = append(p.readers, r)
			*o.dst = wr
			pumps = append(pumps, func() { p.pump(w, r) })
		}
	}

	p.start = time.Now()
	err = cmd.Start()
	statusW.Close()
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		closeAll()
		return nil, &StartError{Program: spec.Args[0], Reason: err.Error()}
	}
	for _, pump := range pumps {
		p.pumps.Add(1)
		go pump()
	}
	if p.stdinW != nil {
		go func() {
			io.Copy(p.stdinW, spec.Stdin)
			p.stdinW.Close()
		}()
	}

	// The init child writes a reason to the status pipe if it cannot exec the
	// user program; a successful exec closes the pipe (close-on-exec) empty.
	msg, _ := io.ReadAll(statusR)
	if len(msg) > 0 {
		p.Wait()
		return nil, &StartError{Program: spec.Args[0], Reason: string(msg)}
	}
	return p, nil
}

func (p *Process) pump(w io.Writer, r *os.File) {
	defer p.pumps.Done()
	_, err := io.Copy(w, r)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
		p.errMu.Lock()
		p.pumpErr = err
		p.errMu.Unlock()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.errMu.Lock()
		p.pumpErr = os.ErrDeadlineExceeded
		p.errMu.Unlock()
	}
}

// Wait waits for the process to exit, kills what is left of its process
// group, drains its output (bounded by the drain grace) and reports how it
// ended.
func (p *Process) Wait() Exit {
	waitErr := p.Cmd.Wait()
	// Nothing of a run outlives it: background jobs left in the group go too.
	killGroup(p.Cmd)
	if p.stdinW != nil {
		p.stdinW.Close()
	}
	deadline := time.Now().Add(p.drain)
	for _, r := range p.readers {
		r.SetReadDeadline(deadline)
	}
	p.pumps.Wait()
	for _, r := range p.readers {
		r.Close()
	}

	e := Exit{Duration: time.Since(p.start)}
	if st := p.Cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal()
			e.Code = 128 + int(e.Signal)
		} else {
			e.Code = st.ExitCode()
		}
	} else if waitErr != nil {
		e.Code = -1
	}
	switch p.ctx.Err() {
	case context.DeadlineExceeded:
		e.TimedOut = true
	case context.Canceled:
		e.Canceled = true
	}
	p.errMu.Lock()
	e.Abandoned = errors.Is(p.pumpErr, os.ErrDeadlineExceeded)
	p.errMu.Unlock()
	return e
}

// Run starts spec and waits for it.
func (s *Sandbox) Run(ctx context.Context, spec *Spec) (Exit, error) {
	p, err := s.Start(ctx, spec)
	if err != nil {
		return Exit{}, err
	}
	return p.Wait(), nil
}

func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
