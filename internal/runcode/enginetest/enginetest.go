// Package enginetest is the contract every runcode.Engine keeps, as one
// suite that each engine package runs over its engines (contract_test.go
// there): output captured per stream, exit codes, a timeout that kills and
// keeps the output before it, a cancel that interrupts, huge output cut to
// the limit and spilled whole, bytes that are not UTF-8 shown as valid
// UTF-8 and kept raw, the engine's state rule (kept between runs of a
// session, or not), and an engine still usable after a timeout.
//
// The suite runs each engine through a runcode.Runner whose only language
// is that engine, so that it checks what a caller of run_code sees, with
// the runner's capture, spill and timeout in the path. An engine whose
// Probe fails here (no python3, a build without the embedded interpreter)
// is skipped with the probe's reason.
//
// A new engine gets the suite by declaring, in Caps, the snippets of its
// language for each check; a check whose snippet is empty is skipped with
// the reason given in Caps.Missing (or a default).
package enginetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
	"github.com/quro-dev/quro/internal/session"
)

// Caps declares what an engine supports and how its language spells each
// check. Every snippet is a complete program for the engine.
type Caps struct {
	// Lang is the request's language name (the runner resolves nothing
	// else), e.g. "python", "js", "ts", "bash".
	Lang string
	// Stateful engines keep a session's variables between runs (the
	// embedded Python worker); stateless ones start fresh every run.
	Stateful bool

	// Print writes "contract-out\n" to stdout and "contract-err\n" to
	// stderr, and ends normally (exit code 0).
	Print string
	// Exit writes "bye\n" to stdout and ends with exit code ExitCode (not
	// 0; an engine without exit(N) ends with its failure code).
	Exit     string
	ExitCode int
	// Loop writes "before-loop\n" to stdout (flushed), then never ends.
	Loop string
	// LoopTimeout is the time budget of the run of Loop (default 3 s): an
	// engine that starts a process per run (a JVM) spends part of it
	// starting, which takes seconds on a loaded machine.
	LoopTimeout time.Duration
	// Huge writes the numbers 0 to HugeCount-1 to stdout, one per line.
	Huge string
	// BadUTF8 writes output with bytes that are not valid UTF-8 between
	// "a" and "b" (or, in a language whose strings cannot hold such bytes,
	// the nearest thing: a lone surrogate); BadUTF8Raw is exactly the bytes
	// that reach stdout. When the engine itself replaces what is not UTF-8
	// (BadUTF8Raw is valid UTF-8, with U+FFFD), the result must show it as
	// it is.
	BadUTF8    string
	BadUTF8Raw []byte
	// SetVar sets a variable to 42; GetVar prints its value, or "unset"
	// when there is no such variable (both on stdout, one line).
	SetVar, GetVar string

	// Missing says, per check name, why the engine has no snippet for it.
	Missing map[string]string

	// CompileTimeout is the budget of the build stage of an engine that
	// builds before it runs (a runcode.Builder: the toolchain engine),
	// apart from each check's run budget; 0 is runcode's default. The
	// snippets are built like a caller's code, so a cold build (Go
	// compiling its standard library into a fresh session's cache) is
	// part of a check, but the time the checks measure (the timeout
	// check's 3 s) is the run's alone.
	CompileTimeout time.Duration
}

// HugeCount is how many lines Caps.Huge prints: about 590 KB, far over the
// suite's 1 KiB stdout limit.
const HugeCount = 100000

// Limit is the stdout and stderr limit of the suite's runner.
const Limit = 1 << 10

// Target is the engine under test and how to make a session for it. The
// session must have its workspace and tmp directories; NewSession may
// register cleanups (stopping a session's worker) with t.
type Target struct {
	Engine     runcode.Engine
	NewSession func(t *testing.T) *session.Session
	// Required: the engine must run on every machine make test runs on
	// (its parts are in TEST_PKGS or in the binary), so a failed Probe
	// fails the suite instead of skipping it.
	Required bool
}

