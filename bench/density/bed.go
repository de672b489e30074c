package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/session"
)

// bed is one real App served over REST (benchbed) with `quro serve`'s
// defaults: session boxes, a disk image per session, the Python worker
// prestarted at create_session, one spare session per template, an
// in-session socket per box, the supervisor (patrol and auto-pause)
// running.
type bed struct{ *benchbed.Bed }

// raisedLimits names the ceilings the bench lifts so that -n sessions fit
// (unless -shipped-limits): printed in the report.
const raisedLimits = "sessions per tenant, the tenant's sessions, tasks, memory and calls running code at once (a burst of first runs), and the session disks (loop devices) of all tenants: no cap"

// appOptions are quro serve's defaults for an App in dataDir. install,
// when set, is a shared extraction of the embedded interpreter (shown
// read-only in every box, as app.New shows the data directory's own).
func appOptions(install string, shipped bool, disk int64) *app.Options {
	opts := &app.Options{
		PrestartPython: true,
		SpareSessions:  1,
		InSession: &app.InSessionOptions{Handler: func(ctrl *controller.Controller, sessions *session.Manager) http.Handler {
			resolver := &insession.Resolver{Sessions: sessions}
			return rest.New(ctrl, &rest.Options{Logger: slog.New(slog.DiscardHandler), Access: rest.Access{Auth: resolver.Auth}})
		}},
	}
	if install != "" {
		opts.Python = &python.EmbeddedOptions{InstallRoot: install}
	}
	opts.Limits.Tenant.Disk = disk
	if !shipped {
		opts.Limits.SessionsPerTenant = -1
		opts.Limits.SessionDisks = -1
		opts.Limits.Tenant.Sessions = -1
		opts.Limits.Tenant.Tasks = -1
		opts.Limits.Tenant.Memory = -1
		opts.Limits.RunsPerTenant = -1
	}
	return opts
}

// newBed assembles the App in dataDir, warms its Python and serves it;
// the supervisor runs until ctx ends.
func newBed(ctx context.Context, dataDir string, opts *app.Options) (*bed, error) {
	a, err := app.New(ctx, dataDir, opts)
	if err != nil {
		return nil, err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return nil, err
	}
	go a.Supervise(ctx, 15*time.Second) // quro serve's --patrol default
	return &bed{b}, nil
}

// texec runs command in the session's shell; it must exit 0.
func (b *bed) texec(ctx context.Context, body []byte) error {
	var out struct {
		ExitCode int    `json:"exit_code"`
		Output   string `json:"output"`
	}
	if err := b.Post(ctx, "terminal_exec", body, &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("terminal_exec: exit %d, output %q", out.ExitCode, out.Output)
	}
	return nil
}

// spareReady waits until the App has a spare session ready (at most d):
// each level's samples start from the same state.
func (b *bed) spareReady(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for b.App.SpareSessions() == 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // a poll: the pool has no event to wait on
	}
	return true
}

// parallel calls f(i) for i in [0, n) from clients goroutines; the first
// error stops the others from taking more.
func parallel(n, clients int, f func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				mu.Lock()
				stop := firstErr != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("session %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}
