package app

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/workspace"
)

// Background processes of a session (internal/proc): programs an agent
// starts, watches, feeds and stops, that outlive the call that started
// them; E2B's envd process service is built on them.

// ProcessSelector names a process of a session: by pid, or by tag.
type ProcessSelector struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Pid     int    `json:"pid,omitempty" jsonschema:"the process's pid (as start_process and list_processes report it)"`
	Tag     string `json:"tag,omitempty" jsonschema:"the tag it was started with, when no pid is given"`
}

func (s ProcessSelector) sel() proc.Selector { return proc.Selector{Pid: s.Pid, Tag: s.Tag} }

// StartProcessInput is start_process's input.
type StartProcessInput struct {
	Session string            `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Command string            `json:"command,omitempty" jsonschema:"the shell line to run with bash, e.g. \"npm start\" (or cmd and args)"`
	Cmd     string            `json:"cmd,omitempty" jsonschema:"instead of command: a program (looked up in PATH), run with args as they are, no shell"`
	Args    []string          `json:"args,omitempty" jsonschema:"cmd's arguments"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"variables over the session's"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory as the box sees it, relative ones from the workspace; default the workspace (/home/user in a session box)"`
	Tag     string            `json:"tag,omitempty" jsonschema:"a name to find the process by later"`
	Stdin   bool              `json:"stdin,omitempty" jsonschema:"keep its stdin open for send_process_input (else /dev/null)"`
	// PTY runs the process on a pseudo-terminal of that size.
	PTY        *proc.Size `json:"pty,omitempty" jsonschema:"run it on a terminal of cols x rows (output stream pty)"`
	TimeoutMS  int64      `json:"timeout_ms,omitempty" jsonschema:"kill it after this many milliseconds; 0 (default) never"`
	Background bool       `json:"background,omitempty" jsonschema:"return as soon as it runs instead of when it ends"`
}

// ProcessResult is start_process's and connect_process's answer: how the
// process ended, or that it still runs.
type ProcessResult struct {
	Pid     int    `json:"pid"`
	Tag     string `json:"tag,omitempty"`
	Running bool   `json:"running" jsonschema:"it still runs (background, or the caller went away first)"`
	// TimedOut: connect_process's timeout_ms passed first.
	TimedOut bool `json:"timed_out,omitempty" jsonschema:"connect_process returned at its timeout_ms; the process still runs"`
	proc.End
	// Output kept for callers that do not stream: the last 64 KiB.
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	PTY    string `json:"pty,omitempty"`
}

// Text summarises the result.
func (r *ProcessResult) Text() string {
	var b strings.Builder
	switch {
	case r.TimedOut:
		fmt.Fprintf(&b, "process %d is running (timeout_ms passed; it keeps running: read_process_output reads its output)", r.Pid)
	case r.Running:
		fmt.Fprintf(&b, "process %d is running", r.Pid)
	default:
		fmt.Fprintf(&b, "process %d ended: %s", r.Pid, r.Status)
	}
	for _, o := range []struct{ name, s string }{{"stdout", r.Stdout}, {"stderr", r.Stderr}, {"terminal", r.PTY}} {
		if o.s != "" {
			fmt.Fprintf(&b, "\n%s:\n%s", o.name, strings.TrimRight(o.s, "\n"))
		}
	}
	return b.String()
}

// ProcessList is list_processes' answer.
type ProcessList struct {
	Processes []proc.Info `json:"processes"`
}

// Text lists the processes.
func (l *ProcessList) Text() string {
	if len(l.Processes) == 0 {
		return "no processes running"
	}
	var b strings.Builder
	for _, p := range l.Processes {
		fmt.Fprintf(&b, "%d", p.Pid)
		if p.Tag != "" {
			fmt.Fprintf(&b, " [%s]", p.Tag)
		}
		fmt.Fprintf(&b, " %s %s\n", p.Config.Cmd, strings.Join(p.Config.Args, " "))
	}
	return strings.TrimRight(b.String(), "\n")
}

// ConnectProcessInput is connect_process's input.
type ConnectProcessInput struct {
	ProcessSelector
	TimeoutMS int64 `json:"timeout_ms,omitempty" jsonschema:"return after this many milliseconds if it still runs (it keeps running); 0 (default): when it ends"`
	// ReplayTerminal: a process on a terminal first sends what it printed
	// before (E2B's pty.connect redraws a terminal from it).
	ReplayTerminal bool `json:"replay_terminal,omitempty" jsonschema:"for a process started with pty: first stream what its terminal showed before (the last 64 KiB kept), then what comes"`
}

