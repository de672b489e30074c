package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/recent"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Life is the one owner of the sessions' lives: their states, the calls
// entered in each, pause and resume, and the one teardown that releases
// everything made for a session — destroyed by a caller, expired, a spare
// retired, or the server closing.
//
// A session's states:
//
//	spare ──claim──▶ ready ⇄ busy            (Enter UseBusy while a run runs)
//	                  │  ▲
//	          pause   ▼  │ resume, or Enter UseBusy
//	                 paused
//	ready/busy/paused ──Destroy──▶ destroying ──▶ gone
//
// Every call that uses a session enters it through Enter, in the mode its
// capability declares (capability.Use; the controller enters before the
// handler runs): a destroy refuses new entries, cancels the calls inside
// and waits for them, then runs the session's ends. What a server keeps
// per session is released by an end: a part that keeps per-session state
// declares its EndFunc once when the Life is made (Enders), and a
// one-off resource registers its release with OnEnd when it is made.
type Life struct {
	m     *Manager
	boxes Boxes
	ends  []Ender
	grace time.Duration
	log   *slog.Logger

	mu    sync.Mutex
	lives map[string]*life
	// gone are sessions being or having been destroyed: a call that looked
	// the session up before the destroy is refused instead of running in it.
	gone   recent.Set
	closed bool
	// moving are sessions quiesced for a move to another node (Quiesce).
	moving map[string]bool

	// releases holds a slot for each destroyed session's release (its
	// disk unmounted and detached, its directory removed, the uid reap)
	// that runs now: a burst of destroys releases at most cap(releases)
	// at once, the others wait their turn in the background.
	releases chan struct{}
	queued   atomic.Int32 // releases waiting for a slot
	// releaseHook, when set, is told of each change of queued or of the
	// slots held; for tests.
	releaseHook func()
}

// Boxes is what the Life asks of the sessions' boxes (the sandbox).
type Boxes interface {
	// Paused reports whether the session's box is frozen.
	Paused(id string) bool
	// Pause freezes the session's box; false when it has none.
	Pause(id string) (bool, error)
	// Resume thaws the session's box; false when it was not frozen.
	Resume(id string) (bool, error)
	// AwaitEnded waits until the session's box, killed by its ends, has
	// exited and its cgroup is gone (at once when none is ending): what
	// the background release waits for before it frees the disk.
	AwaitEnded(id string)
}

// Ender releases what a part of the server keeps for one session. End
// runs once per session at its destroy (and for every session the server
// knows at Close); it must not fail, and must be safe for a session the
// part has nothing of.
type Ender struct {
	Name string
	// First ends run before the others, in the order given: the box's
	// kill, after which the rest only tidy up.
	First bool
	End   func(s *Session)
	// Reopen, when set, undoes End's mark that the session ended for
	// good (a part that refuses it afterwards), for a session whose move
	// to another node failed after Quiesce ran its ends (Unquiesce).
	Reopen func(s *Session)
}

// LifeOptions configure a Life.
type LifeOptions struct {
	Boxes Boxes
	// Enders are the parts' releases, run in order (First ones first)
	// after the calls in the session have returned.
	Enders []Ender
	// Grace bounds how long a destroy (and Close) waits for the calls it
	// canceled (default DestroyGrace).
	Grace time.Duration
	Log   *slog.Logger
}

// DestroyGrace bounds how long a destroy waits for the calls it canceled
// to return before it ends the session's box under them.
const DestroyGrace = 10 * time.Second

// State is where a session is in its life.
type State string

// The states.
const (
	StateSpare      State = "spare"
	StateReady      State = "ready"
	StateBusy       State = "busy"
	StatePaused     State = "paused"
	StateDestroying State = "destroying"
	StateGone       State = "gone"
)

// life is one session's entry in the Life.
type life struct {
	calls map[*call]bool
	busy  int // calls of calls that are busy
	// pausing is closed when a freeze of the session's box in progress
	// ends; nil when none is.
	pausing chan struct{}
	ends    map[uint64]func()
	next    uint64
	drained chan struct{} // closed when the last call returned (destroying)
}

