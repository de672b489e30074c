package app

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

// The server's session ceiling (all tenants together), derived from the
// machine: here an open-file limit that holds three sessions. The default
// session is one; two more, of two tenants, fit; the next, of a third
// tenant under its own ceiling, is refused at once with
// resource_exhausted (429) naming the ceiling, its value, where it came
// from and the flag that raises it; a destroyed session makes room.
func TestServerSessionCeilingFromTheMachine(t *testing.T) {
	t.Parallel()
	m := &Machine{CPUs: 2, MemTotal: 24 << 30, OpenFiles: serverFDs + 2*sessionFDs*3, KernelTasks: 32768}
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Limits: Limits{Machine: m, Tenant: TenantLimits{Disk: 16 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	as := func(tenant string) controller.Caller {
		return controller.Caller{Path: "test", Tenant: tenant, Scope: capability.ScopeExec, TokenID: "t-" + tenant}
	}
	mustCallAs(t, a, as("carol"), "create_session", CreateSessionInput{Name: "c1"})
	d1 := mustCallAs(t, a, as("dave"), "create_session", CreateSessionInput{Name: "d1"}).(*SessionInfo)
	_, err = callAs(t, a, as("erin"), "create_session", CreateSessionInput{Name: "e1"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	for _, want := range []string{"the server (all tenants together) is at its session ceiling of 3", "quro serve --max-sessions N", "open-file limit", "destroy one"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the refusal %q does not say %q", ce.Message, want)
		}
	}
	if ce.RetryAfter == 0 {
		t.Errorf("no Retry-After: %+v", ce)
	}
	mustCallAs(t, a, as("dave"), "destroy_session", SessionRef{Session: d1.ID})
	mustCallAs(t, a, as("erin"), "create_session", CreateSessionInput{Name: "e1"})
	// The operator reads the ceiling and where it came from.
	st := mustCall(t, a, "get_service_status", Empty{}).(*Status)
	if st.Ceilings == nil || st.Ceilings.Sessions != 3 || !strings.Contains(st.Ceilings.From["sessions"], "open-file limit") {
		t.Errorf("status ceilings: %+v", st.Ceilings)
	}
	// A caller who is not the operator does not read them.
	reply, err := callAs(t, a, as(""), "get_service_status", Empty{})
	if err != nil || reply.Output.(*Status).Ceilings != nil {
		t.Errorf("a tenant reads the server's ceilings: %v %+v", err, reply)
	}
}

// A tenant at its process or memory ceiling is refused a new session at
// once, with resource_exhausted (429) naming the ceiling, its value and
// the flags that raise it — never given a session whose box and worker
// would stall at the ceiling (what creation did at ~850 sessions under
// the old 8 GiB default: admission counted the processes' own memory but
// not the kernel memory of their boxes, so the tenant sat at its ceiling
// while admission saw room). Each ceiling is set so that the three
// sessions made fit and a fourth does not.
func TestCreateSessionAtATenantCeilingIsRefusedAtOnce(t *testing.T) {
	needEmbedded(t, nil) // the sessions hold memory in their workers
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, PrestartPython: true,
		Limits: Limits{Tenant: TenantLimits{Disk: 16 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, ok := a.Sandbox.TenantUsage(""); !ok {
		t.Skip("no cgroups layer here")
	}
	name := fmt.Sprintf("full-%d", os.Getpid())
	caller := controller.Caller{Path: "test", Tenant: name, Scope: capability.ScopeAdmin, TokenID: "tf"}
	// Three sessions, each with its box and worker, and 24 MiB held in
	// the worker (so that three of them pass the least memory ceiling,
	// 64 MiB).
	for i := 1; i <= 3; i++ {
		s := mustCallAs(t, a, caller, "create_session", CreateSessionInput{Name: fmt.Sprint("s", i)}).(*SessionInfo)
		reply, err := callAs(t, a, caller, "run_code", RunCodeInput{Session: s.ID, Code: "held = b'x' * (24 << 20)\nprint('held')"})
		if err != nil || !strings.Contains(reply.Output.(*runcode.Result).Stdout, "held") {
			t.Fatalf("session %d: %v %+v", i, err, reply)
		}
	}
	u, _ := a.Sandbox.TenantUsage(name)
	for _, tc := range []struct {
		limits TenantLimits
		says   []string
	}{
		{TenantLimits{Tasks: int64(u.Tasks) + sessionTasks/2},
			[]string{fmt.Sprintf("process ceiling of %d", u.Tasks+sessionTasks/2), "quro serve --tenant-tasks", "quro tenant limits set --tasks"}},
		{TenantLimits{Memory: int64(u.Memory) + sessionMemory/2},
			[]string{"memory ceiling of", "quro serve --tenant-memory", "quro tenant limits set --memory"}},
	} {
		if err := a.setTenantLimits(context.Background(), name, tc.limits); err != nil {
			t.Fatal(err)
		}
		_, err := callAs(t, a, caller, "create_session", CreateSessionInput{Name: "s4"})
		ce := wantCode(t, err, capability.ResourceExhausted)
		for _, want := range append(tc.says, "tenant "+name) {
			if !strings.Contains(ce.Message, want) {
				t.Errorf("the refusal %q does not say %q", ce.Message, want)
			}
		}
		if ce.RetryAfter == 0 {
			t.Errorf("no Retry-After: %+v", ce)
		}
	}
	// Raised again, the tenant gets its session.
	if err := a.setTenantLimits(context.Background(), name, TenantLimits{}); err != nil {
		t.Fatal(err)
	}
	mustCallAs(t, a, caller, "create_session", CreateSessionInput{Name: "s4"})
}
