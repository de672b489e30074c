package js

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/quickjs"
)

// A run's fixed cost is mostly making its VM: a new QuickJS runtime and
// context with the built-ins, the prelude loaded from bytecode, and, after
// the run, freeing it all (about three quarters of a `1+1` run). So the
// Engine keeps a few VMs prepared ahead, off the request path: the prelude
// loaded and the host functions registered, but bound to no run. A run takes
// one, binds it to itself (its session's workspace, env and network policy
// reach the VM only through the run the host functions find at call time),
// and the VM is closed after that one run, in the background; it is never
// put back, so nothing a run does to its globals, the built-in prototypes or
// the prelude's objects can reach another run, of the same session or any
// other. JS keeps no state between runs (the engine contract's state rule:
// stateless), so the pool changes no semantics: a prepared VM is the same
// fresh VM a run used to make for itself, made earlier.
//
// The pool holds at most Options.Spares VMs (2 by default; about 0.25 MiB of
// memory each, see BenchmarkPrepare), filled in the background when no
// run is in progress (see pool); the first run of an Engine makes its own.
// When the pool is empty a run prepares its VM itself, as before. Besides
// the spares, at most maxDead finished runs' VMs wait to be closed, each
// holding what its run left (up to the memory limit), until no run is in
// progress; a run that finds that queue full closes its VM itself.

// prepared is a VM with the prelude loaded, waiting for its one run.
type prepared struct {
	vm  *quickjs.VM
	ctl quickjs.Value // the prelude's controller
	// run is the run this VM serves, set once by bind, before any of the
	// run's JavaScript, on the run's goroutine; nil while the VM waits in
	// the pool, where a host call (there is none: the prelude makes none
	// while loading) is refused.
	run   *run
	taken atomic.Bool
}

// prepTimeout bounds the prelude's evaluation when a VM is prepared. The
// prelude only defines functions; this is a guard against a bug, not a
// budget.
const prepTimeout = 10 * time.Second

// prepare makes a VM ready for a run: memory limit, host functions that
// dispatch to the run bound later, the prelude evaluated.
func (e *Engine) prepare() (*prepared, error) {
	bc, err := compiledPrelude()
	if err != nil {
		return nil, fmt.Errorf("quickjs prelude: %w", err)
	}
	vm, err := quickjs.NewVM()
	if err != nil {
		return nil, fmt.Errorf("quickjs: %w", err)
	}
	p := &prepared{vm: vm}
	vm.SetMemoryLimit(uintptr(e.opts.MemoryLimit))
	if err := vm.RegisterHostFunc("__quro_host", func(args []any) (any, error) {
		if p.run == nil {
			return nil, errors.New("no run is bound to this VM")
		}
		return p.run.host(args)
	}); err != nil {
		vm.Close()
		return nil, fmt.Errorf("quickjs: %w", err)
	}
	if err := vm.RegisterFunc("__quro_compile", func(rel string) quickjs.Value {
		if p.run == nil {
			return quickjs.UndefinedValue
		}
		return p.run.compile(rel)
	}, false); err != nil {
		vm.Close()
		return nil, fmt.Errorf("quickjs: %w", err)
	}
	if err := vm.SetEvalTimeout(prepTimeout); err != nil {
		vm.Close()
		return nil, fmt.Errorf("quickjs: %w", err)
	}
	ctl, err := vm.EvalBytecodeValue(bc)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("quickjs prelude: %w", err)
	}
	p.ctl = ctl
	return p, nil
}

// bind gives p to r: from now on the host functions serve r. A VM is bound
// once; a second bind is a bug in this package and fails.
func (p *prepared) bind(r *run) error {
	if !p.taken.CompareAndSwap(false, true) {
		return errors.New("js: a prepared VM was taken twice")
	}
	p.run = r
	return nil
}

// close frees p's VM.
func (p *prepared) close() {
	p.ctl.Free()
	p.vm.Close()
}

// pool keeps up to cap(spares) prepared VMs, and the VMs of finished runs
// until they are closed.
//
// All QuickJS VMs of the process allocate through one allocator behind one
// mutex (modernc.org/libc), and so does SQLite (modernc.org/sqlite): VM work
// on two goroutines at once mostly waits on that lock, and a run, or the
// SQLite work of the call around it, would be slower, not faster, for a VM
// being made beside it. So the background work (closing, then preparing)
// is done by one goroutine at a time, only while no run is in progress: it
// starts quietDelay after the last run ended, when the call's own work
// after the run is done, and stops when a run starts. Under a continuous
// stream of runs the pool stays empty and each run makes and closes its
// own VM, as without a pool.
type pool struct {
	prepare    func() (*prepared, error)
	spares     chan *prepared
	dead       chan *prepared // VMs of finished runs, to close
	active     atomic.Int32   // runs in progress
	timerSet   atomic.Bool    // a kick after quietDelay is scheduled
	prepFailed atomic.Bool    // the last preparation failed: none until a run ends

	mu      sync.Mutex
	cond    *sync.Cond // on mu: the background goroutine stopped
	running bool       // the background goroutine runs
	closed  bool
}

