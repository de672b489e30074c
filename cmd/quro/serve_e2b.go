package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/version"
)

// E2BKeyFile, in the data directory, keeps the secret the E2B sandboxes'
// access tokens are derived from (0600, 32 random bytes, made at the first
// start). Removing it invalidates every access token handed out. A
// cluster node uses the cluster's key instead (Cluster.E2BKey), which
// edit sets.
const E2BKeyFile = "e2b.key"

// e2bServer builds the E2B-compatible API of a (see docs/e2b.md); check
// is the Origin and Host check of every route (rest.Access.Check); edit
// (nil: none) sets the options quro serve shares with its other routes.
func e2bServer(a *app.App, log *slog.Logger, domain string, noAuth bool, check func(*http.Request) *capability.Error,
	edit func(*e2b.Options)) (*e2b.Server, error) {
	opts := &e2b.Options{
		Logger:  log,
		Domain:  domain,
		Version: version.String(),
		Check:   check,
		Preview: a, // getHost: a sandbox's other ports, through the preview proxy
		Sandbox: func(ctx context.Context, id string) (e2b.Sandbox, error) {
			s, err := a.Sessions.ByIDAnyTenant(ctx, id)
			if errors.Is(err, session.ErrNotFound) || err == nil && s.Tenant == session.SpareTenant {
				return e2b.Sandbox{}, fmt.Errorf("%w: %s", e2b.ErrNoSandbox, id)
			}
			if err != nil {
				return e2b.Sandbox{}, err
			}
			return e2b.Sandbox{Tenant: s.Tenant, Paused: s.Paused}, nil
		},
		Sandboxes: func(ctx context.Context) ([]e2b.SandboxRef, error) {
			owners, err := a.Sessions.Owners(ctx)
			out := make([]e2b.SandboxRef, 0, len(owners))
			for id, tenant := range owners {
				out = append(out, e2b.SandboxRef{ID: id, Tenant: tenant})
			}
			return out, err
		},
	}
	if !noAuth {
		opts.APIKey = func(ctx context.Context, key string) (controller.Caller, error) {
			return a.VerifyToken(ctx, key)
		}
		opts.Key = a.LiveToken
		opts.Keys = func(ctx context.Context, tenant string) ([]string, error) {
			return a.LiveTokenIDs(ctx, tenant, capability.ScopeExec)
		}
	}
	if edit != nil {
		edit(opts)
	}
	if opts.Secret == nil {
		secret, err := app.KeyFile(filepath.Join(a.DataDir, E2BKeyFile), "access tokens handed out die with it")
		if err != nil {
			return nil, err
		}
		opts.Secret = secret
	}
	return e2b.New(a.Controller, opts)
}
