package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// forceCandidate makes every uid proposal u for the rest of the test.
func forceCandidate(t *testing.T, u int) {
	t.Cleanup(SetUIDCandidate(func() int { return u }))
}

func newSession(t *testing.T, s *Store, id, tenant string) *Session {
	t.Helper()
	now := time.Now()
	sess := &Session{ID: id, Name: id, Tenant: tenant, CreatedAt: now, LastUsedAt: now}
	if err := s.CreateSession(context.Background(), sess); err != nil {
		t.Fatal(err)
	}
	return sess
}

// Two sessions of two tenants never share a uid, even when the allocator
// proposes the same one for both; a row cannot be given another's uid.
func TestSessionUIDsAreUnique(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	forceCandidate(t, 2_500_000)
	a := newSession(t, s, "c5", "c5")
	b := newSession(t, s, "c23", "c23")
	if a.UID != 2_500_000 || b.UID == a.UID || b.UID < UIDFirst || b.UID >= UIDLimit {
		t.Fatalf("uids %d and %d", a.UID, b.UID)
	}
	if got, _ := s.SessionByID(ctx, "c23"); got.UID != b.UID {
		t.Fatalf("stored uid %d, returned %d", got.UID, b.UID)
	}
	_, err := s.db.ExecContext(ctx, "UPDATE sessions SET uid = ? WHERE id = 'c23'", a.UID)
	if err == nil || !strings.Contains(err.Error(), "UNIQUE constraint failed: sessions.uid") {
		t.Fatalf("a duplicate uid was stored: %v", err)
	}
	// A proposal outside the range is never taken.
	forceCandidate(t, 0)
	if c := newSession(t, s, "c7", "c7"); c.UID < UIDFirst || c.UID >= UIDLimit || c.UID == a.UID || c.UID == b.UID {
		t.Fatalf("uid %d", c.UID)
	}
}

// A destroyed session's uid is not handed out until it is released.
func TestRetiredUIDIsReservedUntilReleased(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	forceCandidate(t, 2_000_001)
	a := newSession(t, s, "a", "t1")
	uid, err := s.DeleteSession(ctx, "a")
	if err != nil || uid != a.UID {
		t.Fatal(uid, err)
	}
	b := newSession(t, s, "b", "t2")
	if b.UID == a.UID {
		t.Fatalf("uid %d of a destroyed session reused before its release", b.UID)
	}
	r, err := s.RetiredUIDs(ctx)
	if err != nil || len(r) != 1 || r[0] != (Retired{UID: a.UID, SessionID: "a"}) {
		t.Fatalf("%+v %v", r, err)
	}
	if err := s.ReleaseUID(ctx, a.UID); err != nil {
		t.Fatal(err)
	}
	if c := newSession(t, s, "c", "t3"); c.UID != a.UID {
		t.Fatalf("released uid %d not reused: got %d", a.UID, c.UID)
	}
}

// With every candidate taken the lowest free uid is allocated.
func TestAllocFallsBackToLowestFree(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	forceCandidate(t, UIDFirst)
	a := newSession(t, s, "a", "")
	b := newSession(t, s, "b", "")
	c := newSession(t, s, "c", "")
	if a.UID != UIDFirst || b.UID != UIDFirst+1 || c.UID != UIDFirst+2 {
		t.Fatalf("%d %d %d", a.UID, b.UID, c.UID)
	}
	s.DeleteSession(ctx, "b") // reserved, not free
	if d := newSession(t, s, "d", ""); d.UID != UIDFirst+3 {
		t.Fatalf("%d", d.UID)
	}
}

// schema2 makes file a database of schema 2 (before session uids).
func schema2(t *testing.T, file string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for i, name := range []string{"0001_sessions.sql", "0002_tenancy_tokens_audit.sql"} {
		body, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatal(err)
		}
		db.Exec(fmt.Sprintf("PRAGMA user_version = %d", i+1))
	}
	return db
}

// Schema-2 sessions keep their old uid when it is theirs alone; of two
// that share one, the older keeps it and the other gets a fresh uid and a
// pending handover.
func TestAssignUIDsFromSchema2(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	db := schema2(t, file)
	for i, id := range []string{"old", "young", "alone"} {
		if _, err := db.Exec("INSERT INTO sessions (id, name, tenant, created_at, last_used_at) VALUES (?, ?, ?, ?, ?)", id, id, id, i, i); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s := open(t, file)
	legacy := map[string]int{"old": 2_100_000, "young": 2_100_000, "alone": 2_200_000}
	moved, err := s.AssignUIDs(ctx, func(id string) int { return legacy[id] })
	if err != nil || len(moved) != 1 || moved[0] != "young" {
		t.Fatalf("moved %v, %v", moved, err)
	}
	uid := func(id string) int {
		got, err := s.SessionByID(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got.UID
	}
	if uid("old") != 2_100_000 || uid("alone") != 2_200_000 || uid("young") == 2_100_000 || uid("young") < UIDFirst {
		t.Fatalf("old %d young %d alone %d", uid("old"), uid("young"), uid("alone"))
	}
	h, err := s.Handovers(ctx)
	if err != nil || len(h) != 1 || h[0] != (Handover{SessionID: "young", OldUID: 2_100_000}) {
		t.Fatalf("%+v %v", h, err)
	}
	// Idempotent: nothing left without a uid.
	if moved, err := s.AssignUIDs(ctx, func(string) int { return 2_100_000 }); err != nil || len(moved) != 0 {
		t.Fatalf("second pass moved %v, %v", moved, err)
	}
	if err := s.HandoverDone(ctx, "young"); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Handovers(ctx); len(h) != 0 {
		t.Fatalf("%+v", h)
	}
}

// The database and its WAL files are private to the server, also when an
// older quro left them world-readable.
func TestDatabaseFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "quro.db")
	check := func() {
		t.Helper()
		for _, p := range []string{file, file + "-wal", file + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
			}
		}
	}
	s := open(t, file)
	if err := s.SetSetting(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
	check()
	s.Close()
	for _, p := range []string{file, file + "-wal", file + "-shm"} {
		os.Chmod(p, 0o644)
	}
	s = open(t, file)
	if err := s.SetSetting(context.Background(), "k", "w"); err != nil {
		t.Fatal(err)
	}
	check()
}
