package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/version"
	"github.com/quro-dev/quro/internal/workspace"
)

// RunCodeInput is run_code's input.
type RunCodeInput struct {
	Code      string `json:"code" jsonschema:"the source code to run or render"`
	Lang      string `json:"lang,omitempty" jsonschema:"language or alias; default python"`
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds; default 30000; -1: the longest allowed"`
	// Compiled and toolchain languages (internal/engine/toolchain).
	CompileTimeoutMS int64    `json:"compile_timeout_ms,omitempty" jsonschema:"compiled languages: the compile's own time budget in milliseconds, apart from timeout_ms (the program's); default 60000; -1: the longest allowed"`
	Stdin            string   `json:"stdin,omitempty" jsonschema:"compiled and toolchain languages (c, cpp, go, rust, java, ruby, perl, …): the program's standard input"`
	Args             []string `json:"args,omitempty" jsonschema:"compiled and toolchain languages: the program's command-line arguments"`
	// Code contexts (contexts.go).
	Context string            `json:"context,omitempty" jsonschema:"run in this code context (create_code_context; \"default\": the session's default context of lang); python, js/ts and bash only"`
	Rich    bool              `json:"rich,omitempty" jsonschema:"notebook results: the last expression's value and display() outputs in results (the value is not printed), an exception in exception (not a traceback on stderr), the execution_count"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"variables for this run only (set before it, restored after)"`
}

// Empty is the input of capabilities that take no arguments.
type Empty struct{}

// CapabilityInfo describes one capability in list_capabilities.
type CapabilityInfo struct {
	Name         string `json:"name"`
	Description  string `json:"description"`
	Scope        string `json:"scope"`
	InputSchema  any    `json:"input_schema" jsonschema:"JSON schema of the input"`
	OutputSchema any    `json:"output_schema" jsonschema:"JSON schema of the output"`
}

// CapabilityList is list_capabilities' output.
type CapabilityList struct {
	Capabilities []CapabilityInfo `json:"capabilities"`
}

// Text lists names and descriptions.
func (l *CapabilityList) Text() string {
	var b strings.Builder
	for _, c := range l.Capabilities {
		fmt.Fprintf(&b, "%s (%s): %s\n", c.Name, c.Scope, c.Description)
	}
	return strings.TrimRight(b.String(), "\n")
}

// Status is get_service_status' output.
type Status struct {
	PID            int                    `json:"pid"`
	Version        string                 `json:"version"`
	StartedAt      time.Time              `json:"started_at"`
	UptimeSeconds  float64                `json:"uptime_seconds"`
	DataDir        string                 `json:"data_dir,omitempty" jsonschema:"the server's data directory; shown to the operator only"`
	Sessions       int                    `json:"sessions"`
	DefaultSession string                 `json:"default_session"`
	Engines        []runcode.EngineStatus `json:"engines"`
	Isolation      []sandbox.Feature      `json:"isolation"`
	Tenant         *TenantStatus          `json:"tenant" jsonschema:"the calling tenant's ceilings and what it uses now"`
	Watches        *workspace.WatchStats  `json:"watches" jsonschema:"the server's watches (watch_dir, E2B's watchers): the inotify instances they share, what they hold now, and the caps per tenant and for the server"`
	// Ceilings are the server's ceilings in force (sessions of all
	// tenants, and every tenant's defaults), each with where it came
	// from: derived from the machine, or set by the operator. The
	// operator's only.
	Ceilings *Defaults `json:"ceilings,omitempty" jsonschema:"the server's ceilings and every tenant's default ones, each with where it came from (the machine's figures or the operator's flags); shown to the operator only"`
}

// Text summarises the status.
func (s *Status) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "quro %s, pid %d, up %s, %d session(s)", s.Version, s.PID,
		time.Duration(s.UptimeSeconds*float64(time.Second)).Round(time.Second), s.Sessions)
	if s.DataDir != "" {
		b.WriteString(", data " + s.DataDir)
	}
	b.WriteString("\n")
	b.WriteString("engines:\n")
	for _, e := range s.Engines {
		state := "available"
		if !e.Available {
			state = "unavailable: " + e.Reason
		}
		fmt.Fprintf(&b, "  %s tier %d %s: %s\n", e.Lang, e.Tier, e.Engine, state)
	}
	if t := s.Tenant; t != nil {
		b.WriteString(t.Text() + "\n")
	}
	if c := s.Ceilings; c != nil {
		b.WriteString("ceilings, " + c.Text() + "\n")
	}
	if w := s.Watches; w != nil {
		fmt.Fprintf(&b, "watches: %d of %d (%d per tenant), directories watched %d of %d (%d per tenant), inotify instances %d of %d (the host allows %d instances and %d watches per user)\n",
			w.Watches, w.Limits.Watches, w.Limits.TenantWatches, w.Dirs, w.Limits.Dirs, w.Limits.TenantDirs,
			w.Instances, w.Limits.Instances, w.Host.MaxUserInstances, w.Host.MaxUserWatches)
	}
	return strings.TrimRight(b.String(), "\n")
}

