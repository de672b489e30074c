package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
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
// start). Removing it invalidates every access token handed out.
const E2BKeyFile = "e2b.key"

// e2bServer builds the E2B-compatible API of a (see docs/e2b.md); check
// is the Origin and Host check of every route (rest.Access.Check); edit
// (nil: none) sets the options quro serve shares with its other routes.
func e2bServer(a *app.App, log *slog.Logger, domain string, noAuth bool, check func(*http.Request) *capability.Error,
	edit func(*e2b.Options)) (*e2b.Server, error) {
	secret, err := e2bSecret(filepath.Join(a.DataDir, E2BKeyFile))
	if err != nil {
		return nil, err
	}
	opts := &e2b.Options{
		Logger:  log,
		Domain:  domain,
		Secret:  secret,
		Version: version.String(),
		Check:   check,
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
	return e2b.New(a.Controller, opts)
}

// e2bSecret reads the secret in file, making it first if there is none.
func e2bSecret(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil {
		if len(b) < 32 {
			return nil, fmt.Errorf("%s: %d bytes, want 32 or more (remove it to make a new one; access tokens handed out die with it)", file, len(b))
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	// Written beside it, then linked into place: a process that reads
	// the file never sees it half written, and of two first starts one
	// link wins and the other reads the winner's.
	tmp, err := os.CreateTemp(filepath.Dir(file), ".e2b.key.*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), file); errors.Is(err, fs.ErrExist) {
		return e2bSecret(file)
	} else if err != nil {
		return nil, err
	}
	return b, nil
}
