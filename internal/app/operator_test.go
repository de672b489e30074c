package app

import (
	"errors"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// TestOperatorListsEveryTenant: list_sessions with tenant "*" (or a
// tenant's name) is the operator's alone. A tenant's admin, naming every
// tenant or another one, and code in a session of the local tenant are
// refused; the operator sees each session with its tenant.
func TestOperatorListsEveryTenant(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "ta"}
	bob := controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeAdmin, TokenID: "tb"}
	for _, c := range []controller.Caller{alice, bob} {
		if _, err := callAs(t, a, c, "create_session", CreateSessionInput{Name: "w-" + c.Tenant}); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := callAs(t, a, admin, "create_session", CreateSessionInput{Name: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	inSession := admin
	inSession.Session = mine.Output.(*SessionInfo).ID
	for _, tc := range []struct {
		who    string
		c      controller.Caller
		tenant string
	}{
		{"alice, every tenant", alice, "*"},
		{"alice, bob's", alice, "bob"},
		{"alice, the local tenant's", alice, ""},
		{"code in a local session, every tenant", inSession, "*"},
	} {
		if tc.tenant == "" {
			// "" is her own: allowed, and only hers.
			r, err := callAs(t, a, tc.c, "list_sessions", ListSessionsInput{})
			if err != nil {
				t.Fatalf("%s: %v", tc.who, err)
			}
			for _, s := range r.Output.(*SessionList).Sessions {
				if s.Tenant != nil || s.Name == "ops" || s.Name == "w-bob" {
					t.Fatalf("%s: %+v", tc.who, s)
				}
			}
			continue
		}
		_, err := callAs(t, a, tc.c, "list_sessions", ListSessionsInput{Tenant: tc.tenant})
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.PermissionDenied {
			t.Errorf("%s: %v, want permission_denied", tc.who, err)
		}
	}
	tenants := func(in ListSessionsInput) map[string]string {
		r, err := callAs(t, a, admin, "list_sessions", in)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, s := range r.Output.(*SessionList).Sessions {
			if s.Tenant == nil {
				t.Fatalf("%s has no tenant in the operator's listing", s.Name)
			}
			got[s.Name] = *s.Tenant
		}
		return got
	}
	all := tenants(ListSessionsInput{Tenant: "*"})
	if all["w-alice"] != "alice" || all["w-bob"] != "bob" || all["ops"] != "" {
		t.Fatalf("every tenant: %v", all)
	}
	if got := tenants(ListSessionsInput{Tenant: "alice"}); len(got) < 1 || got["w-alice"] != "alice" || got["w-bob"] != "" {
		t.Fatalf("alice's: %v", got)
	}
	if _, err := callAs(t, a, admin, "list_sessions", ListSessionsInput{Tenant: "../x"}); err == nil {
		t.Fatal("a tenant name that is not one was taken")
	}
}
