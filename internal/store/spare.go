package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// ClaimSession hands session id, held by tenant from (the server's spare
// sessions), to tenant to under name, created and used at: one update,
// which succeeds once. A session no longer held by from (claimed already,
// or gone) gives ErrNotFound; a name taken in tenant to gives ErrExists.
// The uid stays the session's.
func (s *Store) ClaimSession(ctx context.Context, id, from, to, name string, at time.Time) error {
	err := s.updateSession(ctx, "UPDATE sessions SET tenant = ?, name = ?, created_at = ?, last_used_at = ? WHERE id = ? AND tenant = ?",
		to, name, at.UnixMilli(), at.UnixMilli(), id, from)
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.tenant") {
		return fmt.Errorf("session %q: %w", name, ErrExists)
	}
	return err
}