// ReadOutputInput is read_process_output's input.
type ReadOutputInput struct {
	ProcessSelector
	Since int64 `json:"since,omitempty" jsonschema:"an offset: the next of the previous answer, to read only what came after it; 0: all that is kept"`
}

// ProcessOutput is read_process_output's answer.
type ProcessOutput struct {
	Pid     int    `json:"pid"`
	Tag     string `json:"tag,omitempty"`
	Running bool   `json:"running"`
	// End is how it ended, once it has.
	End    *proc.End `json:"end,omitempty"`
	Output string    `json:"output" jsonschema:"what it printed from since on (stdout, stderr and terminal merged in order)"`
	Next   int64     `json:"next" jsonschema:"the offset after output: pass it as since to read only what comes next"`
	// Dropped counts the bytes from since on that the ring no longer
	// held.
	Dropped int64 `json:"dropped,omitempty" jsonschema:"bytes after since that were no longer kept (only the last 64 KiB are)"`
	// FromStart: since was past all this process printed (an offset of
	// another process of the same tag), so the output is from its start.
	FromStart bool `json:"from_start,omitempty" jsonschema:"since was past this process's output (another process of that tag?): read from its start"`
}

// Text is the output with one line saying where the process is.
func (o *ProcessOutput) Text() string {
	var b strings.Builder
	if o.Running {
		fmt.Fprintf(&b, "process %d is running", o.Pid)
	} else {
		fmt.Fprintf(&b, "process %d ended: %s", o.Pid, o.End.Status)
	}
	fmt.Fprintf(&b, "; next since=%d", o.Next)
	if o.FromStart {
		b.WriteString(" (since was past its output, from another process of that tag: read from its start)")
	}
	if o.Dropped > 0 {
		fmt.Fprintf(&b, " (%d earlier bytes were dropped: only the last %d KiB are kept)", o.Dropped, proc.RingSize>>10)
	}
	if o.Output == "" {
		b.WriteString("; no new output")
	} else {
		b.WriteString("\n" + strings.TrimRight(o.Output, "\n"))
	}
	return b.String()
}

// ProcessInputInput is send_process_input's input.
type ProcessInputInput struct {
	ProcessSelector
	Data       string `json:"data,omitempty" jsonschema:"text to write"`
	DataBase64 string `json:"data_base64,omitempty" jsonschema:"bytes to write, base64 (instead of data)"`
}

// SignalProcessInput is signal_process's input.
type SignalProcessInput struct {
	ProcessSelector
	Signal string `json:"signal,omitempty" jsonschema:"SIGTERM (default), SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP or SIGCONT"`
}

// ResizeProcessInput is resize_process's input.
type ResizeProcessInput struct {
	ProcessSelector
	Cols int `json:"cols" jsonschema:"columns"`
	Rows int `json:"rows" jsonschema:"rows"`
}

// ProcessDone is the answer of the calls that act on a process.
type ProcessDone struct {
	Pid     int    `json:"pid"`
	Message string `json:"message"`
}

// Text is the message.
func (d *ProcessDone) Text() string { return d.Message }

// maxProcessTimeoutMS is the largest timeout_ms: the largest
// Connect-Timeout-Ms (10 digits).
const maxProcessTimeoutMS = 9_999_999_999

// outputKeep is how much of each stream a result keeps.
const outputKeep = 64 << 10

type tail struct{ b []byte }

func (t *tail) add(p []byte) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*outputKeep {
		t.b = append(t.b[:0:0], t.b[len(t.b)-outputKeep:]...)
	}
}

func (t *tail) String() string {
	if len(t.b) > outputKeep {
		return string(t.b[len(t.b)-outputKeep:])
	}
	return string(t.b)
}

