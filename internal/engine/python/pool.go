package python

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// pool is the registry of resident Python workers, one per session, that
// both worker engines share: the embedded CPython (Embedded) and the
// python3 of a session's rootfs (RootfsWorker). What differs between them
// is how a worker starts (startFor); the rest, runs, timeouts, idle stops,
// Reset, Stop and code contexts, is this. Runs of one session are
// serialised; runs of different sessions proceed in parallel.
type pool struct {
	sb   *sandbox.Sandbox
	opts EmbeddedOptions
	what string // the engine, for errors: "the embedded Python engine"
	// startFor returns a new worker for sess, started or a spare bound to it.
	startFor func(ctx context.Context, sess *session.Session) (*worker, error)

	ctx    context.Context // the workers' lifetime
	cancel context.CancelFunc

	mu     sync.Mutex
	slots  map[string]*slot
	closed bool
	wg     sync.WaitGroup

	// waitingForStart, when set (by tests), is called as a run begins to
	// wait for a worker's start that holds its session's slot.
	waitingForStart func()

	// prestarts has a place per prestart starting a worker: as many at
	// once as the machine has CPUs. A burst of creates then answers
	// beside a few starts rather than a hundred; a run does not take a
	// place (it starts its own worker when none is ready, and a prestart
	// that comes after finds it).
	prestarts chan struct{}

	// locks are the install root's directories the engine uses, held
	// shared until it closes (see removeOldTrees).
	locks treeLocks
}

func newPool(sb *sandbox.Sandbox, opts EmbeddedOptions, what string) pool {
	ctx, cancel := context.WithCancel(context.Background())
	return pool{sb: sb, opts: opts, what: what, ctx: ctx, cancel: cancel, slots: map[string]*slot{},
		prestarts: make(chan struct{}, max(runtime.NumCPU(), 1))}
}

// unstartable is the error of a start that found, before starting
// anything, that the session's worker cannot start (its rootfs is not
// installed, or has no python3): the run reports it as it is.
type unstartable struct{ err error }

func (u unstartable) Error() string { return u.err.Error() }
func (u unstartable) Unwrap() error { return u.err }

// slot is one session's place in the registry.
type slot struct {
	id   string        // the session's
	sem  chan struct{} // held by the run in progress
	mu   sync.Mutex    // guards writes of w (its holder of sem reads it freely)
	w    *worker
	lost string // why the state is gone, to say in the next run
	idle *time.Timer
	// gen counts armIdle's timers (under sem): a timer that fired late,
	// after a run re-armed another, finds gen moved on and does nothing.
	gen uint64
	// The code context of the run in progress and its cancel (under mu).
	runCtx    string
	cancelRun context.CancelCauseFunc
	// What holds sem and since when (under mu), for the error of a run
	// that waited for it in vain: another run, the worker's start, a
	// reset...
	holder string
	since  time.Time
	// starting is set (under mu) while the holder of sem starts the
	// session's worker (a prestart, a spare's start), and closed when it
	// gives sem back: a run that waits for it waits for its worker's
	// start, which is start time, not the run's.
	starting chan struct{}
}

// took records that the caller, which has just taken s.sem, is what
// (e.g. "another run of this session's Python"). give releases s.sem.
func (s *slot) took(what string) {
	s.mu.Lock()
	s.holder, s.since = what, time.Now()
	s.mu.Unlock()
}

// tookToStart is took for a holder that starts the session's worker.
func (s *slot) tookToStart() {
	s.mu.Lock()
	s.holder, s.since, s.starting = startingHolder, time.Now(), make(chan struct{})
	s.mu.Unlock()
}

const startingHolder = "this session's Python to start"

func (s *slot) give() {
	s.mu.Lock()
	s.holder, s.since = "", time.Time{}
	starting := s.starting
	s.starting = nil
	s.mu.Unlock()
	<-s.sem
	if starting != nil {
		close(starting) // after sem is free: a run woken by it finds its turn
	}
}

// startingNow is the channel closed when the worker's start that holds
// s.sem ends, or nil when no start holds it.
func (s *slot) startingNow() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starting
}

// waitedFor says what a run that could not take s.sem waited for.
func (s *slot) waitedFor() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder == "" {
		return "its turn in this session's Python" // released just now
	}
	return s.holder + ", busy for " + time.Since(s.since).Round(100*time.Millisecond).String() + ","
}

func (e *pool) slot(id string) (*slot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New(e.what + " is closed")
	}
	s := e.slots[id]
	if s == nil {
		s = &slot{id: id, sem: make(chan struct{}, 1)}
		e.slots[id] = s
	}
	return s, nil
}

