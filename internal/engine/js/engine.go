// Package js is run_code's JavaScript and TypeScript engine: QuickJS
// (modernc.org/quickjs, pure Go, no cgo) embedded in the server, with
// TypeScript transpiled by esbuild's Go API, a small prelude, and a host API
// that can only touch the session's own workspace.
//
// Every run gets a fresh VM (a new QuickJS runtime and context), so nothing
// leaks between runs or sessions; state that should last is kept in the
// workspace. The VMs are prepared ahead, a few at a time, and each is closed
// after its one run (see pool.go); TypeScript transpiles are cached by a
// hash of the source and the tenant (see cache.go).
//
// A run is bounded by a memory limit (64 MiB by default: exceeding it is an
// "out of memory" error of the code, never a crash of the server), by its
// time budget (the context deadline, enforced by QuickJS's interrupt
// handler, which also stops a regular expression or a Promise chain that
// never ends) and by a limit on JS call depth (a stack overflow is a
// catchable InternalError). A panic inside the engine is recovered and
// reported as an engine failure; that VM is never used again.
//
// What user code sees — console, require, module.exports, timers, Tools,
// Data — is documented in prelude.go.
//
// An Engine is safe for concurrent use: runs share nothing but the compiled
// prelude, the pool of prepared VMs (each used by one run only) and the
// transpile cache (immutable results).
package js

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"modernc.org/quickjs"

	"github.com/quro-dev/quro/internal/runcode"
)

// Options tune an Engine. Zero fields take the defaults in parentheses.
type Options struct {
	// MemoryLimit caps the memory of one run's VM, in bytes (64 MiB).
	MemoryLimit int64
	// MaxRead is the largest file Tools.Files.read or require loads
	// (MemoryLimit).
	MaxRead int64
	// MaxFetch is the largest response body Tools.Net.fetch returns (8 MiB).
	MaxFetch int64
	// Network decides whether the code of session sessionID may fetch u,
	// once the session's network policy (not "none") allows the network at all;
	// a non-nil error refuses, and its text is what the code sees. nil:
	// the session's policy alone decides.
	Network func(sessionID string, u *url.URL) error
	// HTTP is the client fetch uses (a client with no cookies and the
	// default transport, or one that connects through Dial). Its
	// CheckRedirect is replaced so that every redirect is checked by
	// Network too.
	HTTP *http.Client
	// Dial, when set and HTTP is not, connects each of fetch's requests
	// for the code of session sessionID (the server's egress applies the
	// session's policy there). Connections are not kept between requests,
	// so none dialed for one session serves another's.
	Dial func(ctx context.Context, sessionID, network, addr string) (net.Conn, error)
	// Spares is how many prepared VMs the Engine keeps ready (2); each
	// holds about 0.25 MiB. Negative: none, every run makes its VM.
	Spares int
	// TranspileCache caps the memory of cached transpiles, in bytes
	// (16 MiB). Negative: no cache.
	TranspileCache int64
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.MemoryLimit <= 0 {
		r.MemoryLimit = 64 << 20
	}
	if r.MaxRead <= 0 {
		r.MaxRead = r.MemoryLimit
	}
	if r.MaxFetch <= 0 {
		r.MaxFetch = 8 << 20
	}
	if r.HTTP == nil && r.Dial != nil {
		dial := r.Dial
		r.HTTP = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				id, _ := ctx.Value(sessionKey{}).(string)
				return dial(ctx, id, network, addr)
			},
			DisableKeepAlives: true, ForceAttemptHTTP2: true,
			TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: time.Minute,
		}}
	}
	if r.HTTP == nil {
		r.HTTP = &http.Client{}
	}
	if r.Spares == 0 {
		r.Spares = 2
	}
	if r.TranspileCache == 0 {
		r.TranspileCache = 16 << 20
	}
	return r
}

// sessionKey carries the session of a fetch's request to Options.Dial.
type sessionKey struct{}

// Engine runs JavaScript and TypeScript. Use TS for the TypeScript entry of
// run_code's language matrix.
type Engine struct {
	opts     Options
	preludeN int // the prelude's line count
	pool     *pool
	cache    *transpileCache
	ctxs     contexts // kept VMs of code contexts (contexts.go)
}

