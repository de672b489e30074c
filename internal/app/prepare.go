package app

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/progress"
)

// PreparePython runs the embedded interpreter's one-time preparation
// (extracting it into the data directory, once per directory) so that a
// fresh data directory's first Python run finds it done or under way
// instead of starting it; `quro serve` calls it in the background as it
// starts. Runs that arrive meanwhile wait for this same preparation and are
// told its progress as before. The log gets two lines: its start and its
// end, with the time it took; the percentages go to the debug level. A
// build without the interpreter (-tags slim) does nothing.
func (a *App) PreparePython(ctx context.Context) {
	start := time.Now()
	started := false
	serving := ctx // canceled when the server stops: the extraction stops too, leaving nothing half-made
	ctx = progress.With(ctx, func(msg string) {
		if !started {
			started = true
			a.Log.Info("preparing the embedded Python (first start on this data directory)")
		}
		a.Log.Debug(strings.TrimSpace(msg))
	})
	dir, extracted, err := a.Python.Installed(ctx)
	switch {
	case errors.Is(err, python.ErrNotInBuild):
	case err != nil && serving.Err() != nil: // the server is stopping
	case err != nil:
		a.Log.Warn("preparing the embedded Python", "err", err)
	case extracted:
		a.Log.Info("embedded Python prepared", "dir", dir, "seconds", time.Since(start).Seconds())
	default:
		a.Log.Debug("embedded Python ready", "dir", dir)
	}
}