// run runs req in its session's worker, starting one when it has none.
func (e *pool) run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	s, err := e.slot(req.Session.ID)
	if err != nil {
		return nil, err
	}
	if res := e.turn(ctx, s, req.Timeout); res != nil {
		return res, nil
	}
	s.took("another run of this session's Python")
	defer s.give()
	if s.idle != nil {
		s.idle.Stop()
	}
	s.gen++ // a timer that fired but has not taken sem yet stands down
	var notes []string
	if s.lost != "" {
		notes = append(notes, s.lost)
		s.lost = ""
	}
	if s.w != nil && !s.w.alive() {
		if x := s.w.exit; x.OOMKilled && x.Signal == syscall.SIGKILL {
			notes = append(notes, fmt.Sprintf("the session's Python worker was killed since the last run: %s; its variables are lost", x.OOM.Reason()))
		} else {
			notes = append(notes, fmt.Sprintf("the session's Python worker had exited since the last run (status %d); its variables are lost", x.Code))
		}
		s.setWorker(nil)
	}
	if err := e.ensureWorker(ctx, s, req.Session); err != nil {
		var u unstartable
		if errors.As(err, &u) {
			return nil, u.err
		}
		return nil, fmt.Errorf("starting the Python worker: %w", err)
	}
	if c := req.Context; c != nil && c.ID != "" {
		// A restart or removal of the context interrupts this run.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		s.mu.Lock()
		s.runCtx, s.cancelRun = c.ID, cancel
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.runCtx, s.cancelRun = "", nil
			s.mu.Unlock()
		}()
	}
	// The run's timeout counts from here, the worker started: a first
	// run's worker start (seconds on a loaded machine) is not the code's
	// time.
	ctx, cancel := withTimeout(ctx, req.Timeout)
	defer cancel()
	res, usable := s.w.run(ctx, req, req.Session.Env, runOptions{grace: e.opts.InterruptGrace})
	if !usable {
		s.setWorker(nil)
	}
	res.Notes = append(notes, res.Notes...)
	if s.w != nil {
		e.armIdle(s)
	}
	return res, nil
}

// turn takes s.sem for a run, or returns the result of a run that could
// not. Runs of a session wait for each other in the order they came (a
// channel's blocked senders go in turn), for at most their timeout. A
// worker's start that holds the slot (a prestart, a spare's start) is
// waited for as the run's own start would be: for the caller's context
// and at most the sandbox's start bound, never out of the run's timeout,
// which counts from the code's start (a worker still starting on a
// loaded machine failed a first run with a short timeout that its own
// start would have been allowed).
func (e *pool) turn(ctx context.Context, s *slot, timeout time.Duration) *runcode.Result {
	waitStart := time.Now()
	gaveUp := func(err error, timedOut bool) *runcode.Result {
		return &runcode.Result{ExitCode: -1, Interrupted: true, TimedOut: timedOut,
			Error: fmt.Sprintf("this run waited %s for %s and did not start (%v): call again when it is done, or run this in another session",
				time.Since(waitStart).Round(100*time.Millisecond), s.waitedFor(), err)}
	}
	for {
		if starting := s.startingNow(); starting != nil {
			if e.waitingForStart != nil {
				e.waitingForStart()
			}
			bound := e.startBound()
			sctx, cancel := context.WithTimeoutCause(ctx, bound, fmt.Errorf("the worker did not start within %s", bound))
			select {
			case s.sem <- struct{}{}:
				cancel()
				return nil
			case <-starting:
				cancel()
				continue // the start ended: whatever holds the slot now
			case <-sctx.Done():
				err := context.Cause(sctx)
				cancel()
				return gaveUp(err, false)
			}
		}
		select {
		case s.sem <- struct{}{}: // free: taken, whatever the timeout
			return nil
		default:
		}
		wctx, wcancel := withTimeout(ctx, timeout)
		select {
		case s.sem <- struct{}{}:
			wcancel()
			return nil
		case <-wctx.Done():
			wcancel()
			return gaveUp(wctx.Err(), errors.Is(wctx.Err(), context.DeadlineExceeded))
		}
	}
}

// startBound is how long a run waits for a worker's start that holds its
// session's slot: the sandbox's start bound (sandbox.Options.StartTimeout).
func (e *pool) startBound() time.Duration {
	if e.sb == nil {
		return sandbox.DefaultStartTimeout
	}
	return e.sb.StartTimeout()
}

