// Package controller is the one controller every access path calls: it
// checks the caller's scope, dispatches to the capability, records the
// outcome in the log, and turns every failure into a *capability.Error with
// a stable code (Classify, from the one table in errors.go). Access paths
// translate that code into their own status and never start processes
// themselves.
package controller

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// Caller says who is calling and through which access path.
type Caller struct {
	Path    string           // "rest", "cli", "mcp", "ws"
	Tenant  string           // owner of the caller's sessions ("" in single-user mode)
	Scope   capability.Scope // the widest scope the caller holds
	TokenID string           // the token that authenticated the call ("" without auth)
	// Tools is the token's default MCP tool profile ("": the server's).
	Tools string
	// Session, when set, confines the caller to that session (code in a
	// session calling back): it is the default, the only one visible, and
	// no session can be created.
	Session string
	// Background says the client made the call by itself, not for a
	// person's action (a page refreshing what it shows). It only marks a
	// read-scope call's audit entry (Record.Background); any other call
	// is recorded as an ordinary one.
	Background bool
}

// Record is one finished call, as the audit log and the metrics see it.
type Record struct {
	Start      time.Time
	Caller     Caller
	Capability string
	Args       json.RawMessage
	Outcome    string // "ok", OutcomeTimeout, OutcomeCanceled or the error code
	Duration   time.Duration
	Output     any               // the structured output when the call returned one (Err is nil)
	Err        *capability.Error // the error otherwise
	// Session is the id of the session the call acted on: the one it
	// entered, or the one its output names (a session it created); "" for
	// none.
	Session string
	// Background marks a read-scope call the client made by itself
	// (Caller.Background).
	Background bool
}

// sessionNamer is an output that names the session it is about.
type sessionNamer interface{ SessionID() string }

// Outcomes of a call that returned a result but whose run did not finish:
// its time budget ran out, or the call was canceled (the client went
// away), and the run was killed.
const (
	OutcomeTimeout  = "timeout"
	OutcomeCanceled = "canceled"
)

// Stopper is implemented by a capability's output that reports a run:
// StoppedBy is OutcomeTimeout or OutcomeCanceled when the run was stopped
// before it finished, else "".
type Stopper interface{ StoppedBy() string }

// outcomeOf is the outcome of a call that returned out under ctx.
func outcomeOf(ctx context.Context, out any) string {
	stopped := ""
	switch r := out.(type) {
	case Stopper:
		stopped = r.StoppedBy()
	case *runcode.Result:
		switch {
		case r.TimedOut:
			stopped = OutcomeTimeout
		case r.Interrupted:
			stopped = OutcomeCanceled
		}
	case *terminal.Result:
		switch {
		case r.TimedOut:
			stopped = OutcomeTimeout
		case r.Interrupted && ctx.Err() != nil:
			stopped = OutcomeCanceled
		}
	}
	if stopped == "" {
		return "ok"
	}
	return stopped
}

// Observer is told of every finished call, after the reply is built and
// before it is returned. It must not block for long.
type Observer func(ctx context.Context, r *Record)

type callerKey struct{}

// CallerFrom returns the caller of the capability running under ctx.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Reply is what a successful call returns: the structured output and the
// text a model reads.
type Reply struct {
	Output any
	Text   string
}

// Options configure a controller. A nil *Options, and every zero field,
// means the default.
type Options struct {
	// Logger gets one line per call (at debug) and the details of every
	// internal error, with its id (at error) (nil: discarded).
	Logger *slog.Logger
	// Limits bound what one tenant may do at once (zero: no limits).
	Limits Limits
	// Observers are told of every finished call, in order.
	Observers []Observer
	// Enter enters the session a capability declared InSession names, in
	// its mode, before the handler runs (the session's life owner,
	// session.Life); release is called when the handler has returned.
	// nil: such a capability is refused (a controller without sessions).
	Enter Enter
	// Events, when set, is told live of every call on a session that
	// may change or run something (not ReadOnly): its beginning, its
	// streamed output and its end (the web UI's timeline).
	Events *events.Bus
	// Forward, when set, may run a call on another node (a cluster's):
	// every call that names a session, and every create_session, is
	// offered to it, whatever the access path, unless ServeHere marks
	// the context. See Forward.
	Forward Forward
	// Note, when set, is asked after each call that entered a session
	// for a one-line remark about that session to put first in the
	// reply's text (and in its output's notes, when it has them): a
	// session moved from another node of a cluster lost its processes.
	Note func(session string) string
}

