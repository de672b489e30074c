package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/share"
	"golang.org/x/sys/unix"
)

// Spare sessions: a session's first Python run pays for its box (~20 ms)
// and for the interpreter's start (~25 ms). With Options.SpareSessions the
// App keeps, per box template, at least that many spare sessions made ahead
// of demand in the background (the pool's size follows demand: see "The
// pool's size" below): a real session row of session.SpareTenant (a
// uid allocated as any session's, its directories, its tenant's disk
// image), its box, and its Python worker started and ready. create_session
// whose template matches claims one: the new session is the spare (its
// id, uid, directories, box and worker), renamed and handed to the tenant
// in one store update that succeeds once, and a refill starts in the
// background; else the session is made as before.
//
// A template is what a box fixes when it is made, beyond what is the
// spare's own (uid, directories, in-session socket): the tenant (the box's
// cgroup is under the tenant's, and the disk image has the tenant's
// quota), the tenant's limits when the spare was made, and the network
// policy. Sessions on a rootfs get no spare. A spare has never run anyone's
// code: its worker imported only the interpreter's own modules, its
// environment and workspace are empty and new. A spare whose tenant's
// limits changed, or whose worker died, is discarded instead of claimed.
// Discarded spares, and every spare when the App closes, are destroyed as
// a session is: box killed, worker stopped, row deleted (the uid retired),
// disk image and directories removed.
//
// The pool's size: each template has a target, Options.SpareSessions (the
// floor) when idle. A create_session that finds no spare of its template
// ready raises the target by one (additive growth: a burst of N creates
// that the pool could not serve asks for N more spares, so that the next
// burst finds them), up to three bounds: the operator's
// (Options.MaxSpareSessions, the spares of every template together, ready
// and being made), the tenant's share of it (Options.SparesPerTenant, a
// quarter by default, so that one tenant's burst cannot take the server's
// spares), and the tenant's own session ceiling (it could not claim more).
// A spare also counts, from its first process on, in its tenant's memory
// and task ceilings (its box's cgroup is under the tenant's). A template
// that had no miss for an idle period (spareIdle) has its target halved,
// never below the floor, and its ready spares past the target destroyed;
// the pool's patrol does this (trim), on the pool's clock (now, which tests
// replace). Spares are made in parallel, as many at once as the machine has
// CPUs (makers); the rest wait their turn. A create_session that finds
// no spare ready waits for none being made: it makes its session at once
// (see RATIONALE.md, "Why a create does not wait for a spare being
// made").

// maxSpareTemplates bounds the templates with spares: a template
// wanted less recently than that many others loses its spares. A tenant's
// share of them is a quarter (share.Of): a tenant past it loses the spares
// of its own template wanted least recently, never another tenant's, so
// that one tenant's churn of templates does not empty the others' spares
// (with today's two network policies a tenant has at most two templates,
// its share; the share holds as templates gain more parts).
const maxSpareTemplates = 8

// spareKey names a template; the tenant's limits are checked on claim.
type spareKey struct{ tenant, network string }

// spare is one spare session and the tenant limits it was made under.
type spare struct {
	s      *session.Session
	limits TenantLimits
}

// spares is the App's pool of spare sessions.
type spares struct {
	a     *App
	floor int // spares each template keeps when idle (Options.SpareSessions)
	// max bounds the spares of every template together, ready and being
	// made (Options.MaxSpareSessions), and perTenant those of one tenant.
	ceiling, perTenant int
	// maxTemplates is maxSpareTemplates and tenantTemplates a tenant's
	// share of them (tests lower both).
	maxTemplates, tenantTemplates int
	idle                          time.Duration    // spareIdle: a template without a miss this long shrinks
	now                           func() time.Time // the pool's clock (time.Now; tests replace it)
	makers                        chan struct{}    // a slot per spare being made: as many as CPUs
	lock                          *os.File         // spares.lock, held while the pool lives

	ctx    context.Context // the fills' lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	ready   map[spareKey][]*spare
	filling map[spareKey]int       // spares being made or waiting for a maker
	making  map[spareKey]int       // of those, being made (holding a maker)
	binding int                    // claims binding a spare's worker now
	wanted  map[spareKey]time.Time // templates with spares, by last demand
	target  map[spareKey]int       // spares wanted per template (floor when absent)
	missed  map[spareKey]time.Time // the last miss or trim, per template
	changed chan struct{}          // closed (and replaced) when a fill ends
	failed  map[spareKey]time.Time // the last fill that failed, per template
}

