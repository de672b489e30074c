package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"
)

// SessionSecret is a session's secret as stored: its value only sealed
// (the caller seals and opens it).
type SessionSecret struct {
	Name        string
	Placeholder string
	Hosts       []string
	Sealed      []byte
	CreatedAt   time.Time
}

// SetSessionSecret adds the session's secret, or replaces the one of the
// same name. ErrNotFound when the session is gone.
func (s *Store) SetSessionSecret(ctx context.Context, session string, sec SessionSecret) error {
	hosts, err := json.Marshal(sec.Hosts)
	if err != nil {
		return err
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var one int
		if err := tx.QueryRowContext(ctx, "SELECT 1 FROM sessions WHERE id = ?", session).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO session_secrets (session_id, name, placeholder, hosts, sealed, created_at) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (session_id, name) DO UPDATE SET placeholder = excluded.placeholder, hosts = excluded.hosts, sealed = excluded.sealed, created_at = excluded.created_at`,
			session, sec.Name, sec.Placeholder, string(hosts), sec.Sealed, sec.CreatedAt.UnixMilli())
		return err
	})
}

// DeleteSessionSecret removes the session's secret name; false when it
// had none of that name.
func (s *Store) DeleteSessionSecret(ctx context.Context, session, name string) (bool, error) {
	r, err := s.exec(ctx, "DELETE FROM session_secrets WHERE session_id = ? AND name = ?", session, name)
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

// SessionSecrets are the session's secrets, by name.
func (s *Store) SessionSecrets(ctx context.Context, session string) ([]SessionSecret, error) {
	rows, err := s.query(ctx, "SELECT name, placeholder, hosts, sealed, created_at FROM session_secrets WHERE session_id = ? ORDER BY name", session)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionSecret
	for rows.Next() {
		var sec SessionSecret
		var hosts string
		var at int64
		if err := rows.Scan(&sec.Name, &sec.Placeholder, &hosts, &sec.Sealed, &at); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(hosts), &sec.Hosts); err != nil {
			return nil, err
		}
		sec.CreatedAt = fromMilli(at)
		out = append(out, sec)
	}
	return out, rows.Err()
}

// SecretCount is how many secrets all sessions hold (tests: none is
// left after its session).
func (s *Store) SecretCount(ctx context.Context) (int, error) {
	var n int
	err := s.queryRow(ctx, "SELECT count(*) FROM session_secrets").Scan(&n)
	return n, err
}
