package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
)

// fakeBoxes is a box per session that a test freezes and thaws.
type fakeBoxes struct {
	mu     sync.Mutex
	has    map[string]bool
	frozen map[string]bool
	// slow, when set, is a freeze the kernel takes its time over: Pause
	// says it started on freezing and finishes when slow is closed.
	slow     chan struct{}
	freezing chan struct{}
}

func (b *fakeBoxes) Paused(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.frozen[id]
}

func (b *fakeBoxes) Pause(id string) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.slow != nil {
		b.freezing <- struct{}{}
		<-b.slow
	}
	if !b.has[id] {
		return false, nil
	}
	b.frozen[id] = true
	return true, nil
}

func (b *fakeBoxes) AwaitEnded(string) {}

func (b *fakeBoxes) Resume(id string) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.frozen[id]
	delete(b.frozen, id)
	return was, nil
}

func newLife(t testing.TB, log *[]string, grace time.Duration) (*Life, *Manager, *fakeBoxes) {
	t.Helper()
	m := manager(t, t.TempDir())
	boxes := &fakeBoxes{has: map[string]bool{}, frozen: map[string]bool{}}
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		*log = append(*log, s)
		mu.Unlock()
	}
	l := NewLife(m, LifeOptions{Boxes: boxes, Grace: grace, Enders: []Ender{
		{Name: "tidy", End: func(s *Session) { note("tidy " + s.Name) }},
		{Name: "box", First: true, End: func(s *Session) { note("kill " + s.Name) }},
	}})
	return l, m, boxes
}

