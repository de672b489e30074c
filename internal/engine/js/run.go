package js

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	qtranspile "github.com/quro-dev/quro/internal/transpile"
	"io"
	"strings"
	"time"

	"modernc.org/quickjs"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/workspace"
)

// evalAsync is QuickJS's JS_EVAL_FLAG_ASYNC: a global script in which
// top-level await is allowed; the eval returns a Promise of {value}.
const evalAsync = 1 << 7

// mainName is the file name of inline code in positions.
const mainName = "<code>"

// run is one run of user code in one fresh VM. Everything happens on the
// calling goroutine, except the watcher that interrupts on cancel.
type run struct {
	eng      *Engine
	ctx      context.Context
	req      *runcode.Request
	ws       *workspace.FS
	ts       bool
	deadline time.Time
	src      *sources

	prep       *prepared
	vm         *quickjs.VM
	ctl        quickjs.Value
	atoms      map[string]quickjs.Atom
	compileErr *jsError // why the last __quro_compile failed
	fetches    int

	kept *jsContext         // the code context whose VM this run uses, or nil
	exc  *runcode.Exception // rich mode: the code's uncaught error
}

// rich reports whether the run reports its value and error as results.
func (r *run) rich() bool { return r.req.Context != nil && r.req.Context.Rich }

// jsError is an error as user code sees it.
type jsError struct {
	Name    string `json:"name"`
	Message string `json:"message"`
}

// errTimeUp is returned when the run's time budget is spent.
var errTimeUp = errors.New("time budget spent")

// expired reports whether the run must stop: its deadline passed or its
// caller went away.
func (r *run) expired() bool {
	return r.ctx.Err() != nil || !time.Now().Before(r.deadline)
}

// arm gives the next call into JavaScript what is left of the budget.
func (r *run) arm() error {
	left := time.Until(r.deadline)
	if left <= 0 || r.ctx.Err() != nil {
		return errTimeUp
	}
	return r.vm.SetEvalTimeout(left)
}

func (r *run) main() (*runcode.Result, error) {
	var count int
	if cr := r.req.Context; cr != nil && cr.ID != "" {
		c, err := r.eng.context(r.req.Session.Tenant, r.req.Session.ID, cr.ID)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.gone {
			return nil, errors.New("js: the code context was removed while this run waited for it")
		}
		defer func() {
			if p := recover(); p != nil {
				// The VM may be in any state: the context starts afresh.
				if c.prep != nil {
					c.prep.close()
					c.prep = nil
				}
				panic(p)
			}
		}()
		c.running.Store(true)
		defer func() {
			c.used.Store(time.Now().UnixNano())
			c.running.Store(false)
		}()
		if c.evicted {
			c.evicted = false
			fmt.Fprintf(r.req.Stderr, "[this context's JavaScript state was lost: its VM was idle for %s or more and the server, at its cap of %d, closed it to make room; it starts afresh]\n", IdleEvict, MaxContexts)
		}
		c.count++
		count = c.count
		r.kept = c
		ctx, cancel := context.WithCancelCause(r.ctx)
		defer cancel(nil)
		r.ctx = ctx
		c.cancelMu.Lock()
		c.cancelRun = cancel
		c.cancelMu.Unlock()
		defer func() {
			c.cancelMu.Lock()
			c.cancelRun = nil
			c.cancelMu.Unlock()
		}()
	}
	res, err := r.main0()
	if res != nil {
		res.ExecutionCount = count
		if res.Exception == nil {
			res.Exception = r.exc
		}
	}
	return res, err
}

func (r *run) main0() (*runcode.Result, error) {
	code, original := r.req.Code, r.req.Code
	var sm *sourceMap
	if r.ts || esmSyntax.MatchString(code) {
		t, err := r.eng.cache.transpile(r.ctx, r.req.Session.Tenant, code, mainName, r.ts)
		if err != nil {
			var te *transpileError
			var le *qtranspile.Error
			var exc *runcode.Exception
			switch {
			case errors.As(err, &te):
				exc = &runcode.Exception{Name: "SyntaxError", Value: te.Error(), Traceback: te.Error()}
			case errors.As(err, &le):
				exc = &runcode.Exception{Name: "Error", Value: le.Error(), Traceback: "Error: " + le.Error()}
			default:
				return nil, err
			}
			if r.rich() {
				r.exc = exc
			} else {
				fmt.Fprintln(r.req.Stderr, exc.Traceback)
			}
			return &runcode.Result{ExitCode: 1}, nil
		}
		code, sm = t.code, t.sm
	}
	code = stripShebang(code)
	r.src.add(mainName, original, code, sm, false)

	if r.kept != nil {
		if err := r.startKept(); err != nil {
			return nil, err
		}
		defer func() { r.prep.run = nil }()
		if _, err := r.callCtl("reset"); err != nil {
			return r.failed(err)
		}
		dir := r.req.Context.Dir
		if dir == "" {
			dir = sandbox.HomeUser
		}
		if _, err := r.callCtl("nodeProcess", dir); err != nil {
			return r.failed(err)
		}
	} else {
		if err := r.start(); err != nil {
			return nil, err
		}
		// The VM serves this run only: it is closed after it, never reused.
		defer r.eng.pool.done(r.prep)
	}
	stop := r.watch()
	defer stop()

	if _, err := r.callCtl("setMain", mainName); err != nil {
		return r.failed(err)
	}
	if err := r.arm(); err != nil {
		return r.timedOut(), nil
	}
	p, err := r.vm.EvalValue(code, quickjs.EvalGlobal|evalAsync)
	if err != nil {
		return r.failed(err)
	}
	_, err = r.callCtl("settle", p)
	p.Free()
	if err != nil {
		return r.failed(err)
	}
	return r.finish()
}

