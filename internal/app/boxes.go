package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// Session boxes as the app sees them: every process of a session runs in
// its one box (sandbox.Box); here a session is paused and resumed as a
// whole, auto-paused when idle, and its resources reported.

// DefaultAutoPause is how long a session may sit idle before its box is
// paused (Options.AutoPause).
const DefaultAutoPause = 10 * time.Minute

// sessionBoxes is the sandbox's session boxes as the session.Life sees
// them: pause, resume and their state. A pause first stops the session's
// file helper (boxFiles): a frozen helper would hold the next file call
// until its timeout; a call after the resume starts another.
type sessionBoxes struct {
	sb    *sandbox.Sandbox
	files *boxFiles
}

func (b sessionBoxes) Paused(id string) bool {
	bx := b.sb.Box(id)
	return bx != nil && bx.Paused()
}

func (b sessionBoxes) Pause(id string) (bool, error) {
	bx := b.sb.Box(id)
	if bx == nil {
		return false, nil
	}
	b.files.stop(id)
	return true, bx.Pause()
}

func (b sessionBoxes) AwaitEnded(id string) { b.sb.AwaitEnded(id) }

func (b sessionBoxes) Resume(id string) (bool, error) {
	bx := b.sb.Box(id)
	if bx == nil || !bx.Paused() {
		return false, nil
	}
	return true, bx.Resume()
}

// enders are the releases of what the parts of this App keep per
// session, run by the session.Life when a session ends (destroyed,
// expired, a spare retired, the server closing): the box first — one
// kill of its pid namespace ends every process of the session, and a run
// racing with the destroy cannot make it a new box — then the parts
// that only tidy up. A part that keeps something per session adds its
// release here; the leak test (TestSessionsLeaveNothing) finds one that
// does not.
func (a *App) enders() []session.Ender {
	return []session.Ender{
		{Name: "box", First: true, End: func(s *session.Session) { a.Sandbox.EndSession(s.ID) },
			Reopen: func(s *session.Session) { a.Sandbox.ReopenSession(s.ID) }},
		{Name: "processes", End: func(s *session.Session) { a.procs.EndSession(s.ID) }},
		{Name: "python", End: func(s *session.Session) { a.stopPython(s.ID) }},
		{Name: "node", End: func(s *session.Session) { a.node.Stop(s.ID) }},
		{Name: "box files", End: func(s *session.Session) { a.boxFiles.forget(s.ID) }},
		{Name: "code contexts", End: func(s *session.Session) { a.forgetContexts(s.ID) }},
		{Name: "terminals", End: func(s *session.Session) { a.Terminals.CloseSession(s) },
			Reopen: func(s *session.Session) { a.Terminals.ReopenSession(s) }},
		{Name: "tenant", End: func(s *session.Session) { a.tenants.forget(s.ID) }},
		{Name: "network", End: func(s *session.Session) { a.netPolicies.forget(s.ID); a.egress.events.forget(s.ID) }},
		// Their rows go with the session's (ON DELETE CASCADE).
		{Name: "secrets", End: func(s *session.Session) { a.secrets.forget(s.ID) }},
		{Name: "live events", End: func(s *session.Session) { a.Events.Forget(s.ID) }},
	}
}

// entered is the session the controller entered for the call of ctx
// (its capability is declared InSession).
func entered(ctx context.Context) (*session.Session, error) {
	if s := session.Entered(ctx); s != nil {
		return s, nil
	}
	return nil, capability.Errorf(capability.Internal, "the call entered no session: its capability must be declared InSession")
}

// following marks the call of ctx as one that from now on only follows a
// running process's output: a pause no longer waits for it.
//
// It also frees the call's run slot (controller.RunSlotDone): a process it
// follows counts against the process limits, not the runs in flight.
func (a *App) following(ctx context.Context) {
	a.lives.Following(ctx)
	controller.RunSlotDone(ctx)
}

