package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Ceilings stored in a form the server cannot read (a hand-edited
// database, another version's layout, values set_tenant_limits refuses)
// fail closed: the tenant's runs and new sessions are refused (unavailable)
// with a message that names the problem and the fix, never run under the
// server's defaults; get_tenant_limits says why; setting them again with
// the real SQLite store repairs them and runs go ahead.
func TestTenantCeilingsUnreadableRefuseRuns(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	ctx := context.Background()
	_, cgroups := a.Sandbox.TenantUsage("")
	for _, bad := range []string{
		`{"memory_bytes":1073741824,"tasks":"many"}`, // not the JSON set_tenant_limits writes
		`{"memory_bytes":5}`,                         // a ceiling it refuses
		`{"memory_bytes":1073741824,"cpu":1}`,        // another version's layout
		`not json`,
	} {
		if err := a.Store.SetSetting(ctx, tenantKey(""), bad); err != nil {
			t.Fatal(err)
		}
		_, err := TenantOverrides(ctx, a.Store, "")
		var ue *CeilingsUnreadableError
		if !errors.As(err, &ue) || !errors.Is(err, sandbox.ErrTenantUnreadable) {
			t.Fatalf("%s: TenantOverrides: %v, want a CeilingsUnreadableError", bad, err)
		}
		_, err = call(t, a, "run_code", RunCodeInput{Code: "echo ran", Lang: "bash"})
		ce := wantCode(t, err, capability.Unavailable)
		for _, want := range []string{"the local tenant: its stored ceilings cannot be read (", "runs and new sessions are refused", "quro tenant limits set"} {
			if !strings.Contains(ce.Message, want) {
				t.Fatalf("%s: run_code refused with %q, want it to say %q", bad, ce.Message, want)
			}
		}
		if strings.Contains(ce.Message, a.DataDir) {
			t.Fatalf("the message names the data directory: %q", ce.Message)
		}
		_, err = call(t, a, "create_session", CreateSessionInput{Name: "s"})
		if ce := wantCode(t, err, capability.Unavailable); !strings.Contains(ce.Message, "quro tenant limits set") {
			t.Fatalf("create_session: %q", ce.Message)
		}
		if cgroups {
			// A box started without run_code's admission (the session's
			// shell) is refused by the sandbox itself.
			_, err = call(t, a, "terminal_exec", TerminalExecInput{Command: "echo ran"})
			if ce := wantCode(t, err, capability.Unavailable); !strings.Contains(ce.Message, "stored ceilings cannot be read") {
				t.Fatalf("terminal_exec: %q", ce.Message)
			}
		}
		reply, err := call(t, a, "get_tenant_limits", TenantLimitsInput{})
		if err != nil {
			t.Fatal(err)
		}
		if info := reply.Output.(*TenantLimitsInfo); !strings.Contains(info.Unreadable, "cannot be read") || info.Effective != (TenantLimits{}) || reply.Text != info.Unreadable {
			t.Fatalf("get_tenant_limits: %+v %q", info, reply.Text)
		}
	}
	if !cgroups {
		t.Log("no cgroups here: terminal_exec's refusal by the sandbox was not exercised")
	}
	// A tenant with nothing stored is no error.
	if own, err := TenantOverrides(ctx, a.Store, "bob"); err != nil || own != (TenantLimits{}) {
		t.Fatalf("bob: %+v %v", own, err)
	}
	// The fix the message names: set_tenant_limits (what quro tenant
	// limits set calls, from get_tenant_limits' empty own ceilings).
	reply, err := call(t, a, "set_tenant_limits", SetTenantLimitsInput{Tasks: 64})
	if err != nil {
		t.Fatal(err)
	}
	if info := reply.Output.(*TenantLimitsInfo); info.Unreadable != "" || info.Own.Tasks != 64 || info.Effective.Tasks != 64 {
		t.Fatalf("after set: %+v", info)
	}
	if res := runCode(t, a, RunCodeInput{Code: "echo ran", Lang: "bash"}); res.ExitCode != 0 || !strings.Contains(res.Stdout, "ran") {
		t.Fatalf("run after the fix: %+v", res)
	}
	if cgroups {
		if _, err := call(t, a, "terminal_exec", TerminalExecInput{Command: "echo ran"}); err != nil {
			t.Fatalf("terminal_exec after the fix: %v", err)
		}
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "s"}); err != nil {
		t.Fatalf("create_session after the fix: %v", err)
	}
}
