package js

// Persistent contexts (runcode.ContextRun with an ID; E2B's JavaScript
// kernel): a VM kept between the runs of one (session, context), unlike
// run_code's fresh VM per run. Each run is evaluated as a global script
// (QuickJS's async global eval, as every run), not as a module, so that
// its top-level let, const, class and function declarations stay in the
// VM's global scope for the next run; redeclaring a let or const is a
// SyntaxError, as in a browser console. A context's VM has the engine's
// memory limit, serves one run at a time, and is closed when the context
// is dropped (restart, removal, the session's destroy) or the Engine
// closed. A session holds at most MaxContextsPerSession of them and the
// Engine MaxContexts: the VMs live in the server's process, outside every
// box's memory limit, so the two caps bound what code contexts can hold.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"modernc.org/quickjs"
)

// The caps on kept VMs (each up to Options.MemoryLimit).
const (
	MaxContextsPerSession = 4
	MaxContexts           = 64
)

// ErrContextLimit refuses a new JS context past a cap. Test with
// errors.Is.
var ErrContextLimit = errors.New("too many JavaScript code contexts")

// jsContext is one kept VM.
type jsContext struct {
	mu    sync.Mutex // held by the run in progress
	prep  *prepared  // nil until the first run, and after a drop
	count int
	gone  bool                    // dropped: a run that waited for mu makes no new VM
	atoms map[string]quickjs.Atom // the controller's method names in prep's VM
}

type contextKey struct{ session, id string }

type contexts struct {
	mu     sync.Mutex
	m      map[contextKey]*jsContext
	closed bool
}

// get returns the context of key, made if new (within the caps).
func (e *Engine) context(session, id string) (*jsContext, error) {
	cs := &e.ctxs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, errors.New("js: the engine is closed")
	}
	k := contextKey{session, id}
	if c := cs.m[k]; c != nil {
		return c, nil
	}
	n := 0
	for k2 := range cs.m {
		if k2.session == session {
			n++
		}
	}
	if n >= MaxContextsPerSession {
		return nil, fmt.Errorf("%w: session %s has %d JavaScript/TypeScript contexts with state, the most it may (remove_code_context frees one)", ErrContextLimit, session, n)
	}
	if len(cs.m) >= MaxContexts {
		return nil, fmt.Errorf("%w: the server holds %d, the most it may; try again later", ErrContextLimit, len(cs.m))
	}
	if cs.m == nil {
		cs.m = map[contextKey]*jsContext{}
	}
	c := &jsContext{}
	cs.m[k] = c
	return c, nil
}

// DropContext implements runcode.ContextEngine: the context's VM is
// closed (after the run in progress, which is interrupted by its own
// caller, not here) and forgotten.
func (e *Engine) DropContext(ctx context.Context, session, id string) error {
	cs := &e.ctxs
	cs.mu.Lock()
	k := contextKey{session, id}
	c := cs.m[k]
	delete(cs.m, k)
	cs.mu.Unlock()
	if c == nil {
		return nil
	}
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
	cs.m = nil
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
