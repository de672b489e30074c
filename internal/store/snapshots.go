package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Snapshot is a snapshot row: a copy of a session's workspace and
// settings, owned by a tenant.
type Snapshot struct {
	ID         string
	Tenant     string
	Name       string
	SourceID   string // the session it was taken of
	SourceName string
	CreatedAt  time.Time
	Size       int64 // bytes of its files
	Files      int
	Env        map[string]string
	Cwd        string // relative to the workspace ("" or "." for the workspace itself), or absolute outside it
	Network    string
	Rootfs     string
	// Complete is false while the files are copied (and for good, if the
	// server stopped then).
	Complete bool
}

// SnapshotCapError is CreateSnapshot's refusal when the tenant is at a
// snapshot ceiling.
type SnapshotCapError struct {
	Count, MaxCount int
	Bytes, MaxBytes int64
}

func (e *SnapshotCapError) Error() string {
	if e.MaxBytes == 0 {
		return fmt.Sprintf("%d snapshots of at most %d", e.Count, e.MaxCount)
	}
	return fmt.Sprintf("the other snapshots hold %d bytes; this one would pass the ceiling of %d bytes", e.Bytes, e.MaxBytes)
}

const snapshotCols = "id, tenant, name, source_session, source_name, created_at, size, files, env, cwd, network, rootfs, complete"

func scanSnapshot(row interface{ Scan(...any) error }) (*Snapshot, error) {
	var (
		s       Snapshot
		created int64
		env     string
	)
	if err := row.Scan(&s.ID, &s.Tenant, &s.Name, &s.SourceID, &s.SourceName, &created, &s.Size, &s.Files, &env, &s.Cwd, &s.Network, &s.Rootfs, &s.Complete); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	s.CreatedAt = time.UnixMilli(created)
	if err := json.Unmarshal([]byte(env), &s.Env); err != nil {
		return nil, fmt.Errorf("snapshot %s: bad env: %w", s.ID, err)
	}
	return &s, nil
}

// CreateSnapshot records a snapshot about to be copied (incomplete, size
// 0). With maxCount > 0 the tenant may hold at most maxCount snapshots,
// checked in the same transaction as the insert so that snapshots taken
// at once cannot pass it together. A refusal is a *SnapshotCapError; a
// taken name is ErrExists.
func (s *Store) CreateSnapshot(ctx context.Context, snap *Snapshot, maxCount int) error {
	env, err := json.Marshal(snap.Env)
	if err != nil {
		return err
	}
	if snap.Env == nil {
		env = []byte("{}")
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		var bytes int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*), coalesce(sum(size), 0) FROM snapshots WHERE tenant = ?", snap.Tenant).Scan(&n, &bytes); err != nil {
			return err
		}
		if maxCount > 0 && n >= maxCount {
			return &SnapshotCapError{Count: n, MaxCount: maxCount, Bytes: bytes}
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO snapshots ("+snapshotCols+") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,0)",
			snap.ID, snap.Tenant, snap.Name, snap.SourceID, snap.SourceName, snap.CreatedAt.UnixMilli(),
			0, 0, string(env), snap.Cwd, snap.Network, snap.Rootfs)
		return err
	})
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: snapshots.tenant") {
		return fmt.Errorf("snapshot %q: %w", snap.Name, ErrExists)
	}
	return err
}

// FinishSnapshot records the size of snapshot id, copied, and marks it
// complete. With maxBytes > 0 the tenant's snapshots may hold at most
// maxBytes together, checked in the same transaction: a refusal is a
// *SnapshotCapError and leaves the row incomplete (the caller deletes
// it).
func (s *Store) FinishSnapshot(ctx context.Context, id string, size int64, files int, maxBytes int64) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		var others int64
		if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM snapshots
			WHERE tenant = (SELECT tenant FROM snapshots WHERE id = ?) AND id != ?`, id, id).Scan(&n, &others); err != nil {
			return err
		}
		if maxBytes > 0 && others+size > maxBytes {
			return &SnapshotCapError{Count: n + 1, Bytes: others, MaxBytes: maxBytes}
		}
		res, err := tx.ExecContext(ctx, "UPDATE snapshots SET size = ?, files = ?, complete = 1 WHERE id = ?", size, files, id)
		if err != nil {
			return err
		}
		if k, _ := res.RowsAffected(); k == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// SnapshotUsage is how many snapshots tenant holds and their bytes.
func (s *Store) SnapshotUsage(ctx context.Context, tenant string) (n int, bytes int64, err error) {
	err = s.queryRow(ctx, "SELECT count(*), coalesce(sum(size), 0) FROM snapshots WHERE tenant = ?", tenant).Scan(&n, &bytes)
	return n, bytes, err
}

// SnapshotByID returns the snapshot with id, whatever its tenant: the
// caller checks the tenant.
func (s *Store) SnapshotByID(ctx context.Context, id string) (*Snapshot, error) {
	return scanSnapshot(s.queryRow(ctx, "SELECT "+snapshotCols+" FROM snapshots WHERE id = ?", id))
}

// SnapshotByName returns tenant's snapshot called name.
func (s *Store) SnapshotByName(ctx context.Context, tenant, name string) (*Snapshot, error) {
	return scanSnapshot(s.queryRow(ctx, "SELECT "+snapshotCols+" FROM snapshots WHERE tenant = ? AND name = ?", tenant, name))
}

// Snapshots lists tenant's snapshots, oldest first.
func (s *Store) Snapshots(ctx context.Context, tenant string) ([]*Snapshot, error) {
	rows, err := s.query(ctx, "SELECT "+snapshotCols+" FROM snapshots WHERE tenant = ? ORDER BY created_at, name", tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Snapshot
	for rows.Next() {
		snap, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, snap)
	}
	return out, rows.Err()
}

// AllSnapshotIDs lists the ids of every tenant's snapshots (for the
// service's own housekeeping).
func (s *Store) AllSnapshotIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := s.query(ctx, "SELECT id FROM snapshots")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out[id] = true
	}
	return out, rows.Err()
}

// DeleteSnapshot removes the snapshot row of tenant with id. Another
// tenant's snapshot is ErrNotFound, as a missing one.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, id string) error {
	res, err := s.exec(ctx, "DELETE FROM snapshots WHERE id = ? AND tenant = ?", id, tenant)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
