package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Two Stores on one file stand for two quro processes (`quro serve` and
// `quro token revoke`): each has its own cache and its own connections;
// only the file and its generation are shared.

// longCache makes the cache's age bound irrelevant for the test: what it
// sees of another process's change is then the generation's doing alone
// (a slow machine would otherwise pass it through the bound).
func longCache(t *testing.T) {
	old := cacheMaxAge
	cacheMaxAge = time.Hour
	t.Cleanup(func() { cacheMaxAge = old })
}

func TestCacheSeesRevokeFromAnotherStore(t *testing.T) {
	longCache(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a, b := open(t, file), open(t, file)
	if err := a.CreateToken(ctx, &Token{ID: "t1", Hash: "h", Tenant: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read is served by the cache
		if tok, err := a.TokenByID(ctx, "t1"); err != nil || !tok.RevokedAt.IsZero() {
			t.Fatalf("%+v %v", tok, err)
		}
	}
	before := a.Stats().Statements
	if _, err := a.TokenByID(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if n := a.Stats().Statements - before; n != 0 {
		t.Fatalf("a cached token lookup ran %d statements", n)
	}
	if err := b.RevokeToken(ctx, "t1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if tok, err := a.TokenByID(ctx, "t1"); err != nil || tok.RevokedAt.IsZero() {
		t.Fatalf("revoked by another store, still live in the cache: %+v %v", tok, err)
	}
}

func TestCacheSeesSessionsAndSettingsFromAnotherStore(t *testing.T) {
	longCache(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a, b := open(t, file), open(t, file)
	now := time.Now()
	s1 := &Session{ID: "id1", Name: "work", Tenant: "acme", CreatedAt: now, LastUsedAt: now, Network: "none"}
	if err := a.CreateSession(ctx, s1); err != nil {
		t.Fatal(err)
	}
	// Cache: by name, by id, and an absent setting.
	if _, err := a.SessionByName(ctx, "acme", "work"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SessionByID(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Setting(ctx, "default_session:acme"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := a.SessionByName(ctx, "acme", "other"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}

	if err := b.SetSetting(ctx, "default_session:acme", "id1"); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Setting(ctx, "default_session:acme"); err != nil || v != "id1" {
		t.Fatalf("setting set by another store: %q %v", v, err)
	}
	if err := b.SetSessionEnv(ctx, "id1", map[string]string{"K": "v"}); err != nil {
		t.Fatal(err)
	}
	if s, err := a.SessionByID(ctx, "id1"); err != nil || s.Env["K"] != "v" {
		t.Fatalf("env set by another store: %+v %v", s, err)
	}
	if _, err := b.DeleteSession(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if s, err := a.SessionByID(ctx, "id1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destroyed by another store, still found by id: %+v %v", s, err)
	}
	if s, err := a.SessionByName(ctx, "acme", "work"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destroyed by another store, still found by name: %+v %v", s, err)
	}
	// A new session under the freed name is the new one, never the old id.
	s2 := &Session{ID: "id2", Name: "work", Tenant: "acme", CreatedAt: now, LastUsedAt: now, Network: "none"}
	if err := b.CreateSession(ctx, s2); err != nil {
		t.Fatal(err)
	}
	if s, err := a.SessionByName(ctx, "acme", "work"); err != nil || s.ID != "id2" {
		t.Fatalf("name reused by another store: %+v %v", s, err)
	}
	if _, err := a.SessionByID(ctx, "id1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the destroyed id came back: %v", err)
	}
}

// TestCacheNeverServesARevokedTokenUnderRace: readers on one Store verify
// tokens without pause while another Store revokes them one by one; a
// lookup that began after a revoke returned must see it revoked. Run with
// -race.
func TestCacheNeverServesARevokedTokenUnderRace(t *testing.T) {
	longCache(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a, b := open(t, file), open(t, file)
	const n = 40
	var revoked [n]atomic.Bool
	for i := range n {
		if err := a.CreateToken(ctx, &Token{ID: fmt.Sprint("t", i), Hash: "h", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			for k := r; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				i := k % n
				after := revoked[i].Load() // before the lookup begins
				tok, err := a.TokenByID(ctx, fmt.Sprint("t", i))
				if err != nil {
					errs <- err
					return
				}
				if after && tok.RevokedAt.IsZero() {
					errs <- fmt.Errorf("token t%d served live after its revoke returned", i)
					return
				}
			}
		})
	}
	for i := range n {
		// Cached live, then revoked.
		if tok, err := a.TokenByID(ctx, fmt.Sprint("t", i)); err != nil || !tok.RevokedAt.IsZero() {
			t.Fatalf("t%d: %+v %v", i, tok, err)
		}
		if err := b.RevokeToken(ctx, fmt.Sprint("t", i), time.Now()); err != nil {
			t.Fatal(err)
		}
		revoked[i].Store(true)
		// Make sure the readers meet every token again before the next
		// revoke: one lookup of our own through a's cache.
		if tok, err := a.TokenByID(ctx, fmt.Sprint("t", i)); err != nil || tok.RevokedAt.IsZero() {
			t.Fatalf("t%d: %+v %v", i, tok, err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestCacheSeesRevokeFromAnotherProcess: a real second process (this test
// binary re-executed) opens the file and revokes, as `quro token revoke`
// does beside a running `quro serve`.
func TestCacheSeesRevokeFromAnotherProcess(t *testing.T) {
	if file := os.Getenv("QURO_STORE_TEST_REVOKE"); file != "" {
		return // the helper's work is done in TestMain
	}
	longCache(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a := open(t, file)
	if err := a.CreateToken(ctx, &Token{ID: "t1", Hash: "h", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if tok, err := a.TokenByID(ctx, "t1"); err != nil || !tok.RevokedAt.IsZero() {
		t.Fatalf("%+v %v", tok, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QURO_STORE_TEST_REVOKE="+file, "QURO_STORE_TEST_REVOKE_ID=t1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	if tok, err := a.TokenByID(ctx, "t1"); err != nil || tok.RevokedAt.IsZero() {
		t.Fatalf("revoked by another process, still live in the cache: %+v %v", tok, err)
	}
}

func TestMain(m *testing.M) {
	if file := os.Getenv("QURO_STORE_TEST_REVOKE"); file != "" {
		st, err := Open(context.Background(), file)
		if err == nil {
			err = st.RevokeToken(context.Background(), os.Getenv("QURO_STORE_TEST_REVOKE_ID"), time.Now())
			st.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "revoke helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPoolKeepsConnections: connections given back to the pool stay open
// for the next users (database/sql's default kept 2 and closed the rest).
func TestPoolKeepsConnections(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "quro.db"))
	hold := func() {
		var conns []*sql.Conn
		for range 8 {
			c, err := s.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Close()
		}
	}
	hold()
	opened := s.Stats().ConnsOpened
	hold()
	if n := s.Stats().ConnsOpened - opened; n != 0 {
		t.Fatalf("%d connections opened again for 8 users at once", n)
	}
}

// TestCacheAgeBound: a change the generation did not announce (a writer
// that died between its commit and its bump, or the sqlite3 shell) is seen
// once the cache is older than cacheMaxAge.
func TestCacheAgeBound(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a, b := open(t, file), open(t, file)
	if err := a.CreateToken(ctx, &Token{ID: "t1", Hash: "h", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	old := cacheMaxAge
	cacheMaxAge = 0 // every lookup finds the cache too old
	t.Cleanup(func() { cacheMaxAge = old })
	if _, err := a.TokenByID(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	// The revoke without its bump: b's own connection, as a foreign writer.
	if _, err := b.db.ExecContext(ctx, "UPDATE tokens SET revoked_at = 1 WHERE id = 't1'"); err != nil {
		t.Fatal(err)
	}
	if tok, err := a.TokenByID(ctx, "t1"); err != nil || tok.RevokedAt.IsZero() {
		t.Fatalf("an unannounced revoke outlived the cache's age bound: %+v %v", tok, err)
	}
}

// BenchmarkWarmLookups is what a warm call asks the store (its token, its
// session by name, the tenant's default-session and ceilings settings),
// from the cache and, for comparison, from SQLite (the cache switched
// off), with the statements each ran:
//
//	go test -run '^$' -bench WarmLookups -benchtime 20000x ./internal/store/
func BenchmarkWarmLookups(b *testing.B) {
	ctx := context.Background()
	for _, cached := range []bool{true, false} {
		name := "cached"
		if !cached {
			name = "sqlite"
		}
		b.Run(name, func(b *testing.B) {
			s, err := Open(ctx, filepath.Join(b.TempDir(), "quro.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if !cached {
				s.cache = nil
			}
			now := time.Now()
			if err := s.CreateToken(ctx, &Token{ID: "t1", Hash: "h", Tenant: "acme", CreatedAt: now}); err != nil {
				b.Fatal(err)
			}
			if err := s.CreateSession(ctx, &Session{ID: "id1", Name: "work", Tenant: "acme", CreatedAt: now, LastUsedAt: now, Network: "none"}); err != nil {
				b.Fatal(err)
			}
			if err := s.SetSetting(ctx, "default_session:acme", "id1"); err != nil {
				b.Fatal(err)
			}
			st0 := s.Stats()
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.TokenByID(ctx, "t1"); err != nil {
					b.Fatal(err)
				}
				if _, err := s.SessionByName(ctx, "acme", "work"); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Setting(ctx, "default_session:acme"); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Setting(ctx, "tenant_limits:acme"); !errors.Is(err, ErrNotFound) {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st1 := s.Stats()
			b.ReportMetric(float64(st1.Statements-st0.Statements)/float64(b.N), "stmts/op")
			b.ReportMetric(float64(st1.ConnsOpened-st0.ConnsOpened), "conns")
		})
	}
}

// TestUnchangedCwdWritesNothing: a terminal's unchanged directory, reported
// after each command, is not written again (a write would empty every
// process's cache); a changed one is, and another Store sees it.
func TestUnchangedCwdWritesNothing(t *testing.T) {
	longCache(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	a, b := open(t, file), open(t, file)
	now := time.Now()
	if err := a.CreateSession(ctx, &Session{ID: "id1", Name: "w", CreatedAt: now, LastUsedAt: now, Network: "none"}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetSessionCwd(ctx, "id1", "/w/x"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SessionByID(ctx, "id1"); err != nil { // cached with /w/x
		t.Fatal(err)
	}
	gen := a.cache.gen.load()
	for range 3 {
		if err := a.SetSessionCwd(ctx, "id1", "/w/x"); err != nil {
			t.Fatal(err)
		}
	}
	if a.cache.gen.load() != gen {
		t.Fatal("an unchanged cwd was written")
	}
	if err := a.SetSessionCwd(ctx, "id1", "/w/y"); err != nil {
		t.Fatal(err)
	}
	if s, err := b.SessionByID(ctx, "id1"); err != nil || s.Cwd != "/w/y" {
		t.Fatalf("%+v %v", s, err)
	}
	// Changed by another process, then set back here: written.
	if err := b.SetSessionCwd(ctx, "id1", "/w/z"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetSessionCwd(ctx, "id1", "/w/y"); err != nil {
		t.Fatal(err)
	}
	if s, err := b.SessionByID(ctx, "id1"); err != nil || s.Cwd != "/w/y" {
		t.Fatalf("%+v %v", s, err)
	}
}

// TestOpeningEmptiesNoCache: every quro command opens the store; one that
// migrates nothing leaves the running server's cache alone.
func TestOpeningEmptiesNoCache(t *testing.T) {
	file := filepath.Join(t.TempDir(), "quro.db")
	a := open(t, file)
	before := a.cache.gen.load()
	open(t, file)
	if after := a.cache.gen.load(); after != before {
		t.Fatalf("opening the store again moved the generation %d → %d", before, after)
	}
}
