package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// python_run's time budget.
const (
	pythonRunDefaultTimeout = 20 * time.Second
	pythonRunMinTimeout     = time.Second
	pythonRunMaxTimeout     = 60 * time.Second
	// A single argv string is limited to 128 KiB by the kernel.
	pythonRunMaxCode = 120 << 10
)

// PythonRunInput is python_run's input.
type PythonRunInput struct {
	Code      string `json:"code" jsonschema:"Python source, run as python3 -I -u -c CODE"`
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds, 1000..60000; default 20000"`
}

// PythonRunResult is python_run's output.
type PythonRunResult struct {
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Rootfs     string  `json:"rootfs"`
	Python     string  `json:"python,omitempty"` // the rootfs's python3 package version
	DurationMS float64 `json:"duration_ms"`
	Truncated  bool    `json:"truncated,omitempty"`
	StdoutFile string  `json:"stdout_file,omitempty"`
	StderrFile string  `json:"stderr_file,omitempty"`
	Note       string  `json:"note,omitempty"`
}

// Text is `exit_code=N`, then the stdout and stderr sections.
func (r *PythonRunResult) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit_code=%d\n--- stdout ---\n%s", r.ExitCode, r.Stdout)
	if r.Stdout != "" && !strings.HasSuffix(r.Stdout, "\n") {
		b.WriteByte('\n')
	}
	b.WriteString("--- stderr ---\n" + r.Stderr)
	if r.Note != "" {
		if r.Stderr != "" && !strings.HasSuffix(r.Stderr, "\n") {
			b.WriteByte('\n')
		}
		b.WriteString("--- " + r.Note + " ---")
	}
	return strings.TrimRight(b.String(), "\n")
}

// pythonRun holds python_run's state: the rootfs manager and the installs
// it started on first use.
type pythonRun struct {
	a        *App
	m        *rootfs.Manager
	eng      *python.Rootfs // runs the code: the same path as run_code's tier 2
	installs *rootfs.OnFirstUse
}

// registerPythonRun declares python_run.
func (a *App) registerPythonRun(reg *capability.Registry) {
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	m.Installer = a.rootfsInstaller
	p := &pythonRun{a: a, m: m, eng: python.NewRootfs(a.Sandbox, m), installs: &rootfs.OnFirstUse{M: m, Log: a.Log}}
	reg.Register(capability.New("python_run",
		"Run Python in the full Linux sandbox: python3 -I -u -c CODE inside the session's Debian rootfs (the session's rootfs, else the one named \"default\"), "+
			"with the workspace as working directory, a cleared environment (a whitelist plus the session's variables) and the session's network policy. "+
			"Returns exit_code, stdout and stderr (read concurrently; long output keeps head and tail, the full stream is saved in the workspace). "+
			"timeout_ms is 1000..60000 (default 20000); on timeout the whole process tree is killed and the output so far is returned. "+
			"A missing rootfs is installed on first use only for a caller with scope install or admin (debootstrap: needs the network, about a minute); a call whose timeout ends first says so and the install continues: call again, or run `quro rootfs install` beforehand. "+
			"Unlike run_code's python (the session's own interpreter — the embedded CPython 3.14, or the rootfs's python3 on a rootfs session — kept resident), nothing persists between calls except files, and the user site (pip installs) is not used.",
		capability.ScopeExec, p.run).Streaming().InSession(capability.UseBusy))
}

func (p *pythonRun) run(ctx context.Context, in PythonRunInput) (*PythonRunResult, error) {
	timeout, err := runcode.MillisTimeout(in.TimeoutMS, pythonRunMinTimeout, pythonRunMaxTimeout)
	if err != nil {
		return nil, err
	}
	if timeout == 0 {
		timeout = pythonRunDefaultTimeout
	}
	if strings.IndexByte(in.Code, 0) >= 0 {
		return nil, capability.Errorf(capability.InvalidArgument, "code contains a NUL byte, which a command-line argument cannot carry")
	}
	if len(in.Code) > pythonRunMaxCode {
		return nil, capability.Errorf(capability.InvalidArgument, "code is %d bytes; python_run passes it with -c, limited to %d: use run_code, or write a file and run it", len(in.Code), pythonRunMaxCode)
	}
	sess, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	name := sess.Rootfs
	if name == "" {
		name = rootfs.DefaultName
	}
	if err := rootfs.CheckName(name); err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "session %s: %v", sess.Name, err)
	}
	start := time.Now()
	runTimeout := timeout
	if !p.m.Ready(name) {
		// Installing downloads a Debian userland from the host's network
		// and creates a rootfs every tenant may then use: only for a
		// caller that may change rootfses, never implicitly for exec.
		if c, ok := controller.CallerFrom(ctx); !ok || !c.Scope.Covers(capability.ScopeInstall) {
			return nil, capability.Errorf(capability.PermissionDenied,
				"rootfs %q is not installed, and python_run installs a missing rootfs (debootstrap downloads it from the network) only for a caller with scope install or admin; "+
					"nothing was downloaded and the code did not run. An operator runs `quro rootfs install %s` (or a caller with scope install calls python_run once); "+
					"or create a session on an installed rootfs (`quro rootfs status` lists them)", name, name)
		}
		deadline := start.Add(timeout)
		if err := p.waitInstall(ctx, name, deadline); err != nil {
			return nil, err
		}
		// Installed during this call: the run gets what is left.
		if runTimeout = time.Until(deadline); runTimeout < pythonRunMinTimeout {
			return nil, capability.Errorf(capability.DeadlineExceeded,
				"rootfs %q was installed during this call, which left too little of its timeout to run the code: call python_run again", name)
		}
	}
	return p.exec(ctx, sess, name, in.Code, runTimeout, start)
}

