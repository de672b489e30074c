package pip

import (
	"context"
	"slices"
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

// TestTrustedDestinations: the configured indexes' host:port, with the
// scheme's port when the URL names none, PyPI's when no index is set;
// the userinfo is not part of it.
func TestTrustedDestinations(t *testing.T) {
	got := TrustedDestinations("http://u:pw@127.0.0.1:3141/simple/", []string{"https://Idx.Example/simple", "http://[::1]/x", "::bad"})
	want := []string{"127.0.0.1:3141", "Idx.Example:443", "[::1]:80"}
	if !slices.Equal(got, want) {
		t.Fatalf("%q, want %q", got, want)
	}
	if got := TrustedDestinations("", nil); !slices.Equal(got, []string{"pypi.org:443"}) {
		t.Fatalf("default: %q", got)
	}
	args := DownloadArgs("/pip", "/dest", "/wheels", "http://quro:s@127.0.0.1:1", "", nil, []string{"x"})
	if i := slices.Index(args, "--proxy"); i < 0 || args[i+1] != "http://quro:s@127.0.0.1:1" || !slices.Contains(args, "--isolated") {
		t.Fatalf("pip download's arguments: %q", args)
	}
}