// PauseResult is pause_session's and resume_session's answer.
type PauseResult struct {
	Session string `json:"session"`
	Paused  bool   `json:"paused"`
	// Took is how long the freeze or thaw took, in milliseconds.
	Took float64 `json:"took_ms"`
	Note string  `json:"note,omitempty"`
}

// Text is the model-facing answer.
func (r *PauseResult) Text() string {
	state := "running"
	if r.Paused {
		state = "paused"
	}
	s := fmt.Sprintf("session %s is %s (%.1f ms)", r.Session, state, r.Took)
	if r.Note != "" {
		s += "\n" + r.Note
	}
	return s
}

const pauseNote = "A paused session keeps its processes, memory, Python variables, shell state and files, and uses no CPU; " +
	"any call that runs something in it resumes it. A paused session does not survive a restart of the server: its processes end, its files stay."

func (a *App) registerBoxes(reg *capability.Registry) {
	reg.Register(capability.New("pause_session",
		"Freeze every process of a session (the whole box: shell, terminal, Python worker, background jobs) keeping their memory and state, so it uses no CPU. "+
			"Resume with resume_session or by running anything in it. Processes, Python variables and shell state survive a pause but not a restart of the server. "+
			"Refused while a call runs code in the session (a run, a command, terminal input); "+
			"calls that only follow a background process's output or watch files stay open, see nothing while it is paused and go on after resume.",
		capability.ScopeExec, func(ctx context.Context, in SessionRef) (*PauseResult, error) {
			s, err := entered(ctx)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			boxed, err := a.lives.Pause(ctx, s)
			switch {
			case errors.Is(err, session.ErrBusy):
				return nil, errBusy(s, a.lives.Busy(s.ID))
			case err != nil && boxed:
				return nil, pauseFailed(s, err)
			case err != nil:
				return nil, err
			case !boxed:
				// Nothing to freeze: the session is marked paused (its
				// state says so, also after a restart) until resumed or used.
				return &PauseResult{Session: s.ID, Paused: true, Note: "nothing runs in the session, so it uses no CPU or memory already; it is marked paused, its files are kept, and any use resumes it"}, nil
			}
			return &PauseResult{Session: s.ID, Paused: true, Took: ms(time.Since(start)), Note: pauseNote}, nil
		}).InSession(capability.UseRead))
	reg.Register(capability.New("resume_session",
		"Resume a paused session: its processes go on where they stopped (Python variables, shell cwd and variables, running jobs intact).",
		capability.ScopeExec, func(ctx context.Context, in SessionRef) (*PauseResult, error) {
			s, err := entered(ctx)
			if err != nil {
				return nil, err
			}
			was := s.Paused
			start := time.Now()
			resumed, err := a.lives.Resume(ctx, s)
			switch {
			case err != nil && resumed:
				return nil, capability.Errorf(capability.Unavailable, "resume: %v", err)
			case err != nil:
				return nil, err
			case resumed:
				return &PauseResult{Session: s.ID, Took: ms(time.Since(start))}, nil
			case was:
				return &PauseResult{Session: s.ID, Note: "resumed (nothing was running in it)"}, nil
			}
			return &PauseResult{Session: s.ID, Note: "the session was not paused"}, nil
		}).InSession(capability.UseRead))
}

// errBusy refuses a pause of s while n calls run code in it.
func errBusy(s *session.Session, n int) error {
	return capability.Errorf(capability.Busy, "session %s has %d call(s) running code in it (a run, a command, terminal input): wait for them or cancel them, then pause; "+
		"streams that only follow a process or watch files do not hold off a pause", s.ID, n)
}

