package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"sync/atomic"
)

// Session uids are taken from [UIDFirst, UIDLimit): above the ranges
// distributions give to people and to subordinate-id users. It is the
// range of sandbox's per-session uids.
const (
	UIDFirst = 2_000_000
	UIDLimit = 3_000_000
)

// uidCandidate proposes a uid for a new session; the allocation takes it
// only when no session has it and no destroyed session still holds it,
// and otherwise asks again, a few times, before it takes the lowest free
// uid. The default draws uniformly from [UIDFirst, UIDLimit).
var uidCandidate atomic.Pointer[func() int]

func randomUID() int {
	n, err := rand.Int(rand.Reader, big.NewInt(UIDLimit-UIDFirst))
	if err != nil {
		return UIDFirst
	}
	return UIDFirst + int(n.Int64())
}

// SetUIDCandidate makes f propose the uids of new sessions (nil: random)
// and returns a function that puts the previous proposer back. It is for
// tests, to force a collision: whatever f proposes, a session never gets
// a taken uid.
func SetUIDCandidate(f func() int) (restore func()) {
	old := uidCandidate.Swap(&f)
	if f == nil {
		uidCandidate.Store(nil)
	}
	return func() { uidCandidate.Store(old) }
}

func nextCandidate() int {
	if f := uidCandidate.Load(); f != nil && *f != nil {
		return (*f)()
	}
	return randomUID()
}

// ErrNoUID means every uid of the range is taken.
var ErrNoUID = errors.New("no free session uid")

// uidTaken reports whether a session has uid or a destroyed session still
// holds it.
func uidTaken(ctx context.Context, tx *sql.Tx, uid int) (bool, error) {
	var n int
	err := tx.QueryRowContext(ctx,
		"SELECT (SELECT count(*) FROM sessions WHERE uid = ?1) + (SELECT count(*) FROM retired_uids WHERE uid = ?1)", uid).Scan(&n)
	return n > 0, err
}

// allocUID picks a free uid within tx: a few random candidates, then the
// lowest free one.
func allocUID(ctx context.Context, tx *sql.Tx) (int, error) {
	for range 8 {
		u := nextCandidate()
		if u < UIDFirst || u >= UIDLimit {
			continue
		}
		taken, err := uidTaken(ctx, tx, u)
		if err != nil {
			return 0, err
		}
		if !taken {
			return u, nil
		}
	}
	var u sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT min(c) FROM (
			SELECT ?1 AS c
			UNION ALL SELECT uid + 1 FROM sessions WHERE uid IS NOT NULL
			UNION ALL SELECT uid + 1 FROM retired_uids)
		WHERE c >= ?1 AND c < ?2
			AND c NOT IN (SELECT uid FROM sessions WHERE uid IS NOT NULL)
			AND c NOT IN (SELECT uid FROM retired_uids)`, UIDFirst, UIDLimit).Scan(&u)
	if err != nil {
		return 0, err
	}
	if !u.Valid {
		return 0, fmt.Errorf("%w: all %d are in use or reserved by destroyed sessions", ErrNoUID, UIDLimit-UIDFirst)
	}
	return int(u.Int64), nil
}

// AssignUIDs gives every session that has no uid yet (a row of schema 2)
// one, in a single transaction, oldest session first: legacy(id) — the uid
// its files are owned by — when no other session has it and no destroyed
// session holds it, else a fresh one. The sessions that got a fresh uid
// are recorded in uid_handovers (their directories still belong to the
// legacy uid, which another session now has) and returned.
func (s *Store) AssignUIDs(ctx context.Context, legacy func(id string) int) (moved []string, err error) {
	defer s.bump()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		moved = nil
		rows, err := tx.QueryContext(ctx, "SELECT id FROM sessions WHERE uid IS NULL ORDER BY created_at, id")
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			old := legacy(id)
			uid := old
			taken, err := uidTaken(ctx, tx, uid)
			if err != nil {
				return err
			}
			if taken || uid < UIDFirst || uid >= UIDLimit {
				if uid, err = allocUID(ctx, tx); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "INSERT OR REPLACE INTO uid_handovers (session_id, old_uid) VALUES (?, ?)", id, old); err != nil {
					return err
				}
				moved = append(moved, id)
			}
			if _, err := tx.ExecContext(ctx, "UPDATE sessions SET uid = ? WHERE id = ?", uid, id); err != nil {
				return err
			}
		}
		return nil
	})
	return moved, err
}

// Handover is a session whose directories must be handed over from OldUID
// to its (new) uid.
type Handover struct {
	SessionID string
	OldUID    int
}

// Handovers lists the pending handovers.
func (s *Store) Handovers(ctx context.Context) ([]Handover, error) {
	rows, err := s.query(ctx, "SELECT session_id, old_uid FROM uid_handovers ORDER BY session_id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Handover
	for rows.Next() {
		var h Handover
		if err := rows.Scan(&h.SessionID, &h.OldUID); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// HandoverDone records that the session's directories belong to its uid.
func (s *Store) HandoverDone(ctx context.Context, sessionID string) error {
	_, err := s.exec(ctx, "DELETE FROM uid_handovers WHERE session_id = ?", sessionID)
	return err
}

// Retired is a destroyed session's uid, reserved until its processes and
// files are gone.
type Retired struct {
	UID       int
	SessionID string
}

// RetiredUIDs lists the reserved uids of destroyed sessions.
func (s *Store) RetiredUIDs(ctx context.Context) ([]Retired, error) {
	rows, err := s.query(ctx, "SELECT uid, session_id FROM retired_uids ORDER BY uid")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Retired
	for rows.Next() {
		var r Retired
		if err := rows.Scan(&r.UID, &r.SessionID); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ReleaseUID makes a destroyed session's uid free for new sessions. Call
// it only once no process runs under it and the session's files are
// removed.
func (s *Store) ReleaseUID(ctx context.Context, uid int) error {
	_, err := s.exec(ctx, "DELETE FROM retired_uids WHERE uid = ?", uid)
	return err
}
