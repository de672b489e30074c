package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/recent"
	"github.com/quro-dev/quro/internal/session"
)

// Session boxes as the app sees them: every process of a session runs in
// its one box (sandbox.Box); here a session is paused and resumed as a
// whole, auto-paused when idle, and its resources reported.

// DefaultAutoPause is how long a session may sit idle before its box is
// paused (Options.AutoPause).
const DefaultAutoPause = 10 * time.Minute

// inflight tracks the calls running in each session, so that a pause
// never freezes a call that runs code, auto-pause never freezes a session
// in the middle of any call, and destroying a session first ends the
// calls running in it.
//
// A call is busy while it may run something in the box and wait for it
// (a run, a command, terminal input, starting a process): a pause waits
// for it or is refused, because a call frozen with its box would not
// return (its run's timeout and cancel need the box to act) and would
// hold the tenant's run slot until some later use resumes the session.
// A call that only follows a running process's output or watches files
// (connect_process, start_process once its process runs, watch_dir, a
// snapshot's copy) is not busy: it returns whenever its caller leaves,
// frozen box or not, so a pause (manual or at the end of a lifetime) goes
// ahead with it open, as E2B's does; it stays attached, sees nothing
// while the box is frozen and goes on after resume.
type inflight struct {
	mu    sync.Mutex
	n     map[string]int
	busy  map[string]int // calls of n that are busy
	calls map[string]map[*sessionCall]bool
	// gone are sessions being or having been destroyed: a call that
	// looked the session up before the destroy is refused instead of
	// running in it.
	gone recent.Set
	// drained[id] is closed when the last call of a session being
	// destroyed has returned.
	drained map[string]chan struct{}
	// grace, when set (tests), replaces destroyGrace.
	grace time.Duration
}

// sessionCall is one call in flight in a session.
type sessionCall struct {
	cancel context.CancelCauseFunc
	id     string // its session
	busy   bool   // under inflight.mu
}

// callKey holds a call's *sessionCall in the context useSession and
// holdSession return (following finds it there).
type callKey struct{}

// destroyGrace bounds how long a destroy waits for the calls it canceled to
// return before it ends the session's box under them.
const destroyGrace = 10 * time.Second

// errDestroyed is the answer of a call that raced with its session's destroy.
func errDestroyed(s *session.Session) error {
	return capability.Errorf(capability.NotFound, "session %s was destroyed while this call ran: what it started was stopped and its files are gone; create a session (create_session) to go on", s.Name)
}

// useSession marks s used by a call until release: it records the use,
// counts the call in flight, and resumes the session's box if it was
// paused (a paused session wakes on use). The call runs under the context
// it returns, which a destroy of s cancels (its cause: the session was
// destroyed). A session being destroyed refuses new calls.
func (a *App) useSession(ctx context.Context, s *session.Session) (_ context.Context, release func(), err error) {
	ctx, release, err = a.enterSession(ctx, s, true)
	if err != nil {
		return nil, nil, err
	}
	if err := a.Sessions.Touch(ctx, s); err != nil {
		release()
		return nil, nil, err
	}
	if bx := a.Sandbox.Box(s.ID); bx != nil && bx.Paused() {
		if err := bx.Resume(); err != nil {
			release()
			return nil, nil, fmt.Errorf("resume the paused session: %w", err)
		}
		a.Log.Info("session resumed on use", "session", s.ID)
	}
	if s.Paused { // paused with no box, or before a restart: used now
		if err := a.Sessions.SetPaused(ctx, s, false); err != nil {
			release()
			return nil, nil, err
		}
	}
	return ctx, release, nil
}

// holdSession counts a call in flight in s, as useSession does, without
// touching or resuming it (a snapshot reads a paused session as it is): a
// destroy cancels the context it returns and waits for release. The call
// runs nothing in the box, so it does not hold off a pause (not busy).
func (a *App) holdSession(ctx context.Context, s *session.Session) (_ context.Context, release func(), err error) {
	return a.enterSession(ctx, s, false)
}

// following marks the call of ctx (from useSession) as one that from now
// on only follows a running process's output: a pause no longer waits for
// it (see inflight).
func (a *App) following(ctx context.Context) {
	c, _ := ctx.Value(callKey{}).(*sessionCall)
	if c == nil {
		return
	}
	in := &a.inflight
	in.mu.Lock()
	defer in.mu.Unlock()
	if c.busy {
		c.busy = false
		in.unbusy(c.id)
	}
}

// unbusy counts one busy call of session id less; under in.mu.
func (in *inflight) unbusy(id string) {
	if in.busy[id]--; in.busy[id] <= 0 {
		delete(in.busy, id)
	}
}

func (a *App) enterSession(ctx context.Context, s *session.Session, busy bool) (_ context.Context, release func(), err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &sessionCall{cancel: cancel, id: s.ID, busy: busy}
	ctx = context.WithValue(ctx, callKey{}, c)
	in := &a.inflight
	in.mu.Lock()
	if in.gone.Has(s.ID) {
		in.mu.Unlock()
		cancel(nil)
		return nil, nil, capability.Errorf(capability.NotFound, "session %s was destroyed", s.Name)
	}
	in.n[s.ID]++
	if busy {
		if in.busy == nil {
			in.busy = map[string]int{}
		}
		in.busy[s.ID]++
	}
	if in.calls == nil {
		in.calls = map[string]map[*sessionCall]bool{}
	}
	if in.calls[s.ID] == nil {
		in.calls[s.ID] = map[*sessionCall]bool{}
	}
	in.calls[s.ID][c] = true
	in.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			in.mu.Lock()
			if c.busy {
				c.busy = false
				in.unbusy(s.ID)
			}
			delete(in.calls[s.ID], c)
			if len(in.calls[s.ID]) == 0 {
				delete(in.calls, s.ID)
			}
			if in.n[s.ID]--; in.n[s.ID] <= 0 {
				delete(in.n, s.ID)
				if d := in.drained[s.ID]; d != nil {
					close(d)
					delete(in.drained, s.ID)
				}
			}
			in.mu.Unlock()
			cancel(nil)
		})
	}
	return ctx, release, nil
}

