package python

import (
	"context"
	"errors"
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

// Prestarts start as many workers at once as the pool has places (the
// machine's CPUs), the rest waiting their turn: a burst of creates is
// answered beside a few starts. A run of a session whose prestart waits
// for a place does not wait behind it: it starts its session's worker
// itself (the test refuses that start with an error of its own, to show
// the run got there).
func TestPrestartsTakeTurnsAndARunDoesNotWaitBehindThem(t *testing.T) {
	t.Parallel()
	p := newPool(nil, EmbeddedOptions{}, "the test's Python engine")
	places := cap(p.prestarts)
	started, release := make(chan string, places+2), make(chan struct{})
	own := errors.New("the run's own start, refused by the test")
	p.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		if sess.ID == "run" {
			return nil, own
		}
		started <- sess.ID
		<-release
		return nil, errors.New("a prestart, not started by the test")
	}
	t.Cleanup(func() { p.wg.Wait(); p.cancel() })
	for i := range places {
		p.prestart(&session.Session{ID: string(rune('a' + i))}, nil)
	}
	for range places {
		<-started // every place taken
	}
	p.prestart(&session.Session{ID: "extra"}, nil) // waits for a place
	queued := &session.Session{ID: "run"}
	p.prestart(queued, nil) // waits for a place too
	done := make(chan error, 1)
	go func() {
		_, err := p.run(context.Background(), &runcode.Request{Session: queued, Code: "1"})
		done <- err
	}()
	hang := time.NewTimer(time.Minute) // a guard against a hang, not a measurement
	defer hang.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, own) {
			close(release)
			t.Fatalf("the run did not start its own worker: %v", err)
		}
	case <-hang.C:
		close(release)
		t.Fatal("the run waited behind a prestart that waits for a place")
	}
	select {
	case id := <-started:
		close(release)
		t.Fatalf("%s started past the %d places", id, places)
	default:
	}
	close(release)
	if id := <-started; id != "extra" { // its turn, once a place is free
		t.Fatalf("%s started", id)
	}
}
