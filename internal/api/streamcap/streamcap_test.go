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
