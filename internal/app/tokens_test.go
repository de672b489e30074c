package app

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Token management through the controller: a tenant's admin manages its
// own tenant's tokens only, the operator (admin of the local tenant) every
// tenant's, code in a session none; a secret is shown once and never
// listed; and every call is in the audit log.
func TestTokenCapabilitiesTenancy(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "ta"}
	aliceExec := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec, TokenID: "te"}
	inSession := controller.Caller{Path: "test", Tenant: "", Scope: capability.ScopeAdmin, Session: "s-1"}

	// The operator makes tokens for any tenant; the secret is in the answer.
	reply, err := callAs(t, a, admin, "create_token", CreateTokenInput{Tenant: "bob", Scopes: []string{"read"}, Label: "b"})
	if err != nil {
		t.Fatal(err)
	}
	bobTok := reply.Output.(*CreatedToken)
	if bobTok.Tenant != "bob" || !strings.HasPrefix(bobTok.Token, "quro_"+bobTok.ID+"_") || !strings.Contains(reply.Text, bobTok.Token) {
		t.Fatalf("created: %+v\n%s", bobTok, reply.Text)
	}
	if c, err := a.VerifyToken(t.Context(), bobTok.Token); err != nil || c.Tenant != "bob" || c.Scope != capability.ScopeRead {
		t.Fatalf("the new token verifies as %+v, %v", c, err)
	}

	// A tenant's admin: its own tenant by default, no other.
	reply, err = callAs(t, a, alice, "create_token", CreateTokenInput{})
	if err != nil {
		t.Fatal(err)
	}
	aliceTok := reply.Output.(*CreatedToken)
	if aliceTok.Tenant != "alice" || strings.Join(aliceTok.Scopes, ",") != "read,exec" {
		t.Fatalf("alice's default token: %+v", aliceTok.Info)
	}
	_, err = callAs(t, a, alice, "create_token", CreateTokenInput{Tenant: "bob"})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, aliceExec, "create_token", CreateTokenInput{})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, inSession, "create_token", CreateTokenInput{})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, admin, "create_token", CreateTokenInput{Scopes: []string{"root"}})
	wantCode(t, err, capability.InvalidArgument)

	// Lists: one's own tenant's, never a secret; every tenant's for the
	// operator only.
	reply, err = callAs(t, a, alice, "list_tokens", ListTokensInput{})
	if err != nil {
		t.Fatal(err)
	}
	list := reply.Output.(*TokenList).Tokens
	if len(list) != 1 || list[0].ID != aliceTok.ID || strings.Contains(reply.Text, "quro_") {
		t.Fatalf("alice's list: %+v\n%s", list, reply.Text)
	}
	_, err = callAs(t, a, alice, "list_tokens", ListTokensInput{Tenant: "*"})
	wantCode(t, err, capability.PermissionDenied)
	reply, err = callAs(t, a, admin, "list_tokens", ListTokensInput{Tenant: "*"})
	if err != nil || len(reply.Output.(*TokenList).Tokens) != 2 {
		t.Fatalf("the operator's list: %v %v", reply, err)
	}

	// Revoking: another tenant's token is not found, as its sessions are.
	_, err = callAs(t, a, alice, "revoke_token", RevokeTokenInput{ID: bobTok.ID})
	wantCode(t, err, capability.NotFound)
	if _, err := a.VerifyToken(t.Context(), bobTok.Token); err != nil {
		t.Fatalf("bob's token stopped working: %v", err)
	}
	if _, err := callAs(t, a, alice, "revoke_token", RevokeTokenInput{ID: aliceTok.Token}); err != nil {
		t.Fatalf("alice revokes her own (given whole): %v", err)
	}
	if _, err := a.VerifyToken(t.Context(), aliceTok.Token); err == nil {
		t.Fatal("a revoked token still verifies")
	}
	_, err = callAs(t, a, alice, "revoke_token", RevokeTokenInput{ID: aliceTok.ID})
	wantCode(t, err, capability.NotFound)
	if _, err := callAs(t, a, admin, "revoke_token", RevokeTokenInput{ID: bobTok.ID}); err != nil {
		t.Fatalf("the operator revokes bob's: %v", err)
	}

	// Every call is audited, in the caller's tenant, and no secret is.
	reply, err = callAs(t, a, admin, "get_audit_log", AuditInput{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range reply.Output.(*AuditLog).Entries {
		if strings.Contains(e.Args, "quro_") || strings.Contains(e.Message, bobTok.Token) {
			t.Fatalf("a secret in the audit log: %+v", e)
		}
		if strings.HasSuffix(e.Capability, "_token") || e.Capability == "list_tokens" {
			n++
		}
	}
	// The local tenant's: create for bob, the refused create from a
	// session, the bad scope, the list and the revoke.
	if n != 5 {
		t.Fatalf("the local tenant's token calls audited: %d, want 5", n)
	}
	reply, _ = callAs(t, a, alice, "get_audit_log", AuditInput{Capability: "revoke_token"})
	if got := len(reply.Output.(*AuditLog).Entries); got != 3 {
		t.Fatalf("alice's revoke_token entries: %d, want 3", got)
	}
}

// A tenant reads its own ceilings; only the operator sets any.
func TestTenantLimitsCapabilities(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "ta"}
	aliceRead := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeRead, TokenID: "tr"}

	_, err := callAs(t, a, alice, "set_tenant_limits", SetTenantLimitsInput{Tenant: "alice", Tasks: 1 << 20})
	wantCode(t, err, capability.PermissionDenied)
	_, err = callAs(t, a, admin, "set_tenant_limits", SetTenantLimitsInput{Tenant: "alice", Tasks: 3})
	wantCode(t, err, capability.InvalidArgument)
	reply, err := callAs(t, a, admin, "set_tenant_limits", SetTenantLimitsInput{Tenant: "alice", Tasks: 64, Memory: -1})
	if err != nil {
		t.Fatal(err)
	}
	info := reply.Output.(*TenantLimitsInfo)
	if info.Own.Tasks != 64 || info.Effective.Tasks != 64 || info.Effective.Memory != -1 || !strings.Contains(reply.Text, "memory none, tasks 64") {
		t.Fatalf("after set: %+v %s", info, reply.Text)
	}
	reply, err = callAs(t, a, aliceRead, "get_tenant_limits", TenantLimitsInput{})
	if err != nil || reply.Output.(*TenantLimitsInfo).Effective.Tasks != 64 || reply.Output.(*TenantLimitsInfo).Tenant != "alice" {
		t.Fatalf("alice reads her own: %v %v", reply, err)
	}
	_, err = callAs(t, a, aliceRead, "get_tenant_limits", TenantLimitsInput{Tenant: "bob"})
	wantCode(t, err, capability.PermissionDenied)
	// The whole set: a field left out is the default again.
	reply, err = callAs(t, a, admin, "set_tenant_limits", SetTenantLimitsInput{Tenant: "alice", Sessions: 5})
	if err != nil {
		t.Fatal(err)
	}
	if info := reply.Output.(*TenantLimitsInfo); info.Own.Tasks != 0 || info.Effective.Tasks != a.tenants.derived.Tasks || info.Own.Sessions != 5 {
		t.Fatalf("after the second set: %+v", info)
	}
}
