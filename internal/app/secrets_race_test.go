package app

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/store"
)

// TestSecretsSetConcurrent: a secret removed while another of the same
// session is set is gone from what the egress replaces, not brought
// back by the other set's reload.
func TestSecretsSetConcurrent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "q.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	if err := st.CreateSession(ctx, &store.Session{ID: "s1", Name: "s1", Tenant: "t", CreatedAt: now, LastUsedAt: now, Network: "internet"}); err != nil {
		t.Fatal(err)
	}
	sec, err := openSecrets(dir, st)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if err := sec.set(ctx, "s1", "X", "x-value", []string{"x.test"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := sec.set(ctx, "s1", "X", "", nil); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if err := sec.set(ctx, "s1", "Y", "y-value", []string{"y.test"}); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		for _, s := range sec.of("s1") {
			if s.Name == "X" {
				t.Fatalf("round %d: the removed secret X is still replaced", i)
			}
		}
	}
}
