package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/store"
)

// A session's move to another node of a cluster (quro node drain): the
// Life quiesces it here (Quiesce: no call enters, the calls in it are
// canceled and its box ends), its workspace and settings are copied to
// the other node, where the Manager adopts it under the same ID (Adopt);
// then either the move is done here (Moved: the one teardown, as a
// destroy) or it failed and the session is usable here again
// (Unquiesce). Its processes do not move.

// ErrMoving is the cause of a call refused or canceled because its
// session is being moved to another node.
var ErrMoving = errors.New("session being moved to another node")

func errMoving(s *Session) error {
	return capability.Errorf(capability.Unavailable, "session %s is being moved to another node of the cluster: try again in a few seconds", s.Name).WithCause(ErrMoving)
}

// Quiesce stops s for a move: new entries are refused (Unavailable), the
// calls in it are canceled and waited for (at most the grace) and its
// ends run (its box's kill first), so that nothing writes its workspace
// while it is copied. It reports how many calls still ran after the
// grace.
func (l *Life) Quiesce(s *Session) int {
	l.mu.Lock()
	if l.moving == nil {
		l.moving = map[string]bool{}
	}
	l.moving[s.ID] = true
	l.mu.Unlock()
	return l.stop(s, errMoving(s), true)
}

// Unquiesce makes s usable again after a move that failed: the parts
// that marked it ended for good take it again (Ender.Reopen), then calls
// enter it, and its box starts anew on the next one.
func (l *Life) Unquiesce(s *Session) {
	for _, e := range l.ends {
		if e.Reopen != nil {
			e.Reopen(s)
		}
	}
	l.mu.Lock()
	delete(l.moving, s.ID)
	l.mu.Unlock()
}

// Moving reports whether session id is quiesced for a move.
func (l *Life) Moving(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.moving[id]
}

// Moved ends s here after its move to another node: the one teardown of
// a destroy (Manager.Forget, then the release in the background), with
// no call to cancel (Quiesce did).
func (l *Life) Moved(ctx context.Context, s *Session) error {
	l.mu.Lock()
	l.gone.Add(s.ID)
	delete(l.moving, s.ID)
	l.mu.Unlock()
	return l.forget(ctx, s)
}

// Adopted is a session moved here from another node, as it was there.
type Adopted struct {
	ID, Name, Tenant string
	CreatedAt        time.Time
	LastUsedAt       time.Time
	Env              map[string]string
	Cwd              string // absolute in this node's workspace, or ""
	Network          string
	NetRules         *NetRules
	Rootfs           string
	Metadata         map[string]string
	ExpiresAt        time.Time
	OnExpiry         string
}

// Adopt makes the session a (moved from another node), every field
// checked as a create checks it: it is hostile input from the wire.
// fill writes its workspace before its row is stored, so no caller (nor
// the cluster's sync of this node's sessions) sees it half made; on an
// error nothing of it is left. It is admitted against this node's
// ceilings as a create is (the tenant's and the server's session
// ceilings: a *LimitError, before its workspace is read, and counted
// again as its row is stored), since where it was made is no longer
// where it counts. A name another session holds here is suffixed with
// the ID's first 8 digits (s.Name says which).
func (m *Manager) Adopt(ctx context.Context, a *Adopted, fill func(s *Session) error) (*Session, error) {
	if !idRE.MatchString(a.ID) {
		return nil, fmt.Errorf("%w: session id %q", ErrBadName, a.ID)
	}
	if !ValidTenant(a.Tenant) || a.Tenant == SpareTenant {
		return nil, fmt.Errorf("%w: tenant %q", ErrBadName, a.Tenant)
	}
	name, err := sessionName(a.Name, a.ID)
	if err != nil {
		return nil, err
	}
	network := a.Network
	if network == "" {
		network = "none"
	}
	if !slices.Contains(Networks, network) {
		return nil, fmt.Errorf("%w: network policy %q; use one of %v", ErrBadName, network, Networks)
	}
	if a.Rootfs != "" && !nameRE.MatchString(a.Rootfs) {
		return nil, fmt.Errorf("%w: rootfs name %q", ErrBadName, a.Rootfs)
	}
	o := CreateOptions{Env: a.Env, Metadata: a.Metadata, OnExpiry: a.OnExpiry}
	onExpiry, err := o.checkExtras()
	if err != nil {
		return nil, err
	}
	if m.Exists(ctx, a.ID) {
		return nil, fmt.Errorf("%w: session %s is here already", ErrExists, a.ID)
	}
	caps, err := m.admit(ctx, a.Tenant)
	if err != nil {
		return nil, err
	}
	// Names are each node's own (every node makes its tenants' "default"
	// session): a name taken here gets the ID's first 8 digits.
	if _, err := m.store.SessionByName(ctx, a.Tenant, name); err == nil {
		name = name[:min(len(name), 55)] + "-" + a.ID[:8]
		if _, err := m.store.SessionByName(ctx, a.Tenant, name); err == nil {
			return nil, fmt.Errorf("%w: %q", ErrExists, name)
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	now := time.Now()
	created, used := a.CreatedAt, a.LastUsedAt
	if created.IsZero() || created.After(now) {
		created = now
	}
	if used.IsZero() || used.After(now) {
		used = now
	}
	row := &store.Session{ID: a.ID, Name: name, Tenant: a.Tenant, CreatedAt: created, LastUsedAt: used, Network: network,
		NetRules: encodeRules(a.NetRules), Rootfs: a.Rootfs, Env: maps.Clone(a.Env), Metadata: maps.Clone(a.Metadata),
		ExpiresAt: a.ExpiresAt, OnExpiry: onExpiry}
	s := m.fromRow(row)
	if m.Disk.Prepare != nil {
		if err := m.Disk.Prepare(a.Tenant, s.Dir); err != nil {
			return nil, err
		}
	}
	if err := m.ensureDirs(s); err != nil {
		m.undoAdopt(s)
		return nil, err
	}
	if err := fill(s); err != nil {
		m.undoAdopt(s)
		return nil, err
	}
	if err := m.store.CreateSessionWithin(ctx, row, caps); err != nil {
		m.undoAdopt(s)
		if err := m.capped(a.Tenant, err); errors.Is(err, ErrLimit) {
			return nil, err
		}
		if errors.Is(err, store.ErrExists) {
			return nil, fmt.Errorf("%w: %q", ErrExists, row.Name)
		}
		return nil, fmt.Errorf("session: %w", err)
	}
	s.UID = row.UID
	if a.Cwd != "" {
		if err := m.SetCwd(ctx, s.ID, a.Cwd); err != nil {
			return s, err
		}
		s.Cwd = a.Cwd
	}
	return s, nil
}

// undoAdopt removes what an adoption that failed made.
func (m *Manager) undoAdopt(s *Session) {
	_ = m.releaseHost(s) // clean-up of an adoption that failed: its error is the one to report
}