func (a *App) registerProcesses(reg *capability.Registry) {
	reg.Register(capability.New("start_process",
		"Start a shell command (command) or a program (cmd, args) in the session's sandbox as a background process that outlives this call: a server, a watcher, a long build, a REPL. "+
			"It gets a pid (and an optional tag) to find it by; its output streams while the call lasts and it keeps running if the caller goes away "+
			"(only timeout_ms, signal_process or the end of the session stop it). stdin:true keeps its stdin open for send_process_input; "+
			"pty runs it on a terminal (resize_process). The call returns when the process ends (exit code, status, the last 64 KiB of output), "+
			"or, with background:true, once it runs (one that ends at once is reported ended, with its exit code and output). "+
			fmt.Sprintf("A session runs at most %d processes by default, a tenant %d over all its sessions (get_tenant_limits shows its own); ", proc.DefaultMax, DefaultProcessesPerTenant)+
			"a process counts against those, not against the calls running code at once: this call holds a run slot only until the process runs.",
		capability.ScopeExec, a.startProcess).Streaming().InSession(capability.UseBusy))
	reg.Register(capability.New("connect_process",
		"Follow a running background process of the session (by pid or tag): its output from now on (nothing before is replayed, "+
			"except with replay_terminal what a pty process's terminal showed before, from the last 64 KiB kept) streams "+
			"until it ends, or timeout_ms passes, and the call returns how it ended, or that it still runs. Leaving does not stop it.",
		capability.ScopeRead, a.connectProcess).Streaming().InSession(capability.UseBusy))
	reg.Register(capability.New("read_process_output",
		fmt.Sprintf("Read a background process's recent output (by pid or tag; also of one that ended lately) without following it: "+
			"what it printed since the offset since (the next of the previous answer), from the last %d KiB it keeps.", proc.RingSize>>10),
		capability.ScopeRead, a.readProcessOutput).InSession(capability.UseRead))
	reg.Register(capability.New("list_processes",
		"List the running background processes of the session (start_process): pid, tag, program, arguments, variables, directory.",
		capability.ScopeRead, func(ctx context.Context, in SessionRef) (*ProcessList, error) {
			s, err := entered(ctx)
			if err != nil {
				return nil, err
			}
			return &ProcessList{Processes: a.procs.List(s.ID)}, nil
		}).InSession(capability.UseRead))
	reg.Register(capability.New("send_process_input",
		"Write to a background process's stdin (started with stdin:true) or to its terminal (pty: keys, ^C as \\u0003).",
		capability.ScopeExec, func(ctx context.Context, in ProcessInputInput) (*ProcessDone, error) {
			data := []byte(in.Data)
			if in.DataBase64 != "" {
				if in.Data != "" {
					return nil, capability.Errorf(capability.InvalidArgument, "give data or data_base64, not both")
				}
				b, err := base64.StdEncoding.DecodeString(in.DataBase64)
				if err != nil {
					return nil, capability.Errorf(capability.InvalidArgument, "data_base64 is not base64: %v", err)
				}
				data = b
			}
			return a.onProcess(ctx, in.ProcessSelector, func(p *proc.Process) (string, error) {
				if len(data) == 0 {
					return "nothing to send", nil
				}
				return fmt.Sprintf("sent %d bytes", len(data)), p.SendInput(data)
			})
		}).InSession(capability.UseBusy))
	reg.Register(capability.New("close_process_stdin",
		"Close a background process's stdin (started with stdin:true): it reads end of file.",
		capability.ScopeExec, func(ctx context.Context, in ProcessSelector) (*ProcessDone, error) {
			return a.onProcess(ctx, in, func(p *proc.Process) (string, error) { return "stdin closed", p.CloseStdin() })
		}).InSession(capability.UseBusy))
	reg.Register(capability.New("signal_process",
		"Send a signal to a background process and its process group: SIGTERM (default) asks it to stop, SIGKILL kills it.",
		capability.ScopeExec, func(ctx context.Context, in SignalProcessInput) (*ProcessDone, error) {
			name := strings.ToUpper(in.Signal)
			if name == "" {
				name = "SIGTERM"
			}
			if !strings.HasPrefix(name, "SIG") {
				name = "SIG" + name
			}
			sig, ok := proc.Signals[name]
			if !ok {
				return nil, capability.Errorf(capability.InvalidArgument, "signal %q: use SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP or SIGCONT", in.Signal)
			}
			return a.onProcess(ctx, in.ProcessSelector, func(p *proc.Process) (string, error) {
				p.Signal(sig)
				return fmt.Sprintf("%s sent", name), nil
			})
		}).InSession(capability.UseBusy))
	reg.Register(capability.New("resize_process",
		"Resize the terminal of a background process started with a pty.",
		capability.ScopeExec, func(ctx context.Context, in ResizeProcessInput) (*ProcessDone, error) {
			return a.onProcess(ctx, in.ProcessSelector, func(p *proc.Process) (string, error) {
				return fmt.Sprintf("resized to %dx%d", in.Cols, in.Rows), p.Resize(in.Cols, in.Rows)
			})
		}).InSession(capability.UseBusy))
}

