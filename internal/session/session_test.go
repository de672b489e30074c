package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/store"
)

func manager(t testing.TB, dir string) *Manager {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(dir, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := Open(context.Background(), st, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDefaultSessionIsStable(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	d1, err := manager(t, dir).Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := manager(t, dir).Get(ctx, "")
	if err != nil || d2.ID != d1.ID || d1.Name != DefaultName {
		t.Fatalf("default changed across opens: %v %v %v", d1, d2, err)
	}
	if fi, err := os.Stat(d1.Workspace()); err != nil || !fi.IsDir() {
		t.Fatalf("workspace: %v", err)
	}
}

// TestGoneDefaultNotRemadeAtStart: the default session is made on a data
// directory's first start; one gone since (destroyed, or moved to
// another node by a cluster's drain) is made again by the first call
// that asks for it, not by the next start, which holds no session.
func TestGoneDefaultNotRemadeAtStart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	m := manager(t, dir)
	d1, err := m.Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, d1); err != nil {
		t.Fatal(err)
	}
	m = manager(t, dir)
	if all, err := m.AllTenants(ctx); err != nil || len(all) != 0 {
		t.Fatalf("a start after the default went holds %d sessions (%v), want none", len(all), err)
	}
	// The supervisor's patrol asks for it this way: it makes none.
	if s, err := m.DefaultIfAny(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DefaultIfAny with the default gone: %+v %v, want ErrNotFound", s, err)
	}
	if all, err := m.AllTenants(ctx); err != nil || len(all) != 0 {
		t.Fatalf("DefaultIfAny made a session: %d (%v)", len(all), err)
	}
	d2, err := m.Get(ctx, "")
	if err != nil || d2.ID == d1.ID || d2.Name != DefaultName {
		t.Fatalf("the default asked for after it went: %+v %v (the one gone: %s)", d2, err, d1.ID)
	}
	if s, err := m.DefaultIfAny(ctx); err != nil || s.ID != d2.ID {
		t.Fatalf("DefaultIfAny: %+v %v, want %s", s, err, d2.ID)
	}
	if all, err := manager(t, dir).AllTenants(ctx); err != nil || len(all) != 1 || all[0].ID != d2.ID {
		t.Fatalf("the next start holds %v (%v), want only the default %s", all, err, d2.ID)
	}
}

func TestCreateGetByIDAndName(t *testing.T) {
	ctx := context.Background()
	m := manager(t, t.TempDir())
	s, err := m.Create(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ID) != 32 {
		t.Errorf("id %q is not 128 bits of hex", s.ID)
	}
	for _, ref := range []string{s.ID, "work"} {
		got, err := m.Get(ctx, ref)
		if err != nil || got.ID != s.ID {
			t.Errorf("Get(%q) = %v, %v", ref, got, err)
		}
	}
	if _, err := m.Create(ctx, "work"); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate: %v", err)
	}
	anon, err := m.Create(ctx, "")
	if err != nil || anon.Name == "" {
		t.Errorf("anonymous: %v %v", anon, err)
	}
	list, _ := m.List(ctx)
	if len(list) != 3 { // default, work, anonymous
		t.Errorf("list has %d sessions", len(list))
	}
	if s.Workspace() == anon.Workspace() {
		t.Error("two sessions share a workspace")
	}
}

func TestBadNamesAndMissingSessions(t *testing.T) {
	ctx := context.Background()
	m := manager(t, t.TempDir())
	for _, name := range []string{"../x", "a/b", "-x", "with space", string(make([]byte, 65)), "0123456789abcdef0123456789abcdef"} {
		if _, err := m.Create(ctx, name); !errors.Is(err, ErrBadName) {
			t.Errorf("Create(%q): %v", name, err)
		}
	}
	for _, ref := range []string{"nope", "ffffffffffffffffffffffffffffffff"} {
		if _, err := m.Get(ctx, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q): %v", ref, err)
		}
	}
}

func TestTouchRecreatesMissingDirectories(t *testing.T) {
	ctx := context.Background()
	m := manager(t, t.TempDir())
	s, _ := m.Create(ctx, "x")
	os.RemoveAll(s.Dir)
	if err := m.Touch(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.TmpDir()); err != nil {
		t.Fatal(err)
	}
}

