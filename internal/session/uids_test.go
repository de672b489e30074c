package session

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/store"
)

// collidingIDs finds two session ids whose workspaces under root had one
// uid in schema 2 (a birthday search: about a thousand tries).
func collidingIDs(t *testing.T, root string) (string, string, int) {
	t.Helper()
	seen := map[int]string{}
	for range 1_000_000 {
		var b [16]byte
		rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		u := legacyUID(filepath.Join(root, id, "workspace"))
		if other, ok := seen[u]; ok {
			return other, id, u
		}
		seen[u] = id
	}
	t.Fatal("no collision")
	return "", "", 0
}

// writeSchema2 makes file a database of schema 2 with sessions ids (the
// first one the oldest), of tenants named after their index.
func writeSchema2(t *testing.T, file string, ids ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for v, name := range []string{"0001_sessions.sql", "0002_tenancy_tokens_audit.sql"} {
		body, err := os.ReadFile(filepath.Join("..", "store", "migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if _, err := db.Exec("INSERT INTO sessions (id, name, tenant, created_at, last_used_at) VALUES (?, 'default', ?, ?, ?)",
			id, fmt.Sprintf("c%d", i), i, i); err != nil {
			t.Fatal(err)
		}
	}
}

func ownerOf(t *testing.T, p string) int {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// A schema-2 database with two sessions of two tenants whose hashed uids
// collide: after the upgrade the older keeps its uid and its files, the
// younger has a uid of its own and owns its files under it (as root), and
// nothing else has either uid.
func TestUpgradeSplitsCollidingUIDs(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "sessions")
	older, younger, old := collidingIDs(t, root)
	var third string
	var alone int
	for {
		var b [16]byte
		rand.Read(b[:])
		third = hex.EncodeToString(b[:])
		if alone = legacyUID(filepath.Join(root, third, "workspace")); alone != old {
			break
		}
	}
	writeSchema2(t, filepath.Join(dir, "quro.db"), older, younger, third)
	asRoot := os.Geteuid() == 0
	for _, id := range []string{older, younger, third} {
		ws := filepath.Join(root, id, "workspace")
		tmp := filepath.Join(root, id, "tmp")
		for _, d := range []string{filepath.Join(ws, "sub"), tmp} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(ws, "sub", "secret"), []byte(id), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/passwd", filepath.Join(ws, "link")); err != nil {
			t.Fatal(err)
		}
		if asRoot { // as the old server handed them over
			u := legacyUID(ws)
			for _, p := range []string{ws, filepath.Join(ws, "sub"), filepath.Join(ws, "sub", "secret"), filepath.Join(ws, "link"), tmp} {
				if err := os.Lchown(p, u, u); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	m := manager(t, dir)
	ctx := context.Background()
	get := func(id string) *Session {
		s, err := m.ByIDAnyTenant(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	o, y, a := get(older), get(younger), get(third)
	if o.UID != old || a.UID != alone {
		t.Fatalf("uids that were unique changed: %d→%d, %d→%d", old, o.UID, alone, a.UID)
	}
	if y.UID == old || y.UID == alone || y.UID < store.UIDFirst || y.UID >= store.UIDLimit {
		t.Fatalf("the younger of two colliding sessions has uid %d (older %d)", y.UID, o.UID)
	}
	if asRoot {
		for _, p := range []string{y.Workspace(), filepath.Join(y.Workspace(), "sub"), filepath.Join(y.Workspace(), "sub", "secret"), filepath.Join(y.Workspace(), "link"), y.TmpDir()} {
			if got := ownerOf(t, p); got != y.UID {
				t.Errorf("%s owned by %d, want the session's new uid %d", p, got, y.UID)
			}
		}
		if got := ownerOf(t, filepath.Join(o.Workspace(), "sub", "secret")); got != old {
			t.Errorf("the older session's file moved to uid %d", got)
		}
		if got := ownerOf(t, "/etc/passwd"); got != 0 {
			t.Fatalf("a symlink was followed: /etc/passwd owned by %d", got)
		}
	}
	if hs, _ := m.store.Handovers(ctx); len(hs) != 0 {
		t.Fatalf("handovers left: %+v", hs)
	}
	// Reopening changes nothing.
	m2 := manager(t, dir)
	if s, _ := m2.ByIDAnyTenant(ctx, younger); s.UID != y.UID {
		t.Fatalf("uid changed on reopen: %d → %d", y.UID, s.UID)
	}
	// And new sessions never get a taken uid, even when proposed.
	for _, u := range []int{o.UID, y.UID, a.UID} {
		forceUID(t, u)
		n, err := m2.CreateWith(WithTenant(ctx, "c9"), "", CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.UID == o.UID || n.UID == y.UID || n.UID == a.UID {
			t.Fatalf("new session got taken uid %d", n.UID)
		}
	}
}

func forceUID(t *testing.T, u int) {
	t.Cleanup(store.SetUIDCandidate(func() int { return u }))
}

// A destroyed session's uid is not given to a new session while a process
// still runs under it, nor when the server died before removing its
// directory; it is once both are gone.
func TestDestroyReservesUIDUntilProcessesAndFilesAreGone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process under a session uid")
	}
	ctx := context.Background()
	dir := t.TempDir()
	m := manager(t, dir)
	s, err := m.Create(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	// A straggler: a process of the session that outlived the stop.
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.UID)}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := m.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	forceUID(t, s.UID)
	n, err := m.Create(ctx, "next")
	if err != nil {
		t.Fatal(err)
	}
	if n.UID == s.UID {
		t.Fatalf("uid %d reused while a process of the destroyed session runs", s.UID)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// The server dies after the row is gone but before the directory is:
	// the uid of that session stays reserved too.
	half, err := m.Create(ctx, "half")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.store.DeleteSession(ctx, half.ID); err != nil {
		t.Fatal(err)
	}
	forceUID(t, half.UID)
	if x, _ := m.Create(ctx, "x"); x.UID == half.UID {
		t.Fatalf("uid %d of a half-destroyed session reused", half.UID)
	}
	// The next start finishes both: the directory is removed, the uids free.
	m2 := manager(t, dir)
	if _, err := os.Stat(half.Dir); !os.IsNotExist(err) {
		t.Fatalf("half-destroyed directory left: %v", err)
	}
	for _, u := range []int{s.UID, half.UID} {
		forceUID(t, u)
		y, err := m2.Create(ctx, fmt.Sprintf("y%d", u))
		if err != nil {
			t.Fatal(err)
		}
		if y.UID != u {
			t.Fatalf("uid %d still reserved after its session is gone (got %d)", u, y.UID)
		}
	}
}

// BenchmarkUIDsInUse is the uid reap's scan of every process of the host
// (at most once a second while destroyed sessions' uids wait): its cost
// grows with the host's processes, not the server's sessions.
//
//	go test -run '^$' -bench UIDsInUse ./internal/session/
func BenchmarkUIDsInUse(b *testing.B) {
	n := 0
	for b.Loop() {
		n = len(uidsInUse())
	}
	entries, _ := os.ReadDir("/proc")
	b.ReportMetric(float64(len(entries)), "proc-entries")
	b.ReportMetric(float64(n), "uids")
}
