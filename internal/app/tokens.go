package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/auth"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Token management is a capability like any other, so that it is audited
// whichever access path asks (quro token, REST, MCP). Who may do what:
//
//   - a caller manages the tokens of its own tenant only (lists them,
//     revokes them, makes new ones); another tenant's token is not found;
//   - the operator — an admin of the local tenant "" (the CLI on the data
//     directory, or the admin token quro serve wrote) — manages every
//     tenant's;
//   - code in a session (Caller.Session) manages none;
//   - a secret is shown once, in create_token's answer: the store keeps
//     only its hash, and list_tokens shows ids, never secrets.

// CreateTokenInput is create_token's input.
type CreateTokenInput struct {
	Tenant string   `json:"tenant,omitempty" jsonschema:"the tenant the token acts for; default: your own. Only the operator (an admin of the local tenant) names another tenant"`
	Scopes []string `json:"scopes,omitempty" jsonschema:"scopes the token holds: read, exec, install, admin (read ⊂ exec ⊂ admin; install beside exec); default read and exec. None wider than your own"`
	Label  string   `json:"label,omitempty" jsonschema:"a note to recognise the token by in lists (at most 200 characters)"`
	Tools  string   `json:"tools,omitempty" jsonschema:"the MCP tool profile its clients are listed when they name none (agent, full, sessions, admin); default: the server's (agent)"`
}

// CreatedToken is create_token's output: the token itself, shown once.
type CreatedToken struct {
	auth.Issued
}

// Text gives the token and says it is not shown again.
func (c *CreatedToken) Text() string {
	return fmt.Sprintf("%s\ntoken %s for tenant %q with scopes %s; the secret is not shown again (only its hash is stored)",
		c.Token, c.ID, c.Tenant, strings.Join(c.Scopes, ","))
}

// TokenList is list_tokens' output.
type TokenList struct {
	Tokens []auth.Info `json:"tokens" jsonschema:"ids, tenants, scopes and dates; never a secret"`
}

