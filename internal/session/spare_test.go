package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// A spare is nobody's until claimed, and claimed once, with the checks of
// a create.
func TestSpareIsNobodysUntilClaimedOnce(t *testing.T) {
	m := manager(t, t.TempDir())
	bg := context.Background()
	sp, err := m.CreateSpare(bg, "acme", "none")
	if err != nil {
		t.Fatal(err)
	}
	if sp.UID <= 0 || sp.Tenant != SpareTenant || ValidTenant(SpareTenant) {
		t.Fatalf("%+v", sp)
	}
	acme := WithTenant(bg, "acme")
	for _, ctx := range []context.Context{bg, acme} {
		if _, err := m.Get(ctx, sp.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a spare is found: %v", err)
		}
		if n, _ := m.Count(ctx); n > 1 { // the default session only
			t.Fatalf("a spare is counted: %d", n)
		}
	}
	if list, err := m.Spares(bg); err != nil || len(list) != 1 || list[0].ID != sp.ID {
		t.Fatalf("%v %v", list, err)
	}
	// The operator's listing of every tenant (list_sessions tenant "*")
	// is of sessions someone owns: no spare in it.
	every, err := m.ListEvery(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range every {
		if s.ID == sp.ID || s.Tenant == SpareTenant {
			t.Fatalf("every tenant's sessions list a spare: %+v", s)
		}
	}
	if _, err := m.Claim(WithOnly(acme, sp.ID), sp, "x", CreateOptions{}); !errors.Is(err, ErrConfined) {
		t.Fatalf("code in a session claimed a spare: %v", err)
	}
	if _, err := m.Claim(acme, sp, "../x", CreateOptions{}); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	m.MaxPerTenant = 1
	if _, err := m.Create(acme, "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Claim(acme, sp, "work", CreateOptions{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("the session cap does not apply: %v", err)
	}
	m.MaxPerTenant = 0
	if _, err := m.Claim(acme, sp, "first", CreateOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	s, err := m.Claim(acme, sp, "", CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != sp.ID || s.UID != sp.UID || s.Dir != sp.Dir || s.Tenant != "acme" || s.Name != "s-"+sp.ID[:8] {
		t.Fatalf("%+v", s)
	}
	got, err := m.Get(acme, s.Name)
	if err != nil || got.ID != sp.ID || got.UID != sp.UID {
		t.Fatalf("%+v %v", got, err)
	}
	if every, err = m.ListEvery(bg); err != nil || !slices.ContainsFunc(every, func(e *Session) bool { return e.ID == sp.ID && e.Tenant == "acme" }) {
		t.Fatalf("the claimed spare is not in every tenant's sessions: %v %v", every, err)
	}
	if _, err := m.Claim(WithTenant(bg, "other"), sp, "y", CreateOptions{}); !errors.Is(err, ErrClaimed) {
		t.Fatalf("claimed twice: %v", err)
	}
	if _, err := m.Get(WithTenant(bg, "other"), "y"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("%v", err)
	}
	if list, _ := m.Spares(bg); len(list) != 0 {
		t.Fatalf("still a spare: %v", list)
	}
}

// Creates and claims fired at once cannot pass a ceiling together: each
// counts, in the transaction that adds its session, what the others
// committed. Exactly the ceiling's sessions are made, the rest refused
// with the LimitError that names the ceiling; the spares not claimed stay
// spares.
func TestConcurrentCreatesAndClaimsStopAtTheCeiling(t *testing.T) {
	for _, scope := range []string{"tenant", "server"} {
		t.Run(scope, func(t *testing.T) {
			m := manager(t, t.TempDir())
			bg := context.Background()
			acme := WithTenant(bg, "acme")
			const ceiling, n = 3, 24
			spares := make([]*Session, n/2)
			for i := range spares {
				sp, err := m.CreateSpare(bg, "acme", "none")
				if err != nil {
					t.Fatal(err)
				}
				spares[i] = sp
			}
			if scope == "tenant" {
				m.MaxPerTenant = ceiling
			} else {
				m.MaxTotal = ceiling + 1 // the local tenant's default session is one
				if _, err := m.Default(bg); err != nil {
					t.Fatal(err)
				}
			}
			errs := make([]error, n)
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-gate
					if i%2 == 0 {
						_, errs[i] = m.Create(acme, fmt.Sprint("c", i))
					} else {
						_, errs[i] = m.Claim(acme, spares[i/2], fmt.Sprint("c", i), CreateOptions{})
					}
				})
			}
			close(gate)
			wg.Wait()
			made := 0
			for _, err := range errs {
				var le *LimitError
				switch {
				case err == nil:
					made++
				case errors.As(err, &le):
					if le.Scope != scope || le.Max != m.MaxPerTenant+m.MaxTotal {
						t.Errorf("refused at %+v", le)
					}
				default:
					t.Errorf("not a LimitError: %v", err)
				}
			}
			if c, _ := m.Count(acme); made != ceiling || c != ceiling {
				t.Fatalf("%d made, %d counted; the ceiling is %d", made, c, ceiling)
			}
			// A refused claim leaves its spare a spare.
			left, err := m.Spares(bg)
			if err != nil {
				t.Fatal(err)
			}
			mine, err := m.List(acme)
			if err != nil {
				t.Fatal(err)
			}
			claimed := 0
			for _, s := range mine {
				if slices.ContainsFunc(spares, func(sp *Session) bool { return sp.ID == s.ID }) {
					claimed++
				}
			}
			if len(left)+claimed != len(spares) {
				t.Fatalf("%d spares left and %d claimed of %d", len(left), claimed, len(spares))
			}
		})
	}
}