// checkRootfsReady refuses a rootfs name that is not installed, listing
// the installed ones and how to install it (create_session names one).
func (a *App) checkRootfsReady(name string) error {
	if err := rootfs.CheckName(name); err != nil {
		return capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if !m.Ready(name) {
		return missingRootfs(m, name)
	}
	return nil
}

// waitInstall starts installing name in the background (or joins the
// install already running) and waits for it until deadline
// (rootfs.OnFirstUse), saying what the call should do next.
func (p *pythonRun) waitInstall(ctx context.Context, name string, deadline time.Time) error {
	err := p.installs.Wait(ctx, name, deadline)
	var pending *rootfs.PendingError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pending):
		last := pending.Last
		if last != "" {
			last = "; last step: " + last
		}
		return capability.Errorf(capability.Unavailable,
			"rootfs %q is not installed yet: installing it now (started %s ago; debootstrap needs the network and takes about a minute or two%s). "+
				"The code did not run. Call python_run again when it is done, or run `quro rootfs install %s` first (see `quro rootfs status`).",
			name, time.Since(pending.Started).Round(time.Second), last, name)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return capability.Errorf(capability.Canceled, "canceled while rootfs %q was being installed (the install goes on)", name)
	}
	return installError(name, err)
}

// installError says what a failed install on first use means for the
// call; its code is the cause's (rootfs.ErrBusy, rootfs.ErrInstallFailed).
func installError(name string, err error) error {
	if errors.Is(err, rootfs.ErrBusy) {
		return fmt.Errorf("rootfs %q is being installed by another process; the code did not run. Call python_run again when `quro rootfs status %s` says ready (%w)", name, name, err)
	}
	return fmt.Errorf("rootfs %q is not installed and installing it failed; the code did not run. Install it with `quro rootfs install %s` (needs root and the network). %w", name, name, err)
}

// exec runs the code in the rootfs name through run_code's rootfs engine
// (python.Rootfs.RunIn) and shapes its result.
func (p *pythonRun) exec(ctx context.Context, sess *session.Session, name, code string, timeout time.Duration, start time.Time) (*PythonRunResult, error) {
	opts := p.a.Runner.Options()
	runID := time.Now().UTC().Format("20060102T150405.000000000")
	ws := sess.Workspace()
	outDir := sess.OutputsDir()
	stdout := runcode.NewCapture(opts.MaxStdout, filepath.Join(outDir, "python_run-"+runID+".stdout"), opts.SpillLimit).Within(ws).Observed(ctx, "stdout")
	stderr := runcode.NewCapture(opts.MaxStderr, filepath.Join(outDir, "python_run-"+runID+".stderr"), opts.SpillLimit).Within(ws).Observed(ctx, "stderr")
	// The timeout is the program's (runcode.ProcessSpec puts it on the
	// box's Spec, counted from python3's start): a deadline on ctx also
	// counted the making of the box.
	r, err := p.eng.RunIn(ctx, name, &runcode.Request{
		Code: code, Lang: "python", Session: sess, Timeout: timeout, Stdout: stdout, Stderr: stderr,
	}, python.ViaArg)
	if err != nil {
		// Its code is the controller's table's: a box refused at the
		// tenant's ceiling is resource_exhausted, a start failure unavailable.
		return nil, fmt.Errorf("python_run in rootfs %q: %w", name, err)
	}
	so, se := stdout.Finish(), stderr.Finish()
	res := &PythonRunResult{
		ExitCode: r.ExitCode, Stdout: so.Text, Stderr: se.Text, TimedOut: r.TimedOut, Rootfs: name,
		DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		Truncated:  so.Cut || se.Cut, StdoutFile: wsRel(ws, so.File), StderrFile: wsRel(ws, se.File),
	}
	// The engine's words for a timeout, a cancel, the memory limit or a
	// signal (runcode.ExitResult), as one line.
	notes := r.Notes
	if r.Error != "" {
		notes = append([]string{r.Error}, notes...)
	}
	res.Note = hostpath.HomeText(ws, strings.Join(notes, "; "))
	res.Stdout, res.Stderr = hostpath.HomeText(ws, res.Stdout), hostpath.HomeText(ws, res.Stderr)
	if info, err := p.m.Info(name); err == nil {
		res.Python = info.Python
	}
	return res, nil
}

// wsRel is the spill file f (a host path in the workspace ws) relative to
// the workspace, as read_file takes it; "" stays "".
func wsRel(ws, f string) string {
	if f == "" {
		return ""
	}
	if rel, err := filepath.Rel(ws, f); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.ToSlash(rel)
	}
	return filepath.Base(f)
}
