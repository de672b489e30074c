package python

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// A first run that gives up while its session's Python is still starting
// (a prestart holds the session's turn) says that it waited for that
// start, not for "a reset or stop" that never happened. The start here
// blocks until the test lets it end: the run gives up on an expired
// context with the start in progress, every time.
func TestRunThatWaitedForTheStartSaysSo(t *testing.T) {
	t.Parallel()
	p := newPool(nil, EmbeddedOptions{}, "the test's Python engine")
	starting, release := make(chan struct{}), make(chan struct{})
	p.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		close(starting)
		<-release
		return nil, errors.New("not started by the test")
	}
	sess := &session.Session{ID: "s1"}
	p.prestart(sess, nil)
	<-starting
	t.Cleanup(func() { close(release); p.wg.Wait(); p.cancel() })

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := p.run(ctx, &runcode.Request{Session: sess, Code: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Error, "waited") || !strings.Contains(res.Error, "for this session's Python to start, busy for ") ||
		!strings.Contains(res.Error, "did not start") || strings.Contains(res.Error, "reset") || !res.Interrupted {
		t.Fatalf("the run that waited for the start: %+v", res)
	}
}

// A run that comes while its session's worker is still being prestarted
// waits for that start as for its own, not out of its timeout, which
// counts from the code's start: a timeout far shorter than the start (a
// nanosecond here) does not end the run while it waits. The start ends
// when the test lets it (after the run began to wait, an event); the run
// then takes its turn and starts its own worker, which the test refuses
// with an error of its own to show the run got there.
func TestRunWaitsForAPrestartOutOfItsTimeout(t *testing.T) {
	t.Parallel()
	p := newPool(nil, EmbeddedOptions{}, "the test's Python engine")
	starting, release := make(chan struct{}), make(chan struct{})
	second := errors.New("the run's own start, refused by the test")
	calls := 0
	p.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		calls++ // under the slot's turn: one call at a time
		if calls == 1 {
			close(starting)
			<-release
			return nil, errors.New("the prestart, not started by the test")
		}
		return nil, second
	}
	waiting := make(chan struct{})
	var once sync.Once
	p.waitingForStart = func() { once.Do(func() { close(waiting) }) }
	sess := &session.Session{ID: "s1"}
	p.prestart(sess, nil)
	<-starting
	t.Cleanup(func() { p.wg.Wait(); p.cancel() })

	type ran struct {
		res *runcode.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := p.run(context.Background(), &runcode.Request{Session: sess, Code: "1", Timeout: time.Nanosecond})
		done <- ran{res, err}
	}()
	select {
	case r := <-done:
		close(release)
		t.Fatalf("the run ended while the prestart was still starting its worker: %+v %v", r.res, r.err)
	case <-waiting:
	}
	close(release)
	if r := <-done; !errors.Is(r.err, second) {
		t.Fatalf("after the prestart, the run did not take its turn: %+v %v", r.res, r.err)
	}
}

// gatedPool is a pool for the start gate's tests: its places, and a
// channel (of buf) told of each wait for one (true: a run's).
func gatedPool(buf int) (*pool, int, chan bool) {
	p := newPool(nil, EmbeddedOptions{}, "the test's Python engine")
	queued := make(chan bool, buf)
	p.starts.queued = func(run bool) { queued <- run }
	return &p, p.starts.n, queued
}

