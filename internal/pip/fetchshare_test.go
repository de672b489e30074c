package pip

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Each tenant's share of the fetch boxes is one at a time: a's second
// fetch waits for its first (and says so when its time runs out), while
// b's fetch starts at once.
func TestFetchShareIsPerTenant(t *testing.T) {
	c := &Cache{Root: t.TempDir()}
	ctx := context.Background()
	unlockA, err := c.lockFetch(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.lockFetch(short, "a"); err == nil || !strings.Contains(err.Error(), "a tenant's share is one fetch at a time") {
		t.Fatalf("a's second fetch: %v", err)
	}
	b, cancelB := context.WithTimeout(ctx, 5*time.Second)
	defer cancelB()
	unlockB, err := c.lockFetch(b, "b")
	if err != nil {
		t.Fatalf("b's fetch while a's runs: %v", err)
	}
	unlockB()
	unlockA()
	unlockA2, err := c.lockFetch(b, "a")
	if err != nil {
		t.Fatalf("a's fetch after its first ended: %v", err)
	}
	unlockA2()
}