// start takes a prepared VM (prelude loaded, see pool.go) and binds it to
// this run.
func (r *run) start() error {
	p, err := r.eng.pool.take()
	if err != nil {
		return err
	}
	if err := p.bind(r); err != nil {
		r.eng.pool.done(p)
		return err
	}
	r.vm, r.ctl, r.prep = p.vm, p.ctl, p
	r.atoms = map[string]quickjs.Atom{}
	r.src.addPrelude(preludeSource)
	return nil
}

// startKept binds the VM of the run's code context (made on its first
// run) to this run.
func (r *run) startKept() error {
	c := r.kept
	if c.prep == nil {
		p, err := r.eng.prepare()
		if err != nil {
			return err
		}
		p.taken.Store(true)
		c.prep = p
		c.atoms = map[string]quickjs.Atom{}
	}
	c.prep.run = r
	r.vm, r.ctl, r.prep = c.prep.vm, c.prep.ctl, c.prep
	r.atoms = c.atoms
	r.src.addPrelude(preludeSource)
	return nil
}

// watch interrupts the VM when the caller cancels; the returned func stops
// watching, and returns only once the watcher is gone: a VM kept for a
// code context runs again, and an interrupt that landed after its next
// run began (a caller canceling as its run ends) would stop that run. One
// that lands before it is cleared as the next call into JavaScript starts.
func (r *run) watch() func() {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-r.ctx.Done():
			r.vm.Interrupt()
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// callCtl calls a method of the prelude's controller.
func (r *run) callCtl(method string, args ...any) (any, error) {
	if err := r.arm(); err != nil {
		return nil, err
	}
	a, ok := r.atoms[method]
	if !ok {
		var err error
		if a, err = r.vm.NewAtom(method); err != nil {
			return nil, err
		}
		r.atoms[method] = a
	}
	fn, err := r.ctl.GetPropertyValue(a)
	if err != nil {
		return nil, err
	}
	defer fn.Free()
	return fn.Call(r.ctl, args...)
}

// finish runs the event loop (Promise jobs, then timers in time order) until
// nothing is left, then reports the outcome.
func (r *run) finish() (*runcode.Result, error) {
	for {
		if err := r.arm(); err != nil {
			return r.timedOut(), nil //nolint:nilerr // arm fails only once the deadline has passed: a timed-out run is the result
		}
		if _, err := r.vm.ExecutePendingJobs(); err != nil {
			return r.failed(err)
		}
		v, err := r.callCtl("nextTimer")
		if err != nil {
			return r.failed(err)
		}
		delay := toFloat(v)
		if delay < 0 {
			break
		}
		if delay > 0 {
			wait := time.Duration(delay * float64(time.Millisecond))
			if left := time.Until(r.deadline); wait > left {
				res := r.timedOut()
				res.Error = fmt.Sprintf("timed out: the next timer is due in %s but only %s of the run's %s budget is left; pending timers were not run",
					wait.Round(time.Millisecond), left.Round(time.Millisecond), r.budget())
				return res, nil
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				return r.timedOut(), nil
			}
		}
		if _, err := r.callCtl("runTimer"); err != nil {
			return r.failed(err)
		}
	}
	v, err := r.callCtl("outcome")
	if err != nil {
		return r.failed(err)
	}
	var out struct {
		Status string `json:"status"`
		Result *string
		Error  *struct {
			Name    string `json:"name"`
			Message string `json:"message"`
			Stack   string `json:"stack"`
			IsNull  bool   `json:"isNull"`
		} `json:"error"`
	}
	s, _ := v.(string)
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("js: bad outcome from the prelude: %v", err)
	}
	switch out.Status {
	case "fulfilled":
		if out.Result != nil && r.rich() {
			return &runcode.Result{Results: []runcode.RichResult{{Main: true, Data: map[string]any{"text/plain": *out.Result}}}}, nil
		}
		if out.Result != nil {
			fmt.Fprintf(r.req.Stdout, "➡️ %s\n", *out.Result)
		}
		return &runcode.Result{}, nil
	case "rejected":
		e := out.Error
		if interrupted(e.Name, e.Message) {
			// The engine's interrupt (our deadline) landed in a Promise job
			// and rejected the code's Promise: still a timeout, whichever
			// clock noticed first.
			return r.timedOut(), nil
		}
		r.report(e.Name, e.Message, e.Stack, e.IsNull)
		return &runcode.Result{ExitCode: 1}, nil
	}
	fmt.Fprintln(r.req.Stderr, "Error: the code's Promise never settled: nothing was left to run (no pending jobs or timers) that could settle it")
	return &runcode.Result{ExitCode: 1}, nil
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	}
	return -1
}

