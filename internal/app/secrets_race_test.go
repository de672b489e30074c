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
	t.Parallel()
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

// TestSecretHostsSealed: a secret whose hosts were changed in the store
// (by whoever can write quro.db but not read secrets.key) does not open,
// so its value is never sent to the hosts written there.
func TestSecretHostsSealed(t *testing.T) {
	t.Parallel()
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
	if err := sec.set(ctx, "s1", "K", "the-value", []string{"api.test"}); err != nil {
		t.Fatal(err)
	}
	if got := sec.of("s1"); len(got) != 1 || got[0].Value != "the-value" {
		t.Fatalf("before: %+v", got)
	}
	rows, err := st.SessionSecrets(ctx, "s1")
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	rows[0].Hosts = []string{"evil.test"}
	if err := st.SetSessionSecret(ctx, "s1", rows[0]); err != nil {
		t.Fatal(err)
	}
	sec.forget("s1")
	for _, s := range sec.of("s1") {
		if s.Value != "" {
			t.Fatalf("the value opened for hosts %v", s.Hosts)
		}
	}
}
