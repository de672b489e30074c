package runcode

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/quro-dev/quro/internal/session"
)

// Engine runs or renders code of one language family.
//
// Run writes the program's output to req.Stdout and req.Stderr and returns a
// Result with the fields only the engine knows (ExitCode, TimedOut,
// Interrupted, Artifacts, Notes, and Error for an engine failure that still
// produced output). The runner fills in the rest. Run returns an error only
// for an engine-level failure; a failing user program is a Result.
type Engine interface {
	// Name identifies the engine in results, e.g. "python/system".
	Name() string
	// Probe reports whether the engine can run here; the error says why not.
	Probe(ctx context.Context) error
	// Run runs req.
	Run(ctx context.Context, req *Request) (*Result, error)
}

// Request is one run handed to an engine.
type Request struct {
	Code    string
	Lang    string
	Session *session.Session
	// Timeout is the run's time budget, counted from the start of the
	// code: the engine keeps it (ProcessSpec puts it on the sandbox.Spec,
	// whose sandbox counts it from the program's exec; a resident worker
	// counts it from when it is handed the code), never counting the
	// making of a box or the start of a worker, which a loaded machine can
	// take seconds over. ctx carries it only as a backstop: the runner's
	// deadline is the budget plus sandbox.DefaultStartTimeout.
	Timeout time.Duration
	// CompileTimeout is the budget of a Builder's build stage, apart from
	// Timeout.
	CompileTimeout time.Duration
	// Stdin and Args are the program's standard input and arguments
	// (languages with TakesInput only).
	Stdin  string
	Args   []string
	Stdout io.Writer
	Stderr io.Writer
	// Context, when not nil, is a code-context run (only a ContextEngine
	// gets one).
	Context *ContextRun
}

// Code contexts (E2B's code interpreter and Quro's code contexts): a run
// may name a context, a state of its own (variables, working directory,
// execution count) kept by the engine, and ask for the notebook form of
// its output (Rich): the last expression's value and display() calls as
// results, an exception as a structured error.

// ContextRun is the part of a Request about code contexts; nil: a plain
// run_code run in the session's default state.
type ContextRun struct {
	// ID names the context: its state is created on first use. Empty:
	// the session's default state (what run_code uses).
	ID string
	// Dir is the context's working directory when the run creates it.
	Dir string
	// Rich asks for results (Result.Results, Result.Exception,
	// Result.ExecutionCount) instead of printed values and tracebacks.
	Rich bool
	// Env is set for this run only and restored after it.
	Env map[string]string
}

// ErrStepAside is an engine stepping aside for what the session chose
// (its rootfs, or none): not a failure of the engine, so the run on the
// engine that answers carries no note about it.
var ErrStepAside = errors.New("the session chose another engine")

// ErrContextRestarted is the cause of a run's cancel when its code
// context is restarted or removed under it: the engine stops the run and
// reports Result.Exception named ContextRestarting (E2B's name).
var ErrContextRestarted = errors.New("the code context was restarted or removed while this code ran; it was interrupted")

// RestartedException is the Exception of a run stopped by
// ErrContextRestarted.
func RestartedException() *Exception {
	return &Exception{Name: "ContextRestarting", Value: ErrContextRestarted.Error(), Traceback: ErrContextRestarted.Error()}
}

// NoteRestarted begins the note of a run whose session's interpreter had
// been released after it idled: the variables of earlier runs are gone.
// Access paths that show no notes (E2B's /execute) write it on stderr, so
// that no client loses state without being told.
const NoteRestarted = "the Python interpreter was restarted"

// DefaultCompileTimeout is a build stage's budget when neither the caller
// nor Options give one (run_code's compile_timeout_ms schema says it too;
// a test in internal/app keeps the two the same).
const DefaultCompileTimeout = time.Minute

// Builder is an engine whose run may first build the code (compile it)
// under the request's CompileTimeout: the runner's backstop for it counts
// Timeout plus CompileTimeout, and the engine keeps each stage to its own.
type Builder interface {
	Engine
	Builds()
}

// Preparer is an engine with one-time work before its first run that is
// not any run's (the embedded Python's extraction and byte-compilation on
// a fresh data directory: seconds, minutes on a loaded machine). The
// runner waits for it before the run's budget starts, under a budget of
// its own (Options.PrepareTimeout) and the caller's context, whose
// progress reporter Prepare tells how it goes: a run's timeout is its
// code's, and a first run with the default 30 s must not fail because
// the preparation took longer.
type Preparer interface {
	Engine
	// Prepare returns nil at once when the engine is prepared, or needs
	// no preparation for req (it will step aside); else it waits for the
	// preparation, or for ctx (an error that says what it waited for).
	// Any other error is the preparation's failure: the engine cannot
	// run, and the chain's next engine is asked.
	Prepare(ctx context.Context, req *Request) error
}

// Shower is an engine that shows the code (a highlighted page, a rendered
// document) instead of running it: help does not count it as running the
// language, and a run it answers after the chain's runners failed says
// "not run, shown by".
type Shower interface {
	Engine
	Shows()
}

// Shows reports whether e only shows code (a Shower).
func Shows(e Engine) bool {
	_, ok := e.(Shower)
	return ok
}

// UserlandEngine is an engine whose program comes from the session's
// userland (the host's or its rootfs's): its Probe passes, as a session
// on a rootfs may have what the host lacks, and HostProbe says whether
// the host's userland has it (for status and help). HostProbe is called
// each time, so a toolchain installed on the host shows at once.
type UserlandEngine interface {
	Engine
	HostProbe(ctx context.Context) error
}

// ContextEngine is an engine that keeps code contexts: the runner hands
// it the runs that name one (or ask for results); other engines of the
// chain are skipped for those.
type ContextEngine interface {
	Engine
	// DropContext forgets the state of context id of session (a later
	// run starts it afresh). Unknown ids are no error.
	DropContext(ctx context.Context, session, id string) error
}
