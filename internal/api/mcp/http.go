package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
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
func Handler(ctl *controller.Controller, auth httpauth.Func, opts *Options) http.Handler {
	h := &httpHandler{ctl: ctl, auth: auth, opts: opts.withDefaults(), pins: map[string]*pin{}}
	h.sdk = mcp.NewStreamableHTTPHandler(h.serverFor, &mcp.StreamableHTTPOptions{
		Logger:         h.opts.Logger,
		SessionTimeout: h.opts.SessionTimeout,
	})
	return h
}

type httpHandler struct {
	ctl  *controller.Controller
	auth httpauth.Func
	opts Options
	sdk  *mcp.StreamableHTTPHandler

	mu   sync.Mutex
	pins map[string]*pin // by MCP session id
}

// pin is the caller an MCP session belongs to.
type pin struct {
	caller  controller.Caller
	server  *mcp.Server
	created time.Time
}

type callerKey struct{}

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
		h.mu.Unlock()
		switch {
		case p == nil:
			// Unknown (or ended) session: the client starts a new one.
			writeError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "no MCP session %q: initialize a new one", id))
			return
		case p.caller != caller:
			h.opts.Logger.Warn("mcp: request for a session of another caller refused", "caller", describe(caller), "owner", describe(p.caller))
			writeError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied, "this MCP session belongs to another caller"))
			return
		}
		h.sdk.ServeHTTP(w, r)
		return
	}
	// No session yet: serverFor (called by the SDK within this request, if
	// the message opens a session) builds the session's server for caller.
	h.sdk.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
}

// serverFor is the SDK's getServer: it is called once per new MCP session,
// synchronously within the request that opens it.
func (h *httpHandler) serverFor(r *http.Request) *mcp.Server {
	caller, ok := r.Context().Value(callerKey{}).(controller.Caller)
	if !ok {
		return nil // not through ServeHTTP: the SDK answers 400
	}
	id := rand.Text()
	s := newServer(h.ctl, caller, h.opts, id)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.prune()
	h.pins[id] = &pin{caller: caller, server: s, created: time.Now()}
	h.opts.Logger.Debug("mcp: new session", "caller", describe(caller))
	return s
}

// prune forgets the pins of sessions that ended (closed, timed out, or
// never initialised). A young pin is kept: its session may still be
// connecting. Called with h.mu held.
func (h *httpHandler) prune() {
	for id, p := range h.pins {
		if time.Since(p.created) < time.Minute {
			continue
		}
		alive := false
		for range p.server.Sessions() {
			alive = true
			break
		}
		if !alive {
			delete(h.pins, id)
		}
	}
}

func writeError(w http.ResponseWriter, status int, e *capability.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": e})
}
