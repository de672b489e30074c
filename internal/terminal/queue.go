package terminal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The line. A shell runs one command at a time; a command sent while
// another runs waits for it in line, in the order the calls arrived
// (parallel tool calls of one model turn land here together). A call
// waits at most its own timeout: past it, it gets a BusyError and runs
// nothing. A call whose context ends while it waits (the client went
// away) leaves the line at once, and those behind it move up.
//
// One command never holds the line for ever without a caller: a command
// blocked reading its input, whose call has already returned saying so,
// waits for an answer (send_input) that only its caller can give. The
// call at the head of the line then gets an InputError at once instead
// of waiting out its timeout behind it.

// ticket is a place in the shell's line (compared by identity).
type ticket struct {
	arrived time.Time // when the call came: before or after a prompt was reported
}

// BusyError is the answer of a command that waited its whole wait in
// line: it ran nothing. It matches ErrBusy.
type BusyError struct {
	Command string        // the command running (its first line, cut)
	Running time.Duration // since when it runs
	Waited  time.Duration // how long this call waited
	Behind  int           // other calls that were ahead of this one
}

func (e *BusyError) Error() string {
	ahead := ""
	if e.Behind > 0 {
		ahead = fmt.Sprintf(" and %d other call(s) waiting before it", e.Behind)
	}
	return fmt.Sprintf("%s: another call's command (%s) has run for %s%s; this call waited %s in line and ran nothing. "+
		"Call again when it is done (a longer timeout_ms waits longer), or run this with start_process, or in another session, beside it",
		ErrBusy, e.Command, round(e.Running), ahead, round(e.Waited))
}

// Unwrap makes a BusyError match ErrBusy.
func (e *BusyError) Unwrap() error { return ErrBusy }

// ErrAwaitingInput means the shell's command is blocked reading input and
// its call has returned: only an answer (send_input) moves it on.
var ErrAwaitingInput = errors.New("the session's shell is held by a command waiting for input")

// InputError is the answer of a command sent while the shell's command
// waits for input that its call was told about. It matches
// ErrAwaitingInput and ErrBusy.
type InputError struct {
	Command string
	Since   time.Duration // since when the command runs
}

func (e *InputError) Error() string {
	return fmt.Sprintf("%s: %s has run for %s and is blocked reading its input, so this command did not run. "+
		"Answer it with send_input (its result follows); send_input \"\\u0003\" stops it; then send this again",
		ErrAwaitingInput, e.Command, round(e.Since))
}

// Is makes an InputError match ErrAwaitingInput and ErrBusy.
func (e *InputError) Is(target error) bool { return target == ErrAwaitingInput || target == ErrBusy }

// errLineWait is the cause of a wait in line that ran out.
var errLineWait = errors.New("the wait in line ran out")

// lineUpLocked waits in line (at most wait) for the shell to be free,
// then claims it for this call: on nil the shell is running and the
// caller owns it. s.mu is held (released while waiting).
//
// A command left waiting for input (its call returned saying so, and
// nobody answers) is interrupted for a call that came after that answer:
// the caller was told that the next command would do so, and moved on.
// abandoned names it, for the result. A call that was already in line
// then (sent in the same turn, before its caller could read the prompt)
// is refused at once with an InputError instead.
func (s *Shell) lineUpLocked(ctx context.Context, wait time.Duration) (abandoned string, err error) {
	t := &ticket{arrived: time.Now()}
	s.queue = append(s.queue, t)
	s.broadcastLocked() // who watches the line (tests) sees it grow
	defer func() {
		s.queue = slices.DeleteFunc(s.queue, func(q *ticket) bool { return q == t })
		s.broadcastLocked() // the next one may be at the head now
	}()
	wctx, cancel := context.WithTimeoutCause(ctx, wait, errLineWait)
	defer cancel()
	start := time.Now()
	for {
		err := s.waitLocked(wctx, func() bool {
			return s.queue[0] == t && (s.state != StateRunning || s.strandedLocked())
		})
		if err != nil {
			if errors.Is(err, errLineWait) {
				return "", s.busyLocked(time.Since(start), slices.Index(s.queue, t))
			}
			return "", err
		}
		if s.state == StateRunning {
			r := s.cur
			if t.arrived.Before(r.strandedAt) {
				return "", &InputError{Command: r.command, Since: time.Since(r.start)}
			}
			// Marked under mu: an answer (SendInput) that comes now is
			// refused instead of being written to a command being stopped.
			r.abandoned = true
			s.mu.Unlock()
			s.interrupt(r)
			s.mu.Lock()
			abandoned = r.command
			if err := s.waitLocked(wctx, func() bool { return s.cur != r || s.state != StateRunning }); err != nil {
				if errors.Is(err, errLineWait) {
					return "", s.busyLocked(time.Since(start), slices.Index(s.queue, t))
				}
				return "", err
			}
			continue
		}
		if err := s.claimLocked(ctx); !errors.Is(err, ErrBusy) {
			return abandoned, err
		}
	}
}

// strandedLocked reports whether the running command waits for input
// that no caller is waiting to give: its call returned saying so, and no
// send_input has come since.
func (s *Shell) strandedLocked() bool {
	return s.cur != nil && s.cur.awaiting && s.cur.waiters == 0
}

// busyLocked is the error of a call whose wait in line ran out.
func (s *Shell) busyLocked(waited time.Duration, ahead int) error {
	e := &BusyError{Waited: waited, Behind: ahead, Command: "a command"}
	if s.cur != nil {
		e.Command, e.Running = s.cur.command, time.Since(s.cur.start)
	}
	return e
}

// quoteCommand is how an error names a command: its first line, cut at
// 60 characters, in backquotes.
func quoteCommand(c string) string {
	c = strings.TrimSpace(c)
	more := false
	if i := strings.IndexByte(c, '\n'); i >= 0 {
		c, more = c[:i], true
	}
	if r := []rune(c); len(r) > 60 {
		c, more = string(r[:60]), true
	}
	if more {
		c += "…"
	}
	return "`" + c + "`"
}

// round is d to a tenth of a second (a millisecond under one).
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// WaitLine waits until a command runs and at least n more calls wait in
// line behind it, or the shell is closing (for a caller that orders its
// work after the calls it sent: the tests).
func (s *Shell) WaitLine(ctx context.Context, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitLocked(ctx, func() bool { return s.state >= StateRunning && len(s.queue) >= n })
}