// Forward runs capability name for caller on the node that owns the
// session ref names (or, for create_session, ref "", on the node the
// cluster places it on) when that is another node, returning the
// output's JSON form with forwarded true; the owner checks, runs and
// records the call as its own (this node records nothing of it). The
// output a streaming capability reports under ctx (runcode.WithOutput,
// progress.With) is passed on as it arrives. forwarded false: the call
// is this node's to run. The error is a *capability.Error.
type Forward func(ctx context.Context, caller Caller, name, ref string, args json.RawMessage) (out json.RawMessage, forwarded bool, err error)

type serveHereKey struct{}

// ServeHere marks ctx as a call to run on this node, never offered to
// Forward: one another node forwarded here, or one whose session the
// cluster's router already found to be this node's (or placed here).
func ServeHere(ctx context.Context) context.Context {
	return context.WithValue(ctx, serveHereKey{}, true)
}

// IsServeHere reports whether ctx was marked by ServeHere.
func IsServeHere(ctx context.Context) bool { return ctx.Value(serveHereKey{}) != nil }

type pathKey struct{}

// WithPath says, for a call another node forwarded here (whose header it
// signed), the access path its caller used there ("mcp", "ws"): the
// call's record names that path, not the REST route it arrived by.
func WithPath(ctx context.Context, path string) context.Context {
	return context.WithValue(ctx, pathKey{}, path)
}

type credentialKey struct{}

// WithCredential carries the credential (an Authorization header's
// value) that authenticated the caller of the calls under ctx: a call
// forwarded to another node is authenticated there with it, as if the
// caller had sent it there (no node vouches for a caller).
func WithCredential(ctx context.Context, authorization string) context.Context {
	if authorization == "" {
		return ctx
	}
	return context.WithValue(ctx, credentialKey{}, authorization)
}

// CredentialFrom is the credential WithCredential put in ctx ("": none).
func CredentialFrom(ctx context.Context) string {
	s, _ := ctx.Value(credentialKey{}).(string)
	return s
}

// Noter is an output that takes a Note.
type Noter interface{ AddNote(string) }

// Enter enters the session ref names ("": the caller's default, which ctx
// carries) for a call that uses it in mode use, returning the context
// the handler runs under (canceled if the session is destroyed meanwhile)
// and the release of the entry.
type Enter func(ctx context.Context, ref string, use capability.Use) (_ context.Context, release func(), _ error)

// Limits bound what one tenant may do at once.
type Limits struct {
	// RunsPerTenant caps the calls that run code (capability.RunsCode:
	// runs, commands, terminal input, process starts) a tenant may have
	// in flight; more get ResourceExhausted (HTTP 429 with Retry-After).
	// A call holds its slot only while it runs something: one that goes
	// on to only follow a background process (start_process, which
	// counts against the process limits instead) frees it then
	// (RunSlotDone). Files, kill, status and list calls take none.
	// 0 or negative: no cap.
	RunsPerTenant int
	// RunsOf, when set, is tenant's own cap in place of RunsPerTenant
	// (an operator's override; 0 or negative: none). An error refuses the
	// call (a tenant whose ceilings cannot be read runs nothing).
	RunsOf func(ctx context.Context, tenant string) (int, error)
	// Raise says, in the refusal, how the cap is raised (e.g. the flag
	// and the set_tenant_limits field).
	Raise string
}

// Controller dispatches capability calls. Safe for concurrent use.
type Controller struct {
	reg       *capability.Registry
	log       *slog.Logger
	observers []Observer
	limits    Limits
	enter     Enter
	events    *events.Bus
	forward   atomic.Pointer[forwarding]
	note      func(session string) string

	mu       sync.Mutex
	inFlight map[string]int // calls that run code in flight, by tenant
}

// New returns a controller over reg configured by opts (nil: defaults).
func New(reg *capability.Registry, opts *Options) *Controller {
	if opts == nil {
		opts = &Options{}
	}
	c := &Controller{reg: reg, log: opts.Logger, limits: opts.Limits, enter: opts.Enter, events: opts.Events, note: opts.Note,
		observers: append([]Observer(nil), opts.Observers...)}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if opts.Forward != nil {
		c.SetForward(opts.Forward, nil)
	}
	return c
}

// SetForward sets Options.Forward (a cluster's node joins after its
// controller is made), and served, when set, is told of every call
// Forward left to this node once it has run, before the reply returns
// (as an Observer: the cluster records a session created here before its
// caller learns its ID). nil: every call runs here.
func (c *Controller) SetForward(f Forward, served Observer) {
	if f == nil {
		c.forward.Store(nil)
		return
	}
	c.forward.Store(&forwarding{forward: f, served: served})
}

