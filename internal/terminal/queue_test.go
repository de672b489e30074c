package terminal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gated runs, in s, a command that blocks until the test opens the
// workspace's fifo "gate" for writing, and returns its result's channel
// once the command runs.
func gated(t *testing.T, s *Shell, ws string) (release func(), done <-chan *Result) {
	t.Helper()
	exec(t, s, "mkfifo gate", ExecOptions{})
	c := make(chan *Result, 1)
	go func() {
		res, err := s.Exec(context.Background(), "read l <gate; echo first >>order", ExecOptions{Timeout: time.Minute})
		if err != nil {
			t.Errorf("the first command: %v", err)
		}
		c <- res
	}()
	waitShell(t, s, func() bool { return s.state == StateRunning })
	return func() {
		if err := os.WriteFile(filepath.Join(ws, "gate"), []byte("go\n"), 0); err != nil {
			t.Error(err)
		}
	}, c
}

// waitShell waits until ok holds under the shell's lock.
func waitShell(t *testing.T, s *Shell, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.waitLocked(ctx, ok); err != nil {
		t.Fatalf("the shell never got there: %v", err)
	}
}

// TestCallsWaitInLineInArrivalOrder: commands sent while one runs wait for
// it and then run, one by one, in the order they came.
func TestCallsWaitInLineInArrivalOrder(t *testing.T) {
	s, ws, _ := newShell(t, nil)
	release, first := gated(t, s, ws)
	results := make(chan *Result, 2)
	for i, name := range []string{"second", "third"} {
		go func() {
			res, err := s.Exec(context.Background(), "echo "+name+" >>order; echo "+name, ExecOptions{Timeout: time.Minute})
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			results <- res
		}()
		waitShell(t, s, func() bool { return len(s.queue) == i+1 })
	}
	release()
	if res := <-first; res == nil || res.ExitCode != 0 {
		t.Fatalf("first: %+v", res)
	}
	for range 2 {
		if res := <-results; res == nil || res.ExitCode != 0 || res.Running {
			t.Fatalf("%+v", res)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "order")); string(b) != "first\nsecond\nthird\n" {
		t.Fatalf("order %q", b)
	}
}

// TestBusyErrorNamesWhatRuns: a call whose wait in line runs out runs
// nothing, and its error says what runs and what to do, never to
// interrupt the other call's command. A call whose caller goes away
// leaves the line.
func TestBusyErrorNamesWhatRuns(t *testing.T) {
	s, ws, _ := newShell(t, nil)
	release, first := gated(t, s, ws)
	_, err := s.Exec(context.Background(), "echo late >>order", ExecOptions{Timeout: 300 * time.Millisecond})
	var be *BusyError
	if !errors.As(err, &be) || !errors.Is(err, ErrBusy) {
		t.Fatalf("want a BusyError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"`read l <gate; echo first >>order`", "ran nothing", "start_process"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	for _, bad := range []string{`\u0003`, "interrupt", "Ctrl-C"} {
		if strings.Contains(msg, bad) {
			t.Errorf("%q advises %q", msg, bad)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := s.Exec(ctx, "echo gone >>order", ExecOptions{Timeout: time.Minute})
		gone <- err
	}()
	waitShell(t, s, func() bool { return len(s.queue) == 1 })
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a canceled wait: %v", err)
	}
	waitShell(t, s, func() bool { return len(s.queue) == 0 })
	release()
	<-first
	if res := exec(t, s, "cat order", ExecOptions{}); res.Output != "first\n" {
		t.Fatalf("a call that ran nothing ran: %q", res.Output)
	}
}

// TestCommandWaitingForInputHoldsNoLine: a command blocked on input,
// whose call returned saying so, is answered with send_input and ends;
// one left unanswered is interrupted by the next command, which runs and
// says what it interrupted.
func TestCommandWaitingForInputHoldsNoLine(t *testing.T) {
	s, _, _ := newShell(t, nil)
	if res := exec(t, s, "read x; echo got $x", ExecOptions{}); !res.WaitingForInput || !strings.Contains(res.Text(), "send_input") {
		t.Fatalf("%+v", res)
	}
	if err := s.SendInput("v\n"); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Wait(context.Background(), time.Minute); err != nil || res.Output != "got v\n" {
		t.Fatalf("%+v %v", res, err)
	}
	if res := exec(t, s, "X=kept; read y; echo got $y", ExecOptions{}); !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	res := exec(t, s, "echo next $X", ExecOptions{})
	// A soft interrupt keeps what the command set, as a Ctrl-C does.
	if res.Output != "next kept\n" || res.ExitCode != 0 || res.Abandoned != "`X=kept; read y; echo got $y`" {
		t.Fatalf("the next command after an unanswered prompt: %+v", res)
	}
	if txt := res.Text(); !strings.Contains(txt, "interrupted `X=kept; read y; echo got $y`, which waited for input") {
		t.Fatalf("%q", txt)
	}
	if res := exec(t, s, "echo after", ExecOptions{}); res.Output != "after\n" || res.Abandoned != "" {
		t.Fatalf("%+v", res)
	}
}

// TestCallInLineIsToldOfInput: a call already waiting in line when the
// command before it starts waiting for input is told so, without waiting
// out its timeout.
func TestCallInLineIsToldOfInput(t *testing.T) {
	s, ws, _ := newShell(t, nil)
	exec(t, s, "mkfifo gate", ExecOptions{})
	first := make(chan *Result, 1)
	go func() {
		res, _ := s.Exec(context.Background(), "read l <gate; read x", ExecOptions{Timeout: time.Minute})
		first <- res
	}()
	waitShell(t, s, func() bool { return s.state == StateRunning })
	second := make(chan error, 1)
	go func() {
		_, err := s.Exec(context.Background(), "echo second", ExecOptions{Timeout: 10 * time.Minute})
		second <- err
	}()
	waitShell(t, s, func() bool { return len(s.queue) == 1 })
	if err := os.WriteFile(filepath.Join(ws, "gate"), []byte("go\n"), 0); err != nil {
		t.Fatal(err)
	}
	if res := <-first; res == nil || !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	if err := <-second; !errors.Is(err, ErrAwaitingInput) {
		t.Fatalf("want ErrAwaitingInput, got %v", err)
	}
	s.SendInput("\n")
	if _, err := s.Wait(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
}
