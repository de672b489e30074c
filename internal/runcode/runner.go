// Package runcode is run_code: it resolves a language, runs the code through
// that language's chain of engines, and turns what came out into the one
// Result shape and model-facing text, with output cut to size and spilled to
// the session's outputs directory so that nothing is lost.
package runcode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// ErrInvalid marks a request the caller must fix (unknown language, empty or
// oversized code, bad timeout). Test with errors.Is.
var ErrInvalid = errors.New("invalid argument")

type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, a ...any) error { return &invalidError{fmt.Sprintf(format, a...)} }

// Language is one run_code language: its name, aliases and engine chain.
type Language struct {
	Name    string
	Aliases []string
	// Runs is true when the code is executed; false when it is rendered.
	Runs bool
	// Chain is tried in order; the next engine is used only when one fails at
	// engine level with no output at all.
	Chain []Engine
	// Missing explains an empty chain (e.g. an engine not in this build).
	Missing string
	// TakesInput: the language's engines give the program Input.Stdin and
	// Input.Args; other languages refuse them.
	TakesInput bool
}

// Options tune a Runner. Zero fields take the defaults in parentheses.
type Options struct {
	MaxStdout      int           // bytes of stdout kept in the result (12 KiB)
	MaxStderr      int           // bytes of stderr kept in the result (4 KiB)
	MaxCode        int           // largest accepted code (4 MiB)
	SpillLimit     int64         // bytes of each stream kept on disk (256 MiB)
	DefaultTimeout time.Duration // when the caller gives none (30 s)
	MaxTimeout     time.Duration // largest accepted timeout (10 min)
	// PrepareTimeout bounds the wait for an engine's one-time preparation
	// (Preparer) before a run's own budget starts; default MaxTimeout,
	// the longest a caller may already ask a run to wait.
	PrepareTimeout time.Duration
	// DefaultCompileTimeout is a build stage's budget when the caller
	// gives none (the package's DefaultCompileTimeout); at most MaxTimeout.
	DefaultCompileTimeout time.Duration
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&r.MaxStdout, 12<<10)
	def(&r.MaxStderr, 4<<10)
	def(&r.MaxCode, 4<<20)
	if r.SpillLimit <= 0 {
		r.SpillLimit = 256 << 20
	}
	if r.DefaultTimeout <= 0 {
		r.DefaultTimeout = 30 * time.Second
	}
	if r.MaxTimeout <= 0 {
		r.MaxTimeout = 10 * time.Minute
	}
	if r.PrepareTimeout <= 0 {
		r.PrepareTimeout = r.MaxTimeout
	}
	if r.DefaultCompileTimeout <= 0 {
		r.DefaultCompileTimeout = min(DefaultCompileTimeout, r.MaxTimeout)
	}
	return r
}

// Runner runs code. It is safe for concurrent use.
type Runner struct {
	opts   Options
	langs  []*Language
	byName map[string]*Language
	probes map[Engine]*probe
	// probeTimeout bounds one Probe (20 s; tests shorten it).
	probeTimeout time.Duration
}

// probe is an engine's Probe, asked on first need: its verdict is kept.
// A probe its bound cut short gave no verdict (an engine still warming
// up on a loaded machine: the embedded Python's Probe waits for its first
// worker, which took over 20 s at a load of 100): nothing is kept, the
// engine is tried (its run prepares what it needs under the run's own
// budget, and a run it cannot do falls to the next engine as any engine
// failure does), and the next need asks again. Kept, that timeout took
// the engine out of every chain until the server restarted: Python ran
// on the next tier, without the packages the session's pip had put in
// the embedded interpreter's site.
type probe struct {
	e       Engine
	timeout *time.Duration
	mu      sync.Mutex
	done    bool
	err     error
	// running is closed when the probe under way ends: a caller meanwhile
	// takes its outcome instead of probing again after it.
	running chan struct{}
}