// spareIdle is how long a template goes without a miss, once its fills
// have ended, before its target is halved (toward the floor) and its
// spares past it are destroyed.
const spareIdle = 2 * time.Minute

// errSpareUnwanted ends a fill whose spare is no longer wanted when its
// turn comes (its template's target shrank meanwhile).
var errSpareUnwanted = errors.New("the spare is no longer wanted")

// DefaultMaxSpareSessions is the server's bound on spare sessions (all
// templates together, ready and being made) for a machine of mem bytes of
// memory: one per 384 MiB, so that spares (about 12 MiB each) take at most
// about 1/32 of it, between 4 and 256.
func DefaultMaxSpareSessions(mem uint64) int {
	return int(min(max(mem/(384<<20), 4), 256))
}

// MachineMaxSpareSessions is DefaultMaxSpareSessions of this machine's
// memory (quro serve --max-spare-sessions' default).
func MachineMaxSpareSessions() int { return DefaultMaxSpareSessions(machineMemory()) }

// machineMemory is the machine's memory in bytes (0 when unknown).
func machineMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return si.Totalram * uint64(si.Unit)
}

// spareRetry is how long after a failed fill no other starts for its
// template (a tenant at its ceiling, an interpreter that does not start):
// else every create_session would pay a row, a disk image and a box for
// nothing.
const spareRetry = 5 * time.Second

// openSpares starts the pool, first filled for the local tenant's
// sessions without network. One quro process of a data directory keeps
// spares (it holds spares.lock): it removes those a process that did not
// close left behind, and no other process (a CLI command, a second
// server) touches its spares. nil when another process has the lock.
func (a *App) openSpares(ctx context.Context, floor, maxN, perTenant int) *spares {
	lock, err := os.OpenFile(filepath.Join(a.DataDir, "spares.lock"), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		a.Log.Warn("no spare sessions", "err", err)
		return nil
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		a.Log.Info("no spare sessions: another quro process of this data directory keeps them", "err", err)
		return nil
	}
	a.removeStaleSpares(ctx)
	pctx, cancel := context.WithCancel(context.Background())
	switch {
	case maxN == 0:
		maxN = DefaultMaxSpareSessions(machineMemory())
	case maxN < 0:
		maxN = floor // no growth
	}
	floor = min(floor, maxN)
	if perTenant <= 0 {
		perTenant = share.Of(maxN, floor)
	}
	p := &spares{a: a, floor: floor, ceiling: maxN, perTenant: min(max(perTenant, floor), maxN), lock: lock, ctx: pctx, cancel: cancel,
		maxTemplates: maxSpareTemplates, tenantTemplates: share.Of(maxSpareTemplates, 1),
		idle: spareIdle, now: time.Now, makers: make(chan struct{}, max(runtime.NumCPU(), 1)),
		ready: map[spareKey][]*spare{}, filling: map[spareKey]int{}, making: map[spareKey]int{},
		wanted: map[spareKey]time.Time{}, target: map[spareKey]int{}, missed: map[spareKey]time.Time{},
		changed: make(chan struct{}), failed: map[spareKey]time.Time{}}
	p.refill(spareKey{tenant: "", network: "none"})
	p.wg.Add(1)
	go p.patrol()
	return p
}

// patrol trims the pool every quarter of its idle period until it closes.
func (p *spares) patrol() {
	defer p.wg.Done()
	t := time.NewTicker(p.idle / 4)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			p.trim()
		}
	}
}

// trim shrinks the templates that had no miss for an idle period: the
// target halves (never below the floor) and ready spares past it are
// destroyed, those made last first.
func (p *spares) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	now := p.now()
	for key, n := range p.target {
		if p.filling[key] > 0 || now.Sub(p.missed[key]) < p.idle {
			continue // still filling toward its target, or not idle long enough
		}
		n = max(n/2, p.floor)
		p.missed[key] = now
		if n <= p.floor {
			delete(p.target, key)
			delete(p.missed, key)
		} else {
			p.target[key] = n
		}
		list := p.ready[key]
		for len(list) > n {
			p.discardLocked(list[len(list)-1])
			list = list[:len(list)-1]
		}
		p.ready[key] = list
	}
}

