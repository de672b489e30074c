package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// SetSessionLifetime sets when the session's lifetime ends (zero: it has
// none) and what happens then (onExpiry: "" to destroy it, or "pause").
func (s *Store) SetSessionLifetime(ctx context.Context, id string, expiresAt time.Time, onExpiry string) error {
	return s.updateSession(ctx, "UPDATE sessions SET expires_at = ?, on_expiry = ? WHERE id = ?", unixMilli(expiresAt), onExpiry, id)
}

// SetSessionPaused records whether the session is paused.
func (s *Store) SetSessionPaused(ctx context.Context, id string, paused bool) error {
	return s.updateSession(ctx, "UPDATE sessions SET paused = ? WHERE id = ?", paused, id)
}

// SetSessionMetadata replaces the session's metadata.
func (s *Store) SetSessionMetadata(ctx context.Context, id string, md map[string]string) error {
	meta, err := jsonObject(md)
	if err != nil {
		return err
	}
	return s.updateSession(ctx, "UPDATE sessions SET metadata = ? WHERE id = ?", meta, id)
}

// ExpiredSessions lists the ids of the sessions, of every tenant, whose
// lifetime ended at or before now, soonest ended first.
func (s *Store) ExpiredSessions(ctx context.Context, now time.Time) ([]string, error) {
	rows, err := s.query(ctx, "SELECT id FROM sessions WHERE expires_at > 0 AND expires_at <= ? ORDER BY expires_at", now.UnixMilli())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// NextExpiry is the soonest end of a session's lifetime, of every tenant;
// the zero time when no session has a lifetime.
func (s *Store) NextExpiry(ctx context.Context) (time.Time, error) {
	var ms sql.NullInt64
	err := s.queryRow(ctx, "SELECT min(expires_at) FROM sessions WHERE expires_at > 0").Scan(&ms)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !ms.Valid {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return fromMilli(ms.Int64), nil
}

// SetSessionNetwork replaces the session's network policy and its egress
// rules.
func (s *Store) SetSessionNetwork(ctx context.Context, id, network, rules string) error {
	return s.updateSession(ctx, "UPDATE sessions SET network = ?, net_rules = ? WHERE id = ?", network, rules, id)
}
