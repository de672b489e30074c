package mcp

import (
	"bytes"
	"container/list"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/share"
)

const sessionHeader = "Mcp-Session-Id"

// Handler serves MCP over streamable HTTP (mount it at /mcp).
//
// Every HTTP request — the POSTs that carry calls, the GET of the event
// stream, the DELETE that ends a session — is authenticated with auth
// first; a failure is answered with the error as JSON (401 with
// "WWW-Authenticate: Bearer" for missing or bad credentials) and reaches no
// tool.
//
// Who a tool runs as: the SDK runs tool handlers on the MCP session, detached
// from the HTTP request that carried the call, so the caller cannot travel
// in the request's context. Instead each MCP session gets its own server,
// built for the caller that opened it, and the session is pinned to that
// caller: a later request of the session that authenticates as anyone else
// (another tenant, token or scope) is refused with 403 before the SDK sees
// it. So every call runs as the caller its own request authenticated as,
// and no request ever gets another's identity.
//
// A plain tools/call — no progress token or other _meta, one message, on
// an initialized session — is served directly by this handler (see
// serveDirect), on the request's goroutine, and answered with one JSON
// object; the SDK serves everything else, including every call that may
// stream (progress notifications need the event stream). Both run the
// same tool handler with the session's caller, after the same checks.
//
// Sessions are bounded: each holds a server of its own, so at most
// MaxSessionsPerCaller are kept per caller and MaxSessions in all. A new
// session over a cap evicts the least recently used idle session (of the
// caller, of its tenant when the tenant holds its share, or of anyone when
// the total is reached) — one with no POST or
// DELETE in flight; a standing GET event stream does not keep a session
// busy. A later request on an evicted session gets 404, as for any ended
// session, and the client starts a new one. When every session under the
// cap is busy, the new one is refused with 429. The bookkeeping is a map
// by session id and least-recently-used lists of the idle sessions, in all
// and per caller, ordered by when their last request began; a request
// costs O(1) but for passing, when it ends, the sessions used since it
// began. A session idle (no POST or DELETE in
// flight) for Options.SessionTimeout is closed here too.
//
// Event streams (GET with a session id) are held against the token's cap
// of streams (Options.Streams), refused with 429 past it, and pinged: one
// whose client answers no ping within Options.StreamIdleTimeout is ended
// (see keepalive).
func Handler(ctl *controller.Controller, auth httpauth.Func, opts *Options) http.Handler {
	o := opts.withDefaults()
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxSessionsPerCaller <= 0 {
		o.MaxSessionsPerCaller = DefaultMaxSessionsPerCaller
	}
	if o.MaxSessionsPerTenant <= 0 {
		o.MaxSessionsPerTenant = share.Of(o.MaxSessions, o.MaxSessionsPerCaller)
	}
	h := &httpHandler{ctl: ctl, auth: auth, opts: o, pins: map[string]*pin{}, callers: map[controller.Caller]*callerPins{}, idle: list.New(),
		tenants: share.New("MCP sessions", o.MaxSessions, o.MaxSessionsPerTenant), tenantIdle: map[string]*list.List{}}
	// No SessionTimeout for the SDK: the calls served directly (see
	// serveDirect) never reach it, so it would close sessions in use. The
	// idle timeout is kept here instead, with the rest of the bookkeeping.
	h.sdk = mcp.NewStreamableHTTPHandler(h.serverFor, &mcp.StreamableHTTPOptions{
		Logger: h.opts.Logger,
	})
	return h
}

// The session caps when Options leave them 0. A session costs about 250 kB.
const (
	DefaultMaxSessions          = 512
	DefaultMaxSessionsPerCaller = 32
)

type httpHandler struct {
	ctl     *controller.Controller
	auth    httpauth.Func
	opts    Options
	sdk     *mcp.StreamableHTTPHandler
	schemas schemas // resolved once for every session's server

	mu      sync.Mutex
	pins    map[string]*pin // by MCP session id: the sessions held (and those being opened)
	callers map[controller.Caller]*callerPins
	idle    *list.List // of *pin: the idle sessions, most recently used first
	// tenants counts each tenant's sessions against its share (every
	// caller of a tenant together: its tokens, its sessions' in-session
	// callers); tenantIdle are their idle ones, most recently used first.
	tenants    *share.Pool
	tenantIdle map[string]*list.List
	clock      uint64 // counts the POSTs and DELETEs begun (pin.used)
}

