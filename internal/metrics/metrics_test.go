package metrics_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/terminal"
)

type reported struct{}

func (reported) RunReport() (string, string) { return "x/y", metrics.RunExitNonzero }

func TestRunOf(t *testing.T) {
	for _, tc := range []struct {
		name            string
		out             any
		engine, outcome string
		ok              bool
	}{
		{"ok", &runcode.Result{Engine: "shell/sh"}, "shell/sh", metrics.RunOK, true},
		{"exit", &runcode.Result{Engine: "shell/sh", ExitCode: 3}, "shell/sh", metrics.RunExitNonzero, true},
		{"timeout wins", &runcode.Result{Engine: "shell/sh", ExitCode: 137, TimedOut: true, Interrupted: true}, "shell/sh", metrics.RunTimeout, true},
		{"interrupted", &runcode.Result{Engine: "python/embedded", ExitCode: 130, Interrupted: true}, "python/embedded", metrics.RunInterrupted, true},
		{"engine error", &runcode.Result{Engine: "none", ExitCode: -1, Error: "no engine"}, "none", metrics.RunError, true},
		{"terminal ok", &terminal.Result{}, "terminal", metrics.RunOK, true},
		{"terminal waits", &terminal.Result{ExitCode: -1, Running: true, WaitingForInput: true}, "terminal", metrics.RunRunning, true},
		{"terminal timeout", &terminal.Result{ExitCode: 130, TimedOut: true, Interrupted: true}, "terminal", metrics.RunTimeout, true},
		{"terminal error", &terminal.Result{ExitCode: -1, Error: "shell died"}, "terminal", metrics.RunError, true},
		{"reporter", reported{}, "x/y", metrics.RunExitNonzero, true},
		{"not a run", struct{}{}, "", "", false},
	} {
		engine, outcome, ok := metrics.RunOf(tc.out)
		if engine != tc.engine || outcome != tc.outcome || ok != tc.ok {
			t.Errorf("%s: %q %q %v, want %q %q %v", tc.name, engine, outcome, ok, tc.engine, tc.outcome, tc.ok)
		}
	}
}

func TestObserveKeepsLabelsBounded(t *testing.T) {
	reg := capability.NewRegistry()
	reg.Register(capability.New("echo", "echo", capability.ScopeRead, func(ctx context.Context, in struct{}) (*runcode.Result, error) {
		return &runcode.Result{Engine: "shell/sh", ExitCode: 1}, nil
	}))
	m := metrics.New()
	ctl := controller.New(reg, &controller.Options{Observers: []controller.Observer{m.Observer(reg)}})
	ctx := context.Background()
	tenant := controller.Caller{Path: "rest", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "tok-1"}
	ctl.Call(ctx, tenant, "echo", json.RawMessage(`{}`))
	ctl.Call(ctx, tenant, "echo", json.RawMessage(`{}`))
	ctl.Call(ctx, tenant, "no-such-thing-"+time.Now().String(), nil)
	ctl.Call(ctx, controller.Caller{Path: "made-up", Scope: capability.ScopeRead}, "echo", nil)
	ctl.Call(ctx, controller.Caller{Path: "cli"}, "echo", nil) // no scope

	m.SandboxFailure(sandbox.FailInit)
	m.SandboxFailure("something new")

	f := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"quro_calls_total", []string{"capability", "echo", "path", "rest", "outcome", "ok"}, 2},
		{"quro_calls_total", []string{"capability", "unknown", "path", "rest", "outcome", "not_found"}, 1},
		{"quro_calls_total", []string{"capability", "echo", "path", "other", "outcome", "ok"}, 1},
		{"quro_calls_total", []string{"capability", "echo", "path", "cli", "outcome", "permission_denied"}, 1},
		{"quro_call_duration_seconds", []string{"capability", "echo", "path", "rest"}, 2},
		{"quro_runs_total", []string{"capability", "echo", "engine", "shell/sh", "outcome", "exit_nonzero"}, 3},
		{"quro_sandbox_start_failures_total", []string{"reason", "init"}, 1},
		{"quro_sandbox_start_failures_total", []string{"reason", "other"}, 1},
		{"quro_sandbox_start_failures_total", []string{"reason", "setup"}, 0},
	} {
		if got, ok := f.Value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if n := len(f["quro_calls_total"].GetMetric()); n != 4 {
		t.Errorf("%d call series, want 4", n)
	}
	for _, fam := range f {
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				if v := l.GetValue(); v == "alice" || v == "tok-1" {
					t.Errorf("%s has a label %s=%q", fam.GetName(), l.GetName(), v)
				}
			}
		}
	}
	if _, ok := f["go_goroutines"]; !ok {
		t.Error("no Go collector")
	}
	if _, ok := f["process_cpu_seconds_total"]; !ok {
		t.Error("no process collector")
	}
	if _, ok := f["quro_sessions"]; ok {
		t.Error("a gauge without a source is exposed")
	}
}

func TestGauges(t *testing.T) {
	m := metrics.New()
	n := 2
	m.Watch(metrics.Sources{
		Sessions:      func(context.Context) (int, error) { return n, nil },
		Terminals:     func() (int, int) { return 3, 1 },
		PythonWorkers: func() int { return 4 },
		Processes:     func() int { return 6 },
		RunsInFlight:  func() int { return 7 },
		Spares:        func() (int, int) { return 8, 9 },
	})
	check := func(name string, want float64, labels ...string) {
		t.Helper()
		f := metricstest.Scrape(t, m.Handler())
		if got, ok := f.Value(name, labels...); !ok || got != want {
			t.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, want)
		}
	}
	check("quro_sessions", 2)
	n = 5
	check("quro_sessions", 5)
	check("quro_terminals", 3, "kind", "shell")
	check("quro_terminals", 1, "kind", "pty")
	check("quro_python_workers", 4)
	check("quro_background_processes", 6)
	check("quro_runs_in_flight", 7)
	check("quro_spare_sessions", 8, "state", "ready")
	check("quro_spare_sessions", 9, "state", "filling")
}

// TestNodeHandler: a cluster node's /metrics labels every sample with the
// node, so the StatefulSet's pods' series stay apart.
func TestNodeHandler(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	rec := httptest.NewRecorder()
	m.NodeHandler("quro-1").ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	samples := 0
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		samples++
		if !strings.Contains(line, `node="quro-1"`) {
			t.Fatalf("a sample without the node's label: %q", line)
		}
	}
	if samples == 0 {
		t.Fatalf("no samples:\n%s", rec.Body)
	}
	// The registry's own handler is unchanged.
	rec = httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), `node="quro-1"`) {
		t.Fatal("Handler carries the node label too")
	}
}
