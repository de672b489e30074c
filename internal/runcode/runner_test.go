package runcode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/session"
)

// scripted is an engine whose behaviour each test sets: the chain logic is
// tested here; the real engines are tested in their own packages and in app.
type scripted struct {
	name     string
	probe    error
	output   string
	err      error
	ran      *[]string
	exitCode int
}

func (s *scripted) Name() string                    { return s.name }
func (s *scripted) Probe(ctx context.Context) error { return s.probe }
func (s *scripted) Run(ctx context.Context, req *Request) (*Result, error) {
	*s.ran = append(*s.ran, s.name)
	fmt.Fprint(req.Stdout, s.output)
	if s.err != nil {
		return nil, s.err
	}
	return &Result{ExitCode: s.exitCode}, nil
}

func testSession(t *testing.T) *session.Session {
	return &session.Session{ID: "0123456789abcdef0123456789abcdef", Name: "t", Dir: t.TempDir()}
}

func TestChainFallsThroughOnlyOnSilentEngineFailure(t *testing.T) {
	for _, tc := range []struct {
		name       string
		chain      func(ran *[]string) []Engine
		wantRan    string
		wantEngine string
		wantError  string
		wantStdout string
		wantExit   int
	}{
		{
			name: "first works",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", output: "A", ran: r}, &scripted{name: "b", ran: r}}
			},
			wantRan: "a", wantEngine: "a", wantStdout: "A",
		},
		{
			name: "unavailable is skipped",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", probe: errors.New("absent"), ran: r}, &scripted{name: "b", output: "B", ran: r}}
			},
			wantRan: "b", wantEngine: "b", wantStdout: "B",
		},
		{
			name: "silent failure falls through",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", err: errors.New("crashed at start"), ran: r}, &scripted{name: "b", output: "B", ran: r}}
			},
			wantRan: "a,b", wantEngine: "b", wantStdout: "B",
		},
		{
			name: "failure after output stops the chain",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", output: "partial", err: errors.New("crashed"), ran: r}, &scripted{name: "b", ran: r}}
			},
			wantRan: "a", wantEngine: "a", wantStdout: "partial", wantError: "crashed", wantExit: -1,
		},
		{
			name: "user error is a result, not a fallback",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", output: "Traceback", exitCode: 1, ran: r}, &scripted{name: "b", ran: r}}
			},
			wantRan: "a", wantEngine: "a", wantStdout: "Traceback", wantExit: 1,
		},
		{
			name: "nothing works",
			chain: func(r *[]string) []Engine {
				return []Engine{&scripted{name: "a", probe: errors.New("absent"), ran: r}, &scripted{name: "b", err: errors.New("broken"), ran: r}}
			},
			wantRan: "b", wantEngine: "none", wantError: "a: absent; b: broken", wantExit: -1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran []string
			r := New([]Language{{Name: "py", Chain: tc.chain(&ran)}}, nil)
			res, err := r.Run(context.Background(), Input{Code: "x", Lang: "py", Session: testSession(t)})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(ran, ","); got != tc.wantRan {
				t.Errorf("ran %s, want %s", got, tc.wantRan)
			}
			if res.Engine != tc.wantEngine || res.Stdout != tc.wantStdout || res.ExitCode != tc.wantExit {
				t.Errorf("result %+v", res)
			}
			if !strings.Contains(res.Error, tc.wantError) || (tc.wantError == "") != (res.Error == "") {
				t.Errorf("error %q, want %q", res.Error, tc.wantError)
			}
		})
	}
}

// slowProbe is an engine whose first Probe gives no verdict before its
// bound ends (an engine warming up on a loaded machine), and whose later
// probes pass.
type slowProbe struct {
	scripted
	probes int
}

