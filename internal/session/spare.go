package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/quro-dev/quro/internal/store"
)

// SpareTenant holds the spare sessions a server keeps ready ahead of
// demand (a box and a started Python worker each; see the app package):
// it is no valid tenant name (ValidTenant), so no caller is ever it, and
// no caller finds, lists or counts a spare. A spare is a real session
// otherwise: its row, uid, directories and disk image are made as any
// session's, and deleting it retires its uid as any session's.
const SpareTenant = "-spare"

// CreateSpare makes a spare session of network policy network, whose disk
// image has the quota of tenant, the one tenant that may claim it.
func (m *Manager) CreateSpare(ctx context.Context, tenant, network string) (*Session, error) {
	id, err := newID()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	row := &store.Session{ID: id, Name: "spare-" + id[:8], Tenant: SpareTenant, CreatedAt: now, LastUsedAt: now, Network: network}
	return m.materialize(ctx, row, tenant, nil)
}

// Spares lists the spare sessions (a server that stopped without closing
// leaves some: they are deleted at the next start).
func (m *Manager) Spares(ctx context.Context) ([]*Session, error) {
	return m.List(WithTenant(ctx, SpareTenant))
}

// ErrClaimed means the spare was claimed already (or deleted).
var ErrClaimed = errors.New("the spare session was claimed already")

// Claim makes spare a new session of ctx's tenant named name (generated
// when empty), with the checks of CreateWith and o's env, metadata and
// lifetime (its Network and Rootfs are the spare's already). A spare is
// claimed once: the row changes hands, with those settings, in one update
// that only a spare row passes.
func (m *Manager) Claim(ctx context.Context, spare *Session, name string, o CreateOptions) (*Session, error) {
	if spare.Tenant != SpareTenant {
		return nil, ErrClaimed
	}
	tenant, caps, err := m.mayCreate(ctx, true)
	if err != nil {
		return nil, err
	}
	if name, err = sessionName(name, spare.ID); err != nil {
		return nil, err
	}
	onExpiry, err := o.checkExtras()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	set := &store.Session{Env: o.Env, Metadata: o.Metadata, ExpiresAt: o.ExpiresAt, OnExpiry: onExpiry}
	var ce *store.CapError
	switch err := m.store.ClaimSession(ctx, spare.ID, SpareTenant, tenant, name, now, set, caps); {
	case errors.As(err, &ce):
		return nil, m.capped(tenant, err)
	case errors.Is(err, store.ErrExists):
		return nil, fmt.Errorf("%w: %q", ErrExists, name)
	case errors.Is(err, store.ErrNotFound):
		return nil, ErrClaimed
	case err != nil:
		return nil, fmt.Errorf("session: %w", err)
	}
	s := *spare
	s.Tenant, s.Name, s.CreatedAt, s.LastUsedAt = tenant, name, now, now
	s.Env, s.Metadata, s.ExpiresAt, s.OnExpiry = maps.Clone(o.Env), maps.Clone(o.Metadata), o.ExpiresAt, onExpiry
	return &s, nil
}