// callerPins are the sessions of one caller.
type callerPins struct {
	n    int        // sessions held
	idle *list.List // of *pin, most recently used first
}

// pin is an MCP session: the caller it belongs to and its server. The
// fields from busy on are under httpHandler.mu.
type pin struct {
	id      string
	caller  controller.Caller
	server  *mcp.Server
	tools   map[string]*tool                  // the server's, by name (serveDirect)
	session atomic.Pointer[mcp.ServerSession] // once initialize has answered

	callsMu sync.Mutex
	calls   map[string]context.CancelFunc // the direct calls in flight, by JSON-RPC id

	busy    int           // POST and DELETE requests in flight
	gone    bool          // forgotten: evicted, ended or timed out
	idleAll *list.Element // in httpHandler.idle, when idle
	idleOwn *list.Element // in callerPins.idle, when idle
	idleTen *list.Element // in httpHandler.tenantIdle, when idle
	used    uint64        // httpHandler.clock when its last request began
	timer   *time.Timer   // the idle timeout, armed while idle
	idleGen uint64        // counts the idle periods; the timer ends only its own
}

// Count returns the MCP sessions held (for tests).
func (h *httpHandler) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pins)
}

// Counter is implemented by the handler Handler returns.
type Counter interface{ Count() int }

type newSessionKey struct{}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	caller, err := h.auth(r)
	if err != nil {
		ce := controller.Classify(err)
		if ce.Code == capability.Unauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="quro"`)
		}
		writeError(w, rest.Status(ce.Code), ce)
		return
	}
	caller.Path = Path
	if id := r.Header.Get(sessionHeader); id != "" {
		h.mu.Lock()
		p := h.pins[id]
		ok := p != nil && p.caller == caller
		// A POST or DELETE uses the session; the GET of its event stream,
		// which stands open, does not. The POSTs that answer the pings on
		// the stream (see keepalive) do: a client that answers them is
		// still there.
		if ok && r.Method != http.MethodGet {
			h.use(p)
		}
		h.mu.Unlock()
		switch {
		case p == nil:
			// Unknown (ended or evicted) session: the client starts a new one.
			writeError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "no MCP session %q (it ended, timed out or was evicted): initialize a new one", id))
			return
		case !ok:
			h.opts.Logger.Warn("mcp: request for a session of another caller refused", "caller", describe(caller), "owner", describe(p.caller))
			writeError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied, "this MCP session belongs to another caller"))
			return
		}
		if r.Method == http.MethodGet {
			h.serveStream(w, r, p)
			return
		}
		defer h.done(p)
		if r.Method == http.MethodPost {
			if c := parseDirectCall(r); c != nil {
				if h.serveDirect(w, r, p, c) {
					return
				}
			} else {
				cancelDirect(r, p)
			}
		}
		h.sdk.ServeHTTP(w, r)
		if r.Method == http.MethodDelete {
			h.mu.Lock()
			h.forget(p) // ended: its place is free now, not when Wait returns
			h.mu.Unlock()
		}
		return
	}
	if r.Method != http.MethodPost {
		h.sdk.ServeHTTP(w, r) // the SDK answers 400: no session id
		return
	}
	// A POST without a session: the SDK serves it on a session of its own,
	// kept if the POST is an initialize. Only an initialize takes a place
	// under the caps (evicting if need be), before the SDK calls serverFor;
	// anything else — a client's probe for a newer protocol, which the SDK
	// refuses — gets a server for this request only.
	if refuseModernDiscover(w, r) {
		return
	}
	// The tools listed: the client's ?tools=, else its token's default,
	// else the server's.
	name := r.URL.Query().Get("tools")
	if name == "" {
		name = caller.Tools
	}
	if name == "" {
		name = h.opts.Tools
	}
	profile, err := Profile(h.ctl.Registry(), name)
	if err != nil {
		writeError(w, http.StatusBadRequest, controller.Classify(err))
		return
	}
	var p *pin
	admitted := opensSession(r)
	if admitted {
		var evicted []*pin
		p, evicted, err = h.admit(caller, r.Header.Get("Authorization"), profile)
		closeAll(evicted)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, controller.Classify(err))
			return
		}
	} else {
		p = &pin{id: rand.Text(), caller: caller}
		p.server, _ = newServer(h.ctl, caller, r.Header.Get("Authorization"), h.opts, p.id, &h.schemas, profile)
		defer closeAll([]*pin{p})
	}
	h.sdk.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), newSessionKey{}, p)))
	if !admitted {
		return // closed by the deferred closeAll
	}
	var ss *mcp.ServerSession
	for s := range p.server.Sessions() {
		ss = s
	}
	if ss == nil { // the initialize failed: nothing to keep
		h.mu.Lock()
		h.forget(p)
		h.mu.Unlock()
		return
	}
	p.session.Store(ss)
	h.done(p)
	go func() {
		// Closed by the client, the idle timeout or an eviction: forgotten
		// the same way whatever Wait says.
		_ = ss.Wait()
		h.mu.Lock()
		h.forget(p)
		h.mu.Unlock()
	}()
}

// serveStream serves the event stream of p (a GET with its session id),
// held against the caller's cap of streams (Options.Streams) and pinged
// (see keepalive).
func (h *httpHandler) serveStream(w http.ResponseWriter, r *http.Request, p *pin) {
	release, e := h.opts.Streams.Acquire(p.caller)
	if e != nil {
		streamcap.Refuse(w, e, writeError)
		return
	}
	defer release()
	ctx, stop := h.keepalive(r.Context(), w, p)
	defer stop()
	h.sdk.ServeHTTP(w, r.WithContext(ctx))
}

// keepalive pings p's client on its event stream every quarter of
// Options.StreamIdleTimeout, until the returned context ends or stop is
// called; a ping not answered within StreamIdleTimeout ends the stream:
// the context, which the SDK's GET waits on, ends, and the connection's
// write deadline passes, so that a write stuck on a peer that reads
// nothing fails too. A client that answers that it does not know ping
// has answered.
func (h *httpHandler) keepalive(parent context.Context, w http.ResponseWriter, p *pin) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ss := p.session.Load()
	if ss == nil { // not initialized: the SDK refuses the GET
		return ctx, cancel
	}
	idle := h.opts.StreamIdleTimeout
	ping := func(ctx context.Context) error {
		err := ss.Ping(ctx, nil)
		if answered := (*jsonrpc.Error)(nil); errors.As(err, &answered) && answered.Code == codeMethodNotFound {
			return nil // it answered
		}
		return err
	}
	stopPings := streamcap.KeepAlive(ctx, idle, ping, func(err error) {
		h.opts.Logger.Info("mcp: event stream ended: its client answered no ping", "owner", describe(p.caller), "within", idle, "err", err)
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now())
		cancel()
		if f := streamEnded.Load(); f != nil {
			(*f)()
		}
	})
	return ctx, func() {
		cancel()
		stopPings()
	}
}

// codeMethodNotFound is JSON-RPC's "method not found".
const codeMethodNotFound = -32601

// streamEnded, when set (tests), is called after keepalive ended a stream.
var streamEnded atomic.Pointer[func()]

// opensSession reports whether r (a POST without a session id) is an
// initialize, in the protocols that keep sessions (before 2026-07-28). It
// reads the body (at most the SDK's limit) and puts it back.
func opensSession(r *http.Request) bool {
	if v := r.Header.Get("Mcp-Protocol-Version"); v >= modernVersion {
		return false
	}
	if r.Body == nil {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return false
	}
	var msgs []struct {
		Method string `json:"method"`
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		b = append(append([]byte{'['}, t...), ']')
	}
	if json.Unmarshal(b, &msgs) != nil {
		return false
	}
	for _, m := range msgs {
		if m.Method == "initialize" {
			return true
		}
	}
	return false
}

// modernVersion is the first protocol version without sessions
// (2026-07-28): the SDK's stateful streamable HTTP transport, which keeps
// the sessions this handler pins callers to, does not serve it.
const modernVersion = "2026-07-28"

// refuseModernDiscover answers a server/discover probe made at a protocol
// version this transport does not serve with the error the specification
// wants for it (UnsupportedProtocolVersionError, -32022, naming the versions
// it does serve), and reports whether it did. The SDK would instead answer
// the probe with a success whose supportedVersions leaves the probed version
// out (go-sdk issue #1025), and a client that reads that success as "yes"
// (mark3labs/mcp-go v1.2.1) goes on to send 2026-07-28 requests that all
// fail; on this error it falls back to initialize, as the spec says.
func refuseModernDiscover(w http.ResponseWriter, r *http.Request) bool {
	v := r.Header.Get("Mcp-Protocol-Version")
	if v < modernVersion || r.Body == nil {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if err != nil || json.Unmarshal(b, &msg) != nil || msg.Method != "server/discover" || len(msg.ID) == 0 {
		return false
	}
	var supported []string
	for _, sv := range mcp.SupportedProtocolVersions() {
		if sv < modernVersion {
			supported = append(supported, sv)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": msg.ID,
		"error": map[string]any{
			"code":    mcp.CodeUnsupportedProtocolVersion,
			"message": "protocol version " + strconv.Quote(v) + " is not supported over this transport (it keeps sessions): initialize with one of the supported versions",
			"data":    mcp.UnsupportedProtocolVersionData{Supported: supported, Requested: v},
		},
	})
	return true
}

// admit makes room for a new session of caller and holds it, busy, until
// done; it returns the sessions evicted for it, to close. Over a cap with
// no idle session to evict, it fails with ResourceExhausted. cred is the
// credential caller authenticated with (newServer).
func (h *httpHandler) admit(caller controller.Caller, cred string, profile capability.Profile) (p *pin, evicted []*pin, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.callers[caller]
	if c == nil {
		c = &callerPins{idle: list.New()}
		h.callers[caller] = c
	}
	if c.n >= h.opts.MaxSessionsPerCaller {
		e := c.idle.Back()
		if e == nil {
			h.dropCaller(caller, c)
			return nil, nil, capability.Errorf(capability.ResourceExhausted,
				"this token has %d MCP sessions open, each with a call in flight: end one (DELETE /mcp with its Mcp-Session-Id) or wait for a call to finish", c.n)
		}
		evicted = append(evicted, e.Value.(*pin))
		h.forget(e.Value.(*pin))
	}
	var r *share.Refusal
	if err := h.tenants.Check(caller.Tenant); errors.As(err, &r) && r.AtShare {
		var e *list.Element
		if l := h.tenantIdle[caller.Tenant]; l != nil {
			e = l.Back()
		}
		if e == nil {
			h.dropCaller(caller, c)
			return nil, evicted, capability.Errorf(capability.ResourceExhausted,
				"%v: each of the tenant's MCP sessions has a call in flight; end one (DELETE /mcp with its Mcp-Session-Id) or wait for a call to finish", err)
		}
		evicted = append(evicted, e.Value.(*pin))
		h.forget(e.Value.(*pin))
	}
	if len(h.pins) >= h.opts.MaxSessions {
		e := h.idle.Back()
		if e == nil {
			h.dropCaller(caller, c)
			return nil, evicted, capability.Errorf(capability.ResourceExhausted,
				"the server holds %d MCP sessions, each with a call in flight: retry when one finishes", len(h.pins))
		}
		evicted = append(evicted, e.Value.(*pin))
		h.forget(e.Value.(*pin))
	}
	if err := h.tenants.Acquire(caller.Tenant); err != nil { // the evictions above made a place: this is a safeguard
		h.dropCaller(caller, c)
		return nil, evicted, capability.Errorf(capability.ResourceExhausted, "%v", err)
	}
	h.clock++
	p = &pin{id: rand.Text(), caller: caller, busy: 1, used: h.clock, calls: map[string]context.CancelFunc{}}
	p.server, p.tools = newServer(h.ctl, caller, cred, h.opts, p.id, &h.schemas, profile)
	h.pins[p.id] = p
	if c = h.callers[caller]; c == nil { // an eviction may have dropped it
		c = &callerPins{idle: list.New()}
		h.callers[caller] = c
	}
	c.n++
	for _, e := range evicted {
		h.opts.Logger.Info("mcp: idle session evicted for a new one", "owner", describe(e.caller), "caller", describe(caller))
	}
	return p, evicted, nil
}

// use marks a POST or DELETE on p: busy (off the idle lists) until done.
// Called with h.mu.
func (h *httpHandler) use(p *pin) {
	if p.idleAll != nil {
		h.idle.Remove(p.idleAll)
		h.callers[p.caller].idle.Remove(p.idleOwn)
		h.tenantIdle[p.caller.Tenant].Remove(p.idleTen)
		p.idleAll, p.idleOwn, p.idleTen = nil, nil, nil
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	p.idleGen++
	h.clock++
	p.used = h.clock
	p.busy++
}

// done ends a busy request on p; idle again, p goes back in the lists in
// the order requests began: its answer may have reached the client, and
// the client gone on to use another session, before done runs, and that
// session is the more recently used. Only sessions whose requests began
// after p's are passed (usually none).
func (h *httpHandler) done(p *pin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.busy--
	if p.busy == 0 && !p.gone && p.idleAll == nil {
		c := h.callers[p.caller]
		tl := h.tenantIdle[p.caller.Tenant]
		if tl == nil {
			tl = list.New()
			h.tenantIdle[p.caller.Tenant] = tl
		}
		p.idleAll, p.idleOwn, p.idleTen = insertByUse(h.idle, p), insertByUse(c.idle, p), insertByUse(tl, p)
		p.idleGen++
		gen := p.idleGen
		if p.timer != nil {
			p.timer.Stop()
		}
		p.timer = time.AfterFunc(h.opts.SessionTimeout, func() { h.expire(p, gen) })
	}
}

// insertByUse puts p into l (most recently used first) after the pins
// used later than p.
func insertByUse(l *list.List, p *pin) *list.Element {
	e := l.Front()
	for e != nil && e.Value.(*pin).used > p.used {
		e = e.Next()
	}
	if e == nil {
		return l.PushBack(p)
	}
	return l.InsertBefore(p, e)
}

// expire ends p after SessionTimeout without a POST or DELETE, unless p
// was used since the timer of idle period gen was armed.
func (h *httpHandler) expire(p *pin, gen uint64) {
	h.mu.Lock()
	if p.gone || p.busy > 0 || p.idleGen != gen {
		h.mu.Unlock()
		return
	}
	h.forget(p)
	h.mu.Unlock()
	h.opts.Logger.Debug("mcp: idle session closed", "owner", describe(p.caller), "after", h.opts.SessionTimeout)
	closeAll([]*pin{p})
	if f := idleClosed.Load(); f != nil {
		(*f)()
	}
}

// idleClosed, when set (tests), is called after an idle session was closed.
var idleClosed atomic.Pointer[func()]

// forget drops p from the bookkeeping (once). Called with h.mu.
func (h *httpHandler) forget(p *pin) {
	if p.gone {
		return
	}
	p.gone = true
	if p.timer != nil {
		p.timer.Stop()
	}
	// Its direct calls end with it, as the SDK's calls end with their
	// session.
	p.callsMu.Lock()
	for _, cancel := range p.calls {
		cancel()
	}
	p.callsMu.Unlock()
	delete(h.pins, p.id)
	c := h.callers[p.caller]
	tl := h.tenantIdle[p.caller.Tenant]
	if p.idleAll != nil {
		h.idle.Remove(p.idleAll)
		c.idle.Remove(p.idleOwn)
		tl.Remove(p.idleTen)
		p.idleAll, p.idleOwn, p.idleTen = nil, nil, nil
	}
	c.n--
	h.dropCaller(p.caller, c)
	h.tenants.Release(p.caller.Tenant)
	if tl != nil && h.tenants.Held(p.caller.Tenant) == 0 {
		delete(h.tenantIdle, p.caller.Tenant)
	}
}

// dropCaller forgets a caller without sessions. Called with h.mu.
func (h *httpHandler) dropCaller(caller controller.Caller, c *callerPins) {
	if c.n == 0 {
		delete(h.callers, caller)
	}
}

// closeAll closes the SDK sessions of evicted pins (ending their event
// streams and calls).
func closeAll(pins []*pin) {
	for _, p := range pins {
		for ss := range p.server.Sessions() {
			ss.Close()
		}
	}
}

// serverFor is the SDK's getServer: the server of the session that the
// request opens (admitted by ServeHTTP), or nil for any other request (the
// SDK then answers 400 where it needs one).
func (h *httpHandler) serverFor(r *http.Request) *mcp.Server {
	p, ok := r.Context().Value(newSessionKey{}).(*pin)
	if !ok {
		return nil
	}
	h.opts.Logger.Debug("mcp: new session", "caller", describe(p.caller))
	return p.server
}

func writeError(w http.ResponseWriter, status int, e *capability.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": e})
}
