package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ClaimSession hands session id, held by tenant from (the server's spare
// sessions), to tenant to under name, created and used at, with the
// settings of set (its Env, Metadata, ExpiresAt and OnExpiry; nil: none):
// one update, which succeeds once. A session no longer held by from
// (claimed already, or gone) gives ErrNotFound; a name taken in tenant to
// gives ErrExists, a cap of caps met a *CapError (checked in the update's
// transaction, nil: none). The uid stays the session's.
func (s *Store) ClaimSession(ctx context.Context, id, from, to, name string, at time.Time, set *Session, caps *Caps) error {
	if set == nil {
		set = &Session{}
	}
	env := []byte("{}")
	if set.Env != nil {
		var err error
		if env, err = json.Marshal(set.Env); err != nil {
			return err
		}
	}
	meta, err := jsonObject(set.Metadata)
	if err != nil {
		return err
	}
	defer s.bump()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkCaps(ctx, tx, to, caps); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "UPDATE sessions SET tenant = ?, name = ?, created_at = ?, last_used_at = ?, env = ?, metadata = ?, expires_at = ?, on_expiry = ? WHERE id = ? AND tenant = ?",
			to, name, at.UnixMilli(), at.UnixMilli(), string(env), meta, unixMilli(set.ExpiresAt), set.OnExpiry, id, from)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.tenant") {
		return fmt.Errorf("session %q: %w", name, ErrExists)
	}
	return err
}