// call is one call entered in a session.
type call struct {
	cancel context.CancelCauseFunc
	s      *Session
	busy   bool // under Life.mu
}

type callKey struct{}

// NewLife returns the owner of the lives of m's sessions.
func NewLife(m *Manager, o LifeOptions) *Life {
	l := &Life{m: m, boxes: o.Boxes, grace: o.Grace, log: o.Log, lives: map[string]*life{},
		releases: make(chan struct{}, sandbox.TeardownSlots())}
	if l.grace <= 0 {
		l.grace = DestroyGrace
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.ends = slices.Clone(o.Enders)
	slices.SortStableFunc(l.ends, func(a, b Ender) int {
		switch {
		case a.First == b.First:
			return 0
		case a.First:
			return -1
		}
		return 1
	})
	return l
}

// Entered is the session the call running under ctx entered (nil: none).
func Entered(ctx context.Context) *Session {
	if c, _ := ctx.Value(callKey{}).(*call); c != nil {
		return c.s
	}
	return nil
}

// ErrDestroyed is the cause of a call that raced with its session's
// destroy.
var ErrDestroyed = errors.New("session destroyed")

func errDestroyed(s *Session) error {
	return capability.Errorf(capability.NotFound, "session %s was destroyed while this call ran: what it started was stopped and its files are gone; create a session (create_session) to go on", s.Name).WithCause(ErrDestroyed)
}

// Enter enters the session ref names ("": ctx's default) for a call that
// uses it in mode use (controller.Enter): see EnterSession.
func (l *Life) Enter(ctx context.Context, ref string, use capability.Use) (context.Context, func(), error) {
	s, err := l.m.Get(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	return l.EnterSession(ctx, s, use)
}

// EnterSession enters s for a call that uses it in mode use, until
// release. The call runs under the context returned, which a destroy of s
// cancels (its cause: the session was destroyed); a session being
// destroyed refuses the entry. UseRead counts nothing; UseHold counts the
// call (a destroy waits for it); UseBusy also marks the session used and
// resumes its box if paused, and a pause waits for it.
func (l *Life) EnterSession(ctx context.Context, s *Session, use capability.Use) (_ context.Context, release func(), err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &call{cancel: cancel, s: s, busy: use == capability.UseBusy}
	ctx = context.WithValue(ctx, callKey{}, c)
	l.mu.Lock()
	if l.gone.Has(s.ID) || l.closed {
		l.mu.Unlock()
		cancel(nil)
		return nil, nil, capability.Errorf(capability.NotFound, "session %s was destroyed", s.Name)
	}
	if l.moving[s.ID] {
		l.mu.Unlock()
		cancel(nil)
		return nil, nil, errMoving(s)
	}
	if use == capability.UseRead {
		l.mu.Unlock()
		return ctx, func() { cancel(nil) }, nil
	}
	lf := l.lifeOf(s.ID)
	lf.calls[c] = true
	var pausing chan struct{}
	if c.busy {
		lf.busy++
		pausing = lf.pausing
	}
	l.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			l.mu.Lock()
			if c.busy {
				c.busy = false
				lf.busy--
			}
			delete(lf.calls, c)
			if len(lf.calls) == 0 && lf.drained != nil {
				close(lf.drained)
				lf.drained = nil
			}
			l.forgetIdle(s.ID, lf)
			l.mu.Unlock()
			cancel(nil)
		})
	}
	if use == capability.UseBusy {
		if pausing != nil { // a freeze under way: the box is resumed after it
			select {
			case <-pausing:
			case <-ctx.Done():
				release()
				return nil, nil, context.Cause(ctx)
			}
		}
		if err := l.use(ctx, s); err != nil {
			release()
			return nil, nil, err
		}
	}
	return ctx, release, nil
}