// pauseFailed is the error of a freeze of s's box that failed. One the
// kernel did not finish in time (under load, a process sleeping in the
// kernel holds it up) was undone, so the session runs on and a retry may
// succeed: unavailable, with a Retry-After and a message saying so (E2B's
// SDKs raise a 503 as ServiceBusyError, "please retry").
func pauseFailed(s *session.Session, err error) error {
	if errors.Is(err, sandbox.ErrFreezeStalled) {
		e := capability.Errorf(capability.Unavailable,
			"session %s could not be paused now, retry in a moment: %v. Nothing was paused and the session runs on as before "+
				"(a process sleeping in the kernel, e.g. on heavy disk or network I/O, holds a freeze up until it leaves that sleep)", s.ID, err)
		e.RetryAfter = 1
		return e.WithCause(err)
	}
	return capability.Errorf(capability.Unavailable, "pause: %v", err).WithCause(err)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// autoPause pauses the box of every session unused for a.autoPauseAfter
// with no call running and no terminal viewer attached.
func (a *App) autoPause(ctx context.Context) int {
	if a.autoPauseAfter <= 0 {
		return 0
	}
	paused := 0
	for _, id := range a.Sandbox.BoxKeys() {
		bx := a.Sandbox.Box(id)
		if bx == nil || bx.Paused() || !bx.CanPause() {
			continue
		}
		s, err := a.Sessions.ByIDAnyTenant(ctx, id)
		// A spare session waits for its claim running: its worker is
		// blocked on a read, and a claim must not wait for a thaw.
		if err != nil || s.Tenant == session.SpareTenant || time.Since(s.LastUsedAt) < a.autoPauseAfter || a.Terminals.Watched(s) {
			continue
		}
		// Under the Life's lock: a call that starts now waits, then resumes.
		ok, err := a.lives.PauseIdle(id, func() bool { return !bx.Paused() })
		switch {
		case err != nil:
			a.Log.Warn("auto-pause", "session", id, "err", err)
		case ok:
			paused++
			a.Log.Info("session auto-paused", "session", id, "idle", time.Since(s.LastUsedAt).Round(time.Second))
		}
	}
	return paused
}

// SessionResources is what a session's box uses and may use.
type SessionResources struct {
	Paused          bool    `json:"paused"`
	Processes       int     `json:"processes"` // processes the server started in the box and still tracks
	MemoryBytes     uint64  `json:"memory_bytes"`
	MemoryLimit     uint64  `json:"memory_limit"`
	Tasks           uint64  `json:"tasks"`
	TasksLimit      uint64  `json:"tasks_limit"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	CPUPercentLimit uint64  `json:"cpu_percent_limit"`
	DiskBytes       int64   `json:"disk_bytes"` // 0 too: an empty subvolume of the shared filesystem uses none
	DiskLimit       int64   `json:"disk_limit,omitempty"`
}

// resources reads s's box without waking it; nil when s has no box.
func (a *App) resources(s *session.Session) *SessionResources {
	r := &SessionResources{}
	if u, ok := a.tenants.disks.Usage(s.Dir); ok {
		r.DiskBytes, r.DiskLimit = u.Used, u.Quota
	}
	bx := a.Sandbox.Box(s.ID)
	if bx == nil {
		if r.DiskLimit == 0 {
			return nil
		}
		return r
	}
	u, l := bx.Usage(), bx.Limits()
	r.Paused, r.Processes = bx.Paused(), bx.Procs()
	r.MemoryBytes, r.MemoryLimit = u.MemoryBytes, l.Memory
	r.Tasks, r.TasksLimit = u.Tasks, l.Tasks
	r.CPUSeconds, r.CPUPercentLimit = u.CPUSeconds, l.CPUPercent
	return r
}

// boxGauges feeds /metrics.
func (a *App) boxGauges() metrics.BoxStats {
	var st metrics.BoxStats
	for _, id := range a.Sandbox.BoxKeys() {
		bx := a.Sandbox.Box(id)
		if bx == nil {
			continue
		}
		st.Open++
		if bx.Paused() {
			st.Paused++
		}
		u := bx.Usage()
		st.MemoryBytes += u.MemoryBytes
		st.Tasks += u.Tasks
	}
	st.Outside = a.Sandbox.BoxStats().Outside
	return st
}
