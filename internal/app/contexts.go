package app

// Code contexts: named states inside a session that run_code can run in
// (E2B's code-interpreter contexts; Quro's own API has them too). A Python
// context is a namespace of the session's Python worker with its own
// working directory and execution count; a JavaScript/TypeScript context
// is a REPL of the session's Node worker (in its box) where its userland
// has node, else a QuickJS VM kept between runs; a bash context runs in the session's
// resident shell (one per session: bash contexts share its state). The
// registry here keeps what each context is (id, language, directory);
// the engines keep the state, and forget it when the context is
// restarted or removed, or the session destroyed.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// MaxCodeContexts is how many code contexts a session holds, the default
// ones included.
const MaxCodeContexts = 32

// The languages of code contexts, as E2B names them.
const (
	ctxPython     = "python"
	ctxJavaScript = "javascript"
	ctxTypeScript = "typescript"
	ctxBash       = "bash"
)

// CodeContext is one code context.
type CodeContext struct {
	ID       string `json:"id" jsonschema:"the context's id: pass it as run_code's context"`
	Language string `json:"language" jsonschema:"python, javascript, typescript or bash"`
	Cwd      string `json:"cwd" jsonschema:"the working directory a run in it starts in, as the session's box sees it (/home/user is the workspace)"`
	Session  string `json:"session" jsonschema:"id of the session it lives in"`
	Default  bool   `json:"default,omitempty" jsonschema:"the session's default context of its language (run_code with context \"default\")"`

	runs int // bash contexts: the execution count (the engines count the others)
	// bash contexts: the first run (and the first after a restart) goes
	// to the context's directory first.
	moved bool
}

// CodeContextInput is create_code_context's input.
type CodeContextInput struct {
	Session  string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Language string `json:"language,omitempty" jsonschema:"python (default), javascript (js), typescript (ts) or bash"`
	Cwd      string `json:"cwd,omitempty" jsonschema:"working directory of its runs as the box sees it; default /home/user (the workspace); a relative path is under /home/user"`
	Default  bool   `json:"default,omitempty" jsonschema:"answer the session's default context of the language instead (the one run_code's context \"default\" runs in), made if there is none yet; cwd must be empty"`
}

// CodeContextRef names a code context.
type CodeContextRef struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	ID      string `json:"id" jsonschema:"the context's id"`
}

// CodeContextList is list_code_contexts' output.
type CodeContextList struct {
	Contexts []CodeContext `json:"contexts"`
}

// Text lists the contexts.
func (l *CodeContextList) Text() string {
	var b strings.Builder
	for _, c := range l.Contexts {
		def := ""
		if c.Default {
			def = " (default)"
		}
		fmt.Fprintf(&b, "%s %s in %s%s\n", c.ID, c.Language, c.Cwd, def)
	}
	if b.Len() == 0 {
		return "(no code contexts)"
	}
	return strings.TrimRight(b.String(), "\n")
}

// Text describes the context.
func (c *CodeContext) Text() string {
	return fmt.Sprintf("code context %s (%s) in %s, session %s", c.ID, c.Language, c.Cwd, c.Session)
}

// codeContexts is the registry of every session's contexts (the zero
// value is ready).
type codeContexts struct {
	mu        sync.Mutex
	bySession map[string]map[string]*CodeContext
}

// normLanguage is a context language from what a caller wrote.
func normLanguage(lang string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(lang)) {
	case "", "python", "python3", "py":
		return ctxPython, nil
	case "javascript", "js", "node", "nodejs":
		return ctxJavaScript, nil
	case "typescript", "ts":
		return ctxTypeScript, nil
	case "bash", "sh", "shell":
		return ctxBash, nil
	}
	return "", capability.Errorf(capability.InvalidArgument,
		"language %q has no code contexts in Quro: use python, javascript (js), typescript (ts) or bash", lang)
}

// runLang is run_code's language for a context language.
func runLang(lang string) string {
	switch lang {
	case ctxJavaScript:
		return "js"
	case ctxTypeScript:
		return "ts"
	}
	return lang
}