// Run runs the contract over target, each check a subtest.
func Run(t *testing.T, target Target, caps Caps) {
	t.Helper()
	e := target.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := e.Probe(ctx)
	cancel()
	if err != nil {
		if target.Required {
			t.Fatalf("%s cannot run here, but every test machine has what it needs: %v", e.Name(), err)
		}
		t.Skipf("%s cannot run here: %v", e.Name(), err)
	}
	s := &suite{target: target, caps: caps, runner: runcode.New([]runcode.Language{
		{Name: caps.Lang, Runs: true, Chain: []runcode.Engine{e}},
	}, &runcode.Options{MaxStdout: Limit, MaxStderr: Limit, DefaultCompileTimeout: caps.CompileTimeout})}
	for _, c := range []struct {
		name    string
		snippet string
		check   func(t *testing.T)
	}{
		{"output", caps.Print, s.output},
		{"exit code", caps.Exit, s.exitCode},
		{"timeout", caps.Loop, s.timeout},
		{"cancel", caps.Loop, s.cancel},
		{"huge output", caps.Huge, s.huge},
		{"bad UTF-8", caps.BadUTF8, s.badUTF8},
		{"state", caps.SetVar + caps.GetVar, s.state},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.snippet == "" {
				why := caps.Missing[c.name]
				if why == "" {
					why = "no snippet declared in Caps"
				}
				t.Skipf("%s: %s", e.Name(), why)
			}
			c.check(t)
		})
	}
}

type suite struct {
	target Target
	caps   Caps
	runner *runcode.Runner
}

// run runs code in sess with timeout, and fails the test on an invalid
// request (the suite's requests are all valid).
func (s *suite) run(t *testing.T, ctx context.Context, sess *session.Session, code string, timeout time.Duration) *runcode.Result {
	t.Helper()
	res, err := s.runner.Run(ctx, runcode.Input{Code: code, Lang: s.caps.Lang, Session: sess, Timeout: timeout})
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	if res.Engine != s.target.Engine.Name() {
		t.Fatalf("run %q: engine %q answered, want %q (error %q)", code, res.Engine, s.target.Engine.Name(), res.Error)
	}
	return res
}

func dump(r *runcode.Result) string {
	return fmt.Sprintf("exit %d timed_out %v interrupted %v truncated %v error %q stdout %q stderr %q notes %q",
		r.ExitCode, r.TimedOut, r.Interrupted, r.Truncated, r.Error, r.Stdout, r.Stderr, r.Notes)
}

// output: each stream is captured apart, whole, and a normal end is exit
// code 0 with no error.
func (s *suite) output(t *testing.T) {
	sess := s.target.NewSession(t)
	r := s.run(t, context.Background(), sess, s.caps.Print, time.Minute)
	if r.Stdout != "contract-out\n" || r.Stderr != "contract-err\n" || r.ExitCode != 0 || r.Error != "" ||
		r.TimedOut || r.Interrupted || r.Truncated || r.StdoutBytes != 13 || r.StderrBytes != 13 {
		t.Errorf("print: %s", dump(r))
	}
}

// exitCode: the program's exit code is the result's, with its output, and
// a failing program is not an engine error.
func (s *suite) exitCode(t *testing.T) {
	if s.caps.ExitCode == 0 {
		t.Fatal("Caps.ExitCode must be the non-zero code Exit ends with")
	}
	sess := s.target.NewSession(t)
	r := s.run(t, context.Background(), sess, s.caps.Exit, time.Minute)
	if r.ExitCode != s.caps.ExitCode || r.Stdout != "bye\n" || r.Error != "" || r.TimedOut || r.Interrupted {
		t.Errorf("exit: want exit %d and stdout \"bye\\n\"; %s", s.caps.ExitCode, dump(r))
	}
}

