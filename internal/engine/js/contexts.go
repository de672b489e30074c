package js

// Persistent contexts (runcode.ContextRun with an ID; E2B's JavaScript
// kernel): a VM kept between the runs of one (session, context), unlike
// run_code's fresh VM per run. Each run is evaluated as a global script
// (QuickJS's async global eval, as every run), not as a module, so that
// its top-level let, const, class and function declarations stay in the
// VM's global scope for the next run; redeclaring a let or const is a
// SyntaxError, as in a browser console. Each run in a context also sees
// a small process object (process.env: the session's variables and the
// run's own; process.cwd(): the context's directory), as E2B's Node
// kernel has; run_code's fresh VMs have none. A context's VM has the engine's
// memory limit, serves one run at a time, and is closed when the context
// is dropped (restart, removal, the session's destroy) or the Engine
// closed. A session holds at most MaxContextsPerSession of them, a tenant
// MaxContextsPerTenant (its share of the server's, so that no one tenant
// takes them all) and the Engine MaxContexts: the VMs live in the
// server's process, outside every box's memory limit, so the caps bound
// what code contexts can hold.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/quickjs"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/share"
)

// The caps on kept VMs (each up to Options.MemoryLimit).
const (
	MaxContextsPerSession = 4
	MaxContextsPerTenant  = 8
	MaxContexts           = 32
)

// IdleEvict is how long a context's VM must have been idle before a
// server at MaxContexts may close it to make room for another's: its
// state is lost, and the context's next run starts afresh and says so. A
// variable for the tests.
var IdleEvict = 15 * time.Minute

// ErrContextLimit refuses a new JS context past a cap. Test with
// errors.Is.
var ErrContextLimit = errors.New("too many JavaScript code contexts")

// jsContext is one kept VM.
type jsContext struct {
	tenant  string       // the session's tenant, for its share of the cap
	used    atomic.Int64 // unix nanoseconds of its last run's end
	running atomic.Bool
	evicted bool // made again after its VM was evicted (idle): the next run says so

	mu    sync.Mutex // held by the run in progress
	prep  *prepared  // nil until the first run, and after a drop
	count int
	gone  bool                    // dropped: a run that waited for mu makes no new VM
	atoms map[string]quickjs.Atom // the controller's method names in prep's VM

	cancelMu  sync.Mutex
	cancelRun context.CancelCauseFunc // the run in progress's, or nil
}

type contextKey struct{ session, id string }

type contexts struct {
	mu      sync.Mutex
	m       map[contextKey]*jsContext
	shares  *share.Pool         // m's places: MaxContexts, MaxContextsPerTenant each
	evicted map[contextKey]bool // contexts whose VM was evicted, until their next run
	closed  bool
}

// context returns the context of (session, id), made if new (within the
// caps); tenant is the session's.
func (e *Engine) context(tenant, session, id string) (*jsContext, error) {
	cs := &e.ctxs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, errors.New("js: the engine is closed")
	}
	k := contextKey{session, id}
	if c := cs.m[k]; c != nil {
		c.used.Store(time.Now().UnixNano()) // not idle: a run is about to take it
		return c, nil
	}
	if err := cs.room(tenant, session); err != nil {
		if !errors.Is(err, errServerFull) || !cs.evictIdle() {
			return nil, err
		}
	}
	if cs.m == nil {
		cs.m = map[contextKey]*jsContext{}
	}
	if err := cs.pool().Acquire(tenant); err != nil { // room said there is one
		return nil, fmt.Errorf("%w: %v", ErrContextLimit, err)
	}
	c := &jsContext{tenant: tenant, evicted: cs.evicted[k]}
	delete(cs.evicted, k)
	c.used.Store(time.Now().UnixNano())
	cs.m[k] = c
	return c, nil
}

// errServerFull is room's answer when only the server's cap is reached.
var errServerFull = fmt.Errorf("%w: the server holds %d JavaScript/TypeScript contexts with state, the most it may; try again later", ErrContextLimit, MaxContexts)

