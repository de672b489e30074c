package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/runcode"
)

// holdRun starts run_code in session (workspace ws) as c that holds a run
// slot until the returned release is called: it tells through a fifo that
// it runs, then reads a line from another.
func holdRun(t *testing.T, a *App, c controller.Caller, session, ws, name string) (release func()) {
	t.Helper()
	started, rel := filepath.Join(ws, name+".started"), filepath.Join(ws, name+".release")
	for _, f := range []string{started, rel} {
		if err := syscall.Mkfifo(f, 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(f, 0o666)
	}
	done := make(chan error, 1)
	go func() {
		// It holds its slot until released, however long the test takes
		// to get there (over 30 s at a load of 100, when run_code's
		// default budget ended it early and freed the slot): the longest
		// budget, and a call that outlasts it.
		r, err := callWithin(t, a, c, "run_code", RunCodeInput{Lang: "sh", Session: session, TimeoutMS: -1,
			Code: fmt.Sprintf("echo up > %s.started; read line < %s.release; echo \"$line\"", name, name)}, 11*time.Minute)
		if err == nil && r.Output.(*runcode.Result).Stdout != "go\n" {
			err = fmt.Errorf("the run did not finish as planned: %s", r.Text)
		}
		done <- err
	}()
	// Read to its end: the run has written it and holds its slot now.
	f, err := os.Open(started)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "up\n" {
		t.Fatalf("%s started: %q %v", name, b, err)
	}
	f.Close()
	return func() {
		// Read-write: no block if the run died; closed after it ended.
		w, err := os.OpenFile(rel, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteString("go\n")
		err = <-done
		w.Close()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// wantLimit wants err to be resource_exhausted with a Retry-After and a
// message holding every one of texts.
func wantLimit(t *testing.T, what string, err error, texts ...string) {
	t.Helper()
	ce := wantCode(t, err, capability.ResourceExhausted)
	if ce.RetryAfter <= 0 {
		t.Errorf("%s: no Retry-After: %+v", what, ce)
	}
	for _, s := range texts {
		if !strings.Contains(ce.Message, s) {
			t.Errorf("%s: %q does not say %q", what, ce.Message, s)
		}
	}
}

// TestLongLivedProcessesHoldNoRunSlot: the tenant lock-up of issue 28 —
// each background process or followed process held one of the tenant's
// run slots for its whole life, so at the limit nothing worked, not even
// a kill. Now processes count against limits of their own (per session,
// per tenant), each refusal says which limit, its count and how to raise
// it; with every run slot held, kills, files, lists, status and new
// sessions still work; and the operator raises each limit per tenant with
// set_tenant_limits.
func TestLongLivedProcessesHoldNoRunSlot(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Limits: Limits{RunsPerTenant: 2, ProcessesPerSession: 3, ProcessesPerTenant: 4}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	erin := controller.Caller{Path: "test", Tenant: "erin", Scope: capability.ScopeExec}
	mk := func(name string) *SessionInfo {
		return mustCallAs(t, a, erin, "create_session", CreateSessionInput{Name: name}).(*SessionInfo)
	}
	s1, s2, s3 := mk("p1"), mk("p2"), mk("p3")

	// Three processes followed by their calls (E2B's commands.run), more
	// than the two run slots: each call freed its slot once its process ran.
	var follows []*streamCall
	var pids []int
	for range 3 {
		sc := startStream(t, a, erin, "start_process", StartProcessInput{Session: s1.ID, Cmd: "sleep", Args: []string{"100000"}})
		pids = append(pids, sc.pid(t))
		follows = append(follows, sc)
	}
	_, err = callAs(t, a, erin, "start_process", StartProcessInput{Session: s1.ID, Cmd: "sleep", Args: []string{"100000"}, Background: true})
	wantLimit(t, "a 4th process of a session of 3", err, "session already runs 3 background processes (its limit is 3)",
		"quro serve --processes-per-session", "set_tenant_limits processes_per_session")
	bg := mustCallAs(t, a, erin, "start_process", StartProcessInput{Session: s2.ID, Cmd: "sleep", Args: []string{"100000"}, Background: true, Tag: "bg"}).(*ProcessResult)
	if !bg.Running {
		t.Fatalf("background start: %+v", bg)
	}
	_, err = callAs(t, a, erin, "start_process", StartProcessInput{Session: s3.ID, Cmd: "true"})
	wantLimit(t, "a 5th process of a tenant of 4", err, "tenant already runs 4 background processes (its limit is 4)",
		"quro serve --processes-per-tenant", "set_tenant_limits processes")
	// Another tenant has its own count.
	if res := mustCallAs(t, a, admin, "start_process", StartProcessInput{Cmd: "true"}).(*ProcessResult); res.ExitCode != 0 {
		t.Fatalf("another tenant: %+v", res)
	}

	// Both run slots held: a third run is refused naming its limit, and
	// nothing that runs no code is.
	rel1 := holdRun(t, a, erin, s3.ID, s3.Workspace, "r1")
	rel2 := holdRun(t, a, erin, s3.ID, s3.Workspace, "r2")
	_, err = callAs(t, a, erin, "terminal_exec", TerminalExecInput{Session: s3.ID, Command: "true"})
	wantLimit(t, "a 3rd run of 2", err, "runs in flight", "tenant erin already has 2", "its limit is 2",
		"quro serve --runs-per-tenant", "set_tenant_limits runs_in_flight")
	st := mustCallAs(t, a, erin, "get_service_status", Empty{}).(*Status)
	if st.Tenant.RunsInFlight != 2 || st.Tenant.Processes != 4 || st.Tenant.Limits.Runs != 2 || st.Tenant.Limits.Processes != 4 || st.Tenant.Limits.SessionProcesses != 3 {
		t.Errorf("status: runs %d of %d, processes %d of %d (%d per session); want 2 of 2, 4 of 4 (3)", st.Tenant.RunsInFlight, st.Tenant.Limits.Runs,
			st.Tenant.Processes, st.Tenant.Limits.Processes, st.Tenant.Limits.SessionProcesses)
	}
	// /metrics' totals: erin's two runs and four processes (the local
	// tenant's process has ended).
	expect(t, metricstest.Scrape(t, a.Metrics.Handler()), want{"quro_runs_in_flight", nil, 2}, want{"quro_background_processes", nil, 4})
	mustCallAs(t, a, erin, "write_file", WriteFileInput{Session: s2.ID, Path: "f.txt", Content: "at the limit"})
	if got := mustCallAs(t, a, erin, "read_file", ReadFileInput{Session: s2.ID, Path: "f.txt"}); !strings.Contains(fmt.Sprint(got), "at the limit") {
		t.Errorf("read_file at the limit: %+v", got)
	}
	if l := mustCallAs(t, a, erin, "list_processes", SessionRef{Session: s1.ID}).(*ProcessList); len(l.Processes) != 3 {
		t.Errorf("list_processes: %d, want 3", len(l.Processes))
	}
	mk("p4")
	// Followed (a read call: no slot) to see it end.
	watch := startStream(t, a, erin, "connect_process", ConnectProcessInput{ProcessSelector: ProcessSelector{Session: s2.ID, Tag: "bg"}})
	watch.pid(t)
	mustCallAs(t, a, erin, "signal_process", SignalProcessInput{ProcessSelector: ProcessSelector{Session: s2.ID, Tag: "bg"}, Signal: "SIGKILL"})
	follows, pids = append(follows, watch), append(pids, 0)
	for i, sc := range follows {
		if pids[i] != 0 {
			mustCallAs(t, a, erin, "signal_process", SignalProcessInput{ProcessSelector: ProcessSelector{Session: s1.ID, Pid: pids[i]}, Signal: "SIGKILL"})
		}
		if res := sc.wait(t); res.Status != "signal: killed" {
			t.Errorf("a killed process: %+v", res)
		}
	}
	// The kills freed the processes' places; the runs still hold theirs
	// (a start takes a run slot too, while it starts).
	if n := a.procs.TenantCount("erin"); n != 0 {
		t.Errorf("erin's processes after the kills: %d", n)
	}
	_, err = callAs(t, a, erin, "start_process", StartProcessInput{Session: s3.ID, Cmd: "true"})
	wantLimit(t, "a start with both run slots held", err, "runs in flight")

	// The operator raises erin's runs: a third runs beside the two held.
	mustCall(t, a, "set_tenant_limits", SetTenantLimitsInput{Tenant: "erin", Runs: 3, Processes: 8, SessionProcesses: 5})
	if _, err := callAs(t, a, erin, "terminal_exec", TerminalExecInput{Session: s3.ID, Command: "true"}); err != nil {
		t.Errorf("a 3rd run after set_tenant_limits runs_in_flight 3: %v", err)
	}
	rel1()
	rel2()
	for i := range 5 {
		if _, err := callAs(t, a, erin, "start_process", StartProcessInput{Session: s1.ID, Cmd: "sleep", Args: []string{"100000"}, Background: true}); err != nil {
			t.Fatalf("process %d of a session of 5: %v", i+1, err)
		}
	}
	_, err = callAs(t, a, erin, "start_process", StartProcessInput{Session: s1.ID, Cmd: "true"})
	wantLimit(t, "a 6th process of a session of 5", err, "its limit is 5")
	info := mustCall(t, a, "get_tenant_limits", TenantLimitsInput{Tenant: "erin"}).(*TenantLimitsInfo)
	if e := info.Effective; e.Runs != 3 || e.Processes != 8 || e.SessionProcesses != 5 {
		t.Errorf("effective after set_tenant_limits: %+v", e)
	}
	// A tenant without overrides keeps the server's.
	info = mustCall(t, a, "get_tenant_limits", TenantLimitsInput{Tenant: "frank"}).(*TenantLimitsInfo)
	if e := info.Effective; e.Runs != 2 || e.Processes != 4 || e.SessionProcesses != 3 {
		t.Errorf("another tenant's limits: %+v", e)
	}
}

// TestProcessLimitDefaults: the defaults fit an E2B user's twenty
// sandboxes with background processes (docs/e2b.md), and "no cap" is
// none.
func TestProcessLimitDefaults(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	info := mustCall(t, a, "get_tenant_limits", TenantLimitsInput{}).(*TenantLimitsInfo)
	if e := info.Effective; e.Runs != DefaultRunsPerTenant || e.Processes != DefaultProcessesPerTenant || e.SessionProcesses != 64 {
		t.Errorf("defaults: %+v", e)
	}
	if l := info.Effective.procLimits(); l.Session != 64 || l.Tenant != DefaultProcessesPerTenant {
		t.Errorf("as the table takes them: %+v", l)
	}
	if l := (TenantLimits{Processes: -1}).procLimits(); l.Session != -1 || l.Tenant != -1 {
		t.Errorf("none: %+v", l)
	}
}

// TestRunSlotCapabilities: the capabilities that take a run slot are
// those that run code, and only those (capability.RunsCode): kill, files,
// sessions, status and lists never wait on one.
func TestRunSlotCapabilities(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	var got []string
	for _, c := range a.Controller.Registry().List() {
		if c.RunsCode() {
			got = append(got, c.Name)
		}
	}
	slices.Sort(got)
	want := []string{"call_js_function", "python_run", "run_code", "run_js_file", "send_input", "send_process_input", "start_process", "terminal_exec"}
	if !slices.Equal(got, want) {
		t.Errorf("capabilities taking a run slot: %v, want %v", got, want)
	}
}