// The states a session goes through, as State reports them, and the
// entries each allows.
func TestLifeStates(t *testing.T) {
	var log []string
	l, m, boxes := newLife(t, &log, time.Second)
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	boxes.has[s.ID] = true
	if st := l.State(s); st != StateReady {
		t.Fatalf("new session: %s", st)
	}
	cctx, release, err := l.EnterSession(ctx, s, capability.UseBusy)
	if err != nil {
		t.Fatal(err)
	}
	if Entered(cctx) != s || l.State(s) != StateBusy {
		t.Fatalf("entered busy: %v %s", Entered(cctx), l.State(s))
	}
	// A pause waits for busy calls: refused while one runs.
	if _, err := l.Pause(ctx, s); !errors.Is(err, ErrBusy) {
		t.Fatalf("pause while busy: %v", err)
	}
	// A call that only follows no longer holds the pause off.
	l.Following(cctx)
	if boxed, err := l.Pause(ctx, s); err != nil || !boxed || l.State(s) != StatePaused {
		t.Fatalf("pause: %v %v %s", boxed, err, l.State(s))
	}
	release()
	// A busy entry resumes the session.
	_, release, err = l.EnterSession(ctx, s, capability.UseBusy)
	if err != nil {
		t.Fatal(err)
	}
	if boxes.Paused(s.ID) || s.Paused || l.State(s) != StateBusy {
		t.Fatalf("busy entry did not resume: box frozen %v, paused %v, %s", boxes.Paused(s.ID), s.Paused, l.State(s))
	}
	release()
	// Hold and read entries do not.
	if _, err := l.Pause(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, use := range []capability.Use{capability.UseHold, capability.UseRead} {
		_, release, err := l.EnterSession(ctx, s, use)
		if err != nil {
			t.Fatal(err)
		}
		if l.State(s) != StatePaused {
			t.Errorf("%s entry: %s", use, l.State(s))
		}
		release()
	}
	if _, err := l.Destroy(ctx, s); err != nil {
		t.Fatal(err)
	}
	if st := l.State(s); st != StateGone {
		t.Fatalf("destroyed: %s", st)
	}
	if _, _, err := l.EnterSession(ctx, s, capability.UseRead); err == nil {
		t.Fatal("a destroyed session was entered")
	}
	if n := l.Tracked(); n != 0 {
		t.Errorf("%d sessions still tracked", n)
	}
}

// A freeze the kernel takes its time over holds up no other session, and
// a busy call entering the session meanwhile waits for it, then resumes
// the box.
func TestLifeSlowFreezeHoldsUpOnlyItsSession(t *testing.T) {
	var log []string
	l, m, boxes := newLife(t, &log, time.Second)
	ctx := context.Background()
	a, err := m.Create(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	boxes.has[a.ID], boxes.has[b.ID] = true, true
	boxes.slow, boxes.freezing = make(chan struct{}), make(chan struct{}, 1)
	paused := make(chan error, 1)
	go func() {
		_, err := l.Pause(ctx, a)
		paused <- err
	}()
	<-boxes.freezing
	// Another session is entered and used while a's freeze runs.
	_, release, err := l.EnterSession(ctx, b, capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	release()
	// A busy call into a waits for the freeze.
	entered := make(chan error, 1)
	go func() {
		_, release, err := l.EnterSession(ctx, a, capability.UseBusy)
		if err == nil {
			if boxes.Paused(a.ID) {
				err = errors.New("entered a frozen box")
			}
			release() // before the answer: the count below is after it
		}
		entered <- err
	}()
	close(boxes.slow)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	if n := l.Tracked(); n != 0 {
		t.Errorf("%d sessions still tracked", n)
	}
}

// A destroy refuses new calls, cancels those inside with the cause that
// the session was destroyed, waits for them, and only then runs the ends:
// the box's kill first, the session's own ends last registered first, the
// parts' tidy-up after; then the session's files are gone.
func TestLifeDestroyEndsCallsThenRunsEnds(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Minute)
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	cctx, release, err := l.EnterSession(ctx, s, capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	l.OnEnd(s.ID, func() { log = append(log, "first registered") })
	l.OnEnd(s.ID, func() { log = append(log, "second registered") })
	cancel := l.OnEnd(s.ID, func() { log = append(log, "released early") })
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := l.Destroy(ctx, s); err != nil {
			t.Error(err)
		}
	}()
	<-cctx.Done()
	var ce *capability.Error
	if cause := context.Cause(cctx); !errors.As(cause, &ce) || !errors.Is(cause, ErrDestroyed) || !strings.Contains(ce.Message, "destroyed") {
		t.Fatalf("cause: %v", cause)
	}
	if !l.Destroying(s.ID) || l.State(s) != StateDestroying {
		t.Fatalf("state during the destroy: %s", l.State(s))
	}
	if _, _, err := l.EnterSession(ctx, s, capability.UseBusy); err == nil {
		t.Fatal("a session being destroyed was entered")
	}
	if len(log) != 0 {
		t.Fatalf("ends ran before the call returned: %q", log)
	}
	release()
	<-done
	m.WaitReleases() // the directory goes in the destroy's background release
	want := "kill s|second registered|first registered|tidy s"
	if got := strings.Join(log, "|"); got != want {
		t.Errorf("ends ran as %q, want %q", got, want)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("session directory left: %v", err)
	}
	// An end registered after the destroy (a resource made racing with
	// it) runs at once.
	ran := false
	l.OnEnd(s.ID, func() { ran = true })
	if !ran {
		t.Error("an end registered on a destroyed session did not run")
	}
	if n := l.Tracked(); n != 0 {
		t.Errorf("%d sessions still tracked", n)
	}
}

// A destroy returns once the session is gone for callers (its ends run,
// its row gone); its disk and directory are released in the background,
// a create waiting for a disk's place waits for that release, and Close
// waits for it.
func TestLifeDestroyReleasesInTheBackground(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Second)
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if m.AwaitRelease(ctx) {
		t.Fatal("AwaitRelease waited with no release under way")
	}
	unblock := make(chan struct{})
	var released []string
	m.Disk.Release = func(dir string) error {
		<-unblock // an unmount the kernel takes its time over
		released = append(released, dir)
		return nil
	}
	if _, err := l.Destroy(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(log, "|"); got != "kill s|tidy s" {
		t.Errorf("ends ran as %q before the destroy returned", got)
	}
	if m.Exists(ctx, s.ID) || l.State(s) != StateGone {
		t.Errorf("after the destroy returned: exists %v, state %s", m.Exists(ctx, s.ID), l.State(s))
	}
	if _, err := m.Create(ctx, "s"); err != nil {
		t.Errorf("the destroyed session's name is not free: %v", err)
	}
	if n := m.Releasing(); n != 1 {
		t.Errorf("%d releases under way, want 1", n)
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Errorf("the directory went before its disk was released: %v", err)
	}
	// The release is let go on when AwaitRelease waits (its ctx's Done
	// is asked for then, after the release under way was seen): let go
	// before, it could end before AwaitRelease looked, which then rightly
	// saw none under way.
	awaited := make(chan bool)
	closed := make(chan struct{})
	waiting := &doneHook{Context: ctx, hook: func() {
		go func() {
			l.Close(ctx)
			close(closed)
		}()
		close(unblock)
	}}
	go func() { awaited <- m.AwaitRelease(waiting) }()
	if !<-awaited {
		t.Error("AwaitRelease did not see the release end")
	}
	<-closed
	if len(released) != 1 || released[0] != s.Dir {
		t.Errorf("released %q", released)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("Close returned with the directory left: %v", err)
	}
	if n := m.Releasing(); n != 0 {
		t.Errorf("%d releases under way after Close", n)
	}
}

// A burst of destroys releases at most cap(releases) sessions' disks at
// once in the background; the others wait for a slot (the former code
// started every release at once), and WaitReleases waits for them all.
// Disk.Release holds the first releases until the rest have queued.
func TestLifeDestroyBurstReleasesBounded(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Second)
	ctx := context.Background()
	const n, bound = 6, 2
	l.releases = make(chan struct{}, bound)
	var all []*Session
	for i := range n {
		s, err := m.Create(ctx, fmt.Sprintf("burst%d", i))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	changed := make(chan struct{}, 1)
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	l.releaseHook = signal
	gate := make(chan struct{})
	var inside, most atomic.Int32
	m.Disk.Release = func(dir string) error {
		k := inside.Add(1)
		if k > bound {
			t.Errorf("%d releases at once, bound %d", k, bound)
		}
		for h := most.Load(); k > h && !most.CompareAndSwap(h, k); h = most.Load() {
		}
		signal()
		<-gate // an unmount the kernel takes its time over
		inside.Add(-1)
		return nil
	}
	for _, s := range all {
		if _, err := l.Destroy(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for inside.Load() != bound || l.queued.Load() != n-bound {
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%d releasing, %d queued; want %d and %d", inside.Load(), l.queued.Load(), bound, n-bound)
		}
	}
	close(gate)
	m.WaitReleases()
	if h := most.Load(); h != bound {
		t.Errorf("at most %d releases at once, want the bound %d", h, bound)
	}
	for _, s := range all {
		if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
			t.Errorf("session %s's directory is left: %v", s.Name, err)
		}
	}
	if r := m.Releasing(); r != 0 {
		t.Errorf("%d releases under way after WaitReleases", r)
	}
}

// A call that does not return within the grace is reported; the destroy
// goes on under it.
func TestLifeDestroyGrace(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, 50*time.Millisecond)
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := l.EnterSession(ctx, s, capability.UseBusy)
	if err != nil {
		t.Fatal(err)
	}
	late, err := l.Destroy(ctx, s)
	if err != nil || late != 1 {
		t.Fatalf("late %d, err %v", late, err)
	}
	release()
	if n := l.Tracked(); n != 0 {
		t.Errorf("%d sessions still tracked after the late call returned", n)
	}
}

// Close (the server going) runs every tracked session's ends and keeps
// their rows; afterwards nothing is entered.
func TestLifeClose(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Second)
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	l.OnEnd(s.ID, func() { log = append(log, "own") })
	l.Close(ctx)
	if got := strings.Join(log, "|"); got != "kill s|own|tidy s" {
		t.Errorf("close ran %q", got)
	}
	if !m.Exists(ctx, s.ID) {
		t.Error("close deleted the session's row")
	}
	if _, _, err := l.EnterSession(ctx, s, capability.UseRead); err == nil {
		t.Error("entered after Close")
	}
}