// Text is one token a line.
func (l *TokenList) Text() string {
	if len(l.Tokens) == 0 {
		return "no tokens"
	}
	var b strings.Builder
	for _, i := range l.Tokens {
		state := "live"
		if !i.RevokedAt.IsZero() {
			state = "revoked " + i.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "%s tenant=%q scopes=%s created=%s %s", i.ID, i.Tenant, strings.Join(i.Scopes, ","),
			i.CreatedAt.UTC().Format(time.RFC3339), state)
		if i.Tools != "" {
			fmt.Fprintf(&b, " tools=%s", i.Tools)
		}
		if i.Label != "" {
			fmt.Fprintf(&b, " label=%q", i.Label)
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// ListTokensInput is list_tokens' input.
type ListTokensInput struct {
	Tenant string `json:"tenant,omitempty" jsonschema:"only this tenant's tokens; default: your own tenant's. The operator (an admin of the local tenant) may name any tenant, or * for all"`
}

// RevokeTokenInput is revoke_token's input.
type RevokeTokenInput struct {
	ID string `json:"id" jsonschema:"the token's id (the part after quro_ and before the next _, as list_tokens shows it)"`
}

// tokenCaller is the caller of a token capability, refused when it is
// code in a session.
func tokenCaller(ctx context.Context) (controller.Caller, error) {
	c, ok := controller.CallerFrom(ctx)
	if !ok {
		return c, capability.Errorf(capability.PermissionDenied, "token management needs a caller")
	}
	if c.Session != "" {
		return c, capability.Errorf(capability.PermissionDenied,
			"code in a session cannot manage tokens: ask the operator (quro token on the server's host)")
	}
	return c, nil
}

// operator says whether c may act on every tenant: an admin of the local
// tenant, outside any session.
func operator(c controller.Caller) bool {
	return c.Tenant == "" && c.Session == "" && c.Scope.Covers(capability.ScopeAdmin)
}

// forTenant resolves the tenant a call acts on: the caller's own unless
// named, and another only for the operator.
func forTenant(c controller.Caller, named, what string) (string, error) {
	if named == "" || named == c.Tenant {
		return c.Tenant, nil
	}
	if !operator(c) {
		return "", capability.Errorf(capability.PermissionDenied,
			"%s another tenant's is for the operator (an admin of the local tenant, e.g. quro on the server's host); leave tenant empty for your own", what)
	}
	return named, nil
}

func (a *App) registerTokens(reg *capability.Registry) {
	reg.Register(capability.New("create_token",
		"Create a bearer token for your tenant (the operator, an admin of the local tenant, may name any tenant) with the given scopes, "+
			"none wider than your own. The answer carries the token (quro_<id>_<secret>) once: only a hash of the secret is stored, "+
			"and no call shows it again. Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in CreateTokenInput) (*CreatedToken, error) {
			c, err := tokenCaller(ctx)
			if err != nil {
				return nil, err
			}
			tenant, err := forTenant(c, in.Tenant, "making tokens for")
			if err != nil {
				return nil, err
			}
			scopes := in.Scopes
			if len(scopes) == 0 {
				scopes = []string{string(capability.ScopeRead), string(capability.ScopeExec)}
			}
			if scopes, err = auth.ParseScopes(strings.Join(scopes, ",")); err != nil {
				return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
			}
			for _, s := range scopes {
				if !c.Scope.Covers(capability.Scope(s)) {
					return nil, capability.Errorf(capability.PermissionDenied, "scope %q is wider than yours (%s)", s, c.Scope)
				}
			}
			if len(in.Label) > 200 {
				return nil, capability.Errorf(capability.InvalidArgument, "the label is %d characters; at most 200", len(in.Label))
			}
			if _, ok := reg.Profile(in.Tools); in.Tools != "" && !ok {
				return nil, capability.Errorf(capability.InvalidArgument, "no tool profile %q: the profiles are %s", in.Tools, strings.Join(reg.ProfileNames(), ", "))
			}
			iss, err := a.tokens.CreateWithTools(ctx, tenant, scopes, in.Label, in.Tools)
			if err != nil {
				return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
			}
			return &CreatedToken{*iss}, nil
		}))
	reg.Register(capability.New("list_tokens",
		"List the tokens of your tenant, revoked ones included: id, tenant, scopes, label, when created, last used and revoked. "+
			"Never a secret. The operator (an admin of the local tenant) may list another tenant's, or every tenant's with tenant \"*\". Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in ListTokensInput) (*TokenList, error) {
			c, err := tokenCaller(ctx)
			if err != nil {
				return nil, err
			}
			all := in.Tenant == "*"
			tenant := c.Tenant
			if all {
				if !operator(c) {
					return nil, capability.Errorf(capability.PermissionDenied,
						"listing every tenant's tokens is for the operator (an admin of the local tenant); leave tenant empty for your own")
				}
			} else if tenant, err = forTenant(c, in.Tenant, "listing"); err != nil {
				return nil, err
			}
			infos, err := a.tokens.List(ctx)
			if err != nil {
				return nil, err
			}
			out := &TokenList{Tokens: []auth.Info{}}
			for _, i := range infos {
				if all || i.Tenant == tenant {
					out.Tokens = append(out.Tokens, i)
				}
			}
			return out, nil
		}))
	reg.Register(capability.New("revoke_token",
		"Revoke one of your tenant's tokens by id: it stops working at the next request. The operator (an admin of the local tenant) "+
			"may revoke any tenant's. Revoking the token you call with is allowed (this call is its last). Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in RevokeTokenInput) (*Done, error) {
			c, err := tokenCaller(ctx)
			if err != nil {
				return nil, err
			}
			// A whole token given by mistake still names its id.
			id, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(in.ID), "quro_"), "_")
			if id == "" {
				return nil, capability.Errorf(capability.InvalidArgument, "name the token to revoke by its id (list_tokens shows them)")
			}
			infos, err := a.tokens.List(ctx)
			if err != nil {
				return nil, err
			}
			notFound := capability.Errorf(capability.NotFound, "no live token %q in your tenant (list_tokens shows them)", id)
			for _, i := range infos {
				if i.ID != id {
					continue
				}
				if i.Tenant != c.Tenant && !operator(c) {
					return nil, notFound // another tenant's token is not found, as its sessions are
				}
				if err := a.tokens.Revoke(ctx, id); err != nil {
					if errors.Is(err, auth.ErrNotFound) {
						return nil, notFound
					}
					return nil, err
				}
				return &Done{Message: fmt.Sprintf("revoked token %s (tenant %q): it stops working at the next request", id, i.Tenant)}, nil
			}
			return nil, notFound
		}))
}

// CreateToken calls create_token as the operator through the access path
// named path (so the call is audited like any other): for a harness that
// serves the App and needs a token (benchmarks, tests).
func (a *App) CreateToken(ctx context.Context, path, tenant string, scopes []string, label string) (*CreatedToken, error) {
	args, err := json.Marshal(CreateTokenInput{Tenant: tenant, Scopes: scopes, Label: label})
	if err != nil {
		return nil, err
	}
	reply, err := a.Controller.Call(ctx, controller.Caller{Path: path, Scope: capability.ScopeAdmin}, "create_token", args)
	if err != nil {
		return nil, err
	}
	return reply.Output.(*CreatedToken), nil
}
