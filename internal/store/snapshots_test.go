package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Snapshots belong to their tenant: another tenant neither finds nor
// deletes one, by id or name, and names are per tenant. The count ceiling
// holds against snapshots recorded at once, the bytes ceiling when one is
// completed.
func TestSnapshotRows(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "q.db"))
	mk := func(id, tenant, name string) *Snapshot {
		return &Snapshot{ID: id, Tenant: tenant, Name: name, SourceID: "src", SourceName: "w", CreatedAt: time.Now(),
			Env: map[string]string{"A": "1"}, Cwd: "sub", Network: "none"}
	}
	if err := s.CreateSnapshot(ctx, mk("a1", "ta", "s"), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSnapshot(ctx, mk("b1", "tb", "s"), 0); err != nil {
		t.Fatalf("tb cannot have its own \"s\": %v", err)
	}
	if err := s.CreateSnapshot(ctx, mk("a2", "ta", "s"), 0); !errors.Is(err, ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "tb", "a1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("tb deleted ta's snapshot: %v", err)
	}
	if got, err := s.SnapshotByName(ctx, "tb", "s"); err != nil || got.ID != "b1" {
		t.Fatalf("tb's s: %+v %v", got, err)
	}
	got, err := s.SnapshotByID(ctx, "a1")
	if err != nil || got.Tenant != "ta" || got.Complete || got.Env["A"] != "1" || got.Cwd != "sub" {
		t.Fatalf("a1: %+v %v", got, err)
	}
	if err := s.FinishSnapshot(ctx, "a1", 600, 3, 1000); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.SnapshotByID(ctx, "a1"); !got.Complete || got.Size != 600 || got.Files != 3 {
		t.Fatalf("finished: %+v", got)
	}
	// ta holds 600 of 1000 bytes: another 500 does not fit; tb's do not
	// count for ta.
	if err := s.FinishSnapshot(ctx, "b1", 900, 1, 1000); err != nil {
		t.Fatal(err)
	}
	s.CreateSnapshot(ctx, mk("a3", "ta", "t"), 0)
	var ce *SnapshotCapError
	if err := s.FinishSnapshot(ctx, "a3", 500, 1, 1000); !errors.As(err, &ce) || ce.Bytes != 600 {
		t.Fatalf("bytes ceiling: %v", err)
	}
	if n, bytes, _ := s.SnapshotUsage(ctx, "ta"); n != 2 || bytes != 600 {
		t.Fatalf("usage: %d %d", n, bytes)
	}
	// 20 at once under a ceiling of 5 (ta holds 2): exactly 3 more.
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	for i := range 20 {
		wg.Go(func() {
			if s.CreateSnapshot(ctx, mk(fmt.Sprintf("c%d", i), "ta", fmt.Sprintf("c%d", i)), 5) == nil {
				mu.Lock()
				made++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if list, _ := s.Snapshots(ctx, "ta"); made != 3 || len(list) != 5 {
		t.Fatalf("made %d, ta holds %d", made, len(list))
	}
}