// use marks s used by a busy call: the use is recorded and a paused
// session resumed (a paused session wakes on use).
func (l *Life) use(ctx context.Context, s *Session) error {
	if err := l.m.Touch(ctx, s); err != nil {
		return err
	}
	if l.boxes != nil {
		resumed, err := l.boxes.Resume(s.ID)
		if err != nil {
			return fmt.Errorf("resume the paused session: %w", err)
		}
		if resumed {
			l.log.Info("session resumed on use", "session", s.ID)
		}
	}
	if s.Paused { // paused with no box, or before a restart: used now
		return l.m.SetPaused(ctx, s, false)
	}
	return nil
}

// lifeOf is id's life, made if needed; under l.mu.
func (l *Life) lifeOf(id string) *life {
	lf := l.lives[id]
	if lf == nil {
		lf = &life{calls: map[*call]bool{}}
		l.lives[id] = lf
	}
	return lf
}

// forgetIdle drops id's life when nothing is kept in it; under l.mu.
func (l *Life) forgetIdle(id string, lf *life) {
	if len(lf.calls) == 0 && len(lf.ends) == 0 && lf.drained == nil && lf.pausing == nil && l.lives[id] == lf {
		delete(l.lives, id)
	}
}

// Following marks the call of ctx as one that from now on only follows a
// running process's output or watches files: a pause no longer waits
// for it.
func (l *Life) Following(ctx context.Context) {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.busy {
		c.busy = false
		if lf := l.lives[c.s.ID]; lf != nil {
			lf.busy--
		}
	}
}

// OnEnd registers fn to run when session id ends (its destroy, or the
// server's Close), after the calls in it have returned: after the First
// Enders (the box's kill) and before the others, the last registered
// first. cancel unregisters fn (the resource was released early). On a
// session being destroyed fn runs at once.
func (l *Life) OnEnd(id string, fn func()) (cancel func()) {
	l.mu.Lock()
	if l.gone.Has(id) || l.closed {
		l.mu.Unlock()
		fn()
		return func() {}
	}
	lf := l.lifeOf(id)
	if lf.ends == nil {
		lf.ends = map[uint64]func(){}
	}
	lf.next++
	k := lf.next
	lf.ends[k] = fn
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if cur := l.lives[id]; cur == lf {
			delete(lf.ends, k)
			l.forgetIdle(id, lf)
		}
	}
}

// ErrBusy means a pause was refused: calls run code in the session.
var ErrBusy = errors.New("the session is running code")

// Pause freezes s's box, or marks s paused when it has none; refused
// with ErrBusy (wrapped, with the count) while busy calls run in it.
// boxed reports whether a box was frozen.
func (l *Life) Pause(ctx context.Context, s *Session) (boxed bool, err error) {
	return l.freeze(s.ID, func(lf *life) error {
		if l.gone.Has(s.ID) {
			return capability.Errorf(capability.NotFound, "session %s was destroyed", s.Name)
		}
		if lf.busy > 0 {
			return fmt.Errorf("%w: %d call(s)", ErrBusy, lf.busy)
		}
		return nil
	}, func() error { return l.m.SetPaused(ctx, s, true) })
}

// errNotNow is a freeze that ok declined without an error.
var errNotNow = errors.New("not now")

// freeze freezes session id's box if ok, asked under l.mu, allows it,
// then runs then (nil: nothing). The freeze runs outside l.mu (the kernel
// may take seconds), with the session marked pausing: a busy call
// entering it meanwhile waits for the pause to finish, then resumes it.
func (l *Life) freeze(id string, ok func(*life) error, then func() error) (bool, error) {
	l.mu.Lock()
	lf := l.lifeOf(id)
	for lf.pausing != nil { // another pause is freezing it: after that one
		w := lf.pausing
		l.mu.Unlock()
		<-w
		l.mu.Lock()
		lf = l.lifeOf(id)
	}
	if err := ok(lf); err != nil {
		l.forgetIdle(id, lf)
		l.mu.Unlock()
		return false, err
	}
	done := make(chan struct{})
	lf.pausing = done
	l.mu.Unlock()
	var boxed bool
	var err error
	if l.boxes != nil {
		boxed, err = l.boxes.Pause(id)
	}
	if err == nil && then != nil {
		err = then()
	}
	l.mu.Lock()
	lf.pausing = nil
	close(done)
	l.forgetIdle(id, lf)
	l.mu.Unlock()
	return boxed, err
}