func (a *App) onProcess(ctx context.Context, in ProcessSelector, do func(p *proc.Process) (string, error)) (*ProcessDone, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	p, err := a.procs.Get(s.ID, in.sel())
	if err != nil {
		return nil, err
	}
	msg, err := do(p)
	if err != nil {
		return nil, err
	}
	return &ProcessDone{Pid: p.Pid(), Message: msg}, nil
}

// DefaultProcessStartWindow is how long start_process with
// background:true waits for a process that ends at once.
const DefaultProcessStartWindow = 500 * time.Millisecond

// program is what start_process runs: command, a shell line, with bash
// (as terminal_exec runs one), or cmd with its args, a program as it is.
func (in StartProcessInput) program() (string, []string, error) {
	switch {
	case in.Command != "" && in.Cmd != "":
		return "", nil, capability.Errorf(capability.InvalidArgument, "give command (a shell line) or cmd (a program, with args), not both")
	case in.Command != "" && len(in.Args) > 0:
		return "", nil, capability.Errorf(capability.InvalidArgument, "args go with cmd (a program); command is a whole shell line: put the arguments in it")
	case in.Command != "":
		return "bash", []string{"-c", in.Command}, nil
	case in.Cmd != "":
		return in.Cmd, in.Args, nil
	}
	return "", nil, capability.Errorf(capability.InvalidArgument, "command is empty: give the shell line to run (e.g. \"python3 -m http.server 8000\"), or cmd, a program, with args")
}

func (a *App) startProcess(ctx context.Context, in StartProcessInput) (*ProcessResult, error) {
	program, args, err := in.program()
	if err != nil {
		return nil, err
	}
	if in.TimeoutMS < 0 || in.TimeoutMS > maxProcessTimeoutMS {
		return nil, capability.Errorf(capability.InvalidArgument, "timeout_ms %d is outside 0..%d (milliseconds; 0 for no timeout)", in.TimeoutMS, int64(maxProcessTimeoutMS))
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	// In a session box the workspace is also /home/user: the process
	// starts there (and relative directories are taken from there) with
	// HOME /home/user, as E2B's sandboxes do; the box enters it (proc.Start).
	home, dir := s.Workspace(), in.Cwd
	if a.Sandbox.Boxed() {
		home = sandbox.HomeUser
		if !path.IsAbs(dir) {
			dir = path.Join(sandbox.HomeUser, dir)
		}
		if err := a.checkCwd(ctx, dir); err != nil {
			return nil, err
		}
	}
	base := s.Spec()
	base.Home = home
	if s.Rootfs != "" {
		dir, err := RootfsDir(a.DataDir)(s.Rootfs)
		if err != nil {
			return nil, err
		}
		base.Rootfs = dir
	}
	lim, err := a.tenants.Limits(ctx, s.Tenant)
	if err != nil {
		return nil, err
	}
	p, v, err := a.procs.Start(ctx, a.Sandbox, base, s.ID, &proc.Start{
		Config: proc.Config{Cmd: program, Args: args, Env: in.Env, Cwd: in.Cwd},
		Tag:    in.Tag, Dir: dir, Stdin: in.Stdin, PTY: in.PTY, Timeout: time.Duration(in.TimeoutMS) * time.Millisecond,
		Tenant: s.Tenant, Limits: lim.procLimits(),
	})
	if err != nil {
		return nil, explainProcessLimit(err)
	}
	runcode.Started(ctx, p.Pid())
	a.following(ctx) // it runs: from now on this call only streams it (a pause need not wait)
	if in.Background {
		// A process that fails at once (a missing file, a port in use)
		// is reported as ended, with its output, instead of as running.
		wctx, cancel := context.WithTimeout(ctx, a.startWindow)
		defer cancel()
		return a.follow(wctx, p, v, in.Tag, nil)
	}
	return a.follow(ctx, p, v, in.Tag, nil)
}

// checkCwd refuses, before anything starts, a working directory (as the
// box sees it) that the box does not have or that is a file, as E2B's
// envd refuses it: the caller named it. The box's sh that enters the
// directory (sandbox.EnterDirArgs) keeps the last word: on a directory
// removed since, or one this look could not reach (a paused box, a
// directory the look may not read), the start goes ahead and the sh says
// why it cannot enter it.
func (a *App) checkCwd(ctx context.Context, dir string) error {
	if dir == sandbox.HomeUser {
		return nil
	}
	_, ops, done, err := a.openFiles(ctx, dir)
	if err != nil {
		return nil
	}
	defer done()
	e, err := ops.Info(dir)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return capability.Errorf(capability.InvalidArgument, "cwd %s does not exist: nothing was started (a relative cwd is taken from %s)", dir, sandbox.HomeUser)
	case err == nil && e.Type == "file":
		return capability.Errorf(capability.InvalidArgument, "cwd %s is a file, not a directory: nothing was started", dir)
	}
	return nil
}