// targetLocked is how many spares key's template wants now (p.mu held).
func (p *spares) targetLocked(key spareKey) int {
	if n, ok := p.target[key]; ok {
		return n
	}
	return p.floor
}

// miss raises key's target by one after a create_session found none of
// its spares ready, up to the server's bound, the tenant's share and the
// tenant's session ceiling (sessions, when positive).
func (p *spares) miss(key spareKey, sessions int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := min(p.targetLocked(key)+1, p.perTenant)
	if sessions > 0 {
		n = int(min(int64(n), sessions))
	}
	p.target[key] = max(n, p.floor)
	p.missed[key] = p.now()
}

// heldLocked counts the spares of every template, and of tenant's, ready
// and being made (p.mu held).
func (p *spares) heldLocked(tenant string) (all, own int) {
	for k, list := range p.ready {
		all += len(list)
		if k.tenant == tenant {
			own += len(list)
		}
	}
	for k, n := range p.filling {
		all += n
		if k.tenant == tenant {
			own += n
		}
	}
	return all, own
}

// removeStaleSpares deletes the spare sessions a process that did not
// close left behind (their processes ended with it).
func (a *App) removeStaleSpares(ctx context.Context) {
	list, err := a.Sessions.Spares(ctx)
	if err != nil {
		a.Log.Warn("spare sessions", "err", err)
		return
	}
	for _, s := range list {
		a.destroySpare(s)
	}
	if len(list) > 0 {
		a.Sessions.WaitReleases() // at start, their disks and directories go before the pool refills
	}
}

// destroySpare ends spare s as destroy_session ends a session, on the
// one teardown path (session.Life.Destroy): its box and worker, then its
// row (the uid is retired), disk image and directories.
func (a *App) destroySpare(s *session.Session) {
	// Only a spare: never a session a claim gave a tenant.
	if cur, err := a.Sessions.ByIDAnyTenant(context.Background(), s.ID); err == nil && cur.Tenant != session.SpareTenant {
		a.Log.Error("not destroying a claimed session as a spare", "session", s.ID)
		return
	}
	if _, err := a.lives.Destroy(context.Background(), s); err != nil {
		a.Log.Warn("spare session not removed", "session", s.ID, "err", err)
	}
}

// claim returns a spare of the template create_session asks for, claimed
// for ctx's tenant under in.Name, or nil when there is none (the caller
// makes the session as usual). An error is the caller's to report (a name
// taken, the tenant's session cap): the spare stays in the pool.
func (p *spares) claim(ctx context.Context, in CreateSessionInput, o session.CreateOptions) (*session.Session, error) {
	if p == nil || in.Rootfs != "" {
		return nil, nil
	}
	network := in.Network
	if network == "" {
		network = "none"
	}
	if !slices.Contains(session.Networks, network) {
		return nil, nil // refused by the usual path, with its message
	}
	tenant := session.TenantFrom(ctx)
	key := spareKey{tenant, network}
	limits, err := p.a.tenants.Limits(ctx, tenant)
	if err != nil {
		return nil, err // refused: the usual path would refuse it too
	}
	defer p.refill(key)
	for first := true; ; first = false {
		sp := p.take(key)
		if sp == nil {
			if first {
				p.miss(key, limits.Sessions) // the pool could not serve this one
			}
			// None ready: the session is made the usual way now, not after
			// a wait for a spare being made (whose end nothing bounds on a
			// loaded machine); that spare serves the next create.
			return nil, nil
		}
		p.refill(key) // now, not after the claim
		s, next, err := p.claimOne(ctx, key, sp, limits, in.Name, o)
		if !next {
			return s, err
		}
	}
}

// spareWait is how long a claim's bind of a spare's worker may take per
// CPU's worth of binds in flight before the spare is given up as unfit.
const spareWait = time.Second