// Close cancels the calls in the sessions and waits for them before the
// sessions' ends run: a canceled call still running holds files of the
// session's disk open in the server, and the ends (then the server's
// unmount of the disks) came while it ran. The call here returns when
// its context ends; each end records whether it was still running.
func TestLifeCloseWaitsForTheCanceledCalls(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Minute) // a guard: the call returns as soon as it is canceled
	ctx := context.Background()
	s, err := m.Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	cctx, release, err := l.EnterSession(ctx, s, capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	var running atomic.Bool
	running.Store(true)
	var under atomic.Int32
	l.OnEnd(s.ID, func() {
		if running.Load() {
			under.Add(1)
		}
	})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		<-cctx.Done()
		running.Store(false)
		release()
	}()
	l.Close(ctx)
	<-returned
	if n := under.Load(); n != 0 {
		t.Error("the session's end ran while its canceled call still ran")
	}
	if !slices.Contains(log, "kill s") || !slices.Contains(log, "tidy s") {
		t.Errorf("close ran %q", log)
	}
}

// Entries and releases leave nothing behind: a thousand calls in a
// hundred sessions keep no entry once they returned.
func TestLifeForgetsIdleSessions(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Second)
	ctx := context.Background()
	var ss []*Session
	for range 10 {
		s, err := m.Create(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, release, err := l.EnterSession(ctx, ss[i%len(ss)], capability.Use(1+i%3))
			if err != nil {
				t.Error(err)
				return
			}
			cancel := l.OnEnd(ss[i%len(ss)].ID, func() {})
			cancel()
			release()
		}()
	}
	wg.Wait()
	if n := l.Tracked(); n != 0 {
		t.Errorf("%d sessions still tracked", n)
	}
}

// Enter resolves the reference as the caller sees it: another tenant's
// session is not found.
func TestLifeEnterIsConfinedToTheTenant(t *testing.T) {
	var log []string
	l, m, _ := newLife(t, &log, time.Second)
	a := WithTenant(context.Background(), "a")
	s, err := m.Create(a, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Enter(WithTenant(context.Background(), "b"), s.ID, capability.UseRead); !errors.Is(err, ErrNotFound) {
		t.Errorf("another tenant entered: %v", err)
	}
	ctx, release, err := l.Enter(a, "mine", capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if Entered(ctx).ID != s.ID {
		t.Error("entered another session")
	}
}

// doneHook is a context that runs hook the first time its Done is asked
// for: the moment a waiter has checked what it waits on and waits.
type doneHook struct {
	context.Context
	once sync.Once
	hook func()
}

func (c *doneHook) Done() <-chan struct{} {
	c.once.Do(c.hook)
	return c.Context.Done()
}