func (p *probe) get() error {
	p.mu.Lock()
	if p.done {
		defer p.mu.Unlock()
		return p.err
	}
	if ch := p.running; ch != nil {
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.done {
			return p.err
		}
		return nil // that probe gave no verdict: tried
	}
	ch := make(chan struct{})
	p.running = ch
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), *p.timeout)
	err := p.e.Probe(ctx)
	undecided := err != nil && ctx.Err() != nil
	cancel()
	p.mu.Lock()
	if !undecided {
		p.done, p.err = true, err
	}
	p.running = nil
	close(ch)
	p.mu.Unlock()
	if undecided {
		return nil // no verdict within the bound: tried, and asked again next time
	}
	return err
}

// New returns a Runner for langs. Each engine is probed once, on first need.
func New(langs []Language, opts *Options) *Runner {
	r := &Runner{opts: opts.withDefaults(), byName: map[string]*Language{}, probes: map[Engine]*probe{}, probeTimeout: 20 * time.Second}
	for i := range langs {
		l := &langs[i]
		r.langs = append(r.langs, l)
		for _, n := range append([]string{l.Name}, l.Aliases...) {
			if _, dup := r.byName[n]; dup {
				panic("runcode: language name used twice: " + n)
			}
			r.byName[n] = l
		}
		for _, e := range l.Chain {
			if _, ok := r.probes[e]; !ok {
				r.probes[e] = &probe{e: e, timeout: &r.probeTimeout}
			}
		}
	}
	return r
}

// Options returns the runner's effective options.
func (r *Runner) Options() Options { return r.opts }

// Languages lists the language names, in the order given to New.
func (r *Runner) Languages() []string {
	out := make([]string, len(r.langs))
	for i, l := range r.langs {
		out[i] = l.Name
	}
	return out
}

// Aliases returns every accepted name mapped to its language, sorted.
func (r *Runner) Aliases() map[string]string {
	m := make(map[string]string, len(r.byName))
	for n, l := range r.byName {
		m[n] = l.Name
	}
	return m
}

// Resolve maps a language name or alias (any case) to its language.
func (r *Runner) Resolve(lang string) (*Language, error) {
	key := strings.ToLower(strings.TrimSpace(lang))
	if key == "" {
		key = "python"
	}
	l, ok := r.byName[key]
	if !ok {
		return nil, invalidf("unknown language %q; supported: %s", lang, strings.Join(r.Languages(), ", "))
	}
	return l, nil
}

