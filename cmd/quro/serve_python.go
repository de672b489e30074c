//go:build !slim

package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/progress"
)

// prepareEmbeddedPython starts the embedded interpreter's one-time
// preparation as `quro serve` starts (extracting it into the data
// directory, once per directory), so that a fresh data directory's first
// Python run finds it done or under way instead of starting it. Runs that
// arrive meanwhile wait for this same preparation and are told its
// progress as before. The log gets two lines: its start and its end, with
// the time it took; the percentages go to the debug level.
func prepareEmbeddedPython(ctx context.Context, emb *python.Embedded, log *slog.Logger) {
	start := time.Now()
	started := false
	serving := ctx
	ctx = progress.With(context.WithoutCancel(ctx), func(msg string) {
		if !started {
			started = true
			log.Info("preparing the embedded Python (first start on this data directory)")
		}
		log.Debug(strings.TrimSpace(msg))
	})
	dir, extracted, err := emb.Installed(ctx)
	switch {
	case err != nil && serving.Err() != nil: // the server is stopping
	case err != nil:
		log.Warn("preparing the embedded Python", "err", err)
	case extracted:
		log.Info("embedded Python prepared", "dir", dir, "seconds", time.Since(start).Seconds())
	default:
		log.Debug("embedded Python ready", "dir", dir)
	}
}