// engineFamily: javascript and typescript contexts are one kind of VM.
func engineFamily(lang string) string {
	if lang == ctxTypeScript {
		return ctxJavaScript
	}
	return lang
}

// contextDir checks a context's directory and makes it absolute (relative
// paths are under /home/user).
func contextDir(dir string) (string, error) {
	if dir == "" {
		return sandbox.HomeUser, nil
	}
	if len(dir) > 4096 || strings.ContainsRune(dir, 0) {
		return "", capability.Errorf(capability.InvalidArgument, "cwd must be a path of at most 4096 bytes without NUL")
	}
	if !path.IsAbs(dir) {
		dir = path.Join(sandbox.HomeUser, dir)
	}
	return path.Clean(dir), nil
}

func newContextID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	// The form of E2B's ids (UUIDs), which some clients print or check.
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// add makes a context in session sid.
func (r *codeContexts) add(sid, lang, dir string, def bool) (*CodeContext, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addLocked(sid, lang, dir, def)
}

// addLocked is add with r.mu held.
func (r *codeContexts) addLocked(sid, lang, dir string, def bool) (*CodeContext, error) {
	m := r.bySession[sid]
	if len(m) >= MaxCodeContexts {
		return nil, capability.Errorf(capability.ResourceExhausted,
			"session %s has %d code contexts, the most it can hold: remove_code_context frees one", sid, len(m))
	}
	if m == nil {
		if r.bySession == nil {
			r.bySession = map[string]map[string]*CodeContext{}
		}
		m = map[string]*CodeContext{}
		r.bySession[sid] = m
	}
	if !def && engineFamily(lang) == ctxJavaScript {
		// Each keeps a VM in the server's memory: the engine holds at most
		// js.MaxContextsPerSession for a session, and a context past that
		// would fail only at its first run.
		n := 0
		for _, c := range m {
			if engineFamily(c.Language) == ctxJavaScript {
				n++
			}
		}
		if n >= js.MaxContextsPerSession {
			return nil, capability.Errorf(capability.ResourceExhausted,
				"session %s has %d JavaScript/TypeScript code contexts (its default ones included), the most it can hold: each keeps a VM in the server's memory; remove_code_context frees one (python and bash contexts are not limited so)", sid, n)
		}
	}
	c := &CodeContext{ID: newContextID(), Language: lang, Cwd: dir, Session: sid, Default: def}
	m[c.ID] = c
	return c, nil
}

// defaultOf is session sid's default context of lang, made on first use.
// The search and the making are one hold of r.mu: two first runs at once
// must find one default, not make one each.
func (r *codeContexts) defaultOf(sid, lang string) (*CodeContext, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.bySession[sid] {
		if c.Default && c.Language == lang {
			return c, nil
		}
	}
	return r.addLocked(sid, lang, sandbox.HomeUser, true)
}

// get finds context id of session sid.
func (r *codeContexts) get(sid, id string) (*CodeContext, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.bySession[sid][id]; c != nil {
		return c, nil
	}
	return nil, capability.Errorf(capability.NotFound,
		"code context %q not found in session %s: list_code_contexts lists them, create_code_context makes one", id, sid)
}