// budget is the run's whole time budget, for messages.
func (r *run) budget() time.Duration {
	if r.req.Timeout > 0 {
		return r.req.Timeout
	}
	return time.Until(r.deadline).Round(time.Millisecond)
}

// timedOut is the result of a run stopped by its deadline or its caller.
func (r *run) timedOut() *runcode.Result {
	if errors.Is(context.Cause(r.ctx), runcode.ErrContextRestarted) {
		return &runcode.Result{ExitCode: 1, Interrupted: true, Error: runcode.ErrContextRestarted.Error(), Exception: runcode.RestartedException()}
	}
	if r.ctx.Err() != nil && !errors.Is(r.ctx.Err(), context.DeadlineExceeded) {
		return &runcode.Result{ExitCode: 1, Interrupted: true, Error: "canceled by the caller; the JS engine stopped the code (output so far is kept)"}
	}
	return &runcode.Result{ExitCode: 1, TimedOut: true, Interrupted: true,
		Error: fmt.Sprintf("timed out after %s; the JS engine interrupted the code (output so far is kept)", r.budget().Round(time.Millisecond))}
}

// failed turns an error that came out of the engine into the result: the
// run's end if time is up, else the code's uncaught error.
func (r *run) failed(err error) (*runcode.Result, error) {
	if errors.Is(err, errTimeUp) || r.expired() {
		return r.timedOut(), nil
	}
	var qe *quickjs.Error
	if !errors.As(err, &qe) {
		return nil, fmt.Errorf("quickjs: %w", err)
	}
	if interrupted(qe.Name, qe.Message) {
		return r.timedOut(), nil
	}
	isNull := qe.Name == "" && qe.Error() == "null"
	msg := qe.Message
	if qe.Name == "" {
		msg = qe.Error()
	}
	r.report(qe.Name, msg, qe.Stack, isNull)
	return &runcode.Result{ExitCode: 1}, nil
}

// interrupted reports whether an error is QuickJS's interrupt, which only
// the run's deadline or its caller's cancel raise (SetEvalTimeout, watch).
// Its timer and r.deadline are read at slightly different moments, so
// expired() may still be false when it lands.
func interrupted(name, message string) bool {
	return name == "InternalError" && message == "interrupted"
}

// report writes an uncaught error to stderr: its name and message, the
// stack in the user's files and lines, and the line it happened at.
func (r *run) report(name, message, stack string, isNull bool) {
	w := r.req.Stderr
	if r.rich() {
		var b strings.Builder
		w = &b
		defer func() {
			n := name
			if n == "" {
				n = "Error"
			}
			r.exc = &runcode.Exception{Name: n, Value: message, Traceback: strings.TrimRight(b.String(), "\n")}
		}()
	}
	limit := workspace.Human(r.eng.opts.MemoryLimit)
	switch {
	case isNull:
		fmt.Fprintf(w, "Uncaught null: the code most likely ran out of memory: QuickJS throws null when the memory limit of %s is reached and not even an error object can be allocated (or the code threw null itself)\n", limit)
		return
	case name == "InternalError" && message == "out of memory":
		fmt.Fprintf(w, "Uncaught InternalError: out of memory: the code used more than this run's memory limit of %s\n", limit)
		return
	}
	head := "Uncaught "
	if name == "SyntaxError" {
		head = ""
	}
	switch {
	case name == "":
		head += message
	case message == "":
		head += name
	default:
		head += name + ": " + message
	}
	if name == "InternalError" && message == "stack overflow" {
		head += " (too much recursion)"
	}
	frames, at := r.src.stack(stack)
	// w is the run's stderr (a runcode.Capture, which never fails): there
	// is nowhere else to report a failed write to it.
	_, _ = io.WriteString(w, head+"\n")
	if frames != "" {
		_, _ = io.WriteString(w, frames+"\n")
	}
	if ex := at.excerpt(); ex != "" {
		_, _ = io.WriteString(w, ex+"\n")
	}
}

// stripShebang blanks a leading "#!" line, keeping line numbers.
func stripShebang(code string) string {
	code = strings.TrimPrefix(code, "\ufeff")
	if strings.HasPrefix(code, "#!") {
		if i := strings.IndexByte(code, '\n'); i >= 0 {
			return "//" + code[2:i] + code[i:]
		}
		return "//" + code[2:]
	}
	return code
}