// New returns an Engine. It compiles nothing: the prelude is compiled by
// the first VM prepared in the process (see compiledPrelude), so a process
// that runs no JavaScript (a CLI command running Python or shell, most
// tests' Apps) does not pay for it.
func New(opts *Options) *Engine {
	e := &Engine{opts: opts.withDefaults()}
	e.preludeN = strings.Count(preludeSource, "\n") + 1
	e.pool = newPool(e.opts.Spares, e.prepare)
	e.cache = newTranspileCache(e.opts.TranspileCache)
	return e
}

// compiledPrelude is the prelude's bytecode at preludeLine, compiled by
// the first VM prepared in the process: every Engine's prepared VMs load
// it (read only, by EvalBytecodeValue), so an App made after the first
// does not pay the compile again. Its bytecode is the same for every
// Engine (the prelude's source is a constant, and no option enters it);
// a failure is a programmer error, which every run then reports.
var compiledPrelude = sync.OnceValues(func() ([]byte, error) {
	vm, err := quickjs.NewVM()
	if err != nil {
		return nil, fmt.Errorf("new VM: %w", err)
	}
	defer vm.Close()
	return vm.Compile(strings.Repeat("\n", preludeLine-1)+preludeSource, quickjs.EvalGlobal)
})

// Close frees the prepared VMs the Engine keeps. Runs still work after it
// (each makes its own VM); Close is for an Engine that is dropped.
func (e *Engine) Close() error {
	e.pool.close()
	e.closeContexts()
	return nil
}

// MemoryLimit is the memory cap of one run, in bytes.
func (e *Engine) MemoryLimit() int64 { return e.opts.MemoryLimit }

// Name implements runcode.Engine.
func (e *Engine) Name() string { return "js/quickjs" }

// Probe implements runcode.Engine: it runs a line of JS in a fresh VM.
func (e *Engine) Probe(ctx context.Context) error {
	vm, err := quickjs.NewVM()
	if err != nil {
		return fmt.Errorf("quickjs: %w", err)
	}
	defer vm.Close()
	v, err := vm.Eval("[1, 2, 3].map(x => x * 2).join()", quickjs.EvalGlobal)
	if err != nil {
		return fmt.Errorf("quickjs: %w", err)
	}
	if v != "2,4,6" {
		return fmt.Errorf("quickjs: unexpected result %v", v)
	}
	return nil
}

// Run implements runcode.Engine. req.Lang "ts" (or "typescript") is
// transpiled first; anything else runs as JavaScript.
func (e *Engine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	ts := req.Lang == "ts" || req.Lang == "typescript"
	return e.run(ctx, req, ts)
}

// TS returns the TypeScript face of e: the same engine, named
// "ts/quickjs+esbuild", that always transpiles.
func (e *Engine) TS() runcode.Engine { return tsEngine{e} }

type tsEngine struct{ e *Engine }

func (t tsEngine) Name() string                    { return "ts/quickjs+esbuild" }
func (t tsEngine) Probe(ctx context.Context) error { return t.e.Probe(ctx) }
func (t tsEngine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	return t.e.run(ctx, req, true)
}

// ErrCrashed marks a panic inside the engine, recovered; the run's VM was
// dropped. Test with errors.Is.
var ErrCrashed = errors.New("the QuickJS engine crashed")

func (e *Engine) run(ctx context.Context, req *runcode.Request, ts bool) (res *runcode.Result, err error) {
	if req.Session == nil {
		return nil, errors.New("js: no session")
	}
	ws, err := e.openWorkspace(req.Session.Workspace(), req.Session.UID)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	// The run's time counts from here (ctx's deadline, the runner's, is
	// a backstop that also counts what came before), or ctx's deadline
	// when it is sooner.
	deadline, ok := ctx.Deadline()
	if req.Timeout > 0 {
		if d := time.Now().Add(req.Timeout); !ok || d.Before(deadline) {
			deadline, ok = d, true
		}
	}
	if !ok {
		return nil, errors.New("js: no time budget: give a deadline or req.Timeout")
	}
	r := &run{eng: e, ctx: ctx, req: req, ws: ws, ts: ts, deadline: deadline, src: newSources()}
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%w: %v (the run's VM was discarded)", ErrCrashed, p)
		}
	}()
	return r.main()
}
