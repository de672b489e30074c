package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// runClock bounds a run twice, each bound counted on its own: its start
// (the box made or claimed, the init child up to the program's exec) by
// Options.StartTimeout, then its program by Spec.Timeout. A timeout that
// also counted the making of the box ended short runs on a loaded
// machine before their program began ("canceled while the sandbox was
// starting"), and the program of one that began late got less than its
// time. ctx is the run's context: the caller's, ended by either bound
// with its own cause.
type runClock struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

// startTimeout is the cause of a run's context when its start took
// longer than its bound.
type startTimeout struct{ limit time.Duration }

func (e startTimeout) Error() string {
	return fmt.Sprintf("the sandbox did not start within %s (the machine is overloaded, or the server cannot make boxes)", e.limit)
}

// errRunTimeout is the cause of a run's context when Spec.Timeout passed.
var errRunTimeout = errors.New("the run's timeout passed")

// startHook, when set (by tests), is called at the start of each run
// with the run's context and spec, before its box is made or claimed: it
// holds the start as a loaded machine does.
var startHook atomic.Pointer[func(ctx context.Context, spec *Spec)]

func newRunClock(ctx context.Context, limit time.Duration) *runClock {
	c := &runClock{}
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	c.timer = time.AfterFunc(limit, func() { c.cancel(startTimeout{limit}) })
	return c
}

// started ends the start's bound and starts the run's timeout (none when
// timeout <= 0). False: the start's bound passed first.
func (c *runClock) started(timeout time.Duration) bool {
	if !c.timer.Stop() {
		return false
	}
	if timeout > 0 {
		c.timer = time.AfterFunc(timeout, func() { c.cancel(errRunTimeout) })
	}
	return true
}

// stop releases the clock once the run ended (nil: a process started
// without one).
func (c *runClock) stop() {
	if c == nil {
		return
	}
	c.timer.Stop()
	c.cancel(context.Canceled)
}

// timedOut says whether the run's context ended by a timeout: the run's
// own or the caller's deadline.
func timedOut(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), errRunTimeout)
}

// canceledWhileStarting words a start that ctx ended.
func canceledWhileStarting(ctx context.Context) string {
	var st startTimeout
	if errors.As(context.Cause(ctx), &st) {
		return st.Error()
	}
	return "canceled while the sandbox was starting"
}