// ensureWorker gives s a worker for sess when it has none. Called by the
// holder of s.sem.
func (e *pool) ensureWorker(ctx context.Context, s *slot, sess *session.Session) error {
	if s.w != nil {
		return nil
	}
	w, err := e.startFor(ctx, sess)
	if err != nil {
		return err
	}
	s.setWorker(w)
	return nil
}

// armIdle (re)starts s's idle timer: IdleTimeout after the worker's last
// run, UnusedTimeout while it has run nothing (a prestarted worker, or a
// claimed spare's). Called by the holder of s.sem.
func (e *pool) armIdle(s *slot) {
	if s.idle != nil {
		s.idle.Stop()
	}
	s.gen++
	gen, d := s.gen, e.opts.IdleTimeout
	if s.w != nil && s.w.runs == 0 {
		d = min(d, e.opts.UnusedTimeout)
	}
	s.idle = time.AfterFunc(d, func() { e.idleStop(s, gen) })
}

// idleStop releases s's worker when its timer of generation gen is still
// the current one and no run is in progress (see release).
func (e *pool) idleStop(s *slot, gen uint64) {
	select {
	case s.sem <- struct{}{}:
	default:
		return // a run is in progress; it re-arms the timer
	}
	s.took("the release of this session's idle Python")
	defer s.give()
	if s.gen != gen {
		return // a run came between the timer firing and now
	}
	e.release(s)
}

// ReleaseIdle does now what the session's idle timer does when it fires:
// it releases the session's worker unless a run is in progress or the
// session's box is paused. It reports whether a worker was released. The
// idle timer calls the same code; this is for tests and for callers that
// need the memory back before the timer runs out.
func (e *pool) ReleaseIdle(sessionID string) bool {
	e.mu.Lock()
	s := e.slots[sessionID]
	e.mu.Unlock()
	if s == nil {
		return false
	}
	select {
	case s.sem <- struct{}{}:
	default:
		return false
	}
	s.took("the release of this session's idle Python")
	defer s.give()
	return e.release(s)
}

// release ends s's worker to give its memory back, and keeps for the next
// run the note that the interpreter was restarted, when the worker had run
// code (a worker that ran nothing held no state: nothing is lost, nothing
// is said). A paused session keeps its worker: pause_session promises the
// state back, and the pause is what keeps an idle session's state at no
// CPU cost (see sandbox.Box.Pause); the timer is armed again. Called by
// the holder of s.sem.
func (e *pool) release(s *slot) bool {
	if bx := e.sb.Box(s.id); bx != nil && bx.Paused() {
		e.armIdle(s)
		return false
	}
	if s.idle != nil {
		s.idle.Stop()
	}
	s.gen++
	if s.w == nil {
		return false
	}
	ran := s.w.runs > 0
	s.w.kill()
	<-s.w.done
	s.setWorker(nil)
	if ran {
		s.lost = fmt.Sprintf(runcode.NoteRestarted+": it had been idle for %s and was released to free memory, so variables, imports and functions of earlier runs are gone; run again the code that made what this run needs", humanIdle(e.opts.IdleTimeout))
	}
	return true
}

// humanIdle writes an idle period as a person would: 5 min, 90 s, 1h30m.
func humanIdle(d time.Duration) string {
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	case d >= time.Second && d%time.Second == 0 && d < time.Minute:
		return fmt.Sprintf("%d s", d/time.Second)
	}
	return d.Round(time.Second).String()
}

// Reset gives the session a fresh interpreter: its globals, imports and
// variables are cleared. It waits for a run in progress.
func (e *pool) Reset(ctx context.Context, sessionID string) error {
	s, err := e.slot(sessionID)
	if err != nil {
		return err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.took("a reset of this session's Python")
	defer s.give()
	s.endWorker()
	s.lost = ""
	return nil
}

// endWorker stops the idle timer and kills the slot's worker, waiting until
// it is gone. The caller holds the slot's semaphore.
func (s *slot) endWorker() {
	if s.idle != nil {
		s.idle.Stop()
	}
	if s.w != nil {
		s.w.kill()
		<-s.w.done
		s.setWorker(nil)
	}
}

// Stop ends the session's worker now, even in the middle of a run (which
// then reports that the worker was killed), and forgets the session. It
// does not wait for the worker's exit (a destroy answers without it;
// Close waits for it).
func (e *pool) Stop(sessionID string) {
	e.mu.Lock()
	s := e.slots[sessionID]
	delete(e.slots, sessionID)
	e.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case s.sem <- struct{}{}:
		s.took("the stop of this session's Python")
		if s.idle != nil {
			s.idle.Stop()
		}
		if w := s.worker(); w != nil {
			w.kill()
			s.setWorker(nil)
			e.mu.Lock()
			if !e.closed { // else Close's cancel kills it and Close waits
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					<-w.done
				}()
			}
			e.mu.Unlock()
		}
		s.give()
	default:
		// A run holds the slot: end its worker under it; the run reports it.
		if w := s.worker(); w != nil {
			w.kill()
		}
	}
}