func (s *slowProbe) Probe(ctx context.Context) error {
	s.probes++
	if s.probes == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// A probe its bound cuts short is no verdict: the engine is tried, not
// skipped, and asked again on the next run, not taken out of the chain
// for the Runner's life (the embedded Python's probe, waiting for its
// first worker at a load of 100, timed out once and every later Python
// run went to the next tier, without the session's pip packages). A
// verdict is kept: an engine absent is probed once.
func TestProbeCutShortByItsBoundIsNoVerdict(t *testing.T) {
	var ran []string
	slow := &slowProbe{scripted: scripted{name: "a", output: "A", ran: &ran}}
	absent := &scripted{name: "x", probe: errors.New("absent"), ran: &ran}
	r := New([]Language{{Name: "py", Chain: []Engine{slow, &scripted{name: "b", output: "B", ran: &ran}}},
		{Name: "other", Chain: []Engine{absent, &scripted{name: "c", output: "C", ran: &ran}}}}, nil)
	r.probeTimeout = time.Millisecond
	for i := range 2 {
		res, err := r.Run(context.Background(), Input{Code: "x", Lang: "py", Session: testSession(t)})
		if err != nil {
			t.Fatal(err)
		}
		if res.Engine != "a" || res.Stdout != "A" || len(res.Notes) != 0 {
			t.Fatalf("run %d: %+v, want engine a's answer", i+1, res)
		}
	}
	if slow.probes != 2 {
		t.Errorf("the engine whose first probe was cut short was probed %d times, want 2 (once more, then kept)", slow.probes)
	}
	if _, err := r.Run(context.Background(), Input{Code: "x", Lang: "py", Session: testSession(t)}); err != nil || slow.probes != 2 {
		t.Errorf("a passed probe was asked again (%d probes): %v", slow.probes, err)
	}
	for range 2 {
		if res, err := r.Run(context.Background(), Input{Code: "x", Lang: "other", Session: testSession(t)}); err != nil || res.Engine != "c" {
			t.Fatalf("an absent engine's chain: %+v %v", res, err)
		}
	}
	if got := strings.Join(ran, ","); got != "a,a,a,c,c" {
		t.Errorf("ran %s, want a,a,a,c,c", got)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	var ran []string
	r := New([]Language{{Name: "python", Aliases: []string{"py"}, Chain: []Engine{&scripted{name: "a", ran: &ran}}}, {Name: "js"}},
		&Options{MaxCode: 1000})
	s := testSession(t)
	for _, tc := range []struct {
		in   Input
		want string
	}{
		{Input{Code: "", Session: s}, "code is empty"},
		{Input{Code: " \n\t", Session: s}, "code is empty"},
		{Input{Code: "x", Lang: "cobol", Session: s}, `unknown language "cobol"; supported: python, js`},
		{Input{Code: strings.Repeat("x", 1001), Session: s}, "the limit is 1000 bytes"},
		{Input{Code: "x", Timeout: -1, Session: s}, "timeout must not be negative"},
		{Input{Code: "x", Timeout: 1 << 62, Session: s}, "above the limit"},
	} {
		_, err := r.Run(context.Background(), tc.in)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.in.Lang, err, tc.want)
		}
	}
	if len(ran) != 0 {
		t.Errorf("an engine ran for a bad request: %v", ran)
	}
}

func TestAliasesAndCase(t *testing.T) {
	r := New([]Language{{Name: "python", Aliases: []string{"py", "py3"}}, {Name: "shell", Aliases: []string{"sh"}}}, nil)
	for in, want := range map[string]string{"": "python", "PY": "python", " py3 ": "python", "Shell": "shell", "sh": "shell"} {
		l, err := r.Resolve(in)
		if err != nil || l.Name != want {
			t.Errorf("Resolve(%q) = %v, %v; want %s", in, l, err, want)
		}
	}
}

func TestEmptyChainSaysWhy(t *testing.T) {
	r := New([]Language{{Name: "js", Missing: "not in this build"}}, nil)
	res, err := r.Run(context.Background(), Input{Code: "1", Lang: "js", Session: testSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != "no js engine is available: not in this build" || res.Engine != "none" {
		t.Errorf("%+v", res)
	}
}

func TestResultText(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  Result
		want string
	}{
		{"nothing", Result{}, "(no output)"},
		{"stdout", Result{Stdout: "hi\n"}, "hi"},
		{"stderr and exit", Result{Stdout: "a", Stderr: "boom\n", ExitCode: 2}, "a\n⚠️ stderr:\nboom\n⚠️ exit code 2"},
		{"engine error", Result{Error: "timed out after 1s", Stdout: "partial", ExitCode: 137, TimedOut: true},
			"⚠️ error: timed out after 1s\npartial"},
		{"cut", Result{Stdout: "x", StdoutFile: ".quro/outputs/r.stdout", StdoutBytes: 2048},
			"x\n(full stdout, 2.0 KiB: .quro/outputs/r.stdout)"},
		{"notes and artifacts", Result{Notes: []string{"not run"}, Artifacts: []Artifact{{Kind: "html", Name: "p.html", Data: "<p>"}}},
			"ℹ️ not run\n📎 html artifact \"p.html\" (3 bytes)"},
	} {
		if got := tc.res.Text(); got != tc.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tc.name, got, tc.want)
		}
	}
}