// EngineStatus is one engine's place in a chain and whether it can run.
type EngineStatus struct {
	Lang      string `json:"lang"`
	Tier      int    `json:"tier"`
	Engine    string `json:"engine"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// Engines probes every engine (once) and reports the chains.
func (r *Runner) Engines() []EngineStatus {
	var out []EngineStatus
	for _, l := range r.langs {
		if len(l.Chain) == 0 {
			out = append(out, EngineStatus{Lang: l.Name, Engine: "-", Reason: l.Missing})
		}
		for i, e := range l.Chain {
			st := EngineStatus{Lang: l.Name, Tier: i + 1, Engine: e.Name(), Available: true}
			if err := r.probe(e); err != nil {
				st.Available, st.Reason = false, err.Error()
			}
			out = append(out, st)
		}
	}
	return out
}

// probe is e's availability for status and help: its Probe, and for an
// engine of the session's userland whether the host's has its program.
func (r *Runner) probe(e Engine) error {
	if err := r.probes[e].get(); err != nil {
		return err
	}
	if u, ok := e.(UserlandEngine); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := u.HostProbe(ctx); err != nil {
			return fmt.Errorf("%w (sessions on a rootfs use the rootfs's)", err)
		}
	}
	return nil
}

// Runnable splits the languages into those whose code runs on this
// server's own userland now (an engine that runs code is available) and
// those that are only rendered here, each with why (the first unavailable
// engine's reason); for help.
func (r *Runner) Runnable() (runs []string, shown map[string]string) {
	shown = map[string]string{}
	for _, l := range r.langs {
		if !l.Runs {
			continue
		}
		ok, why := false, l.Missing
		for _, e := range l.Chain {
			if Shows(e) {
				continue
			}
			err := r.probe(e)
			if err == nil {
				ok = true
				break
			}
			if why == "" {
				why = hostpath.Tenant(err)
			}
		}
		if ok {
			runs = append(runs, l.Name)
		} else {
			shown[l.Name] = why
		}
	}
	return runs, shown
}

// Input is one run_code call.
type Input struct {
	Code    string
	Lang    string
	Session *session.Session
	Timeout time.Duration // 0 means the default
	// CompileTimeout is the build stage's budget (compiled languages);
	// 0 means the default.
	CompileTimeout time.Duration
	// Stdin and Args go to the program (languages with TakesInput).
	Stdin string
	Args  []string
	// Context makes it a code-context run (see ContextRun); the code
	// may then be empty, as a notebook cell may.
	Context *ContextRun
}

// Run runs in. The error is ErrInvalid-wrapped for a bad request; every
// other outcome, engine failures included, is in the Result.
func (r *Runner) Run(ctx context.Context, in Input) (*Result, error) {
	lang, err := r.Resolve(in.Lang)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Code) == "" && in.Context == nil {
		return nil, invalidf("code is empty: pass the %s source to run in \"code\"", lang.Name)
	}
	if len(in.Code) > r.opts.MaxCode {
		return nil, invalidf("code is %s; the limit is %s (write large programs to a file in the workspace and run that)",
			HumanBytes(int64(len(in.Code))), HumanBytes(int64(r.opts.MaxCode)))
	}
	timeout := in.Timeout
	switch {
	case timeout < 0:
		return nil, invalidf("timeout must not be negative")
	case timeout == 0:
		timeout = r.opts.DefaultTimeout
	case timeout > r.opts.MaxTimeout:
		return nil, invalidf("timeout %s is above the limit of %s", timeout, r.opts.MaxTimeout)
	}
	compile := in.CompileTimeout
	switch {
	case compile < 0:
		return nil, invalidf("compile timeout must not be negative")
	case compile == 0:
		compile = r.opts.DefaultCompileTimeout
	case compile > r.opts.MaxTimeout:
		return nil, invalidf("compile timeout %s is above the limit of %s", compile, r.opts.MaxTimeout)
	}
	if err := r.checkInput(lang, in); err != nil {
		return nil, err
	}
	if in.Session == nil {
		return nil, invalidf("no session")
	}

	runID := newRunID()
	outDir := in.Session.OutputsDir()
	ws := in.Session.Workspace()
	stdout := NewCapture(r.opts.MaxStdout, filepath.Join(outDir, runID+".stdout"), r.opts.SpillLimit).Within(ws).Observed(ctx, "stdout")
	stderr := NewCapture(r.opts.MaxStderr, filepath.Join(outDir, runID+".stderr"), r.opts.SpillLimit).Within(ws).Observed(ctx, "stderr")

	start := time.Now()
	res := r.runChain(ctx, lang, &Request{
		Code: in.Code, Lang: lang.Name, Session: in.Session, Timeout: timeout, CompileTimeout: compile,
		Stdin: in.Stdin, Args: in.Args,
		Stdout: stdout, Stderr: stderr, Context: in.Context,
	}, stdout, stderr)
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	res.Session = in.Session.ID
	res.Lang = lang.Name
	if res.Artifacts == nil {
		res.Artifacts = []Artifact{}
	}
	res.Stdout, res.StdoutBytes, res.StdoutFile = r.finish(stdout, in.Session, &res.Truncated, &res.Notes, "stdout")
	res.Stderr, res.StderrBytes, res.StderrFile = r.finish(stderr, in.Session, &res.Truncated, &res.Notes, "stderr")
	if res.TimedOut {
		res.Interrupted = true
	}
	homeNamed(ws, res)
	return res, nil
}

// homeNamed names the workspace /home/user (hostpath.Home, where the box
// shows it too) in what the code printed and what the engines said: a
// process that asks its directory (os.getcwd(), pwd) or a traceback of a
// file in the workspace names the host path otherwise.
func homeNamed(ws string, res *Result) {
	res.Stdout = hostpath.HomeText(ws, res.Stdout)
	res.Stderr = hostpath.HomeText(ws, res.Stderr)
	res.Error = hostpath.HomeText(ws, res.Error)
	for i, n := range res.Notes {
		res.Notes[i] = hostpath.HomeText(ws, n)
	}
	if e := res.Exception; e != nil {
		e.Value, e.Traceback = hostpath.HomeText(ws, e.Value), hostpath.HomeText(ws, e.Traceback)
	}
}

func (r *Runner) runChain(ctx context.Context, lang *Language, req *Request, stdout, stderr *Capture) *Result {
	if len(lang.Chain) == 0 {
		msg := "no " + lang.Name + " engine is available"
		if lang.Missing != "" {
			msg += ": " + lang.Missing
		}
		return &Result{Engine: "none", ExitCode: -1, Error: msg}
	}
	var why, runFailed reasons
	for _, e := range lang.Chain {
		if _, ok := e.(ContextEngine); req.Context != nil && !ok {
			why.add(e.Name(), "keeps no code contexts")
			continue
		}
		if err := r.probes[e].get(); err != nil {
			why.add(e.Name(), hostpath.Tenant(err))
			continue
		}
		budget := req.Timeout
		if _, ok := e.(Builder); ok {
			budget += req.CompileTimeout
		}
		if p, ok := e.(Preparer); ok {
			if res, err := r.prepare(ctx, p, req, budget); res != nil {
				return res
			} else if err != nil {
				why.add(e.Name(), hostpath.Tenant(err))
				runFailed.add(e.Name(), hostpath.Tenant(err))
				continue
			}
		}
		// The engine keeps the budget from the code's start (see
		// Request.Timeout): a deadline of the budget here also counted
		// the making of the box or the worker, and a short run_code on a
		// loaded machine ended as "canceled while the sandbox was
		// starting". This one is the backstop of an engine that forgot.
		runCtx, cancel := context.WithTimeout(ctx, budget+sandbox.DefaultStartTimeout)
		res, err := e.Run(runCtx, req)
		cancel()
		if err == nil {
			res.Engine = e.Name()
			if len(runFailed.texts) > 0 {
				// An engine the chain prefers could not run this code
				// here (e.g. no bash in the session's rootfs): say so, as
				// the code may have been written for it.
				verb := "ran with "
				if Shows(e) {
					verb = "not run, shown by "
				}
				res.Notes = append(res.Notes, verb+e.Name()+" because "+runFailed.String())
			}
			return res
		}
		if stdout.Len() > 0 || stderr.Len() > 0 {
			// The engine failed after the code produced output: the model
			// must see it as it is, not a rerun on another engine.
			if res == nil {
				res = &Result{ExitCode: -1}
			}
			res.Engine, res.Error = e.Name(), hostpath.Tenant(err)
			return res
		}
		why.add(e.Name(), hostpath.Tenant(err))
		if !errors.Is(err, ErrStepAside) {
			runFailed.add(e.Name(), hostpath.Tenant(err))
		}
	}
	return &Result{Engine: "none", ExitCode: -1,
		Error: "no " + lang.Name + " engine could run the code (" + why.String() + ")"}
}

// prepare waits for p's one-time preparation under PrepareTimeout (or the
// run's budget, when larger) and ctx. A wait that ended first is the
// run's result: it did not start, and the preparation goes on for the
// next. Any other error is the preparation's failure.
func (r *Runner) prepare(ctx context.Context, p Preparer, req *Request, budget time.Duration) (*Result, error) {
	pctx, cancel := context.WithTimeout(ctx, max(budget, r.opts.PrepareTimeout))
	defer cancel()
	err := p.Prepare(pctx, req)
	if err == nil || pctx.Err() == nil {
		return nil, err
	}
	return &Result{Engine: p.Name(), ExitCode: -1, TimedOut: errors.Is(pctx.Err(), context.DeadlineExceeded),
		Error: hostpath.Tenant(err) + "; this run did not start"}, nil
}

// maxArgs bounds a program's arguments.
const maxArgs = 1024

// checkInput refuses stdin and args for a language that cannot take them
// (they would be lost), and arguments an exec cannot carry.
func (r *Runner) checkInput(lang *Language, in Input) error {
	if in.Stdin == "" && len(in.Args) == 0 {
		return nil
	}
	if !lang.TakesInput {
		return invalidf("stdin and args are for the compiled and toolchain languages (c, cpp, go, rust, java, ruby, perl, …); %s does not take them: pass input through a file in the workspace", lang.Name)
	}
	if len(in.Stdin) > r.opts.MaxCode {
		return invalidf("stdin is %s; the limit is %s (write large input to a file in the workspace and read that)",
			HumanBytes(int64(len(in.Stdin))), HumanBytes(int64(r.opts.MaxCode)))
	}
	if len(in.Args) > maxArgs {
		return invalidf("%d args; the limit is %d", len(in.Args), maxArgs)
	}
	n := 0
	for i, a := range in.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf("args[%d] holds a NUL byte, which a program's argument cannot carry", i)
		}
		n += len(a)
	}
	if n > 100<<10 {
		return invalidf("args are %s in all; the limit is 100 KiB (pass large input through stdin or a file)", HumanBytes(int64(n)))
	}
	return nil
}

// DropContext forgets context id of session in every engine of lang's
// chain that keeps contexts.
func (r *Runner) DropContext(ctx context.Context, lang, session, id string) error {
	l, err := r.Resolve(lang)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range l.Chain {
		if ce, ok := e.(ContextEngine); ok {
			errs = append(errs, ce.DropContext(ctx, session, id))
		}
	}
	return errors.Join(errs...)
}

// finish turns a capture into the result's text, size and file fields.
func (r *Runner) finish(c *Capture, s *session.Session, truncated *bool, notes *[]string, stream string) (string, int64, string) {
	v := c.Finish()
	if v.Cut {
		*truncated = true
	}
	var file string
	if v.File != "" {
		if rel, err := filepath.Rel(s.Workspace(), v.File); err == nil {
			file = rel
		} else {
			file = v.File
		}
		if v.FileBytes < v.Bytes {
			*notes = append(*notes, fmt.Sprintf("%s file keeps the first %s of %s", stream, HumanBytes(v.FileBytes), HumanBytes(v.Bytes)))
		}
	}
	if v.FileError != "" {
		*notes = append(*notes, fmt.Sprintf("full %s could not be saved: %s", stream, v.FileError))
	}
	if v.Escaped {
		*notes = append(*notes, stream+" had bytes that are not UTF-8 (or NUL); they are shown as \\xNN and kept raw in "+file)
	}
	return v.Text, v.Bytes, file
}

func newRunID() string {
	var b [4]byte
	rand.Read(b[:])
	return time.Now().UTC().Format("20060102-150405.000000") + "-" + hex.EncodeToString(b[:])
}

// SortedAliases renders "name [alias, alias]" for each language: for help.
func (r *Runner) SortedAliases() []string {
	var out []string
	for _, l := range r.langs {
		a := append([]string(nil), l.Aliases...)
		sort.Strings(a)
		s := l.Name
		if len(a) > 0 {
			s += " [" + strings.Join(a, ", ") + "]"
		}
		out = append(out, s)
	}
	return out
}

// reasons are why engines of a chain did not run the code, in chain
// order; engines that gave the same reason share one entry ("a, b: why"),
// so that two tiers that check the same thing do not say it twice.
type reasons struct {
	names [][]string
	texts []string
}

func (r *reasons) add(name, why string) {
	for i, t := range r.texts {
		if t == why {
			r.names[i] = append(r.names[i], name)
			return
		}
	}
	r.names = append(r.names, []string{name})
	r.texts = append(r.texts, why)
}

func (r *reasons) String() string {
	parts := make([]string, len(r.texts))
	for i, t := range r.texts {
		parts[i] = strings.Join(r.names[i], ", ") + ": " + t
	}
	return strings.Join(parts, "; ")
}
