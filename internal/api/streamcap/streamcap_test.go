package streamcap

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// TestLimiter: the cap is per tenant and token; a release frees one place
// however often it is called; callers without a token id, a nil Limiter
// and a cap of 0 count nothing.
func TestLimiter(t *testing.T) {
	l := New(2, "--max-streams-per-token")
	a := controller.Caller{Tenant: "t", TokenID: "a"}
	sameIDOtherTenant := controller.Caller{Tenant: "u", TokenID: "a"}
	r1, e := l.Acquire(a)
	if e != nil {
		t.Fatal(e)
	}
	if _, e := l.Acquire(a); e != nil {
		t.Fatal(e)
	}
	_, e = l.Acquire(a)
	if e == nil || e.Code != capability.ResourceExhausted || !strings.Contains(e.Message, "--max-streams-per-token") {
		t.Fatalf("past the cap: %v", e)
	}
	if _, e := l.Acquire(sameIDOtherTenant); e != nil {
		t.Fatalf("another tenant's token: %v", e)
	}
	r1()
	r1()
	if n := l.Held(a); n != 1 {
		t.Fatalf("held %d after one release called twice, want 1", n)
	}
	for range 5 {
		if _, e := l.Acquire(controller.Caller{Tenant: "t"}); e != nil {
			t.Fatalf("a caller without a token id: %v", e)
		}
	}
	for _, lim := range []*Limiter{nil, New(0, "")} {
		for range 5 {
			if _, e := lim.Acquire(a); e != nil {
				t.Fatalf("no cap: %v", e)
			}
		}
	}
}

// TestLimiterTenantShares: with Tenants, a tenant's tokens together hold
// at most its share of the server's streams (a quarter, at least one
// token's cap): tenant a, with many tokens, is refused at its share with
// a message naming it and the flag, while tenant b still gets its own; a
// release gives a's place back.
func TestLimiterTenantShares(t *testing.T) {
	l := New(2, "--max-streams-per-token")
	l.Tenants(16, "--max-conns") // a tenant's share: 4
	var rel []func()
	for i := range 4 {
		r, e := l.Acquire(controller.Caller{Tenant: "a", TokenID: string(rune('a' + i/2))})
		if e != nil {
			t.Fatalf("a's stream %d: %v", i, e)
		}
		rel = append(rel, r)
	}
	_, e := l.Acquire(controller.Caller{Tenant: "a", TokenID: "fresh"})
	if e == nil || e.Code != capability.ResourceExhausted {
		t.Fatalf("a past its share with a fresh token: %v", e)
	}
	for _, want := range []string{"tenant's share of the streams", "4 of 4 (of the server's 16)", "--max-conns"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("a's refusal %q does not say %q", e.Message, want)
		}
	}
	if n := l.Held(controller.Caller{Tenant: "a", TokenID: "fresh"}); n != 0 {
		t.Fatalf("a refused stream is held: %d", n)
	}
	for range 2 {
		if _, e := l.Acquire(controller.Caller{Tenant: "b", TokenID: "b1"}); e != nil {
			t.Fatalf("b while a holds its share: %v", e)
		}
	}
	rel[0]()
	rel[0]()
	if _, e := l.Acquire(controller.Caller{Tenant: "a", TokenID: "fresh"}); e != nil {
		t.Fatalf("a after a release: %v", e)
	}
}
