package share_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/share"
)

// Two tenants: a at its share is refused with a message naming the share,
// b still gets places until the pool is full; a release gives a place back.
func TestShareTwoTenants(t *testing.T) {
	p := share.New("widgets", 5, 3)
	for range 3 {
		if err := p.Acquire("a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Check("a"); err == nil {
		t.Fatal("Check: a at its share has room")
	}
	err := p.Acquire("a")
	var r *share.Refusal
	if !errors.Is(err, share.ErrFull) || !errors.As(err, &r) || !r.AtShare || !strings.Contains(err.Error(), "tenant's share of the widgets") || !strings.Contains(err.Error(), "3 of 3") {
		t.Fatalf("a past its share: %v", err)
	}
	for range 2 {
		if err := p.Acquire("b"); err != nil {
			t.Fatalf("b while a holds its share: %v", err)
		}
	}
	if err := p.Acquire("b"); !errors.As(err, &r) || r.AtShare || !strings.Contains(err.Error(), "server's widgets are all in use") {
		t.Fatalf("b in a full pool: %v", err)
	}
	p.Release("a")
	if err := p.Acquire("b"); err != nil {
		t.Fatalf("b after a released one: %v", err)
	}
	if s := p.Stats(); s.Held != 5 || s.Tenants != 2 || s.Top != 3 || s.RefusedShare != 1 || s.RefusedFull != 1 || s.PerTenant != 3 {
		t.Fatalf("stats %+v", s)
	}
	if share.Of(1024, 32) != 256 || share.Of(64, 32) != 32 || share.Of(16, 32) != 16 {
		t.Fatal("Of")
	}
}

// Adopt counts a place that exists already past the caps: the tenant is
// then refused until it is back under its share.
func TestShareAdoptPastTheCaps(t *testing.T) {
	p := share.New("disks", 2, 1)
	p.Adopt("a")
	p.Adopt("a")
	if err := p.Acquire("a"); !errors.Is(err, share.ErrFull) {
		t.Fatalf("a past its share after Adopt: %v", err)
	}
	if err := p.Acquire("b"); !errors.Is(err, share.ErrFull) {
		t.Fatalf("b in a pool Adopt filled: %v", err)
	}
	p.Release("a")
	p.Release("a")
	if err := p.Acquire("b"); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Held != 1 || s.Tenants != 1 {
		t.Fatalf("stats %+v", s)
	}
}
