package pip

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/egress"
)

// Each tenant's share of the fetch boxes is one at a time: a's second
// fetch says it waits for its first (FetchWaitLine) and waits (its error
// says so when its time runs out), while b's fetch starts at once and
// says nothing of waiting.
func TestFetchShareIsPerTenant(t *testing.T) {
	c := &Cache{Root: t.TempDir()}
	ctx := context.Background()
	var out strings.Builder
	unlockA, err := c.lockFetch(ctx, "a", &out)
	if err != nil || out.Len() != 0 {
		t.Fatalf("a's first fetch: %v, said %q", err, out.String())
	}
	// The second waits until its caller gives up: canceled once it
	// said it waits (no time limit to run out).
	seen := make(chan struct{})
	said := &lineWriter{line: FetchWaitLine, seen: seen}
	second, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-seen; cancel() }()
	if _, err := c.lockFetch(second, "a", said); err == nil || !strings.Contains(err.Error(), "a tenant's share is one fetch at a time") {
		t.Fatalf("a's second fetch: %v", err)
	}
	unlockB, err := c.lockFetch(ctx, "b", &out)
	if err != nil || out.Len() != 0 {
		t.Fatalf("b's fetch while a's runs: %v, said %q", err, out.String())
	}
	unlockB()
	unlockA()
	unlockA2, err := c.lockFetch(ctx, "a", &out)
	if err != nil || out.Len() != 0 {
		t.Fatalf("a's fetch after its first ended: %v, said %q", err, out.String())
	}
	unlockA2()
}

// lineWriter closes seen when line has been written to it (by one
// writer: lockFetch's).
type lineWriter struct {
	line   string
	seen   chan struct{}
	b      strings.Builder
	closed bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.b.Write(p)
	if !w.closed && strings.Contains(w.b.String(), w.line+"\n") {
		w.closed = true
		close(w.seen)
	}
	return len(p), nil
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
	if got := TrustedDestinations("", nil); !slices.Equal(got, []string{"pypi.org:443", "files.pythonhosted.org:443"}) {
		t.Fatalf("default: %q", got)
	}
	args := DownloadArgs("/pip", "/dest", "/wheels", "http://127.0.0.1:3128", "", 0, nil, []string{"x"})
	if i := slices.Index(args, "--proxy"); i < 0 || args[i+1] != "http://127.0.0.1:3128" || !slices.Contains(args, "--isolated") || slices.Contains(args, "--retries") {
		t.Fatalf("pip download's arguments: %q", args)
	}
	// Retries: pip's default at 0, none when negative, the number else.
	for retries, want := range map[int]string{-1: "0", 2: "2"} {
		args := DownloadArgs("/pip", "/dest", "/wheels", "http://127.0.0.1:3128", "", retries, nil, []string{"x"})
		if i := slices.Index(args, "--retries"); i < 0 || args[i+1] != want || i > slices.Index(args, "--") {
			t.Fatalf("retries %d: %q", retries, args)
		}
	}
}

// TestFetchPolicy: a fetch box's egress policy names the indexes'
// host:port alone and trusts them (a loopback index is the operator's);
// another port of the index's host, another name and a public address
// are not allowed, and no name but the indexes' resolves.
func TestFetchPolicy(t *testing.T) {
	p := Policy("http://u:pw@127.0.0.1:3141/simple/", []string{"https://idx.example/simple"})
	if p.Mode != egress.ModeRules || !slices.Equal(p.Trusted, []string{"127.0.0.1:3141", "idx.example:443"}) {
		t.Fatalf("policy %+v", p)
	}
	for _, c := range []struct {
		name string
		port int
		ok   bool
	}{{"idx.example", 443, true}, {"idx.example", 80, false}, {"github.com", 443, false}, {"files.pythonhosted.org", 443, false}} {
		if ok, rule := p.DecideName(c.name, c.port); ok != c.ok {
			t.Errorf("%s:%d: %v (%s)", c.name, c.port, ok, rule)
		}
	}
	if ok, _ := p.DecideLookup("github.com"); ok {
		t.Error("github.com resolves in a fetch box")
	}
	if ok, rule := p.DecideAddr(netip.MustParseAddr("203.0.113.7"), 443); ok {
		t.Errorf("a public address: allowed (%s)", rule)
	}
	if ok, _ := Policy("", nil).DecideName("files.pythonhosted.org", 443); !ok {
		t.Error("PyPI's files are not reachable under the default index")
	}
}