// timeout: a run past its time budget is stopped and says so, keeps the
// output it wrote before, and the engine (and the session) runs the next
// code normally.
func (s *suite) timeout(t *testing.T) {
	sess := s.target.NewSession(t)
	// A first run starts whatever the engine starts per session (a worker),
	// so that the budget below is spent on the loop, not on a cold start:
	// the loop must have printed before the budget ends.
	s.warm(t, sess)
	budget := s.caps.LoopTimeout
	if budget == 0 {
		budget = 3 * time.Second
	}
	// The budget is the engine's to keep (the runner's deadline is a
	// backstop): the loop never ends by itself. Whether it printed within
	// the budget is the machine's load, not the engine's doing.
	r := s.run(t, context.Background(), sess, s.caps.Loop, budget)
	if !r.TimedOut || !r.Interrupted || !strings.Contains(r.Error, "timed out") {
		t.Errorf("loop past its timeout: want timed_out, interrupted and an error saying \"timed out\"; %s", dump(r))
	}
	// A timeout keeps the output written before it. The deadline passes
	// once the loop printed, an event: at a load of 40 and more a 3 s
	// budget passed before an interpreter (ruby) had printed.
	ctx := sandboxtest.NewExpiring(context.Background())
	var seen bytes.Buffer
	var mu sync.Mutex
	ctx.Context = runcode.WithOutput(context.Background(), func(stream string, p []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stream == "stdout" {
			seen.Write(p)
			if strings.Contains(seen.String(), "before-loop\n") {
				ctx.Expire()
			}
		}
	})
	r = s.run(t, ctx, sess, s.caps.Loop, time.Minute)
	if !r.TimedOut || !r.Interrupted || !strings.HasPrefix(r.Stdout, "before-loop\n") {
		t.Errorf("loop past its deadline lost the output written before: %s", dump(r))
	}
	r = s.run(t, context.Background(), sess, s.caps.Print, time.Minute)
	if r.Stdout != "contract-out\n" || r.ExitCode != 0 || r.Error != "" {
		t.Errorf("run after a timeout: %s", dump(r))
	}
}

// warm runs Print once in sess.
func (s *suite) warm(t *testing.T, sess *session.Session) {
	t.Helper()
	if r := s.run(t, context.Background(), sess, s.caps.Print, time.Minute); r.Stdout != "contract-out\n" {
		t.Fatalf("warm-up run: %s", dump(r))
	}
}

// cancel: a caller that goes away (its context canceled) interrupts the
// run, which is not a timeout; the output before is kept. The cancel is
// done on the loop's first output, an event, not after a delay.
func (s *suite) cancel(t *testing.T) {
	sess := s.target.NewSession(t)
	s.warm(t, sess)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen bytes.Buffer
	var mu sync.Mutex
	ctx = runcode.WithOutput(ctx, func(stream string, p []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stream == "stdout" {
			seen.Write(p)
			if strings.Contains(seen.String(), "before-loop\n") {
				cancel()
			}
		}
	})
	// The budget is a minute: an engine that ignores the cancel fails here
	// as timed out, rather than hanging the suite.
	r := s.run(t, ctx, sess, s.caps.Loop, time.Minute)
	if !r.Interrupted || r.TimedOut || r.Error == "" {
		t.Errorf("canceled loop: want interrupted, not timed out, with an error; %s", dump(r))
	}
	if !strings.HasPrefix(r.Stdout, "before-loop\n") {
		t.Errorf("canceled loop lost the output written before: %s", dump(r))
	}
	r = s.run(t, context.Background(), sess, s.caps.Print, time.Minute)
	if r.Stdout != "contract-out\n" || r.ExitCode != 0 || r.Error != "" {
		t.Errorf("run after a cancel: %s", dump(r))
	}
}