// evictIdle closes the VM that has been idle the longest, if one has for
// IdleEvict, to make room (cs.mu held); it reports whether it did.
func (cs *contexts) evictIdle() bool {
	var oldK contextKey
	var old *jsContext
	limit := time.Now().Add(-IdleEvict).UnixNano()
	for k, c := range cs.m {
		if c.running.Load() || c.used.Load() > limit {
			continue
		}
		if old == nil || c.used.Load() < old.used.Load() {
			oldK, old = k, c
		}
	}
	if old == nil {
		return false
	}
	delete(cs.m, oldK)
	cs.pool().Release(old.tenant)
	if cs.evicted == nil || len(cs.evicted) >= 4*MaxContexts {
		cs.evicted = map[contextKey]bool{}
	}
	cs.evicted[oldK] = true
	go old.drop() // waits for a run that took it just now, which then finds it gone
	return true
}

// CheckContext reports (an error wrapping ErrContextLimit) whether a run
// in context id of session, of tenant, would be refused for the caps: the
// caller can refuse it as such before the run (the run itself checks
// again).
func (e *Engine) CheckContext(tenant, session, id string) error {
	cs := &e.ctxs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed || cs.m[contextKey{session, id}] != nil {
		return nil
	}
	return cs.room(tenant, session)
}

// room: whether one more context fits, with cs.mu held.
func (cs *contexts) room(tenant, session string) error {
	n := 0
	for k2 := range cs.m {
		if k2.session == session {
			n++
		}
	}
	if n >= MaxContextsPerSession {
		return fmt.Errorf("%w: session %s has %d JavaScript/TypeScript contexts with state, the most it may (remove_code_context frees one)", ErrContextLimit, session, n)
	}
	var r *share.Refusal
	if err := cs.pool().Check(tenant); errors.As(err, &r) {
		if !r.AtShare {
			return errServerFull
		}
		return fmt.Errorf("%w: %v (remove_code_context or destroying a session frees one)", ErrContextLimit, err)
	}
	return nil
}

// pool is the contexts' places, the server's MaxContexts and each
// tenant's share, MaxContextsPerTenant (cs.mu held).
func (cs *contexts) pool() *share.Pool {
	if cs.shares == nil {
		cs.shares = share.New("JavaScript/TypeScript contexts with state", MaxContexts, MaxContextsPerTenant)
	}
	return cs.shares
}

// DropContext implements runcode.ContextEngine: the context's VM is
// closed (after the run in progress, which is interrupted by its own
// caller, not here) and forgotten.
func (e *Engine) DropContext(ctx context.Context, session, id string) error {
	cs := &e.ctxs
	cs.mu.Lock()
	k := contextKey{session, id}
	c := cs.m[k]
	if c != nil {
		delete(cs.m, k)
		cs.pool().Release(c.tenant)
	}
	delete(cs.evicted, k)
	cs.mu.Unlock()
	if c == nil {
		return nil
	}
	// A run in progress is stopped (E2B's restart stops the kernel).
	c.cancelMu.Lock()
	if c.cancelRun != nil {
		c.cancelRun(runcode.ErrContextRestarted)
	}
	c.cancelMu.Unlock()
	c.drop()
	return nil
}

// DropContext of the TypeScript face: the same contexts.
func (t tsEngine) DropContext(ctx context.Context, session, id string) error {
	return t.e.DropContext(ctx, session, id)
}

func (c *jsContext) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	if c.prep != nil {
		c.prep.close()
		c.prep = nil
	}
}

// closeContexts closes every kept VM (Engine.Close).
func (e *Engine) closeContexts() {
	cs := &e.ctxs
	cs.mu.Lock()
	m := cs.m
	cs.m, cs.shares = nil, nil
	cs.closed = true
	cs.mu.Unlock()
	for _, c := range m {
		c.drop()
	}
}

// Contexts is how many contexts hold a VM (for tests and metrics).
func (e *Engine) Contexts() int {
	e.ctxs.mu.Lock()
	defer e.ctxs.mu.Unlock()
	return len(e.ctxs.m)
}