// Resume thaws s's box and marks s running; resumed reports whether a
// frozen box was thawed.
func (l *Life) Resume(ctx context.Context, s *Session) (resumed bool, err error) {
	if l.boxes != nil {
		if resumed, err = l.boxes.Resume(s.ID); err != nil {
			return resumed, err
		}
	}
	return resumed, l.m.SetPaused(ctx, s, false)
}

// PauseIdle freezes the box of session id if no call is in it and
// idle(id) still holds under the lock (auto-pause).
func (l *Life) PauseIdle(id string, idle func() bool) (bool, error) {
	boxed, err := l.freeze(id, func(lf *life) error {
		if len(lf.calls) > 0 || l.gone.Has(id) || l.boxes == nil || !idle() {
			return errNotNow
		}
		return nil
	}, nil)
	if errors.Is(err, errNotNow) {
		return false, nil
	}
	return boxed, err
}

// State is where s is in its life.
func (l *Life) State(s *Session) State {
	l.mu.Lock()
	gone, lf := l.gone.Has(s.ID), l.lives[s.ID]
	busy := lf != nil && lf.busy > 0
	l.mu.Unlock()
	switch {
	case gone && lf != nil:
		return StateDestroying
	case gone:
		return StateGone
	case s.Tenant == SpareTenant:
		return StateSpare
	case s.Paused || l.boxes != nil && l.boxes.Paused(s.ID):
		return StatePaused
	case busy:
		return StateBusy
	}
	return StateReady
}

// Destroying reports whether session id is being (or was) destroyed.
func (l *Life) Destroying(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gone.Has(id)
}

// Busy is how many busy calls run in session id.
func (l *Life) Busy(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lf := l.lives[id]; lf != nil {
		return lf.busy
	}
	return 0
}

// Calls is how many calls (busy or held) are in session id.
func (l *Life) Calls(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lf := l.lives[id]; lf != nil {
		return len(lf.calls)
	}
	return 0
}

// Tracked is how many sessions the Life keeps an entry for (calls in
// them, ends registered, or a destroy waiting): the leak tests' count.
func (l *Life) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lives)
}

// Destroy ends s for good — a caller's destroy, an expired lifetime, a
// spare retired: new entries are refused, the calls in it are canceled
// (their cause: the session was destroyed) and waited for (at most the
// grace), its ends run (the box's kill first: its init is sent SIGKILL,
// which takes every process of the box with it), and its row goes
// (Manager.Forget). It returns then: the session is gone for every
// caller. What the kernel and the host still hold of it — the box's exit
// and its cgroup's removal, then its disk image unmounted, detached and
// removed, its directory, its uid — is released in the background by the
// same one teardown (the release Forget returned), which Close and
// Manager.WaitReleases wait for. It reports how many calls were still
// running after the grace in late.
func (l *Life) Destroy(ctx context.Context, s *Session) (late int, err error) {
	late = l.end(s, true)
	if late > 0 {
		l.log.Warn("destroy: calls still running after the grace; their session's box ended under them", "session", s.ID, "calls", late)
	}
	return late, l.forget(ctx, s)
}