// hideHostPaths makes s what a tenant reads: no data directory, and the
// engines' and isolation features' words without the host paths in them
// (the cgroups', bubblewrap's): the operator's status and quro doctor
// show them.
func (s *Status) hideHostPaths() {
	s.DataDir = ""
	s.Ceilings = nil // the machine's figures and the server's are the operator's
	s.Engines = slices.Clone(s.Engines)
	for i := range s.Engines {
		s.Engines[i].Reason = hostpath.Names(s.Engines[i].Reason)
	}
	s.Isolation = slices.Clone(s.Isolation)
	for i := range s.Isolation {
		s.Isolation[i].Detail = hostpath.Names(s.Isolation[i].Detail)
	}
}

// Help is help's output.
type Help struct {
	Guide string `json:"text"`
}

// Text returns the guide.
func (h *Help) Text() string { return h.Guide }

func (a *App) register(reg *capability.Registry) {
	opts := a.Runner.Options()
	reg.Register(capability.New("run_code",
		"Run or render code and get one result. lang (default python) is python, js, ts, bash, sh, shell, html, css, json, xml, svg, "+
			"or a compiled or toolchain language (c, cpp, go, rust, java, ruby, …): help languages lists every one with its aliases, how each runs, and which run on this server. "+
			"python is the session's Python, the same interpreter as python3 and pip in its shell: the embedded CPython 3.14 on the host userland, the rootfs's python3 on a session created on a rootfs, "+
			"run by a resident worker (variables and imports persist between runs, a timeout is a KeyboardInterrupt that keeps them, the last expression and display() become artifacts, matplotlib figures PNG images); "+
			"%pip install X (or !pip install X) installs into the session's user site and imports at once. "+
			"The shells run in the session's sandbox with the workspace (/home/user) as working directory; html, css, json, xml and svg are validated and rendered as artifacts. "+
			fmt.Sprintf("The text result shows errors (⚠️), stdout, then stderr (⚠️); stdout is cut to %d KiB and stderr to %d KiB keeping head and tail, ", opts.MaxStdout>>10, opts.MaxStderr>>10)+
			"with the full output saved in the workspace (stdout_file/stderr_file). "+
			fmt.Sprintf("On timeout (default %s, at most %s) the whole process tree is killed and the output so far is returned.", opts.DefaultTimeout, opts.MaxTimeout),
		capability.ScopeExec, a.runCode).Streaming().InSession(capability.UseBusy))
	a.registerSessions(reg)
	a.registerSnapshots(reg)
	a.registerPythonRun(reg)
	a.registerPackages(reg)
	a.registerFiles(reg)
	a.registerEdit(reg)
	a.registerProcesses(reg)
	a.registerFSOps(reg)
	a.registerContexts(reg)
	reg.Register(capability.New("list_capabilities",
		"List every capability with its description, required scope and input/output JSON schemas.",
		capability.ScopeRead, func(ctx context.Context, _ Empty) (*CapabilityList, error) {
			out := &CapabilityList{}
			for _, c := range reg.List() {
				out.Capabilities = append(out.Capabilities, CapabilityInfo{
					Name: c.Name, Description: c.Description, Scope: string(c.Scope),
					InputSchema: c.InputSchema, OutputSchema: c.OutputSchema,
				})
			}
			return out, nil
		}))
	reg.Register(capability.New("get_service_status",
		"Service status: pid, version, uptime, number of sessions, the engines of each language with their availability, the isolation features of the machine, your tenant's ceilings (memory, processes, CPU, sessions, disk per session, watches) with what it uses now, and the server's watches with their caps.",
		capability.ScopeRead, func(ctx context.Context, _ Empty) (*Status, error) {
			st, err := a.Status(ctx)
			if c, ok := controller.CallerFrom(ctx); err == nil && (!ok || !operator(c)) {
				st.hideHostPaths()
			}
			return st, err
		}))
	a.registerHelp(reg)
}

