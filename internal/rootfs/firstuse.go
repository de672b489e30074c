package rootfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
)

// OnFirstUse installs missing rootfses for callers that can wait only so
// long (python_run): one install per name at a time, detached from the
// call that started it, so that it outlives a call whose time is up and
// later calls join it. A failed install is reported to the call that
// waits for it, or else to the next call that looks, and then tried again.
// What a call reads (a failure, the last step) names no host path
// (hostpath.Names: debootstrap's lines name the data directory); Log
// gets a failure's whole text.
type OnFirstUse struct {
	M   *Manager
	Log *slog.Logger // nil: slog.Default()

	mu sync.Mutex
	// jobs are the installs by name; a finished one stays until the next
	// call looks at it.
	jobs map[string]*installJob
}

type installJob struct {
	start time.Time
	done  chan struct{}
	err   error // set before done is closed
	mu    sync.Mutex
	last  string // the last progress line
}

func (j *installJob) lastLine() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.last
}

// PendingError reports that the install of a rootfs was still running
// when the caller's deadline came; it goes on.
type PendingError struct {
	Name    string
	Started time.Time // when the install began
	Last    string    // its last progress line, "" when none yet; no host path in it
}

func (e *PendingError) Error() string {
	return fmt.Sprintf("rootfs %q is still being installed (started %s ago)", e.Name, time.Since(e.Started).Round(time.Second))
}

// Wait installs the rootfs name unless it is ready (with default
// InstallOptions), or joins the install already running, and waits for it
// until deadline. The error is a *PendingError when the deadline comes
// first, ctx.Err() when ctx ends first (the install goes on in both
// cases), or the install's own (Manager.Install's: ErrBusy when another
// process is installing it, the installer's failure).
func (f *OnFirstUse) Wait(ctx context.Context, name string, deadline time.Time) error {
	f.mu.Lock()
	if f.jobs == nil {
		f.jobs = map[string]*installJob{}
	}
	job := f.jobs[name]
	if job != nil {
		select {
		case <-job.done:
			// A finished attempt: a failure is reported once, then retried.
			delete(f.jobs, name)
			if job.err != nil {
				f.mu.Unlock()
				return tenantError{job.err}
			}
			job = nil
		default:
		}
	}
	if job == nil && !f.M.Ready(name) {
		job = &installJob{start: time.Now(), done: make(chan struct{})}
		f.jobs[name] = job
		log := f.Log
		if log == nil {
			log = slog.Default()
		}
		log.Info("installing rootfs on first use", "rootfs", name)
		go func() {
			// Detached from the call: the install outlives a call whose
			// deadline is sooner, and later calls join it.
			_, err := f.M.Install(context.Background(), name, InstallOptions{}, func(line string) {
				job.mu.Lock()
				job.last = line
				job.mu.Unlock()
			})
			if err != nil && !errors.Is(err, ErrBusy) {
				err = fmt.Errorf("%w: %w", ErrInstallFailed, err)
			}
			// Logged whole before any call reads it without its paths.
			if err != nil {
				log.Warn("rootfs install on first use failed", "rootfs", name, "err", err)
			}
			job.err = err
			close(job.done)
		}()
	}
	f.mu.Unlock()
	if job == nil {
		return nil // became ready meanwhile
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-job.done:
		f.mu.Lock()
		if f.jobs[name] == job {
			delete(f.jobs, name)
		}
		f.mu.Unlock()
		if job.err != nil {
			return tenantError{job.err}
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return &PendingError{Name: name, Started: job.start, Last: hostpath.Names(job.lastLine())}
	}
}

// tenantError is an install's failure as a caller reads it: its host
// paths cut to their last element; errors.Is and As see the failure.
type tenantError struct{ err error }

func (e tenantError) Error() string { return hostpath.Names(e.err.Error()) }
func (e tenantError) Unwrap() error { return e.err }
