package python

import (
	"errors"
	"log/slog"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
)

// DefaultIdleTimeout is how long a session's Python worker is kept
// without runs before it is released (EmbeddedOptions.IdleTimeout, quro
// serve --python-idle): an idle worker holds about 7 MiB, which a pause
// cannot give back on a machine without swap (docs/RATIONALE.md).
const DefaultIdleTimeout = 15 * time.Minute

// DefaultUnusedTimeout is how long a worker that has run nothing is kept
// (EmbeddedOptions.UnusedTimeout), as long as a box keeps an unused
// spawner.
const DefaultUnusedTimeout = 30 * time.Second

// EmbeddedOptions tune the embedded-CPython engine. Zero fields take the
// defaults in parentheses; a nil *EmbeddedOptions means all defaults.
type EmbeddedOptions struct {
	// IdleTimeout releases a session's worker after this long without
	// runs (DefaultIdleTimeout), to give its memory back; the next run
	// starts a fresh one and says the state was lost. A paused session
	// keeps its worker.
	IdleTimeout time.Duration
	// UnusedTimeout releases a worker that has run nothing (a prestarted
	// worker, a claimed spare's) after this long (DefaultUnusedTimeout, at
	// most IdleTimeout): it was started so that a first run right after
	// create_session finds it, and a session that has run nothing keeps no
	// interpreter once that moment has passed. Nothing is lost, so the next
	// run says nothing.
	UnusedTimeout time.Duration
	// InterruptGrace is how long code may take to stop after the
	// KeyboardInterrupt of a timeout before the worker is killed (2 s).
	InterruptGrace time.Duration
	// NoSpare turns off the pre-warmed spare worker that spares a new
	// session's first run the interpreter's start-up. It is always off
	// when the sandbox boxes its runs (sandbox.Sandbox.Boxed).
	NoSpare bool
	// Limits for worker processes. Default: the sandbox's limits without
	// the CPU-time limit, which for a resident process would count its whole
	// life rather than one run (runs are bounded by their timeouts).
	Limits *sandbox.Limits
	// DrainGrace bounds how long output is read after a worker died while a
	// process it started still holds the pipes (1 s).
	DrainGrace time.Duration
	// InstallRoot is the directory whose python/ subdirectory holds the
	// extracted interpreter (the data directory). Several data directories
	// may share one installation, as the tests do.
	InstallRoot string
	// Progress, if set, is told how the first extraction of the
	// interpreter goes (bytes written of the total).
	Progress func(done, total int64)
	// Status, if set, is told how the one-time preparation of the
	// interpreter goes, as lines such as "preparing the embedded Python
	// (first run on this data directory): compiling the standard library
	// 40%" (about one a percent), whichever call started it. A call's own
	// progress reporter (progress.With) gets the same lines while it waits.
	Status func(msg string)
	// Logger has what went wrong in the background whole, host paths
	// included: a failed preparation (a run's result shows it with its
	// host paths cut), pip's compiling, the removal of other builds'
	// directories (nil: slog.Default()).
	Logger *slog.Logger
}

func (o *EmbeddedOptions) withDefaults(sb *sandbox.Sandbox) EmbeddedOptions {
	var r EmbeddedOptions
	if o != nil {
		r = *o
	}
	if sb.Boxed() {
		// A boxed worker sees only the directories it started with: a
		// spare started in its own directory cannot be bound to a
		// session's workspace later. Each session's worker starts in its
		// box on its first run.
		r.NoSpare = true
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if r.IdleTimeout <= 0 {
		r.IdleTimeout = DefaultIdleTimeout
	}
	if r.UnusedTimeout <= 0 {
		r.UnusedTimeout = DefaultUnusedTimeout
	}
	if r.InterruptGrace <= 0 {
		r.InterruptGrace = 2 * time.Second
	}
	if r.DrainGrace <= 0 {
		r.DrainGrace = time.Second
	}
	if r.Limits == nil {
		l := sb.Limits()
		l.CPUSeconds = 0
		r.Limits = &l
	} else {
		l := *r.Limits
		r.Limits = &l
	}
	return r
}

// ErrNotInBuild is the error of a binary built with -tags slim, without the
// embedded interpreter.
var ErrNotInBuild = errors.New("the embedded CPython is not in this build (built with -tags slim); the chain uses the next tier")