// endCalls ends the calls in flight in session s before it is destroyed:
// from now on new calls are refused, those running are canceled (their
// cause: errDestroyed), and it waits — at most grace — until they have
// returned. It reports how many were still running after the grace.
func (a *App) endCalls(s *session.Session, grace time.Duration) int {
	in := &a.inflight
	in.mu.Lock()
	in.gone.Add(s.ID)
	var drained chan struct{}
	if in.n[s.ID] > 0 {
		if in.drained == nil {
			in.drained = map[string]chan struct{}{}
		}
		if drained = in.drained[s.ID]; drained == nil {
			drained = make(chan struct{})
			in.drained[s.ID] = drained
		}
	}
	for c := range in.calls[s.ID] {
		c.cancel(errDestroyed(s))
	}
	in.mu.Unlock()
	if drained == nil {
		return 0
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-drained:
		return 0
	case <-t.C:
		return a.callsIn(s.ID)
	}
}

// destroying reports whether session id is being (or was) destroyed: its
// calls are ended, new ones refused.
func (a *App) destroying(id string) bool {
	a.inflight.mu.Lock()
	defer a.inflight.mu.Unlock()
	return a.inflight.gone.Has(id)
}

// busyIn is how many busy calls (see inflight) run in session id.
func (a *App) busyIn(id string) int {
	a.inflight.mu.Lock()
	defer a.inflight.mu.Unlock()
	return a.inflight.busy[id]
}

func (a *App) callsIn(id string) int {
	a.inflight.mu.Lock()
	defer a.inflight.mu.Unlock()
	return a.inflight.n[id]
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
			s, err := a.Sessions.Get(ctx, in.Session)
			if err != nil {
				return nil, err
			}
			bx := a.Sandbox.Box(s.ID)
			if bx == nil {
				if n := a.busyIn(s.ID); n > 0 {
					return nil, errBusy(s, n)
				}
				// Nothing to freeze: the session is marked paused (its
				// state says so, also after a restart) until resumed or used.
				if err := a.Sessions.SetPaused(ctx, s, true); err != nil {
					return nil, err
				}
				return &PauseResult{Session: s.ID, Paused: true, Note: "nothing runs in the session, so it uses no CPU or memory already; it is marked paused, its files are kept, and any use resumes it"}, nil
			}
			start := time.Now()
			// Under the lock: a call that starts now waits, then resumes.
			a.inflight.mu.Lock()
			if n := a.inflight.busy[s.ID]; n > 0 {
				a.inflight.mu.Unlock()
				return nil, errBusy(s, n)
			}
			err = bx.Pause()
			a.inflight.mu.Unlock()
			if err != nil {
				return nil, capability.Errorf(capability.Unavailable, "pause: %v", err)
			}
			if err := a.Sessions.SetPaused(ctx, s, true); err != nil {
				return nil, err
			}
			return &PauseResult{Session: s.ID, Paused: true, Took: ms(time.Since(start)), Note: pauseNote}, nil
		}))
	reg.Register(capability.New("resume_session",
		"Resume a paused session: its processes go on where they stopped (Python variables, shell cwd and variables, running jobs intact).",
		capability.ScopeExec, func(ctx context.Context, in SessionRef) (*PauseResult, error) {
			s, err := a.Sessions.Get(ctx, in.Session)
			if err != nil {
				return nil, err
			}
			bx := a.Sandbox.Box(s.ID)
			if bx == nil || !bx.Paused() {
				was := s.Paused
				if err := a.Sessions.SetPaused(ctx, s, false); err != nil {
					return nil, err
				}
				if was {
					return &PauseResult{Session: s.ID, Note: "resumed (nothing was running in it)"}, nil
				}
				return &PauseResult{Session: s.ID, Note: "the session was not paused"}, nil
			}
			start := time.Now()
			if err := bx.Resume(); err != nil {
				return nil, capability.Errorf(capability.Unavailable, "resume: %v", err)
			}
			if err := a.Sessions.SetPaused(ctx, s, false); err != nil {
				return nil, err
			}
			return &PauseResult{Session: s.ID, Took: ms(time.Since(start))}, nil
		}))
}

// errBusy refuses a pause of s while n calls run code in it.
func errBusy(s *session.Session, n int) error {
	return capability.Errorf(capability.Busy, "session %s has %d call(s) running code in it (a run, a command, terminal input): wait for them or cancel them, then pause; "+
		"streams that only follow a process or watch files do not hold off a pause", s.ID, n)
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
		a.inflight.mu.Lock()
		if a.inflight.n[id] == 0 {
			// Under the lock: a call that starts now waits, then resumes.
			if err := bx.Pause(); err == nil {
				paused++
				a.Log.Info("session auto-paused", "session", id, "idle", time.Since(s.LastUsedAt).Round(time.Second))
			} else {
				a.Log.Warn("auto-pause", "session", id, "err", err)
			}
		}
		a.inflight.mu.Unlock()
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
	DiskBytes       int64   `json:"disk_bytes,omitempty"`
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
