//go:build slim

package python

import (
	"context"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// Embedded is the slim build's stand-in for tier 1: it is never available,
// so the Python chain falls through to the next tier.
type Embedded struct{ root string }

// NewEmbedded returns the stand-in; only the worker module's directory
// under the install root is of use (BoxDirs).
func NewEmbedded(dataDir string, sb *sandbox.Sandbox, opts *EmbeddedOptions) *Embedded {
	if opts != nil && opts.InstallRoot != "" {
		dataDir = opts.InstallRoot
	}
	return &Embedded{root: dataDir}
}

// BoxDirs is the worker module's directory once it is complete (the
// rootfs tier's worker), for every session box; there is no interpreter
// tree or pip.
func (e *Embedded) BoxDirs() []string {
	if d, ok := completeWorkerDir(e.root); ok {
		return []string{d}
	}
	return nil
}

// Name implements runcode.Engine.
func (e *Embedded) Name() string { return "python/embedded" }

// Probe implements runcode.Engine: always ErrNotInBuild.
func (e *Embedded) Probe(ctx context.Context) error { return ErrNotInBuild }

// Warm reports ErrNotInBuild.
func (e *Embedded) Warm(ctx context.Context) error { return ErrNotInBuild }

// Run implements runcode.Engine: always ErrNotInBuild.
func (e *Embedded) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	return nil, ErrNotInBuild
}

// Reset has nothing to reset.
func (e *Embedded) Reset(ctx context.Context, sessionID string) error { return nil }

// Stop has nothing to stop.
func (e *Embedded) Stop(sessionID string) {}

// DropContext implements runcode.ContextEngine.
func (e *Embedded) DropContext(ctx context.Context, sessionID, id string) error { return nil }

// Close has nothing to close.
func (e *Embedded) Close() error { return nil }

// Sessions is always 0.
func (e *Embedded) Sessions() int { return 0 }

// Installed reports ErrNotInBuild.
func (e *Embedded) Installed(ctx context.Context) (dir string, extracted bool, err error) {
	return "", false, ErrNotInBuild
}

// Prestart does nothing: there is no embedded interpreter.
func (e *Embedded) Prestart(sess *session.Session) {}

// KeepsSpares is false: there is no embedded interpreter.
func (e *Embedded) KeepsSpares() bool { return false }

// StartSpare reports ErrNotInBuild.
func (e *Embedded) StartSpare(ctx context.Context, sess *session.Session) error { return ErrNotInBuild }

// BindSpare reports ErrNotInBuild.
func (e *Embedded) BindSpare(ctx context.Context, sess *session.Session) error { return ErrNotInBuild }

// Claimed does nothing.
func (e *Embedded) Claimed(id string) {}

// ReleaseIdle reports false: this build keeps no workers.
func (e *Embedded) ReleaseIdle(sessionID string) bool { return false }
