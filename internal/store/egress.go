package store

import (
	"context"
	"strings"
	"time"
)

// EgressEntry is one row of the egress log: the egress's decision on one
// connection (or DNS name) of a session's box.
type EgressEntry struct {
	Seq      int64
	Session  string
	Start    time.Time
	Dest     string
	Addr     string
	Decision string
	Rule     string
	Reason   string
	BytesOut int64
	BytesIn  int64
	Duration time.Duration
}

// EgressKeep bounds the egress log: PerSession rows of each session and
// Total rows in all (the oldest deleted first; ≤ 0: no bound).
type EgressKeep struct {
	PerSession int
	Total      int
}

// AppendEgress inserts entries in one transaction, then deletes each of
// their sessions' rows beyond keep.PerSession and every row beyond
// keep.Total, oldest first.
func (s *Store) AppendEgress(ctx context.Context, entries []EgressEntry, keep EgressKeep) error {
	ins, err := s.prepare(ctx, "INSERT INTO egress_log (session, start_us, dest, addr, decision, rule, reason, bytes_out, bytes_in, duration_us) VALUES (?,?,?,?,?,?,?,?,?,?)")
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
	sessions := map[string]bool{}
	for _, e := range entries {
		s.stmts.Add(1)
		if _, err := txIns.ExecContext(ctx, e.Session, e.Start.UnixMicro(), e.Dest, e.Addr, e.Decision, e.Rule, e.Reason,
			e.BytesOut, e.BytesIn, e.Duration.Microseconds()); err != nil {
			return err
		}
		sessions[e.Session] = true
	}
	if keep.PerSession > 0 {
		for id := range sessions {
			s.stmts.Add(1)
			if _, err := tx.ExecContext(ctx, `DELETE FROM egress_log WHERE session = ? AND seq <=
				(SELECT seq FROM egress_log WHERE session = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, id, id, keep.PerSession); err != nil {
				return err
			}
		}
	}
	if keep.Total > 0 {
		s.stmts.Add(1)
		if _, err := tx.ExecContext(ctx, `DELETE FROM egress_log WHERE seq <=
			(SELECT seq FROM egress_log ORDER BY seq DESC LIMIT 1 OFFSET ?)`, keep.Total); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// EgressFilter selects a session's egress rows.
type EgressFilter struct {
	Session  string
	Decision string    // "" for any
	Since    time.Time // zero for any: rows whose connection started at or after it
	Limit    int       // the latest Limit rows, by their connection's start (≤ 0: all)
}

// Egress returns the latest rows matching f, oldest first, in the order
// their connections started.
func (s *Store) Egress(ctx context.Context, f EgressFilter) ([]EgressEntry, error) {
	var q strings.Builder
	q.WriteString("SELECT seq, session, start_us, dest, addr, decision, rule, reason, bytes_out, bytes_in, duration_us FROM egress_log WHERE session = ?")
	args := []any{f.Session}
	if f.Decision != "" {
		q.WriteString(" AND decision = ?")
		args = append(args, f.Decision)
	}
	if !f.Since.IsZero() {
		q.WriteString(" AND start_us >= ?")
		args = append(args, f.Since.UnixMicro())
	}
	// By the connection's start: a refused connection is written at
	// once, an allowed one when it has closed, so the order of writing
	// is not the order of the connections.
	q.WriteString(" ORDER BY start_us DESC, seq DESC")
	if f.Limit > 0 {
		q.WriteString(" LIMIT ?")
		args = append(args, f.Limit)
	}
	rows, err := s.query(ctx, q.String(), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []EgressEntry
	for rows.Next() {
		var (
			e           EgressEntry
			start, took int64
		)
		if err := rows.Scan(&e.Seq, &e.Session, &start, &e.Dest, &e.Addr, &e.Decision, &e.Rule, &e.Reason, &e.BytesOut, &e.BytesIn, &took); err != nil {
			return nil, err
		}
		e.Start = time.UnixMicro(start)
		e.Duration = time.Duration(took) * time.Microsecond
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

// ForgetEgress deletes session's rows (its end).
func (s *Store) ForgetEgress(ctx context.Context, session string) error {
	_, err := s.exec(ctx, "DELETE FROM egress_log WHERE session = ?", session)
	return err
}

// PruneEgress deletes the rows of sessions that no longer exist (destroyed
// while no server ran, or before their last rows were written).
func (s *Store) PruneEgress(ctx context.Context) error {
	_, err := s.exec(ctx, "DELETE FROM egress_log WHERE session NOT IN (SELECT id FROM sessions)")
	return err
}