// TestStartsTakeTurnsRunsFirst: worker starts take places, as many at
// once as the machine has CPUs, prestarts and runs alike; a run whose
// session has no worker waits for a place ahead of every prestart that
// waits (a person waits for it, not for a prestart), and the prestarts
// waiting go in the order they came.
func TestStartsTakeTurnsRunsFirst(t *testing.T) {
	t.Parallel()
	p, places, queued := gatedPool(8)
	started := make(chan string, places+4)
	release := map[string]chan struct{}{}
	for i := range places {
		release[string(rune('a'+i))] = make(chan struct{})
	}
	own := errors.New("the run's own start, refused by the test")
	p.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		started <- sess.ID
		if sess.ID == "run" {
			return nil, own
		}
		if ch := release[sess.ID]; ch != nil {
			<-ch
		}
		return nil, errors.New("a prestart, not started by the test")
	}
	t.Cleanup(func() {
		for _, ch := range release {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		p.wg.Wait()
		p.cancel()
	})
	for i := range places {
		p.prestart(&session.Session{ID: string(rune('a' + i))}, nil)
	}
	for range places {
		<-started // every place taken
	}
	p.prestart(&session.Session{ID: "extra"}, nil)
	if run := <-queued; run {
		t.Fatal("the prestart waited as a run")
	}
	queuedSess := &session.Session{ID: "run"}
	p.prestart(queuedSess, nil)
	<-queued
	done := make(chan error, 1)
	go func() {
		_, err := p.run(context.Background(), &runcode.Request{Session: queuedSess, Code: "1"})
		done <- err
	}()
	if run := <-queued; !run {
		t.Fatal("the run did not wait for a place as a run")
	}
	select {
	case id := <-started:
		t.Fatalf("%s started past the %d places", id, places)
	default:
	}
	close(release["a"]) // one place free: the run's, before both prestarts
	if id := <-started; id != "run" {
		t.Fatalf("%s started before the waiting run", id)
	}
	if err := <-done; !errors.Is(err, own) {
		t.Fatalf("the run did not start its worker: %v", err)
	}
	if id := <-started; id != "extra" { // the run's place, given back, to the first prestart
		t.Fatalf("%s started before the prestart that came first", id)
	}
}

// TestABurstOfFirstRunsTakesTurnsInOrder: first runs in sessions without
// a worker start theirs a few at a time (the places), never more at once,
// and those that waited start in the order they came; none fails.
func TestABurstOfFirstRunsTakesTurnsInOrder(t *testing.T) {
	t.Parallel()
	p, places, queued := gatedPool(1)
	var mu sync.Mutex
	var order []string
	inFlight, most := 0, 0
	started := make(chan struct{}, 3*places)
	release := make(chan struct{})
	refused := errors.New("started and refused by the test")
	p.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		mu.Lock()
		order = append(order, sess.ID)
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		started <- struct{}{}
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil, refused
	}
	t.Cleanup(func() { p.wg.Wait(); p.cancel() })
	n := 3 * places
	errs := make(chan error, n)
	var want []string
	for i := range n {
		id := fmt.Sprintf("s%02d", i)
		want = append(want, id)
		go func() {
			_, err := p.run(context.Background(), &runcode.Request{Session: &session.Session{ID: id}, Code: "1"})
			errs <- err
		}()
		if i < places {
			<-started // a place of its own
		} else {
			<-queued // waits, after the one before
		}
	}
	// One start ends at a time: each freed place goes to the next waiting
	// run, which starts before the next place frees.
	for range n - places {
		release <- struct{}{}
		<-started
	}
	close(release)
	for range n {
		if err := <-errs; !errors.Is(err, refused) {
			t.Errorf("a first run did not reach its start: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most > places {
		t.Errorf("%d workers started at once, over %d places", most, places)
	}
	if !slices.Equal(order[places:], want[places:]) {
		t.Errorf("the waiting runs started in the order %v, not %v", order[places:], want[places:])
	}
}

// TestAStuckLineOfStartsEndsTheWait: a wait for a place ends once no
// start ended for its stall bound (here every place held for ever), with
// an error that says so, and the waiter leaves the line; a place given
// back then goes to the next waiter, not to the one that left.
func TestAStuckLineOfStartsEndsTheWait(t *testing.T) {
	t.Parallel()
	g := newStartGate(1)
	if err := g.acquire(context.Background(), true, 0); err != nil {
		t.Fatal(err)
	}
	err := g.acquire(context.Background(), true, 50*time.Millisecond)
	var st stalled
	if !errors.As(err, &st) || !strings.Contains(err.Error(), "no worker start ended for 50ms") {
		t.Fatalf("a wait in a stuck line: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- g.acquire(context.Background(), false, 0) }()
	g.release()
	if err := <-got; err != nil {
		t.Fatalf("the next waiter: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.free != 0 || len(g.runs) != 0 || len(g.pre) != 0 {
		t.Fatalf("free %d, runs %d, prestarts %d waiting", g.free, len(g.runs), len(g.pre))
	}
}
