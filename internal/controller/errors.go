package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"

	"github.com/quro-dev/quro/internal/boxfs"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/project"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
	"github.com/quro-dev/quro/internal/workspace"
)

// class gives the errors it matches a code. The client reads the error's
// own text (which names the path, session or value) followed by hint.
type class struct {
	match func(error) bool
	code  capability.Code
	hint  string // appended after ": "
	text  string // replaces the error's text when set
	retry int    // RetryAfter seconds, for ResourceExhausted
}

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func as[T error]() func(error) bool {
	return func(err error) bool {
		var t T
		return errors.As(err, &t)
	}
}

// classes is the one table from the errors of the domain packages to
// codes, first match wins. Handlers return the domain error (wrapped with
// context by fmt.Errorf %w where useful) and never classify it themselves;
// capability.Errorf is for the checks a handler makes itself. An error
// matching no class is Internal: its text stays in the server log.
var classes = []class{
	// Sessions.
	{match: is(session.ErrNotFound), code: capability.NotFound},
	{match: is(session.ErrExists), code: capability.AlreadyExists},
	{match: is(session.ErrBadName), code: capability.InvalidArgument},
	{match: is(session.ErrBadMetadata), code: capability.InvalidArgument},
	{match: is(session.ErrBadLifetime), code: capability.InvalidArgument},
	{match: is(session.ErrLimit), code: capability.ResourceExhausted, retry: 60},
	{match: is(session.ErrConfined), code: capability.PermissionDenied},
	{match: is(sandbox.ErrSessionEnded), code: capability.NotFound},
	{match: is(sandbox.ErrPaused), code: capability.Busy, hint: "resume_session resumes it"},
	// A box refused at start because its tenant is at a ceiling
	// (terminal_exec, python_run…: run_code says so itself).
	{match: is(sandbox.ErrTenantCeiling), code: capability.ResourceExhausted, retry: 30},
	// A run or new session of a tenant whose stored ceilings cannot be
	// read: refused (fail closed); the text names the problem and the fix.
	{match: is(sandbox.ErrTenantUnreadable), code: capability.Unavailable},
	// The session's disk.
	{match: is(workspace.ErrNoSpace), code: capability.ResourceExhausted},
	{match: is(quota.ErrNotGrown), code: capability.Busy},
	// A new session's disk found no loop device (other processes of the
	// host took the free ones, or the kernel's are used up): nothing of
	// the session was made.
	{match: is(quota.ErrNoLoop), code: capability.Unavailable, retry: 5, hint: "nothing was made: try again"},
	// A cap on watches or watched directories (a tenant's, the
	// server's), or the host's inotify limits.
	{match: is(workspace.ErrWatchLimit), code: capability.ResourceExhausted, retry: 30},

	// Runs.
	{match: is(runcode.ErrInvalid), code: capability.InvalidArgument},
	// A JavaScript code context's VM past a cap (session, tenant, server).
	{match: is(js.ErrContextLimit), code: capability.ResourceExhausted, retry: 30},

	// The session box's file helper failed to answer (it died or was
	// killed, the box paused or ended under it): its text says so.
	{match: is(boxfs.ErrHelper), code: capability.Unavailable, retry: 1},

	// Files in the workspace, and projects.
	{match: is(workspace.ErrOutside), code: capability.PermissionDenied},
	{match: is(workspace.ErrPermission), code: capability.PermissionDenied},
	{match: is(workspace.ErrNotFound), code: capability.NotFound},
	{match: is(workspace.ErrExists), code: capability.AlreadyExists},
	{match: is(project.ErrNotEmpty), code: capability.AlreadyExists},
	{match: is(workspace.ErrIsDir), code: capability.InvalidArgument},
	{match: is(workspace.ErrNotDir), code: capability.InvalidArgument},
	{match: is(workspace.ErrTooLarge), code: capability.InvalidArgument},
	{match: is(workspace.ErrInvalid), code: capability.InvalidArgument},
	{match: is(project.ErrBadName), code: capability.InvalidArgument},
	{match: is(project.ErrUnknownTemplate), code: capability.InvalidArgument},

	// The session shell and terminal.
	// A busy shell's errors say themselves what runs and what to do
	// (terminal/queue.go); no hint may advise stopping another call's
	// command.
	{match: is(terminal.ErrBusy), code: capability.Busy},
	{match: is(terminal.ErrHeld), code: capability.Busy},
	{match: is(terminal.ErrInvalid), code: capability.InvalidArgument},
	{match: is(terminal.ErrNotRunning), code: capability.InvalidArgument},
	{match: is(terminal.ErrNoBash), code: capability.Unavailable},
	{match: is(terminal.ErrStart), code: capability.Unavailable},
	{match: is(terminal.ErrClosed), code: capability.Unavailable, hint: "its session was destroyed, or the server is stopping"},

	// Background processes (start_process and the calls on them).
	{match: is(proc.ErrNotFound), code: capability.NotFound},
	{match: is(proc.ErrTooMany), code: capability.ResourceExhausted, retry: 5},
	{match: is(proc.ErrInvalid), code: capability.InvalidArgument},
	// The program named is not in the box: the caller's to fix, not an
	// outage (the sandbox's own start failures below are Unavailable).
	{match: is(proc.ErrNoProgram), code: capability.InvalidArgument},
	{match: is(proc.ErrLagged), code: capability.ResourceExhausted},
	{match: is(proc.ErrClosed), code: capability.Unavailable, hint: "its session was destroyed, or the server is stopping"},

	// Rootfs names, packages and changes. A wait for another change of
	// the rootfs that ran out of the call's time (or was canceled) comes
	// before ErrBusy, which it wraps.
	{match: is(rootfs.ErrBadName), code: capability.InvalidArgument},
	{match: is(rootfs.ErrBadPackage), code: capability.InvalidArgument},
	{match: is(rootfs.ErrRefused), code: capability.InvalidArgument},
	{match: is(rootfs.ErrBadOption), code: capability.InvalidArgument},
	{match: is(rootfs.ErrNotInstalled), code: capability.NotFound},
	{match: waitError(true), code: capability.Canceled},
	{match: waitError(false), code: capability.DeadlineExceeded, hint: "nothing was changed: try again"},
	{match: is(rootfs.ErrBusy), code: capability.Busy, hint: "try again when it is done"},
	{match: is(rootfs.ErrUnsettled), code: capability.Unavailable},
	{match: is(rootfs.ErrUnreadable), code: capability.Unavailable, hint: "repair_rootfs, or the operator, can settle it"},
	{match: is(rootfs.ErrInstallFailed), code: capability.Unavailable},

	// A build without the embedded CPython (-tags slim) reached by a call
	// that needs it (install_packages {manager: pip}: pip comes with it);
	// run_code's chain falls through to the next tier instead.
	{match: is(python.ErrNotInBuild), code: capability.Unavailable,
		text: "this build of quro has no embedded Python (built with -tags slim), nor the pip that comes with it: " +
			"use a build without -tags slim, or, in a session on a rootfs, install_packages python3-pip and run its pip in the session's shell"},

	// The call itself.
	{match: is(context.Canceled), code: capability.Canceled, text: "the call was canceled"},
	{match: is(context.DeadlineExceeded), code: capability.DeadlineExceeded, text: "the call ran out of time (where it takes timeout_ms, a larger one gives it longer)"},

	// The sandbox could not start a program (not found, an isolation
	// layer missing on this machine): its text says what and why.
	{match: as[*sandbox.StartError](), code: capability.Unavailable},
	{match: is(sandbox.ErrLayerMissing), code: capability.Unavailable},
}

