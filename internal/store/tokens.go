package store

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"
)

// Token is a token row. The secret itself is never stored, only its hash.
type Token struct {
	ID         string
	Hash       string
	Tenant     string
	Scopes     []string
	Label      string
	Tools      string // the default MCP tool profile ("": the server's)
	CreatedAt  time.Time
	LastUsedAt time.Time // zero if never used
	RevokedAt  time.Time // zero if live
}

const tokenCols = "id, hash, tenant, scopes, label, tools, created_at, last_used_at, revoked_at"

func scanToken(row interface{ Scan(...any) error }) (*Token, error) {
	var (
		t                      Token
		scopes                 string
		created, used, revoked int64
	)
	if err := row.Scan(&t.ID, &t.Hash, &t.Tenant, &scopes, &t.Label, &t.Tools, &created, &used, &revoked); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	if scopes != "" {
		t.Scopes = strings.Split(scopes, ",")
	}
	t.CreatedAt = time.UnixMilli(created)
	if used != 0 {
		t.LastUsedAt = time.UnixMilli(used)
	}
	if revoked != 0 {
		t.RevokedAt = time.UnixMilli(revoked)
	}
	return &t, nil
}

// CreateToken inserts a token.
func (s *Store) CreateToken(ctx context.Context, t *Token) error {
	defer s.bump()
	_, err := s.exec(ctx, "INSERT INTO tokens (id, hash, tenant, scopes, label, tools, created_at) VALUES (?,?,?,?,?,?,?)",
		t.ID, t.Hash, t.Tenant, strings.Join(t.Scopes, ","), t.Label, t.Tools, t.CreatedAt.UnixMilli())
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") {
		return ErrExists
	}
	return err
}

// TokenByID returns the token with id, revoked or not.
// From memory when cached (see cache.go): a revocation by any process
// sharing the file is seen by the next call.
func (s *Store) TokenByID(ctx context.Context, id string) (*Token, error) {
	var epoch uint64
	if s.cache != nil {
		var hit *Token
		if hit, epoch = s.cache.token(id); hit != nil {
			return hit, nil
		}
	}
	st, err := s.stmt(ctx, "SELECT "+tokenCols+" FROM tokens WHERE id = ?")
	if err != nil {
		return nil, err
	}
	row, err := scanToken(st.QueryRowContext(ctx, id))
	if err == nil && s.cache != nil {
		s.cache.putToken(epoch, row)
	}
	return row, err
}

// Tokens lists every token, oldest first.
func (s *Store) Tokens(ctx context.Context) ([]*Token, error) {
	rows, err := s.query(ctx, "SELECT "+tokenCols+" FROM tokens ORDER BY created_at, id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// CountLiveTokens returns the number of tokens not revoked.
func (s *Store) CountLiveTokens(ctx context.Context) (int, error) {
	var n int
	err := s.queryRow(ctx, "SELECT count(*) FROM tokens WHERE revoked_at = 0").Scan(&n)
	return n, err
}

// RevokeToken marks the token revoked at at. Revoking twice is an error
// (ErrNotFound), so a typo in an id is not silently accepted.
func (s *Store) RevokeToken(ctx context.Context, id string, at time.Time) error {
	defer s.bump() // after the commit: the next Verify anywhere rereads it
	res, err := s.exec(ctx, "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at = 0", at.UnixMilli(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// TouchToken records a use of the token.
func (s *Store) TouchToken(ctx context.Context, id string, at time.Time) error {
	st, err := s.stmt(ctx, "UPDATE tokens SET last_used_at = ? WHERE id = ?")
	if err != nil {
		return err
	}
	release, err := s.write(ctx)
	if err != nil {
		return err
	}
	defer release()
	_, err = st.ExecContext(ctx, at.UnixMilli(), id)
	return err
}
