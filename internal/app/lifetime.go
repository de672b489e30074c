package app

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
// calls run code in it (a box is never frozen under such a call; each
// ends within its timeout). Streams that only follow or watch do not
// hold it off (see inflight).
const pauseRetry = 100 * time.Millisecond

// lifetimes is the patrol's state; wake is made with the App, so that
// lifetimeChanged needs no lock.
type lifetimes struct {
	wake chan struct{} // a lifetime was set: look again now

	// listed, when set (tests), is called with the due sessions once the
	// patrol has read them and before it ends any.
	listed func(due []*session.Session)

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

// expiryWorkers bounds how many expired sessions are ended at once: a
// destroy may wait (destroyGrace) for the calls running in its session,
// and that wait must not hold back the others' end.
const expiryWorkers = 8

// endExpired ends the sessions whose lifetime is up, each looked at again
// right before (a lifetime extended or removed since the list is kept),
// several at once. pending: one of them is to be paused but calls run
// code in it; it is left for the next look.
func (a *App) endExpired(ctx context.Context) (pending bool) {
	due, err := a.Sessions.Expired(ctx, time.Now())
	if err != nil {
		if ctx.Err() == nil {
			a.Log.Warn("session lifetimes", "err", err)
		}
		return false
	}
	if a.life.listed != nil {
		a.life.listed(due)
	}
	var (
		wg   sync.WaitGroup
		pend atomic.Bool
		sem  = make(chan struct{}, expiryWorkers)
	)
	for _, s := range due {
		if s.Tenant == session.SpareTenant {
			continue // spares get no lifetime; never end one by mistake
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if !a.endOne(ctx, s.ID) {
				pend.Store(true)
			}
		}()
	}
	wg.Wait()
	return pend.Load() && ctx.Err() == nil
}

// endOne ends session id if its lifetime is still up, read now: a
// set_session_timeout that landed since the patrol's list is obeyed.
// false: it is to be paused but calls run code in it.
func (a *App) endOne(ctx context.Context, id string) bool {
	s, err := a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil {
		if !errors.Is(err, session.ErrNotFound) && ctx.Err() == nil {
			a.Log.Warn("session lifetimes", "session", id, "err", err)
		}
		return true
	}
	if s.Tenant == session.SpareTenant || s.ExpiresAt.IsZero() || s.ExpiresAt.After(time.Now()) {
		return true // extended or removed meanwhile
	}
	if s.OnExpiry == session.ExpiryPause {
		return a.pauseExpired(ctx, s)
	}
	if err := a.destroySession(ctx, s); err != nil && !errors.Is(err, session.ErrNotFound) {
		a.Log.Warn("destroying a session whose lifetime ended", "session", s.ID, "err", err)
		return true
	}
	a.Log.Info("session destroyed: its lifetime ended", "session", s.ID, "tenant", s.Tenant, "late", time.Since(s.ExpiresAt).Round(time.Millisecond))
	return true
}

// pauseExpired pauses the box of s, whose lifetime ended with on_timeout
// pause, and removes the lifetime (a paused session waits, as on E2B,
// until it is resumed or destroyed). false: calls run code in s, try
// later.
func (a *App) pauseExpired(ctx context.Context, s *session.Session) bool {
	if bx := a.Sandbox.Box(s.ID); bx != nil && !bx.Paused() && !bx.CanPause() {
		a.Log.Warn("a session's lifetime ended with pause, but its box cannot be frozen here: it keeps running", "session", s.ID)
		if err := a.Sessions.SetPaused(ctx, s, true); err != nil && !errors.Is(err, session.ErrNotFound) {
			a.Log.Warn("session lifetimes", "session", s.ID, "err", err)
		}
	} else {
		// The Life pauses under its lock: a busy call refuses it (try
		// later), a call that starts now waits, then resumes. A session
		// without a box is marked paused all the same: nothing runs in it
		// until it is resumed or used.
		_, err := a.lives.Pause(ctx, s)
		switch {
		case errors.Is(err, session.ErrBusy):
			return false
		case err != nil && !errors.Is(err, session.ErrNotFound):
			a.Log.Warn("pausing a session whose lifetime ended", "session", s.ID, "err", err)
		}
	}
	if err := a.Sessions.SetLifetime(ctx, s, time.Time{}, ""); err != nil && !errors.Is(err, session.ErrNotFound) {
		a.Log.Warn("session lifetimes", "session", s.ID, "err", err)
	}
	a.Log.Info("session paused: its lifetime ended", "session", s.ID, "tenant", s.Tenant)
	return true
}