func (a *App) connectProcess(ctx context.Context, in ConnectProcessInput) (*ProcessResult, error) {
	if in.TimeoutMS < 0 || in.TimeoutMS > maxProcessTimeoutMS {
		return nil, capability.Errorf(capability.InvalidArgument, "timeout_ms %d is outside 0..%d (milliseconds; 0 to follow it to its end)", in.TimeoutMS, int64(maxProcessTimeoutMS))
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	p, err := a.procs.Get(s.ID, in.sel())
	if err != nil {
		return nil, err
	}
	var v *proc.Viewer
	var before []byte
	if in.ReplayTerminal && p.Info().PTY {
		v, before, err = p.AttachReplay()
	} else {
		v, err = p.Attach()
	}
	if err != nil {
		return nil, err
	}
	a.following(ctx) // only streams the process (a pause need not wait)
	runcode.Started(ctx, p.Pid())
	if in.TimeoutMS == 0 {
		return a.follow(ctx, p, v, p.Info().Tag, before)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Duration(in.TimeoutMS)*time.Millisecond)
	defer cancel()
	res, err := a.follow(tctx, p, v, p.Info().Tag, before)
	if err == nil && res.Running && ctx.Err() == nil {
		res.TimedOut = true
	}
	return res, err
}

func (a *App) readProcessOutput(ctx context.Context, in ReadOutputInput) (*ProcessOutput, error) {
	if in.Since < 0 {
		return nil, capability.Errorf(capability.InvalidArgument, "since %d is negative: give 0, or the next of the previous answer", in.Since)
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	p, err := a.procs.Find(s.ID, in.sel())
	if err != nil {
		return nil, err
	}
	// Ended first, then the output: an ended process's output is whole.
	ended := p.Ended()
	o := p.ReadOutput(in.Since)
	restarted := false
	if in.Since > o.Next {
		// An offset of another process (one of the same tag that ended
		// and was started again): this one is read from its start.
		o, restarted = p.ReadOutput(0), true
	}
	res := &ProcessOutput{Pid: p.Pid(), Tag: p.Info().Tag, Running: !ended, Output: string(o.Data), Next: o.Next, Dropped: o.Dropped, FromStart: restarted}
	if ended {
		e := p.End()
		res.End = &e
	}
	return res, nil
}

// follow hands v's output to the caller's stream until the process ends
// or the caller goes away (the process runs on).
func (a *App) follow(ctx context.Context, p *proc.Process, v *proc.Viewer, tag string, terminalBefore []byte) (*ProcessResult, error) {
	defer v.Detach()
	out := runcode.OutputFrom(ctx)
	var kept [3]tail
	idx := map[string]int{"stdout": 0, "stderr": 1, "pty": 2}
	res := &ProcessResult{Pid: p.Pid(), Tag: tag}
	if len(terminalBefore) > 0 { // replayed: a terminal's output is all one stream
		kept[2].add(terminalBefore)
		if out != nil {
			out("pty", terminalBefore)
		}
	}
	for {
		select {
		case ev, ok := <-v.C:
			if !ok {
				if err := v.Err(); err != nil {
					return nil, fmt.Errorf("%w; this caller read it too slowly and was detached; the process still runs: connect_process follows it again", err)
				}
				res.End = p.End()
				res.Stdout, res.Stderr, res.PTY = kept[0].String(), kept[1].String(), kept[2].String()
				return res, nil
			}
			kept[idx[ev.Stream]].add(ev.Data)
			if out != nil {
				out(ev.Stream, ev.Data)
			}
			v.Consumed(len(ev.Data))
		case <-ctx.Done():
			res.Running = true
			res.Stdout, res.Stderr, res.PTY = kept[0].String(), kept[1].String(), kept[2].String()
			return res, nil
		}
	}
}