// waitError matches a *rootfs.WaitError that was (or was not) canceled.
func waitError(canceled bool) func(error) bool {
	return func(err error) bool {
		var we *rootfs.WaitError
		return errors.As(err, &we) && we.Canceled == canceled
	}
}

// lookup is the *capability.Error of err by the table, or nil when no
// class matches.
func lookup(err error) *capability.Error {
	var ce *capability.Error
	if errors.As(err, &ce) {
		return ce
	}
	for _, c := range classes {
		if !c.match(err) {
			continue
		}
		// What the tenant reads: an error marked as naming the host's
		// paths (hostpath.Error) has them cut here, at the edge, and
		// whole in the server's log.
		msg := hostpath.Tenant(err)
		switch {
		case c.text != "":
			msg = c.text
		case c.hint != "":
			msg += ": " + c.hint
		}
		// The cause stays reachable in this process (errors.Is, e.g.
		// workspace.ErrNoSpace for E2B's 507); its text is the message.
		e := capability.Errorf(c.code, "%s", msg).WithCause(err)
		e.RetryAfter = c.retry
		return e
	}
	return nil
}

// Classify maps an error from any layer to a *capability.Error by the one
// table (classes). An error the table does not know is an Internal one: it
// is logged with a short random id on slog's default logger (the
// controller's own calls log on its Logger, with the capability, tenant and
// access path), and the client reads only that id, never the error's text,
// which may name server paths or internals.
func Classify(err error) *capability.Error {
	return classify(context.Background(), slog.Default(), err)
}

func classify(ctx context.Context, log *slog.Logger, err error, attrs ...slog.Attr) *capability.Error {
	if e := lookup(err); e != nil {
		return e
	}
	if cerr := ctx.Err(); cerr != nil {
		// The call's context ended and what failed under it is not in
		// the table (a store query it interrupted: SQLite's
		// "interrupted"): the caller canceled the call or its time ran
		// out, not the server. At load a client's short deadline read as
		// an internal error.
		return lookup(cerr)
	}
	id := newID()
	log.LogAttrs(ctx, slog.LevelError, "internal error", append(attrs, slog.String("id", id), slog.String("err", err.Error()))...)
	return capability.Errorf(capability.Internal, "internal error (id %s): the server failed, not the call; try again, and if it goes on, give the operator this id (the server log has the details)", id)
}

// newID is a short random id naming one internal error in the log.
func newID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NoSpace reports whether a failed call failed on a full disk (the
// session's quota or the filesystem): an access path that answers that
// case apart (E2B's 507) asks here rather than reading the domain's
// errors itself.
func NoSpace(err error) bool { return errors.Is(err, workspace.ErrNoSpace) }
