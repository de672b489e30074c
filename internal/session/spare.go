package session

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	s := m.fromRow(row)
	if m.Disk.Prepare != nil {
		if err := m.Disk.Prepare(tenant, s.Dir); err != nil {
			return nil, err
		}
	}
	release := func() {
		if m.Disk.Release != nil {
			_ = m.Disk.Release(s.Dir) // the create's error is the one to report
		}
		os.RemoveAll(s.Dir)
	}
	if err := m.ensureDirs(s); err != nil {
		release()
		return nil, err
	}
	if err := m.store.CreateSession(ctx, row); err != nil {
		release()
		return nil, fmt.Errorf("session: %w", err)
	}
	s.UID = row.UID
	return s, nil
}

// Spares lists the spare sessions (a server that stopped without closing
// leaves some: they are deleted at the next start).
func (m *Manager) Spares(ctx context.Context) ([]*Session, error) {
	return m.List(WithTenant(ctx, SpareTenant))
}

// ErrClaimed means the spare was claimed already (or deleted).
var ErrClaimed = errors.New("the spare session was claimed already")

// Claim makes spare a new session of ctx's tenant named name (generated
// when empty), with the checks of CreateWith. A spare is claimed once:
// the row changes hands in one update that only a spare row passes.
func (m *Manager) Claim(ctx context.Context, spare *Session, name string) (*Session, error) {
	if onlyFrom(ctx) != "" {
		return nil, fmt.Errorf("%w: code running in a session cannot create sessions", ErrConfined)
	}
	if spare.Tenant != SpareTenant {
		return nil, ErrClaimed
	}
	tenant := TenantFrom(ctx)
	if !ValidTenant(tenant) {
		return nil, fmt.Errorf("%w: tenant %q", ErrBadName, tenant)
	}
	maxN := m.MaxPerTenant
	if m.MaxFor != nil {
		maxN = m.MaxFor(tenant)
	}
	if maxN > 0 {
		n, err := m.store.CountSessions(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if n >= maxN {
			return nil, fmt.Errorf("%w: %d sessions of at most %d; destroy one you no longer need", ErrLimit, n, maxN)
		}
	}
	if name == "" {
		name = "s-" + spare.ID[:8]
	}
	if !nameRE.MatchString(name) || idRE.MatchString(name) {
		return nil, fmt.Errorf("%w %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrBadName, name)
	}
	now := time.Now()
	switch err := m.store.ClaimSession(ctx, spare.ID, SpareTenant, tenant, name, now); {
	case errors.Is(err, store.ErrExists):
		return nil, fmt.Errorf("%w: %q", ErrExists, name)
	case errors.Is(err, store.ErrNotFound):
		return nil, ErrClaimed
	case err != nil:
		return nil, fmt.Errorf("session: %w", err)
	}
	s := *spare
	s.Tenant, s.Name, s.CreatedAt, s.LastUsedAt = tenant, name, now, now
	return &s, nil
}