// huge: output far over the limit is cut to about the limit in the
// result, and the whole stream is in the spill file it names.
func (s *suite) huge(t *testing.T) {
	sess := s.target.NewSession(t)
	r := s.run(t, context.Background(), sess, s.caps.Huge, 5*time.Minute)
	var want bytes.Buffer
	for i := range HugeCount {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if r.ExitCode != 0 || r.Error != "" || !r.Truncated || r.StdoutBytes != int64(want.Len()) {
		t.Fatalf("huge output: want exit 0, truncated, stdout_bytes %d; exit %d truncated %v stdout_bytes %d error %q stderr %q",
			want.Len(), r.ExitCode, r.Truncated, r.StdoutBytes, r.Error, r.Stderr)
	}
	// The cut view is the head, a marker line and the tail.
	if len(r.Stdout) > Limit+200 || !strings.HasPrefix(r.Stdout, "0\n1\n2\n") ||
		!strings.HasSuffix(r.Stdout, fmt.Sprintf("%d\n", HugeCount-1)) || !strings.Contains(r.Stdout, "cut from the middle") {
		t.Errorf("huge output view (%d bytes, limit %d): %.300q … %q", len(r.Stdout), Limit, r.Stdout, r.Stdout[max(0, len(r.Stdout)-100):])
	}
	if r.StdoutFile == "" {
		t.Fatal("huge output: no stdout_file; the cut output is lost")
	}
	got, err := os.ReadFile(filepath.Join(sess.Workspace(), r.StdoutFile))
	if err != nil {
		t.Fatalf("huge output spill: %v", err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("huge output spill %s: %d bytes, want %d (the whole stream)", r.StdoutFile, len(got), want.Len())
	}
}

// badUTF8: bytes that are not UTF-8 do not break the run; the result's
// text is valid UTF-8 that shows them (\xNN), a note says so, and the raw
// bytes are kept in the file it names.
func (s *suite) badUTF8(t *testing.T) {
	sess := s.target.NewSession(t)
	r := s.run(t, context.Background(), sess, s.caps.BadUTF8, time.Minute)
	if r.ExitCode != 0 || r.Error != "" {
		t.Fatalf("bad UTF-8: %s", dump(r))
	}
	if utf8.Valid(s.caps.BadUTF8Raw) {
		// The engine replaced the bad sequence before it reached stdout.
		if !strings.Contains(string(s.caps.BadUTF8Raw), "\uFFFD") || r.Stdout != string(s.caps.BadUTF8Raw) || r.StdoutFile != "" {
			t.Errorf("bad UTF-8 replaced by the engine: stdout %q file %q, want %q and no file", r.Stdout, r.StdoutFile, s.caps.BadUTF8Raw)
		}
		return
	}
	if !utf8.ValidString(r.Stdout) || !strings.HasPrefix(r.Stdout, "a") || !strings.Contains(r.Stdout, `\x`) || !strings.Contains(r.Stdout, "b") {
		t.Errorf("bad UTF-8: stdout %q, want valid UTF-8 with the bad bytes as \\xNN", r.Stdout)
	}
	if r.StdoutBytes != int64(len(s.caps.BadUTF8Raw)) {
		t.Errorf("bad UTF-8: stdout_bytes %d, want %d", r.StdoutBytes, len(s.caps.BadUTF8Raw))
	}
	noted := false
	for _, n := range r.Notes {
		noted = noted || strings.Contains(n, "not UTF-8")
	}
	if !noted || r.StdoutFile == "" {
		t.Fatalf("bad UTF-8: no note or no raw file; %s file %q", dump(r), r.StdoutFile)
	}
	raw, err := os.ReadFile(filepath.Join(sess.Workspace(), r.StdoutFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, s.caps.BadUTF8Raw) {
		t.Errorf("bad UTF-8: raw file holds %q, want %q", raw, s.caps.BadUTF8Raw)
	}
}

// state: a stateful engine keeps a variable between two runs of one
// session and not in another session; a stateless engine keeps nothing.
func (s *suite) state(t *testing.T) {
	sess := s.target.NewSession(t)
	if r := s.run(t, context.Background(), sess, s.caps.SetVar, time.Minute); r.ExitCode != 0 || r.Error != "" {
		t.Fatalf("set variable: %s", dump(r))
	}
	r := s.run(t, context.Background(), sess, s.caps.GetVar, time.Minute)
	want := "unset\n"
	if s.caps.Stateful {
		want = "42\n"
	}
	if r.Stdout != want || r.ExitCode != 0 {
		t.Errorf("stateful=%v: the next run of the session prints %q, want %q; %s", s.caps.Stateful, r.Stdout, want, dump(r))
	}
	other := s.target.NewSession(t)
	if r := s.run(t, context.Background(), other, s.caps.GetVar, time.Minute); r.Stdout != "unset\n" {
		t.Errorf("another session sees the variable: %s", dump(r))
	}
}
