package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/store"
)

// The fix that a refusal for unreadable stored ceilings names works: quro
// tenant limits show says what is wrong, and quro tenant limits set,
// which starts from the tenant's own ceilings, starts from the defaults
// and repairs them.
func TestTenantLimitsSetRepairsUnreadableCeilings(t *testing.T) {
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	data := t.TempDir()
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "show", "--tenant", "acme"); code != 0 {
		t.Fatalf("show: exit %d: %s", code, errs)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(data, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.SetSetting(ctx, "tenant_limits/acme", `{"tasks":"many"}`); err != nil {
		t.Fatal(err)
	}
	out, errs, code := quro(t, "", "--data", data, "tenant", "limits", "show", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "its stored ceilings cannot be read") || !strings.Contains(out, "quro tenant limits set --tenant acme") {
		t.Fatalf("show of unreadable ceilings: exit %d: %s %s", code, out, errs)
	}
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "set", "--tenant", "acme", "--tasks", "64"); code != 0 {
		t.Fatalf("set: exit %d: %s", code, errs)
	}
	if got, err := app.TenantOverrides(ctx, st, "acme"); err != nil || got != (app.TenantLimits{Tasks: 64}) {
		t.Fatalf("acme's ceilings after set: %+v %v", got, err)
	}
	// --network-max changes that one ceiling; the others stay.
	out, errs, code = quro(t, "", "--data", data, "tenant", "limits", "set", "--tenant", "acme", "--network-max", "none")
	if code != 0 || !strings.Contains(out, "network at most none") {
		t.Fatalf("set --network-max: exit %d: %s %s", code, out, errs)
	}
	if got, err := app.TenantOverrides(ctx, st, "acme"); err != nil || got != (app.TenantLimits{Tasks: 64, NetworkMax: "none"}) {
		t.Fatalf("acme's ceilings after --network-max: %+v %v", got, err)
	}
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "set", "--tenant", "acme", "--network-max", "everything"); code == 0 || !strings.Contains(errs, "none, internet or host") {
		t.Fatalf("set --network-max everything: exit %d: %s", code, errs)
	}
}

// quro serve's flags set every tenant's default runs in flight and
// process limits; quro tenant limits set overrides them for one tenant,
// keeping its other ceilings, and show reads them back.
func TestRunAndProcessLimitFlags(t *testing.T) {
	f := &serveFlags{}
	cmd := &cobra.Command{Use: "serve"}
	f.register(cmd)
	if err := cmd.ParseFlags([]string{"--runs-per-tenant", "32", "--processes-per-tenant", "512", "--processes-per-session", "100"}); err != nil {
		t.Fatal(err)
	}
	opts := f.appOptions(&globals{}, nil)
	if l := opts.Limits.Tenant; l.Runs != 32 || l.Processes != 512 || l.SessionProcesses != 100 {
		t.Fatalf("serve's limits: %+v", l)
	}

	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	data := t.TempDir()
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "set", "--tenant", "acme", "--tasks", "64"); code != 0 {
		t.Fatalf("set: exit %d: %s", code, errs)
	}
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "set", "--tenant", "acme", "--runs", "3", "--processes", "9", "--processes-per-session", "5"); code != 0 {
		t.Fatalf("set: exit %d: %s", code, errs)
	}
	out, errs, code := quro(t, "", "--data", data, "tenant", "limits", "show", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "tasks 64") || !strings.Contains(out, "runs in flight 3, background processes 9 (5 per session)") {
		t.Fatalf("show: exit %d: %s %s", code, out, errs)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(data, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got, err := app.TenantOverrides(ctx, st, "acme"); err != nil || got != (app.TenantLimits{Tasks: 64, Runs: 3, Processes: 9, SessionProcesses: 5}) {
		t.Fatalf("acme's ceilings after set: %+v %v", got, err)
	}
}

// quro serve's session ceilings reach the App; quro doctor shows the
// ceilings derived from this machine and where each came from.
func TestSessionCeilingFlagsAndDoctor(t *testing.T) {
	f := &serveFlags{}
	cmd := &cobra.Command{Use: "serve"}
	f.register(cmd)
	if err := cmd.ParseFlags([]string{"--max-sessions", "900", "--max-sessions-per-tenant", "300", "--tenant-tasks", "9000"}); err != nil {
		t.Fatal(err)
	}
	opts := f.appOptions(&globals{}, nil)
	if l := opts.Limits; l.Sessions != 900 || l.SessionsPerTenant != 300 || l.Tenant.Tasks != 9000 {
		t.Fatalf("serve's limits: %+v", l)
	}
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	out, errs, code := quro(t, "", "--data", t.TempDir(), "doctor")
	if code != 0 {
		t.Fatalf("doctor: exit %d: %s", code, errs)
	}
	for _, want := range []string{"CEILINGS of a machine with", "sessions (all tenants): ", "memory per tenant: ", "MemTotal in /proc/meminfo", "tasks per tenant: ", "kernel.pid_max"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor does not say %q:\n%s", want, out)
		}
	}
	if _, ceilings, ok := strings.Cut(out, "CEILINGS"); ok {
		t.Logf("CEILINGS%s", ceilings)
	}
}
