// Package share splits a server-wide budget (connections, slots, kept
// VMs) into per-tenant shares, so that one tenant at its share cannot
// take what is left from the others: a Pool holds at most Max in all and
// at most PerTenant for any one tenant, and refuses past either with an
// error that names the cap it met.
//
// It is the one owner of the concept: every server-wide pool a tenant can
// fill takes its places from a Pool.
package share

import (
	"errors"
	"fmt"
	"sync"
)

// ErrFull is what every refusal wraps: test with errors.Is. The refusal
// itself is a *Refusal.
var ErrFull = errors.New("share: no place left")

// Refusal is a refused Acquire: the pool's name, and whether the tenant
// was at its share (else the pool was full).
type Refusal struct {
	Pool      string
	Tenant    string
	AtShare   bool // the tenant held its share; false: the pool was full
	Held      int  // the tenant's places (AtShare), else the pool's
	PerTenant int  // the share
	PoolMax   int  // the pool's cap
}

func (r *Refusal) Error() string {
	if r.AtShare {
		return fmt.Sprintf("the tenant's share of the %s is in use: %d of %d (of the server's %d); release some or retry later",
			r.Pool, r.Held, r.PerTenant, r.PoolMax)
	}
	return fmt.Sprintf("the server's %s are all in use (%d); retry later", r.Pool, r.PoolMax)
}

func (r *Refusal) Unwrap() error { return ErrFull }

// Pool is a budget of places with a per-tenant share. The zero Pool and
// a nil one admit everything.
type Pool struct {
	name     string
	max, per int

	mu      sync.Mutex
	n       int
	held    map[string]int
	refused [2]uint64 // at the tenant's share; at the pool's max
}

// New returns a pool named name (in plural, as its refusals say it: "in-
// session connections") of max places, at most per of them a tenant's.
// max or per ≤ 0 is no cap; per is at most max.
func New(name string, max, per int) *Pool {
	if max > 0 && (per <= 0 || per > max) {
		per = max
	}
	return &Pool{name: name, max: max, per: per, held: map[string]int{}}
}

// Acquire takes a place for tenant, or returns a *Refusal.
func (p *Pool) Acquire(tenant string) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.refusal(tenant); r != nil {
		if r.AtShare {
			p.refused[0]++
		} else {
			p.refused[1]++
		}
		return r
	}
	if p.held == nil {
		p.held = map[string]int{}
	}
	p.n++
	p.held[tenant]++
	return nil
}

// Adopt takes a place for tenant past the caps: for a place that exists
// already when the pool starts (a disk image a previous server left
// mounted), which no refusal can undo. New places go through Acquire.
func (p *Pool) Adopt(tenant string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = map[string]int{}
	}
	p.n++
	p.held[tenant]++
}

// Check returns the *Refusal Acquire would return now, or nil; it takes
// nothing (a caller that refuses early, before work it would waste).
func (p *Pool) Check(tenant string) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.refusal(tenant); r != nil {
		return r
	}
	return nil
}

// refusal is why tenant gets no place now, or nil (p.mu held).
func (p *Pool) refusal(tenant string) *Refusal {
	if h := p.held[tenant]; p.per > 0 && h >= p.per {
		return &Refusal{Pool: p.name, Tenant: tenant, AtShare: true, Held: h, PoolMax: p.max, PerTenant: p.per}
	}
	if p.max > 0 && p.n >= p.max {
		return &Refusal{Pool: p.name, Tenant: tenant, Held: p.n, PoolMax: p.max, PerTenant: p.per}
	}
	return nil
}

// Release gives back a place tenant acquired.
func (p *Pool) Release(tenant string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.held[tenant]
	if h <= 0 {
		panic("share: Release of a place not acquired (" + p.name + ")")
	}
	p.n--
	if h == 1 {
		delete(p.held, tenant)
	} else {
		p.held[tenant] = h - 1
	}
}

// Stats are a pool's counts.
type Stats struct {
	Max, PerTenant int    // the caps (0: none)
	Held, Tenants  int    // places held; tenants holding some
	Top            int    // the most places one tenant holds
	RefusedShare   uint64 // refused since the start: tenant at its share
	RefusedFull    uint64 // refused since the start: pool full
}

// Stats returns the current counts.
func (p *Pool) Stats() Stats {
	if p == nil {
		return Stats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Max: p.max, PerTenant: p.per, Held: p.n, Tenants: len(p.held), RefusedShare: p.refused[0], RefusedFull: p.refused[1]}
	for _, h := range p.held {
		s.Top = max(s.Top, h)
	}
	return s
}

// Held is the places tenant holds.
func (p *Pool) Held(tenant string) int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[tenant]
}

// Of is the usual share of a pool of max places: a quarter, and at least
// floor (what one session may hold, say), at most max.
func Of(total, floor int) int {
	return min(total, max(total/4, floor))
}