func (r *codeContexts) list(sid string) []CodeContext {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]CodeContext, 0, len(r.bySession[sid]))
	for _, c := range r.bySession[sid] {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Default != out[j].Default {
			return out[i].Default
		}
		if out[i].Language != out[j].Language {
			return out[i].Language < out[j].Language
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func (r *codeContexts) remove(sid, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.bySession[sid], id)
}

// forget drops every context of session sid (it is destroyed; its engines
// end their state themselves).
func (r *codeContexts) forget(sid string) []*CodeContext {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*CodeContext
	for _, c := range r.bySession[sid] {
		out = append(out, c)
	}
	delete(r.bySession, sid)
	return out
}

func (a *App) registerContexts(reg *capability.Registry) {
	reg.Register(capability.New("create_code_context",
		"Make a code context in a session: a state of its own that run_code runs in when given its id as context — "+
			"for python a namespace of the session's interpreter (variables, imports) with its own working directory and execution count; "+
			"for javascript/typescript a REPL of the session's Node worker where its userland has node (require of Node's modules and of /home/user/node_modules, top-level await; else a QuickJS VM), top-level declarations persisting between runs; for bash the session's resident shell. "+
			fmt.Sprintf("cwd defaults to %s, where every session box shows the workspace. A session holds at most %d contexts, at most %d of them javascript/typescript (each keeps a VM in the server's memory). "+
				"With default true it answers the session's default context of the language (run_code's context \"default\"), made if there is none yet.", sandbox.HomeUser, MaxCodeContexts, js.MaxContextsPerSession),
		capability.ScopeExec, a.createCodeContext).InSession(capability.UseHold))
	reg.Register(capability.New("list_code_contexts",
		"List a session's code contexts, its default python and javascript contexts included (run_code with context \"default\" runs in the default context of its lang).",
		capability.ScopeRead, a.listCodeContexts).InSession(capability.UseRead))
	reg.Register(capability.New("restart_code_context",
		"Restart a code context: its state (variables, imports, working directory, count) starts afresh under the same id; waits for a run in it to end.",
		capability.ScopeExec, a.restartCodeContext).InSession(capability.UseBusy))
	reg.Register(capability.New("remove_code_context",
		"Remove a code context and its state (a run in it is waited for).",
		capability.ScopeExec, a.removeCodeContext).InSession(capability.UseBusy))
}

func (a *App) createCodeContext(ctx context.Context, in CodeContextInput) (*CodeContext, error) {
	lang, err := normLanguage(in.Language)
	if err != nil {
		return nil, err
	}
	dir, err := contextDir(in.Cwd)
	if err != nil {
		return nil, err
	}
	if in.Default && in.Cwd != "" {
		return nil, capability.Errorf(capability.InvalidArgument,
			"cwd and default were both given: a default context runs in %s; omit one", sandbox.HomeUser)
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	var c *CodeContext
	if in.Default {
		c, err = a.contexts.defaultOf(s.ID, lang)
	} else {
		c, err = a.contexts.add(s.ID, lang, dir, false)
	}
	if err != nil {
		return nil, err
	}
	a.contexts.mu.Lock()
	out := *c
	a.contexts.mu.Unlock()
	return &out, nil
}

func (a *App) listCodeContexts(ctx context.Context, in SessionRef) (*CodeContextList, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	// The defaults are listed as E2B lists its default kernels.
	for _, l := range []string{ctxPython, ctxJavaScript} {
		if _, err := a.contexts.defaultOf(s.ID, l); err != nil {
			return nil, err
		}
	}
	return &CodeContextList{Contexts: a.contexts.list(s.ID)}, nil
}

func (a *App) restartCodeContext(ctx context.Context, in CodeContextRef) (*CodeContext, error) {
	s, c, err := a.contextOf(ctx, in)
	if err != nil {
		return nil, err
	}
	if err := a.dropContextState(ctx, s, c); err != nil {
		return nil, err
	}
	a.contexts.mu.Lock()
	c.runs, c.moved = 0, false
	out := *c
	a.contexts.mu.Unlock()
	return &out, nil
}

// CodeContextRemoved is remove_code_context's output.
type CodeContextRemoved struct {
	Removed string `json:"removed" jsonschema:"the id of the context removed"`
}

func (a *App) removeCodeContext(ctx context.Context, in CodeContextRef) (*CodeContextRemoved, error) {
	s, c, err := a.contextOf(ctx, in)
	if err != nil {
		return nil, err
	}
	if err := a.dropContextState(ctx, s, c); err != nil {
		return nil, err
	}
	a.contexts.remove(s.ID, c.ID)
	return &CodeContextRemoved{Removed: c.ID}, nil
}

func (a *App) contextOf(ctx context.Context, in CodeContextRef) (*session.Session, *CodeContext, error) {
	if in.ID == "" {
		return nil, nil, capability.Errorf(capability.InvalidArgument, "id is empty: pass a context id (list_code_contexts lists them)")
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := a.contexts.get(s.ID, in.ID)
	if err != nil {
		return nil, nil, err
	}
	return s, c, nil
}

// dropContextState makes the engine of c forget its state.
func (a *App) dropContextState(ctx context.Context, s *session.Session, c *CodeContext) error {
	if c.Language == ctxBash {
		return nil // the session's shell is shared by its bash contexts
	}
	return a.Runner.DropContext(ctx, runLang(engineFamily(c.Language)), s.ID, c.ID)
}

// forgetContexts drops the contexts of a destroyed session and the state
// the engines keep for them outside the session's box (JS VMs).
func (a *App) forgetContexts(sid string) {
	for _, c := range a.contexts.forget(sid) {
		if engineFamily(c.Language) == ctxJavaScript {
			_ = a.Runner.DropContext(context.Background(), "js", sid, c.ID)
		}
	}
}

// contextRun resolves run_code's context: the context, and the language
// to run. lang is what the caller asked for ("" when nothing).
func (a *App) contextRun(s *session.Session, id, lang string) (*CodeContext, string, error) {
	var c *CodeContext
	var err error
	if id == "default" {
		l, err := normLanguage(lang)
		if err != nil {
			return nil, "", err
		}
		c, err = a.contexts.defaultOf(s.ID, l)
		if err != nil {
			return nil, "", err
		}
	} else if c, err = a.contexts.get(s.ID, id); err != nil {
		return nil, "", err
	}
	run := runLang(c.Language)
	if lang != "" {
		l, err := normLanguage(lang)
		if err != nil {
			return nil, "", err
		}
		if engineFamily(l) != engineFamily(c.Language) {
			return nil, "", capability.Errorf(capability.InvalidArgument,
				"code context %s is a %s context; lang %q cannot run in it (omit lang, or use a context of that language)", c.ID, c.Language, lang)
		}
		run = runLang(l)
	}
	return c, run, nil
}

// checkRunEnv checks run_code's per-run variables.
func checkRunEnv(env map[string]string) error {
	if err := sandbox.CheckEnv(env); err != nil {
		return capability.Errorf(capability.InvalidArgument, "env: %v", err)
	}
	return nil
}

// runBashContext runs code in the session's resident shell (bash
// contexts), as terminal_exec does; env is set for this command only.
func (a *App) runBashContext(ctx context.Context, s *session.Session, c *CodeContext, code string, env map[string]string, timeout time.Duration) (*runcode.Result, error) {
	if timeout == 0 {
		timeout = a.Runner.Options().DefaultTimeout
	}
	cmd := code
	if len(env) > 0 {
		// A subshell: the variables end with the command (and so do its
		// other changes to the shell's state).
		var b strings.Builder
		b.WriteString("(")
		keys := make([]string, 0, len(env))
		for k := range env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "export %s=%s; ", k, shellQuote(env[k]))
		}
		b.WriteString("\n" + code + "\n)")
		cmd = b.String()
	}
	a.contexts.mu.Lock()
	if !c.moved {
		// The shell is the session's: it stays where the context's code
		// takes it, as a bash kernel does.
		cmd = "cd -- " + shellQuote(c.Cwd) + " 2>/dev/null\n" + cmd
		c.moved = true
	}
	a.contexts.mu.Unlock()
	start := time.Now()
	r, err := a.Terminals.Exec(ctx, s, cmd, terminal.ExecOptions{Timeout: timeout, Split: true})
	if err != nil {
		return nil, err
	}
	a.contexts.mu.Lock()
	c.runs++
	n := c.runs
	a.contexts.mu.Unlock()
	res := &runcode.Result{
		Session: s.ID, Lang: "bash", Engine: "shell/resident", ExitCode: r.ExitCode,
		Stdout: r.Output, Stderr: r.Stderr, TimedOut: r.TimedOut, Interrupted: r.Interrupted,
		Truncated: r.Truncated, Artifacts: []runcode.Artifact{},
		DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		Context:    c.ID, ExecutionCount: n,
	}
	return res, nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
