package sandbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// holds are how long the starts of runs in a directory take (as on a
// loaded machine), for the tests that set them (holdStarts).
var (
	holds     sync.Map // Spec.Dir → time.Duration
	holdsOnce sync.Once
)

// holdStarts makes each start of a run in dir take hold before its box
// is made or claimed, or until the run's context ends, whichever is
// first.
func holdStarts(t *testing.T, dir string, hold time.Duration) {
	holdsOnce.Do(func() {
		h := func(ctx context.Context, spec *Spec) {
			d, ok := holds.Load(spec.Dir)
			if !ok {
				return
			}
			select {
			case <-time.After(d.(time.Duration)):
			case <-ctx.Done():
			}
		}
		startHook.Store(&h)
	})
	holds.Store(dir, hold)
	t.Cleanup(func() { holds.Delete(dir) })
}

// A run's timeout counts from its program's start: a start that takes
// longer than the timeout (a box made on a loaded machine) neither fails
// the start ("canceled while the sandbox was starting", as when the
// caller's deadline bounded both) nor shortens the program's time; the
// timeout still ends a program that runs past it. In a session's box and
// in a box of its own.
func TestTimeoutCountsFromTheProgramsStart(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	for _, session := range []string{"clock-session", ""} {
		name := "own-box"
		if session != "" {
			name = "session-box"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const timeout = 4 * time.Second
			dir := t.TempDir()
			holdStarts(t, dir, timeout+500*time.Millisecond)
			var out bytes.Buffer
			exit, err := sb.Run(testCtx(t), &Spec{Args: []string{"sh", "-c", "echo ran"}, Dir: dir, Session: session,
				Stdout: &out, Stderr: &out, Timeout: timeout})
			if err != nil || exit.TimedOut || exit.Canceled || exit.Code != 0 || out.String() != "ran\n" {
				t.Fatalf("a start longer than the timeout: err %v, exit %+v, output %q; want the program's whole run", err, exit, out.String())
			}
			holdStarts(t, dir, 200*time.Millisecond)
			out.Reset()
			exit, err = sb.Run(testCtx(t), &Spec{Args: []string{"sleep", "1000"}, Dir: dir, Session: session,
				Stdout: &out, Stderr: &out, Timeout: 100 * time.Millisecond})
			if err != nil || !exit.TimedOut || exit.Canceled {
				t.Fatalf("a program past its timeout: err %v, exit %+v, output %q; want it timed out", err, exit, out.String())
			}
		})
	}
}

// The start has a bound of its own, Options.StartTimeout, with its own
// error: not a timeout of the run, not the caller's cancel.
func TestStartTimeoutIsItsOwnError(t *testing.T) {
	t.Parallel()
	var reasons []string
	sb, err := New(&Options{SessionBoxes: true, StartTimeout: 50 * time.Millisecond, OnFailure: func(r string) { reasons = append(reasons, r) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.CloseBoxes)
	dir := t.TempDir()
	holdStarts(t, dir, time.Hour) // until the start's bound ends the run's context
	ctx := testCtx(t)
	_, err = sb.Run(ctx, &Spec{Args: []string{"true"}, Dir: dir, Session: "slow", Timeout: time.Hour})
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "did not start within 50ms") || ctx.Err() != nil {
		t.Fatalf("err %v (ctx %v), want a StartError naming the start's bound", err, ctx.Err())
	}
	if len(reasons) != 1 || reasons[0] != FailStartTimeout {
		t.Fatalf("reasons %q, want [%s]", reasons, FailStartTimeout)
	}
}
