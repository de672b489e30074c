package app

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var cli = controller.Caller{Path: "cli", Scope: capability.ScopeAdmin}

func cliCall(t *testing.T, a *App, name string, args any) (*controller.Reply, error) {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return a.Controller.Call(context.Background(), cli, name, b)
}

type want struct {
	name   string
	labels []string
	value  float64
}

func expect(t *testing.T, f metricstest.Families, ws ...want) {
	t.Helper()
	for _, w := range ws {
		if got, ok := f.Value(w.name, w.labels...); !ok || got != w.value {
			t.Errorf("%s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.value)
		}
	}
}

func TestMetricsCountCallsAndRuns(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, in := range []RunCodeInput{
		{Lang: "sh", Code: "echo ok"},
		{Lang: "sh", Code: "echo ok again"},
		{Lang: "sh", Code: "exit 3"},
		{Lang: "sh", Code: "echo before; sleep 30", TimeoutMS: 2000}, // the budget covers the box's start too
	} {
		if _, err := cliCall(t, a, "run_code", in); err != nil {
			t.Fatalf("%q: %v", in.Code, err)
		}
	}
	if _, err := cliCall(t, a, "run_code", RunCodeInput{Lang: "cobol", Code: "x"}); err == nil {
		t.Fatal("cobol ran")
	}
	if _, err := cliCall(t, a, "no_such_capability", struct{}{}); err == nil {
		t.Fatal("an unknown capability answered")
	}
	if _, err := cliCall(t, a, "terminal_exec", TerminalExecInput{Command: "false"}); err != nil {
		t.Fatal(err)
	}

	f := metricstest.Scrape(t, a.Metrics.Handler())
	expect(t, f,
		want{"quro_calls_total", []string{"capability", "run_code", "path", "cli", "outcome", "ok"}, 3},
		want{"quro_calls_total", []string{"capability", "run_code", "path", "cli", "outcome", "timeout"}, 1},
		want{"quro_calls_total", []string{"capability", "run_code", "path", "cli", "outcome", "invalid_argument"}, 1},
		want{"quro_calls_total", []string{"capability", "unknown", "path", "cli", "outcome", "not_found"}, 1},
		want{"quro_calls_total", []string{"capability", "terminal_exec", "path", "cli", "outcome", "ok"}, 1},
		want{"quro_call_duration_seconds", []string{"capability", "run_code", "path", "cli"}, 5},
		want{"quro_runs_total", []string{"capability", "run_code", "engine", "shell/sh", "outcome", "ok"}, 2},
		want{"quro_runs_total", []string{"capability", "run_code", "engine", "shell/sh", "outcome", "exit_nonzero"}, 1},
		want{"quro_runs_total", []string{"capability", "run_code", "engine", "shell/sh", "outcome", "timeout"}, 1},
		want{"quro_runs_total", []string{"capability", "terminal_exec", "engine", "terminal", "outcome", "exit_nonzero"}, 1},
		want{"quro_sandbox_start_failures_total", []string{"reason", "init"}, 0},
	)
	if got := f.Sum("quro_runs_total"); got != 5 {
		t.Errorf("%v runs in all, want 5 (a refused call is not a run)", got)
	}
	// The timed-out run took at least its budget.
	h := f["quro_call_duration_seconds"]
	for _, m := range h.GetMetric() {
		if m.GetHistogram().GetSampleSum() < 0.3 && m.GetLabel()[0].GetValue() == "run_code" {
			t.Errorf("run_code durations sum to %vs, less than the timeout alone", m.GetHistogram().GetSampleSum())
		}
	}
}

func TestMetricsGaugesFollowSessions(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	f := metricstest.Scrape(t, a.Metrics.Handler())
	before, ok := f.Value("quro_sessions")
	if !ok {
		t.Fatal("no quro_sessions")
	}
	expect(t, f,
		want{"quro_terminals", []string{"kind", "shell"}, 0},
		want{"quro_terminals", []string{"kind", "pty"}, 0},
		want{"quro_python_workers", nil, 0},
	)

	if _, err := cliCall(t, a, "create_session", CreateSessionInput{Name: "m1"}); err != nil {
		t.Fatal(err)
	}
	m2, err := cliCall(t, a, "create_session", CreateSessionInput{Name: "m2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cliCall(t, a, "terminal_exec", TerminalExecInput{Session: "m1", Command: "true"}); err != nil {
		t.Fatal(err)
	}
	// read_screen starts nothing; the terminal WebSocket opens a PTY.
	if _, err := a.OpenPTY(context.Background(), m2.Output.(*SessionInfo).ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cliCall(t, a, "run_code", RunCodeInput{Session: "m1", Code: "x = 1"}); err != nil {
		t.Fatal(err)
	}
	workers := 0.0
	if wantPython == "python/embedded" {
		workers = 1 // the slim build has no resident workers
	}
	expect(t, metricstest.Scrape(t, a.Metrics.Handler()),
		want{"quro_sessions", nil, before + 2},
		want{"quro_terminals", []string{"kind", "shell"}, 1},
		want{"quro_terminals", []string{"kind", "pty"}, 1},
		want{"quro_python_workers", nil, workers},
	)

	for _, s := range []string{"m1", "m2"} {
		if _, err := cliCall(t, a, "destroy_session", SessionRef{Session: s}); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, metricstest.Scrape(t, a.Metrics.Handler()),
		want{"quro_sessions", nil, before},
		want{"quro_terminals", []string{"kind", "shell"}, 0},
		want{"quro_terminals", []string{"kind", "pty"}, 0},
		want{"quro_python_workers", nil, 0},
	)
}

func TestMetricsCountSandboxFailures(t *testing.T) {
	t.Parallel()
	var seen []string
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Sandbox: &sandbox.Options{Path: "/nonexistent", OnFailure: func(r string) { seen = append(seen, r) }}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	// sh is not in the sandbox PATH: run_code's engine probe says so
	// before any start; the terminal's shell fails to start in the init child.
	reply, err := cliCall(t, a, "run_code", RunCodeInput{Lang: "sh", Code: "echo never"})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Output.(*runcode.Result).Error == "" {
		t.Fatalf("run_code without sh: %+v", reply.Output)
	}
	if _, err := cliCall(t, a, "terminal_exec", TerminalExecInput{Command: "echo never"}); err == nil {
		t.Fatal("terminal_exec without bash answered")
	}
	f := metricstest.Scrape(t, a.Metrics.Handler())
	expect(t, f,
		want{"quro_runs_total", []string{"capability", "run_code", "engine", "none", "outcome", "error"}, 1},
		want{"quro_calls_total", []string{"capability", "terminal_exec", "path", "cli", "outcome", "unavailable"}, 1},
		want{"quro_sandbox_start_failures_total", []string{"reason", "init"}, float64(len(seen))},
	)
	if len(seen) == 0 || seen[0] != sandbox.FailInit {
		t.Errorf("the caller's OnFailure saw %q, want init first", seen)
	}
}