// claimOne claims sp, taken from the pool, with o's env, metadata and
// lifetime; next: it was unfit and discarded, try another.
func (p *spares) claimOne(ctx context.Context, key spareKey, sp *spare, limits TenantLimits, name string, o session.CreateOptions) (_ *session.Session, next bool, _ error) {
	defer p.wg.Done() // take's
	if sp.limits != limits {
		p.discard(sp)
		return nil, true, nil
	}
	// A spare's worker answers a bind at once; one that does not (its box
	// starved of CPU by the tenant's quota) is unfit, and the session is
	// made the usual way rather than waiting for it.
	// The worker starts the claimed session's runs: it gets the
	// session's first variables now.
	// In a burst the binds share the CPUs: each waits a second per CPU's
	// worth of binds in flight, since a spare given up on is replaced by
	// a session made from scratch, many times slower (bench/spare: with
	// 100 spares ready and a flat second, a loaded 2-core machine gave up
	// on dozens and made their sessions anew).
	p.mu.Lock()
	p.binding++
	wait := spareWait * time.Duration((p.binding+cap(p.makers)-1)/cap(p.makers))
	p.mu.Unlock()
	bound := *sp.s
	bound.Env = o.Env
	bctx, cancel := context.WithTimeout(ctx, wait)
	err := p.a.Python.BindSpare(bctx, &bound)
	cancel()
	p.mu.Lock()
	p.binding--
	p.mu.Unlock()
	if err != nil {
		p.a.Log.Warn("spare session unfit", "session", sp.s.ID, "err", err)
		p.discard(sp)
		return nil, true, nil
	}
	s, err := p.a.Sessions.Claim(ctx, sp.s, name, o)
	switch {
	case err == nil:
		p.a.Python.Claimed(s.ID)
		return s, false, nil
	case errors.Is(err, session.ErrExists), errors.Is(err, session.ErrLimit),
		errors.Is(err, session.ErrBadName), errors.Is(err, session.ErrConfined),
		errors.Is(err, session.ErrBadMetadata), errors.Is(err, session.ErrBadLifetime):
		p.put(key, sp) // unchanged: the update did not happen
		return nil, false, err
	default:
		p.a.Log.Warn("spare session not claimed", "session", sp.s.ID, "err", err)
		p.discard(sp)
		return nil, true, nil
	}
}

// take removes a spare of key from the pool; nil when there is none
// ready. Once taken, a spare is claimed, put back or discarded by its
// taker alone, which then calls p.wg.Done (close waits for it).
func (p *spares) take(key spareKey) *spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.wanted[key] = p.now()
	list := p.ready[key]
	if len(list) == 0 {
		return nil
	}
	sp := list[0]
	p.ready[key] = list[1:]
	p.wg.Add(1)
	return sp
}

// put returns an unclaimed spare to the pool.
func (p *spares) put(key spareKey, sp *spare) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.wanted[key].IsZero() || len(p.ready[key]) >= p.targetLocked(key) {
		p.discardLocked(sp)
		return
	}
	p.ready[key] = append(p.ready[key], sp)
}

// discard destroys sp in the background.
func (p *spares) discard(sp *spare) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discardLocked(sp)
}

func (p *spares) discardLocked(sp *spare) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.a.destroySpare(sp.s)
	}()
}

// refill starts making spares of key until the pool has its target of
// them (those being made included), within the server's bound and the
// tenant's share. Past key's tenant's share of templates, its own template
// wanted least recently loses its spares; past p.maxTemplates, the
// server's.
func (p *spares) refill(key spareKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.wanted[key] = p.now()
	for p.templatesOf(key.tenant) > max(p.tenantTemplates, 1) {
		p.dropLocked(p.oldestLocked(key, true))
	}
	for len(p.wanted) > max(p.maxTemplates, 1) {
		p.dropLocked(p.oldestLocked(key, false))
	}
	if t, ok := p.failed[key]; ok && p.now().Sub(t) < spareRetry {
		return
	}
	all, own := p.heldLocked(key.tenant)
	for n := len(p.ready[key]) + p.filling[key]; n < p.targetLocked(key) && all < p.ceiling && own < p.perTenant; n++ {
		p.filling[key]++
		all++
		own++
		p.wg.Add(1)
		go p.fill(key)
	}
}

// templatesOf counts tenant's templates with spares (p.mu held).
func (p *spares) templatesOf(tenant string) int {
	n := 0
	for k := range p.wanted {
		if k.tenant == tenant {
			n++
		}
	}
	return n
}

// oldestLocked is the template wanted least recently but key, of key's
// tenant alone when own (p.mu held; there is one).
func (p *spares) oldestLocked(key spareKey, own bool) spareKey {
	var old spareKey
	var at time.Time
	for k, t := range p.wanted {
		if k != key && (!own || k.tenant == key.tenant) && (at.IsZero() || t.Before(at)) {
			old, at = k, t
		}
	}
	return old
}