func TestConfinedToOneSession(t *testing.T) {
	m := manager(t, t.TempDir())
	ctx := WithTenant(context.Background(), "acme")
	mine, err := m.Create(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Create(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	in := WithOnly(ctx, mine.ID)
	for _, ref := range []string{"", "mine", mine.ID} {
		if s, err := m.Get(in, ref); err != nil || s.ID != mine.ID {
			t.Errorf("Get(%q) = %v, %v", ref, s, err)
		}
	}
	for _, ref := range []string{"other", other.ID, "default"} {
		if _, err := m.Get(in, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q) reached beyond the session: %v", ref, err)
		}
	}
	if list, _ := m.List(in); len(list) != 1 || list[0].ID != mine.ID {
		t.Errorf("List: %v", list)
	}
	if n, _ := m.Count(in); n != 1 {
		t.Errorf("Count %d", n)
	}
	if _, err := m.Create(in, "escape"); !errors.Is(err, ErrConfined) {
		t.Errorf("Create: %v", err)
	}
	// Another tenant's id stays unknown even when confined to it.
	if _, err := m.Get(WithOnly(WithTenant(context.Background(), "evil"), mine.ID), ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("confined to another tenant's session: %v", err)
	}
}

// TestAnotherProcessesChangesSeenAtOnce: two Managers on one data
// directory, each with its own Store (two quro processes): a session
// destroyed, created or made the default by one is what the other finds
// next, though it had the old rows in its cache.
func TestAnotherProcessesChangesSeenAtOnce(t *testing.T) {
	dir := t.TempDir()
	ctx := WithTenant(context.Background(), "acme")
	m1, m2 := manager(t, dir), manager(t, dir)
	old, err := m1.Create(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // cached by name, by id, and the default
		if s, err := m1.Get(ctx, "work"); err != nil || s.ID != old.ID {
			t.Fatalf("%+v %v", s, err)
		}
		if _, err := m1.Get(ctx, old.ID); err != nil {
			t.Fatal(err)
		}
	}
	def, err := m1.Default(ctx)
	if err != nil || !m1.IsDefault(ctx, def) || m1.IsDefault(ctx, old) {
		t.Fatalf("default %+v %v", def, err)
	}

	if err := m2.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	if s, err := m1.Get(ctx, "work"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destroyed by another process, still found by name: %+v %v", s, err)
	}
	if s, err := m1.Get(ctx, old.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destroyed by another process, still found by id: %+v %v", s, err)
	}
	fresh, err := m2.Create(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := m1.Get(ctx, "work"); err != nil || s.ID != fresh.ID {
		t.Fatalf("made by another process: %+v %v", s, err)
	}
	if err := m2.SetDefault(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if s, err := m1.Get(ctx, ""); err != nil || s.ID != fresh.ID || !m1.IsDefault(ctx, fresh) || m1.IsDefault(ctx, def) {
		t.Fatalf("default set by another process: %+v %v", s, err)
	}
	if _, err := m1.Get(ctx, old.ID); !errors.Is(err, ErrNotFound) {
		t.Fatal("the destroyed session came back")
	}
}

// TestTouchWritesAtMostOncePerInterval: a session used again and again is
// written to the store once per touchEvery, not per call, and the warm
// lookups that precede each use read no SQLite.
func TestTouchWritesAtMostOncePerInterval(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m := manager(t, dir)
	s, err := m.Create(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	s.LastUsedAt = time.Time{} // due
	if err := m.Touch(ctx, s); err != nil {
		t.Fatal(err)
	}
	before := m.store.Stats().Statements
	start := time.Now()
	calls := 0
	for time.Since(start) < touchEvery/2 && calls < 200 {
		got, err := m.Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Touch(ctx, got); err != nil {
			t.Fatal(err)
		}
		calls++
	}
	// Within half an interval at most one write falls due (the cache's
	// own refill every second is a read or two).
	if n := m.store.Stats().Statements - before; n > 4 {
		t.Fatalf("%d statements for %d warm uses", n, calls)
	}
}

// CheckMetadata's bounds, including what JSON cannot carry (a Go caller
// can): invalid UTF-8.
func TestCheckMetadata(t *testing.T) {
	ok := map[string]string{"team": "a", "note": "é ok"}
	if err := CheckMetadata(ok); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]string{
		{"k": "\xff"}, {"\xff": "v"}, {"k": "a\x00b"}, {"": "v"},
		{strings.Repeat("k", MaxMetadataKey+1): "v"}, {"k": strings.Repeat("v", MaxMetadataValue+1)},
	} {
		if err := CheckMetadata(bad); !errors.Is(err, ErrBadMetadata) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
