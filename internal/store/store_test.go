package store

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func open(t *testing.T, file string) *Store {
	t.Helper()
	s, err := Open(context.Background(), file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMigrationsApplyOnceAndReopen(t *testing.T) {
	file := filepath.Join(t.TempDir(), "quro.db")
	s := open(t, file)
	v, err := s.SchemaVersion(context.Background())
	if err != nil || v < 1 {
		t.Fatalf("schema %d, %v", v, err)
	}
	s.Close()
	s2 := open(t, file)
	if v2, _ := s2.SchemaVersion(context.Background()); v2 != v {
		t.Fatalf("reopen changed schema %d -> %d", v, v2)
	}
}

func TestConcurrentOpenMigratesOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "quro.db")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(context.Background(), file)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestSessions(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	now := time.UnixMilli(time.Now().UnixMilli())
	in := &Session{ID: "id1", Name: "one", CreatedAt: now, LastUsedAt: now, Env: map[string]string{"A": "b"}, Network: "none"}
	if err := s.CreateSession(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, &Session{ID: "id2", Name: "one", CreatedAt: now, LastUsedAt: now}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	got, err := s.SessionByName(ctx, "", "one")
	if err != nil || got.ID != "id1" || got.Env["A"] != "b" || !got.CreatedAt.Equal(now) {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := s.SessionByID(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	later := now.Add(time.Minute)
	if err := s.TouchSession(ctx, "id1", later); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.SessionByID(ctx, "id1"); !got.LastUsedAt.Equal(later) {
		t.Errorf("touch: %v", got.LastUsedAt)
	}
	if n, _ := s.CountSessions(ctx, ""); n != 1 {
		t.Errorf("count %d", n)
	}
	if uid, err := s.DeleteSession(ctx, "id1"); err != nil || uid != in.UID {
		t.Fatalf("delete: uid %d (want %d), %v", uid, in.UID, err)
	}
	if _, err := s.DeleteSession(ctx, "id1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestSettings(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	if _, err := s.Setting(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	s.SetSetting(ctx, "k", "1")
	s.SetSetting(ctx, "k", "2")
	if v, err := s.Setting(ctx, "k"); v != "2" || err != nil {
		t.Fatalf("%q %v", v, err)
	}
}
