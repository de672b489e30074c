package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A database made by the first schema keeps its sessions when it is
// migrated, and names become unique per tenant instead of service-wide.
func TestMigrateFromFirstSchema(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	db, err := sql.Open("sqlite", "file:"+file)
	if err != nil {
		t.Fatal(err)
	}
	first, err := migrationFS.ReadFile("migrations/0001_sessions.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{string(first), "PRAGMA user_version = 1",
		`INSERT INTO sessions (id, name, created_at, last_used_at, env) VALUES ('00000000000000000000000000000001', 'old', 1, 2, '{"A":"1"}')`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s := open(t, file)
	got, err := s.SessionByName(ctx, "", "old")
	if err != nil {
		t.Fatalf("the old session is gone: %v", err)
	}
	if got.Env["A"] != "1" || got.LastUsedAt.UnixMilli() != 2 {
		t.Fatalf("old session changed: %+v", got)
	}
	now := time.Now()
	if err := s.CreateSession(ctx, &Session{ID: "b1", Name: "old", Tenant: "b", CreatedAt: now, LastUsedAt: now}); err != nil {
		t.Fatalf("another tenant cannot reuse the name: %v", err)
	}
	err = s.CreateSession(ctx, &Session{ID: "b2", Name: "old", Tenant: "b", CreatedAt: now, LastUsedAt: now})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("same tenant, same name: %v", err)
	}
	if n, _ := s.CountSessions(ctx, "b"); n != 1 {
		t.Fatalf("tenant b has %d sessions", n)
	}
	if n, _ := s.CountAllSessions(ctx); n != 2 {
		t.Fatalf("%d sessions in all", n)
	}
	if list, _ := s.Sessions(ctx, ""); len(list) != 1 || list[0].Name != "old" {
		t.Fatalf("local tenant lists %v", list)
	}
}

func TestTokens(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	tok := &Token{ID: "abc", Hash: "h", Tenant: "t", Scopes: []string{"read", "exec"}, CreatedAt: time.UnixMilli(5)}
	if err := s.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateToken(ctx, tok); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	got, err := s.TokenByID(ctx, "abc")
	if err != nil || got.Tenant != "t" || len(got.Scopes) != 2 || !got.RevokedAt.IsZero() || !got.LastUsedAt.IsZero() {
		t.Fatalf("%+v %v", got, err)
	}
	if n, _ := s.CountLiveTokens(ctx); n != 1 {
		t.Fatalf("%d live", n)
	}
	if err := s.TouchToken(ctx, "abc", time.UnixMilli(9)); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken(ctx, "abc", time.UnixMilli(10)); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken(ctx, "abc", time.UnixMilli(11)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	if _, err := s.TokenByID(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	list, _ := s.Tokens(ctx)
	if len(list) != 1 || list[0].RevokedAt.UnixMilli() != 10 || list[0].LastUsedAt.UnixMilli() != 9 {
		t.Fatalf("%+v", list)
	}
	if n, _ := s.CountLiveTokens(ctx); n != 0 {
		t.Fatalf("%d live after revoke", n)
	}
}

func TestAuditAppendQueryPrune(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	var batch []AuditEntry
	for i := range 10 {
		tenant := "a"
		if i%2 == 1 {
			tenant = "b"
		}
		batch = append(batch, AuditEntry{At: time.UnixMicro(int64(1000 + i)), Tenant: tenant, Path: "rest",
			Capability: []string{"run_code", "list_sessions"}[i%3%2], Outcome: "ok", Duration: time.Duration(i) * time.Microsecond})
	}
	if err := s.AppendAudit(ctx, batch, 0); err != nil {
		t.Fatal(err)
	}
	got, err := s.Audit(ctx, AuditFilter{Tenant: "a", Limit: 100})
	if err != nil || len(got) != 5 {
		t.Fatalf("%d entries, %v", len(got), err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("not oldest first: %v", got)
		}
	}
	got, _ = s.Audit(ctx, AuditFilter{Tenant: "a", Limit: 2})
	if len(got) != 2 || got[1].At.UnixMicro() != 1008 {
		t.Fatalf("latest two: %+v", got)
	}
	got, _ = s.Audit(ctx, AuditFilter{Tenant: "a", Capability: "list_sessions", Limit: 100})
	for _, e := range got {
		if e.Capability != "list_sessions" {
			t.Fatalf("filter: %+v", e)
		}
	}
	got, _ = s.Audit(ctx, AuditFilter{Tenant: "b", Since: time.UnixMicro(1007), Limit: 100})
	if len(got) != 2 {
		t.Fatalf("since: %+v", got)
	}
	// keep 4: only the four newest rows survive.
	if err := s.AppendAudit(ctx, []AuditEntry{{At: time.UnixMicro(2000), Tenant: "a", Outcome: "ok"}}, 4); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Audit(ctx, AuditFilter{Tenant: "a", Limit: 100})
	b, _ := s.Audit(ctx, AuditFilter{Tenant: "b", Limit: 100})
	if len(a)+len(b) != 4 {
		t.Fatalf("kept %d+%d rows, want 4", len(a), len(b))
	}
}
