package app

import (
	"context"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
)

// Ceilings stored in a form the server cannot read (a hand-edited
// database, another version's layout) are an error for get_tenant_limits,
// never silent zeroes or half-read values; runs fall back to the server's
// defaults, and setting them again repairs them.
func TestTenantLimitsUnreadable(t *testing.T) {
	a := newApp(t, nil)
	ctx := context.Background()
	if err := a.Store.SetSetting(ctx, tenantKey("alice"), `{"memory_bytes":1073741824,"tasks":"many"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := TenantOverrides(ctx, a.Store, "alice"); err == nil || !strings.Contains(err.Error(), "unreadable") {
		t.Fatalf("TenantOverrides: %v, want unreadable", err)
	}
	_, err := callAs(t, a, admin, "get_tenant_limits", TenantLimitsInput{Tenant: "alice"})
	wantCode(t, err, capability.Internal)
	if got := a.tenants.Limits(ctx, "alice"); got != a.tenants.defaults {
		t.Fatalf("effective ceilings %+v, want the defaults %+v (nothing half-read)", got, a.tenants.defaults)
	}
	// A tenant with nothing stored is no error.
	if own, err := TenantOverrides(ctx, a.Store, "bob"); err != nil || own != (TenantLimits{}) {
		t.Fatalf("bob: %+v %v", own, err)
	}
	reply, err := callAs(t, a, admin, "set_tenant_limits", SetTenantLimitsInput{Tenant: "alice", Tasks: 64})
	if err != nil {
		t.Fatal(err)
	}
	if info := reply.Output.(*TenantLimitsInfo); info.Own.Tasks != 64 || info.Effective.Tasks != 64 {
		t.Fatalf("after set: %+v", info)
	}
}
