package store

import (
	"context"
	"strings"
	"time"
)

// AuditEntry is one row of the audit log.
type AuditEntry struct {
	Seq        int64
	At         time.Time
	Tenant     string
	TokenID    string
	Path       string
	Capability string
	Args       string
	Outcome    string
	Message    string
	Duration   time.Duration
	Session    string // the session the call acted on ("" for none)
	Background bool   // a read the client made by itself
}

// AppendAudit inserts entries in one transaction, then deletes the oldest
// rows beyond keep (keep ≤ 0 keeps everything).
func (s *Store) AppendAudit(ctx context.Context, entries []AuditEntry, keep int64) error {
	// Both statements are prepared once per Store (a batch is usually one
	// call's entry, and parsing them was most of the batch's work).
	s.audits.Add(1)
	ins, err := s.prepare(ctx, "INSERT INTO audit (at, tenant, token_id, path, capability, args, outcome, message, duration_us, session, background) VALUES (?,?,?,?,?,?,?,?,?,?,?)")
	if err != nil {
		return err
	}
	trim, err := s.prepare(ctx, "DELETE FROM audit WHERE seq <= (SELECT max(seq) FROM audit) - ?")
	if err != nil {
		return err
	}
	release, err := s.write(ctx)
	if err != nil {
		return err
	}
	defer release()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	txIns := tx.StmtContext(ctx, ins)
	defer txIns.Close()
	for _, e := range entries {
		if _, err := txIns.ExecContext(ctx, e.At.UnixMicro(), e.Tenant, e.TokenID, e.Path, e.Capability,
			e.Args, e.Outcome, e.Message, e.Duration.Microseconds(), e.Session, e.Background); err != nil {
			return err
		}
	}
	if keep > 0 {
		txTrim := tx.StmtContext(ctx, trim)
		defer txTrim.Close()
		if _, err := txTrim.ExecContext(ctx, keep); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// AuditFilter selects audit rows.
type AuditFilter struct {
	Tenant     string
	Capability string    // "" for any
	TokenID    string    // "" for any
	Since      time.Time // zero for any
	Limit      int       // the latest Limit rows
	// Outcome: "" for any, "ok", "failed" (anything but ok) or one outcome.
	Outcome string
	Session string // "" for any
	// Background includes the rows marked background (left out otherwise).
	Background bool
}

// Audit returns the latest rows matching f, oldest first.
func (s *Store) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	q := strings.Builder{}
	q.WriteString("SELECT seq, at, tenant, token_id, path, capability, args, outcome, message, duration_us, session, background FROM audit WHERE tenant = ?")
	args := []any{f.Tenant}
	if f.Capability != "" {
		q.WriteString(" AND capability = ?")
		args = append(args, f.Capability)
	}
	if f.TokenID != "" {
		q.WriteString(" AND token_id = ?")
		args = append(args, f.TokenID)
	}
	switch f.Outcome {
	case "":
	case "failed":
		q.WriteString(" AND outcome != 'ok'")
	default:
		q.WriteString(" AND outcome = ?")
		args = append(args, f.Outcome)
	}
	if f.Session != "" {
		q.WriteString(" AND session = ?")
		args = append(args, f.Session)
	}
	if !f.Background {
		q.WriteString(" AND background = 0")
	}
	if !f.Since.IsZero() {
		q.WriteString(" AND at >= ?")
		args = append(args, f.Since.UnixMicro())
	}
	q.WriteString(" ORDER BY seq DESC LIMIT ?")
	args = append(args, f.Limit)
	rows, err := s.query(ctx, q.String(), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var (
			e      AuditEntry
			at, us int64
		)
		if err := rows.Scan(&e.Seq, &at, &e.Tenant, &e.TokenID, &e.Path, &e.Capability, &e.Args, &e.Outcome, &e.Message, &us, &e.Session, &e.Background); err != nil {
			return nil, err
		}
		e.At = time.UnixMicro(at)
		e.Duration = time.Duration(us) * time.Microsecond
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
