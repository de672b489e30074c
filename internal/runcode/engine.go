package runcode

import (
	"context"
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
	// Timeout is the run's time budget; ctx also carries it as a deadline.
	Timeout time.Duration
	Stdout  io.Writer
	Stderr  io.Writer
}