// TestFallbackAtRunTimeIsNoted: when a preferred engine cannot run this
// code here (bash missing from a session's rootfs) and the next one runs
// it, the result says so; a probe failure (the engine is absent from the
// server altogether) is not repeated on every run.
func TestFallbackAtRunTimeIsNoted(t *testing.T) {
	var ran []string
	r := New([]Language{{Name: "shell", Chain: []Engine{
		&scripted{name: "shell/bash", err: errors.New("the session's rootfs has no bash"), ran: &ran},
		&scripted{name: "shell/sh", output: "ok", ran: &ran},
	}}}, nil)
	res, err := r.Run(context.Background(), Input{Code: "echo ok", Lang: "shell", Session: testSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Engine != "shell/sh" || len(res.Notes) != 1 || res.Notes[0] != "ran with shell/sh because shell/bash: the session's rootfs has no bash" {
		t.Errorf("engine %s notes %q", res.Engine, res.Notes)
	}
	r = New([]Language{{Name: "shell", Chain: []Engine{
		&scripted{name: "shell/bash", probe: errors.New("absent"), ran: &ran},
		&scripted{name: "shell/sh", output: "ok", ran: &ran},
	}}}, nil)
	res, _ = r.Run(context.Background(), Input{Code: "echo ok", Lang: "shell", Session: testSession(t)})
	if res.Engine != "shell/sh" || len(res.Notes) != 0 {
		t.Errorf("probe failure: engine %s notes %q", res.Engine, res.Notes)
	}
}

// TestResultsNameNoMarkedHostPath: an engine error marked as naming the
// host's paths (hostpath.Error: a failed preparation of the embedded
// Python) is cut where run_code writes it into what a tenant reads (the
// result's error, a fallback's note, help's reason), and only there: the
// engine's status, the operator's, keeps it whole.
func TestResultsNameNoMarkedHostPath(t *testing.T) {
	const root = "/var/cache/quro/python"
	failed := hostpath.Error(fmt.Errorf("mkdir %s/tree: not a directory", root))
	var ran []string
	for _, tc := range []struct {
		name  string
		chain []Engine
		text  func(*Result) string
	}{
		{"the result's error", []Engine{&scripted{name: "a", output: "x", err: failed, ran: &ran}}, func(r *Result) string { return r.Error }},
		{"no engine ran", []Engine{&scripted{name: "a", probe: failed, ran: &ran}}, func(r *Result) string { return r.Error }},
		{"a fallback's note", []Engine{&scripted{name: "a", err: failed, ran: &ran}, &scripted{name: "b", output: "ok", ran: &ran}},
			func(r *Result) string { return strings.Join(r.Notes, "\n") }},
	} {
		r := New([]Language{{Name: "py", Chain: tc.chain}}, nil)
		res, err := r.Run(context.Background(), Input{Code: "x", Lang: "py", Session: testSession(t)})
		if err != nil {
			t.Fatal(err)
		}
		if got := tc.text(res); strings.Contains(got, root) || !strings.Contains(got, "mkdir tree: not a directory") {
			t.Errorf("%s: %q", tc.name, got)
		}
	}
	r := New([]Language{{Name: "py", Runs: true, Chain: []Engine{&scripted{name: "a", probe: failed, ran: &ran}}}}, nil)
	if _, shown := r.Runnable(); strings.Contains(shown["py"], root) || !strings.Contains(shown["py"], "mkdir tree") {
		t.Errorf("help's reason: %q", shown["py"])
	}
	if st := r.Engines(); len(st) != 1 || !strings.Contains(st[0].Reason, root) {
		t.Errorf("the operator's status: %+v", st)
	}
}

// preparing is a scripted engine with a one-time preparation: it records
// how long the context it is prepared under has left, and fails with
// prepErr.
type preparing struct {
	scripted
	prepErr error
	left    time.Duration
}

func (p *preparing) Prepare(ctx context.Context, req *Request) error {
	p.left = time.Duration(1<<63 - 1)
	if dl, ok := ctx.Deadline(); ok {
		p.left = time.Until(dl)
	}
	return p.prepErr
}

// An engine's preparation is waited for under PrepareTimeout, not the
// run's budget; a preparation that failed sends the run to the next
// tier, noted; one that the caller's context ended is the run's result.
func TestPreparationIsNotTheRunsBudget(t *testing.T) {
	var ran []string
	a := &preparing{scripted: scripted{name: "a", output: "A", ran: &ran}}
	r := New([]Language{{Name: "python", Chain: []Engine{a, &scripted{name: "b", output: "B", ran: &ran}}}}, &Options{PrepareTimeout: time.Hour})
	res, err := r.Run(context.Background(), Input{Code: "x", Lang: "python", Session: testSession(t), Timeout: time.Second})
	if err != nil || res.Engine != "a" || res.Stdout != "A" {
		t.Fatalf("prepared run: %v %+v", err, res)
	}
	if a.left <= time.Minute {
		t.Fatalf("prepared under %s, want the hour of PrepareTimeout", a.left)
	}

	a.prepErr = errors.New("extraction failed")
	res, _ = r.Run(context.Background(), Input{Code: "x", Lang: "python", Session: testSession(t)})
	if res.Engine != "b" || len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "a: extraction failed") {
		t.Fatalf("failed preparation: engine %s notes %q", res.Engine, res.Notes)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran = nil
	a.prepErr = fmt.Errorf("still being prepared: %w", context.Canceled)
	res, _ = r.Run(ctx, Input{Code: "x", Lang: "python", Session: testSession(t)})
	if res.Engine != "a" || res.ExitCode != -1 || !strings.Contains(res.Error, "did not start") || len(ran) != 0 {
		t.Fatalf("canceled preparation: ran %v, %+v", ran, res)
	}
}