// quietDelay is how long the background work waits after the last run
// ended: long enough for the call's own work after the run (its answer, the
// audit record) to be done first. Measured over REST on a loaded machine,
// starting at once instead cost a call 0.6 ms of its median.
const quietDelay = time.Millisecond

// maxDead bounds the VMs waiting to be closed; a run that finds the queue
// full closes its VM itself.
const maxDead = 2

func newPool(n int, prepare func() (*prepared, error)) *pool {
	p := &pool{prepare: prepare, spares: make(chan *prepared, max(n, 0)), dead: make(chan *prepared, maxDead)}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// take returns a prepared VM for a run that is starting: a spare if there
// is one, else one made now. The run must call done with it when it ends.
func (p *pool) take() (v *prepared, err error) {
	p.active.Add(1)
	ok := false
	defer func() {
		if !ok { // an error, or a panic in the engine: no run to end
			p.end()
		}
	}()
	select {
	case v = <-p.spares:
	default:
		v, err = p.prepare()
	}
	ok = err == nil
	return v, err
}

// done hands the VM of a run that ended over to be closed, off the run's
// path when the queue has room.
func (p *pool) done(v *prepared) {
	p.mu.Lock()
	queued := false
	if !p.closed {
		select {
		case p.dead <- v:
			queued = true
		default:
		}
	}
	p.mu.Unlock()
	if !queued {
		v.close()
	}
	p.end()
}

// end marks a run's end; after the last one the background work starts,
// quietDelay later, if no run started meanwhile.
func (p *pool) end() {
	// A run ended: a preparation that failed (memory pressure, a limit too
	// small for the prelude) is tried again, once, after it.
	p.prepFailed.Store(false)
	if p.active.Add(-1) != 0 || !p.pending() || !p.timerSet.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(quietDelay, func() {
		p.timerSet.Store(false)
		if p.active.Load() == 0 {
			p.kick()
		}
	})
}

// pending reports whether there is background work.
func (p *pool) pending() bool {
	return len(p.dead) > 0 || (len(p.spares) < cap(p.spares) && !p.prepFailed.Load())
}

// kick starts the background goroutine unless it runs already, there is
// nothing to do, or the pool is closed.
func (p *pool) kick() {
	p.mu.Lock()
	if p.closed || p.running || !p.pending() {
		p.mu.Unlock()
		return
	}
	p.running = true
	p.mu.Unlock()
	go func() {
		for p.step() {
		}
		p.mu.Lock()
		p.running = false
		p.cond.Broadcast()
		p.mu.Unlock()
		// A run that ended while this goroutine was stopping found it
		// running and started none: look again.
		if p.active.Load() == 0 {
			p.kick()
		}
	}()
}

// step does one piece of background work, if no run is in progress: it
// closes a finished run's VM, or else prepares a spare. It reports whether
// there may be more to do.
func (p *pool) step() bool {
	if p.active.Load() != 0 || p.isClosed() {
		return false
	}
	select {
	case v := <-p.dead:
		v.close()
		return true
	default:
	}
	if len(p.spares) >= cap(p.spares) {
		return false
	}
	v, err := p.prepare()
	if err != nil {
		// A run makes its own VM and reports the error. No more tries
		// until a run ends: the goroutine would otherwise spin on it.
		p.prepFailed.Store(true)
		return false
	}
	if !p.put(v) {
		v.close()
		return false
	}
	return true
}

// put adds v to the pool; false when it is full or closed.
func (p *pool) put(v *prepared) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	select {
	case p.spares <- v:
		return true
	default:
		return false
	}
}

func (p *pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// wait returns once the background goroutine is not running.
func (p *pool) wait() {
	p.mu.Lock()
	for p.running {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

// close frees the spares and the finished VMs and stops the background
// work; later runs make and close their own VMs.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wait()
	for {
		select {
		case v := <-p.spares:
			v.close()
		case v := <-p.dead:
			v.close()
		default:
			return
		}
	}
}
