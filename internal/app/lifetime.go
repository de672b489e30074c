package app

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/session"
)

// Session lifetimes (create_session's timeout_s, set_session_timeout):
// the server ends a session whose lifetime is up — destroys it, or
// pauses its box when it asked for that — within milliseconds of its
// expires_at, by a timer set to the soonest end in the store. Changes made
// through this App reset the timer at once (lifetimeChanged); those made
// by another quro process on the same data directory are seen within
// lifetimeRecheck. The patrol runs in the server (Supervise: quro serve,
// quro mcp), which holds the sessions' boxes, never in a one-shot CLI
// command: a destroy there would leave the server's box of the session
// running. Its first look is at start, so the sessions whose lifetime
// ended while no server ran are ended then.

// lifetimeRecheck bounds how long a lifetime set by another process on
// the same data directory may go unseen.
const lifetimeRecheck = time.Second

// pauseRetry is how soon a session due to pause is looked at again while
// calls run in it (a box is never frozen under a running call).
const pauseRetry = 100 * time.Millisecond

// lifetimes is the patrol's state; wake is made with the App, so that
// lifetimeChanged needs no lock.
type lifetimes struct {
	wake chan struct{} // a lifetime was set: look again now

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// startLifetimes starts the patrol once (Supervise); Close stops it.
func (a *App) startLifetimes() {
	l := &a.life
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.started, l.cancel, l.done = true, cancel, make(chan struct{})
	go a.lifetimePatrol(ctx, l.done)
}

// stopLifetimes stops the patrol and waits for it; none starts after.
func (a *App) stopLifetimes() {
	l := &a.life
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// lifetimeChanged tells the patrol that a lifetime now ends at end (a
// removed one, zero, needs no look).
func (a *App) lifetimeChanged(end time.Time) {
	if end.IsZero() {
		return
	}
	select {
	case a.life.wake <- struct{}{}:
	default: // a look is due already
	}
}

func (a *App) lifetimePatrol(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.life.wake:
		}
		pending := a.endExpired(ctx)
		wait := lifetimeRecheck
		if next, err := a.Sessions.NextExpiry(ctx); err != nil {
			if ctx.Err() == nil {
				a.Log.Warn("session lifetimes", "err", err)
			}
		} else if !next.IsZero() {
			wait = min(wait, max(time.Until(next), time.Millisecond))
		}
		if pending {
			wait = max(wait, pauseRetry)
		}
		t.Reset(wait)
	}
}

// endExpired ends the sessions whose lifetime is up. pending: one of them
// is to be paused but calls run in it; it is left for the next look.
func (a *App) endExpired(ctx context.Context) (pending bool) {
	now := time.Now()
	due, err := a.Sessions.Expired(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			a.Log.Warn("session lifetimes", "err", err)
		}
		return false
	}
	for _, s := range due {
		if ctx.Err() != nil {
			return false
		}
		if s.Tenant == session.SpareTenant {
			continue // spares get no lifetime; never end one by mistake
		}
		if s.OnExpiry == session.ExpiryPause {
			if !a.pauseExpired(ctx, s) {
				pending = true
			}
			continue
		}
		if err := a.destroySession(ctx, s); err != nil && !errors.Is(err, session.ErrNotFound) {
			a.Log.Warn("destroying a session whose lifetime ended", "session", s.ID, "err", err)
			continue
		}
		a.Log.Info("session destroyed: its lifetime ended", "session", s.ID, "tenant", s.Tenant, "late", time.Since(s.ExpiresAt).Round(time.Millisecond))
	}
	return pending
}

// pauseExpired pauses the box of s, whose lifetime ended with on_timeout
// pause, and removes the lifetime (a paused session waits, as on E2B,
// until it is resumed or destroyed). false: calls run in s, try later.
func (a *App) pauseExpired(ctx context.Context, s *session.Session) bool {
	if bx := a.Sandbox.Box(s.ID); bx != nil && !bx.Paused() {
		if !bx.CanPause() {
			a.Log.Warn("a session's lifetime ended with pause, but its box cannot be frozen here: it keeps running", "session", s.ID)
		} else {
			a.inflight.mu.Lock()
			if a.inflight.n[s.ID] > 0 {
				a.inflight.mu.Unlock()
				return false
			}
			// Under the lock: a call that starts now waits, then resumes.
			err := bx.Pause()
			a.inflight.mu.Unlock()
			if err != nil {
				a.Log.Warn("pausing a session whose lifetime ended", "session", s.ID, "err", err)
			}
		}
	}
	// A session without a box is marked paused all the same: nothing runs
	// in it until it is resumed or used.
	if err := a.Sessions.SetPaused(ctx, s, true); err != nil && !errors.Is(err, session.ErrNotFound) {
		a.Log.Warn("session lifetimes", "session", s.ID, "err", err)
	}
	if err := a.Sessions.SetLifetime(ctx, s, time.Time{}, ""); err != nil && !errors.Is(err, session.ErrNotFound) {
		a.Log.Warn("session lifetimes", "session", s.ID, "err", err)
	}
	a.Log.Info("session paused: its lifetime ended", "session", s.ID, "tenant", s.Tenant)
	return true
}