// forwarding is what SetForward set.
type forwarding struct {
	forward Forward
	served  Observer
}

// Registry returns the capability registry.
func (c *Controller) Registry() *capability.Registry { return c.reg }

// Call runs capability name with args for caller. The error, if any, is a
// *capability.Error; an internal one says only its id, under which the
// cause is logged.
func (c *Controller) Call(ctx context.Context, caller Caller, name string, args json.RawMessage) (*Reply, error) {
	return c.dispatch(ctx, caller, name, args, nil)
}

// Invoke runs capability name with in, a value of its input type, for an
// access path that holds typed inputs (E2B's): no JSON is decoded, and
// the reply's Output is the handler's own typed value. in is checked
// against the input schema as Call's arguments are, and recorded in the
// audit log in its JSON form.
func (c *Controller) Invoke(ctx context.Context, caller Caller, name string, in any) (*Reply, error) {
	args, err := json.Marshal(in)
	if err != nil {
		args = nil
	}
	return c.dispatch(ctx, caller, name, args, &typedInput{in: in, err: err})
}

// typedInput is Invoke's input (and its JSON form's error, if any).
type typedInput struct {
	in  any
	err error
}

func (c *Controller) dispatch(ctx context.Context, caller Caller, name string, args json.RawMessage, typed *typedInput) (*Reply, error) {
	start := time.Now()
	if p, ok := ctx.Value(pathKey{}).(string); ok && p != "" {
		caller.Path = p
	}
	var entered string
	var forwarded bool
	reply, lc, err := c.call(ctx, caller, name, args, typed, &entered, &forwarded)
	if forwarded {
		// The owner checked, ran and recorded it: its log and metrics
		// have the call, once.
		if err != nil {
			err = Classify(err)
		}
		return reply, err
	}
	if err == nil && reply != nil && entered != "" && c.note != nil {
		if n := c.note(entered); n != "" {
			reply.Text = n + "\n" + reply.Text
			if nt, ok := reply.Output.(Noter); ok {
				nt.AddNote(n)
			}
		}
	}
	rec := &Record{Start: start, Caller: caller, Capability: name, Args: args, Outcome: "ok", Duration: time.Since(start), Session: entered}
	if capb, ok := c.reg.Get(name); ok && caller.Background && capb.Scope == capability.ScopeRead {
		rec.Background = true
	}
	if err != nil {
		rec.Err = classify(ctx, c.log, err, slog.String("capability", name), slog.String("path", caller.Path),
			slog.String("tenant", caller.Tenant), slog.String("session", caller.Session))
		rec.Outcome = string(rec.Err.Code)
		err = rec.Err
	} else {
		rec.Output = reply.Output
		rec.Outcome = outcomeOf(ctx, reply.Output)
		if n, ok := reply.Output.(sessionNamer); ok && rec.Session == "" {
			rec.Session = n.SessionID()
		}
	}
	// One line per call, at debug: at info, a busy server would log a line
	// per call (quro serve's --access-log logs requests at info).
	c.log.LogAttrs(ctx, slog.LevelDebug, "call",
		slog.String("capability", name), slog.String("path", caller.Path), slog.String("tenant", caller.Tenant),
		slog.String("outcome", rec.Outcome), slog.Duration("duration", rec.Duration))
	if t := transferFrom(ctx); t != nil {
		t.add(rec) // told once, at EndTransfer
	} else {
		for _, fn := range c.observers {
			fn(ctx, rec)
		}
	}
	if fwd := c.forward.Load(); fwd != nil && fwd.served != nil {
		fwd.served(ctx, rec)
	}
	if lc != nil {
		lc.end(rec, reply)
	}
	return reply, err
}