func (s *slot) worker() *worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

// setWorker is called by the holder of s.sem only.
func (s *slot) setWorker(w *worker) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}

// Sessions is the number of sessions with a live worker (for status).
func (e *pool) Sessions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.slots {
		if w := s.worker(); w != nil && w.alive() {
			n++
		}
	}
	return n
}

// close stops every worker and waits for them; locked, if set, runs
// under the lock once the pool is closed (the spare is taken there).
func (e *pool) close(locked func()) {
	e.mu.Lock()
	e.closed = true
	slots := e.slots
	e.slots = map[string]*slot{}
	if locked != nil {
		locked()
	}
	e.mu.Unlock()
	e.cancel() // the sandbox kills each worker's process group
	for _, s := range slots {
		if s.idle != nil {
			s.idle.Stop()
		}
		if w := s.worker(); w != nil {
			<-w.done
		}
	}
	e.wg.Wait()
	e.locks.release()
}

// Claimed tells the engine that the spare session id is now a session's:
// its worker's idle timer runs from now. A worker that died meanwhile is
// forgotten without a note: the session's first run starts another.
func (e *pool) Claimed(id string) {
	e.mu.Lock()
	s := e.slots[id]
	e.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		return // a run holds it (the session was found already): it arms the timer
	}
	s.took("the claim of this session's spare Python")
	defer s.give()
	if s.w == nil {
		return
	}
	if !s.w.alive() {
		s.setWorker(nil)
		return
	}
	if s.idle == nil {
		e.armIdle(s)
	}
}

// DropContext implements runcode.ContextEngine: the worker forgets code
// context id (a later run starts it afresh). It waits for a run in
// progress. A session without a worker has no context state to drop.
func (e *pool) DropContext(ctx context.Context, sessionID, id string) error {
	s, err := e.slot(sessionID)
	if err != nil {
		return err
	}
	select {
	case s.sem <- struct{}{}:
	default:
		// A run in this context is interrupted (E2B's restart stops the
		// kernel); a run in another context is waited for.
		s.mu.Lock()
		if s.runCtx == id && s.cancelRun != nil {
			s.cancelRun(runcode.ErrContextRestarted)
		}
		s.mu.Unlock()
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.took("the restart of a code context of this session's Python")
	defer s.give()
	w := s.w
	if w == nil || !w.alive() {
		return nil
	}
	if err := w.send(map[string]string{"op": "drop", "ctx": id}); err != nil {
		return fmt.Errorf("the Python worker is gone: %w", err)
	}
	f, err := w.await(ctx)
	switch {
	case ctx.Err() != nil:
		// The reply is still to come and would be read as a run's:
		// the worker cannot be trusted to be in step any more.
		w.kill()
		return ctx.Err()
	case err != nil:
		return errors.New("the Python worker exited while dropping the context")
	case f.Op != "dropped":
		return fmt.Errorf("the Python worker did not drop the context (%s)", f.Error)
	}
	return nil
}

// prestart starts sess's worker in the background when it has none, after
// ready (if set) succeeded; see Embedded.Prestart.
func (e *pool) prestart(sess *session.Session, ready func(ctx context.Context) error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		if ready != nil && ready(e.ctx) != nil {
			return
		}
		// The slot first: a Stop while this waits for its place removes
		// it, and the check below sees that.
		s, err := e.slot(sess.ID)
		if err != nil {
			return
		}
		select {
		case e.prestarts <- struct{}{}:
			defer func() { <-e.prestarts }()
		case <-e.ctx.Done():
			return
		}
		select {
		case s.sem <- struct{}{}:
		case <-e.ctx.Done():
			return
		}
		s.tookToStart()
		defer s.give()
		e.mu.Lock()
		gone := e.slots[sess.ID] != s // Stop ran meanwhile
		e.mu.Unlock()
		if gone || s.w != nil {
			return
		}
		if e.ensureWorker(e.ctx, s, sess) == nil {
			e.armIdle(s)
		}
	}()
}

// withTimeout is ctx bounded by d when d > 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