// forget removes s's row (Manager.Forget) and releases what it left on
// the host in the background: the tail of Destroy and Moved.
func (l *Life) forget(ctx context.Context, s *Session) error {
	release, err := l.m.Forget(ctx, s)
	l.mu.Lock()
	if lf := l.lives[s.ID]; lf != nil && len(lf.calls) == 0 {
		delete(l.lives, s.ID)
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	go func() {
		if l.boxes != nil {
			l.boxes.AwaitEnded(s.ID) // its disk is unmounted once no process of the box holds it
		}
		l.queued.Add(1)
		l.releaseChanged()
		l.releases <- struct{}{}
		l.queued.Add(-1)
		l.releaseChanged()
		err := release()
		<-l.releases
		l.releaseChanged()
		if err != nil {
			l.log.Warn("destroy: what the session left on the host is not all released (looked at again on the next destroy and start)", "session", s.ID, "err", err)
		}
	}()
	return nil
}

func (l *Life) releaseChanged() {
	if l.releaseHook != nil {
		l.releaseHook()
	}
}

// end refuses new entries in s, cancels and waits for its calls (when
// wait), and runs its ends. It returns the calls still running.
func (l *Life) end(s *Session, wait bool) int {
	l.mu.Lock()
	l.gone.Add(s.ID)
	l.mu.Unlock()
	return l.stop(s, errDestroyed(s), wait)
}

// stop cancels the calls in s with cause and waits for them (when wait),
// then runs its ends; the caller marked s first, so that no new call
// enters. It returns the calls still running.
func (l *Life) stop(s *Session, cause error, wait bool) int {
	l.mu.Lock()
	lf := l.lifeOf(s.ID)
	var drained chan struct{}
	if len(lf.calls) > 0 {
		if lf.drained == nil {
			lf.drained = make(chan struct{})
		}
		drained = lf.drained
	}
	for c := range lf.calls {
		c.cancel(cause)
	}
	l.mu.Unlock()
	late := 0
	if drained != nil && wait {
		t := time.NewTimer(l.grace)
		select {
		case <-drained:
		case <-t.C:
			late = l.Calls(s.ID)
		}
		t.Stop()
	}
	l.runEnds(s, lf)
	return late
}

// runEnds runs the First enders, then s's own ends (last registered
// first), then the other enders.
func (l *Life) runEnds(s *Session, lf *life) {
	l.mu.Lock()
	keys := make([]uint64, 0, len(lf.ends))
	for k := range lf.ends {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	own := make([]func(), 0, len(keys))
	for i := len(keys) - 1; i >= 0; i-- {
		own = append(own, lf.ends[keys[i]])
	}
	lf.ends = nil
	l.mu.Unlock()
	i := 0
	for ; i < len(l.ends) && l.ends[i].First; i++ {
		l.ends[i].End(s)
	}
	for _, fn := range own {
		fn()
	}
	for ; i < len(l.ends); i++ {
		l.ends[i].End(s)
	}
}

// Close ends every session the server holds something of (the server is
// going): the background releases of the sessions destroyed are waited
// for, then the others' calls are canceled and waited for (within the
// grace, together, as a destroy waits), and their ends run; their rows
// stay (a session outlives a restart of the server, its processes do
// not). After Close every entry is refused.
//
// The wait: a canceled call still running (a snapshot's copy, a file
// operation) holds files of the session's disk open in the server, and
// the ends, then the server's unmount of the disks, came while it did:
// the disk stayed mounted (EBUSY).
func (l *Life) Close(ctx context.Context) {
	l.m.WaitReleases() // the destroys' background releases first
	l.mu.Lock()
	l.closed = true
	ids := make([]string, 0, len(l.lives))
	for id := range l.lives {
		ids = append(ids, id)
	}
	cause := errors.New("the server is shutting down")
	lives := make([]*life, len(ids))
	var drained []chan struct{}
	for i, id := range ids {
		lf := l.lifeOf(id)
		lives[i] = lf
		if len(lf.calls) > 0 {
			if lf.drained == nil {
				lf.drained = make(chan struct{})
			}
			drained = append(drained, lf.drained)
		}
		for c := range lf.calls {
			c.cancel(cause)
		}
	}
	l.mu.Unlock()
	if len(drained) > 0 {
		t := time.NewTimer(l.grace)
	wait:
		for _, ch := range drained {
			select {
			case <-ch:
			case <-t.C:
				l.log.Warn("close: calls still running after the grace; their sessions' ends run under them")
				break wait
			}
		}
		t.Stop()
	}
	for i, id := range ids {
		s, err := l.m.ByIDAnyTenant(ctx, id)
		if err != nil {
			s = &Session{ID: id, Name: id}
		}
		l.runEnds(s, lives[i])
	}
}
