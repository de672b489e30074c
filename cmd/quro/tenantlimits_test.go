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
	data, st := tenantDataDir(t)
	ctx := context.Background()
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

// A data directory whose server keeps the tenants' ceilings elsewhere (a
// cluster node's: the cluster's tenants.quro.dev objects) refuses quro
// tenant limits in-process, whose store no node reads, naming where they
// are.
func TestTenantLimitsInProcessRefusedOnAClusterNodesData(t *testing.T) {
	data, st := tenantDataDir(t)
	ctx := context.Background()
	// What a cluster node's start writes (App.UseTenantLimitsSource).
	if err := st.SetSetting(ctx, "tenant_limits_source", "the cluster's tenants.quro.dev objects (namespace quro)"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"set", "--tasks", "64"}, {"show"}} {
		_, errs, code := quro(t, "", append([]string{"--data", data, "tenant", "limits"}, append(args, "--tenant", "acme")...)...)
		if code == 0 || !strings.Contains(errs, "tenants.quro.dev objects (namespace quro)") || !strings.Contains(errs, "--server") {
			t.Fatalf("quro tenant limits %s on a cluster node's data directory: exit %d: %s", args[0], code, errs)
		}
	}
	if got, err := app.TenantOverrides(ctx, st, "acme"); err != nil || got != (app.TenantLimits{}) {
		t.Fatalf("a refused set stored %+v, %v", got, err)
	}
}

// tenantDataDir is a data directory that quro tenant limits show made,
// in-process (no server), and its store, open.
func tenantDataDir(t *testing.T) (string, *store.Store) {
	t.Helper()
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	data := t.TempDir()
	if _, errs, code := quro(t, "", "--data", data, "tenant", "limits", "show", "--tenant", "acme"); code != 0 {
		t.Fatalf("show: exit %d: %s", code, errs)
	}
	st, err := store.Open(context.Background(), filepath.Join(data, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return data, st
}