func (a *App) runCode(ctx context.Context, in RunCodeInput) (*runcode.Result, error) {
	var timeout time.Duration
	var err error
	if in.TimeoutMS == -1 {
		timeout = a.Runner.Options().MaxTimeout
	} else if timeout, err = runcode.MillisTimeout(in.TimeoutMS, 0, a.Runner.Options().MaxTimeout); err != nil {
		return nil, err
	}
	var compile time.Duration
	if in.CompileTimeoutMS == -1 {
		compile = a.Runner.Options().MaxTimeout
	} else if compile, err = runcode.MillisTimeoutOf("compile_timeout_ms", in.CompileTimeoutMS, 0, a.Runner.Options().MaxTimeout); err != nil {
		return nil, err
	}
	if in.Context == "" {
		// Resolve the language first: an unknown one is an error even
		// before the session is looked at.
		if _, err := a.Runner.Resolve(in.Lang); err != nil {
			return nil, err
		}
	}
	if err := checkRunEnv(in.Env); err != nil {
		return nil, err
	}
	sess, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	var cr *runcode.ContextRun
	lang := in.Lang
	if in.Context != "" {
		c, l, err := a.contextRun(sess, in.Context, in.Lang)
		if err != nil {
			return nil, err
		}
		if c.Language == ctxBash {
			return a.runBashContext(ctx, sess, c, in.Code, in.Env, timeout)
		}
		lang = l
		if engineFamily(c.Language) == ctxJavaScript && a.js != nil {
			// A context past the JS engine's caps is refused as such
			// (resource_exhausted), not as a run no engine could do.
			if err := a.js.CheckContext(sess.Tenant, sess.ID, c.ID); err != nil {
				return nil, err
			}
		}
		cr = &runcode.ContextRun{ID: c.ID, Dir: c.Cwd, Rich: in.Rich, Env: in.Env}
	} else if in.Rich || len(in.Env) > 0 {
		cr = &runcode.ContextRun{Rich: in.Rich, Env: in.Env}
	}
	if err := a.admit(ctx, sess); err != nil {
		return nil, err
	}
	refused := a.egress.events.mark(sess.ID)
	res, err := a.Runner.Run(ctx, runcode.Input{
		Code: in.Code, Lang: lang, Session: sess, Timeout: timeout, Context: cr,
		CompileTimeout: compile, Stdin: in.Stdin, Args: in.Args,
	})
	if res != nil && cr != nil && cr.ID != "" {
		res.Context = cr.ID
	}
	if res != nil && (res.ExitCode != 0 || res.Error != "" || res.Exception != nil) {
		// A run that failed with a connection the egress refused says
		// which, and what would allow it.
		if note := a.egress.events.refusedSince(sess.ID, refused); note != "" {
			res.Notes = append(res.Notes, note)
		}
	}
	return res, err
}

// Status reports the service status.
func (a *App) Status(ctx context.Context) (*Status, error) {
	n, err := a.Sessions.Count(ctx)
	if err != nil {
		return nil, err
	}
	// A status read makes no session: the default's ID when the tenant
	// has one, empty when none was made yet or it is gone (the next call
	// without a session makes it). Made here, a status read cost the
	// caller a session of its ceiling, and quro doctor, run beside a
	// server on its data directory (a cluster node's, in its pod), made
	// a session there.
	var defID string
	switch def, err := a.Sessions.DefaultIfAny(ctx); {
	case err == nil:
		defID = def.ID
	case !errors.Is(err, session.ErrNotFound):
		return nil, err
	}
	ts, err := a.tenantStatus(ctx)
	if err != nil {
		return nil, err
	}
	ws := a.watchHub.Stats()
	ceilings := a.tenants.ceilings
	return &Status{
		PID: os.Getpid(), Version: version.String(), StartedAt: a.Started,
		UptimeSeconds: time.Since(a.Started).Seconds(), DataDir: a.DataDir,
		Sessions: n, DefaultSession: defID,
		Engines: a.Runner.Engines(), Isolation: a.Isolation(), Tenant: ts, Watches: &ws, Ceilings: &ceilings,
	}, nil
}
