package python

import (
	"context"
	"errors"
	"strings"
	"testing"

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