// call runs the capability; entered is set to the id of the session the
// call entered, if any, forwarded to whether another node ran it
// (Forward), and lc is the live view's record of the call.
func (c *Controller) call(ctx context.Context, caller Caller, name string, args json.RawMessage, typed *typedInput, entered *string, forwarded *bool) (_ *Reply, lc *liveCall, _ error) {
	capb, ok := c.reg.Get(name)
	if !ok {
		return nil, nil, capability.Errorf(capability.NotFound, "no capability %q; list_capabilities shows them", name)
	}
	if !caller.Scope.Covers(capb.Scope) {
		return nil, nil, capability.Errorf(capability.PermissionDenied, "%s needs scope %q", name, capb.Scope)
	}
	var in any
	var err error
	if typed != nil {
		in, err = capb.Check(typed.in, args, typed.err)
	} else {
		in, err = capb.Decode(args)
	}
	if err != nil {
		return nil, nil, err
	}
	if fwd := c.forward.Load(); fwd != nil && ctx.Value(serveHereKey{}) == nil {
		ref, enter := capb.SessionRef(in)
		if enter && ref == "" {
			ref = caller.Session // its default: confined callers run on its node
		}
		if enter && ref != "" || name == "create_session" && caller.Session == "" {
			raw, ok, err := fwd.forward(ctx, caller, name, ref, args)
			if ok {
				*forwarded = true
				if err != nil {
					return nil, nil, err
				}
				out, err := capb.DecodeOutput(raw)
				if err != nil {
					return nil, nil, err
				}
				return replyOf(out), nil, nil
			}
		}
	}
	if capb.RunsCode() && (c.limits.RunsPerTenant > 0 || c.limits.RunsOf != nil) {
		release, err := c.acquire(ctx, caller.Tenant)
		if err != nil {
			return nil, nil, err
		}
		if release != nil {
			s := &runSlot{release: release}
			defer s.done()
			ctx = context.WithValue(ctx, runSlotKey{}, s)
		}
	}
	ctx = session.WithTenant(context.WithValue(ctx, callerKey{}, caller), caller.Tenant)
	if caller.Session != "" {
		ctx = session.WithOnly(ctx, caller.Session)
	}
	if ref, enter := capb.SessionRef(in); enter {
		if c.enter == nil {
			return nil, nil, capability.Errorf(capability.Internal, "%s uses a session, and this controller has none", name)
		}
		var leave func()
		ctx, leave, err = c.enter(ctx, ref, capb.Use)
		if err != nil {
			return nil, nil, err
		}
		defer leave()
		if s := session.Entered(ctx); s != nil {
			*entered = s.ID
		}
		ctx, lc = c.liveBegin(ctx, caller, capb, args)
	}
	out, err := capb.Run(ctx, in)
	if err != nil {
		return nil, lc, err
	}
	return replyOf(out), lc, nil
}

// replyOf is the reply of a call whose output is out.
func replyOf(out any) *Reply {
	reply := &Reply{Output: out}
	if t, ok := out.(capability.Texter); ok {
		reply.Text = t.Text()
	} else {
		b, _ := json.MarshalIndent(out, "", "  ")
		reply.Text = string(b)
	}
	return reply
}

// runSlot is a call's run slot, released once: when the call returns, or
// earlier when it only follows a process from then on (RunSlotDone).
type runSlot struct {
	once    sync.Once
	release func()
}

func (s *runSlot) done() { s.once.Do(s.release) }

type runSlotKey struct{}

// RunSlotDone frees the run slot of the call running under ctx, if it
// holds one: from now on the call runs nothing, it only follows a
// process that counts against limits of its own (start_process once the
// process runs). Safe to call more than once, and without a slot.
func RunSlotDone(ctx context.Context) {
	if s, ok := ctx.Value(runSlotKey{}).(*runSlot); ok {
		s.done()
	}
}

// RunsInFlight is how many calls that run code tenant has in flight.
func (c *Controller) RunsInFlight(tenant string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight[tenant]
}

// RunsInFlightAll is how many calls that run code all tenants have in
// flight.
func (c *Controller) RunsInFlightAll() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.inFlight {
		n += v
	}
	return n
}

// runLimit is tenant's cap of calls that run code in flight (0: none).
func (c *Controller) runLimit(ctx context.Context, tenant string) (int, error) {
	if c.limits.RunsOf != nil {
		return c.limits.RunsOf(ctx, tenant)
	}
	return c.limits.RunsPerTenant, nil
}

// acquire counts one more call that runs code of tenant in flight, or
// refuses when the tenant is at its limit. A nil release: no cap applies.
func (c *Controller) acquire(ctx context.Context, tenant string) (func(), error) {
	limit, err := c.runLimit(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.inFlight[tenant]; n >= limit {
		raise := ""
		if c.limits.Raise != "" {
			raise = "; " + c.limits.Raise
		}
		who := "the local tenant"
		if tenant != "" {
			who = "tenant " + tenant
		}
		e := capability.Errorf(capability.ResourceExhausted,
			"runs in flight: %s already has %d calls running code at once (its limit is %d); wait for one to finish and try again "+
				"(background processes do not count: only calls while they run something)%s", who, n, limit, raise)
		e.RetryAfter = 1
		return nil, e
	}
	if c.inFlight == nil {
		c.inFlight = map[string]int{}
	}
	c.inFlight[tenant]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.inFlight[tenant]--; c.inFlight[tenant] == 0 {
			delete(c.inFlight, tenant)
		}
	}, nil
}