// dropLocked discards template k's spares and forgets it (p.mu held).
func (p *spares) dropLocked(k spareKey) {
	for _, sp := range p.ready[k] {
		p.discardLocked(sp)
	}
	delete(p.ready, k)
	delete(p.wanted, k)
	delete(p.failed, k)
	delete(p.target, k)
	delete(p.missed, k)
}

// fill makes one spare of key, once a maker is free, and adds it to the
// pool.
func (p *spares) fill(key spareKey) {
	defer p.wg.Done()
	var sp *spare
	var err error
	made := false // it held a maker
	select {
	case p.makers <- struct{}{}:
		p.mu.Lock()
		// Still wanted? The target may have shrunk while this fill waited.
		made = !p.closed && len(p.ready[key])+p.making[key] < p.targetLocked(key)
		if made {
			p.making[key]++
		}
		p.mu.Unlock()
		if made {
			sp, err = p.make(key)
		} else {
			err = errSpareUnwanted
		}
		<-p.makers
	case <-p.ctx.Done():
		err = p.ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling[key]--; p.filling[key] == 0 {
		delete(p.filling, key)
	}
	if made {
		if p.making[key]--; p.making[key] == 0 {
			delete(p.making, key)
		}
	}
	if _, grown := p.target[key]; grown && p.filling[key] == 0 {
		p.missed[key] = p.now() // full (or given up): the idle period starts
	}
	close(p.changed)
	p.changed = make(chan struct{})
	if err != nil {
		if p.ctx.Err() == nil && !errors.Is(err, errSpareUnwanted) {
			p.failed[key] = p.now()
			p.a.Log.Warn("spare session not made", "tenant", key.tenant, "network", key.network, "err", err)
		}
		return
	}
	delete(p.failed, key)
	if p.closed || p.wanted[key].IsZero() || len(p.ready[key]) >= p.targetLocked(key) {
		p.discardLocked(sp)
		return
	}
	p.ready[key] = append(p.ready[key], sp)
}

// make makes a spare session of key with its box and a started worker.
func (p *spares) make(key spareKey) (*spare, error) {
	a := p.a
	limits, err := a.tenants.Limits(p.ctx, key.tenant)
	if err != nil {
		return nil, err
	}
	s, err := a.Sessions.CreateSpare(p.ctx, key.tenant, key.network)
	if err != nil {
		return nil, err
	}
	// Its box's cgroup goes under the tenant's, and admission counts it
	// with the tenant's, from the first process on: the session's row
	// names the spare tenant until the claim.
	a.tenants.remember(s.ID, key.tenant)
	err = a.Python.StartSpare(p.ctx, s)
	if now, lerr := a.tenants.Limits(p.ctx, key.tenant); err == nil && (lerr != nil || now != limits) {
		err = errors.New("the tenant's limits changed while the spare was made")
	}
	if err != nil {
		a.destroySpare(s)
		return nil, err
	}
	return &spare{s: s, limits: limits}, nil
}

// close destroys every spare and waits until the pool's work has ended.
func (p *spares) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	for _, list := range p.ready {
		for _, sp := range list {
			p.discardLocked(sp)
		}
	}
	p.ready = map[spareKey][]*spare{}
	p.mu.Unlock()
	p.cancel() // a spare being made is destroyed by its fill
	p.wg.Wait()
	p.lock.Close()
}

// SpareStats is the spare pool's state: spares ready, being made (making
// or waiting for a maker) and wanted (the templates' targets together).
type SpareStats struct{ Ready, Filling, Target int }

// SpareStats reports the pool's state, for status and benchmarks.
func (a *App) SpareStats() SpareStats {
	p := a.spares
	if p == nil {
		return SpareStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var st SpareStats
	for k := range p.wanted {
		st.Target += p.targetLocked(k)
	}
	st.Ready, _ = p.heldLocked("")
	for _, n := range p.filling {
		st.Ready -= n
		st.Filling += n
	}
	return st
}

// SpareSessions reports the spare sessions ready now, for status and tests.
func (a *App) SpareSessions() int {
	p := a.spares
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, list := range p.ready {
		n += len(list)
	}
	return n
}
