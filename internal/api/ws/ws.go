// Package ws serves the WebSocket routes of the REST table: the session's
// interactive terminal (GET /v1/sessions/{id}/pty) and runs whose output
// is streamed as it arrives (GET /v1/stream/{capability}). Access is
// checked before the upgrade (origin, host, token, and the session through
// the controller, so another tenant's session is a 404); after it the
// protocol is quro.v1, described in docs/architecture.md.
package ws

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/terminal"
)

// Protocol is the subprotocol the server selects.
const Protocol = "quro.v1"

// BearerPrefix marks the subprotocol entry that carries a token, for
// browsers, which cannot set headers on a WebSocket: a client offers
// "quro.v1" and "quro.bearer.<token>"; the server selects quro.v1.
const BearerPrefix = "quro.bearer."

// Options configure a Server. nil means defaults.
type Options struct {
	// Access is shared with the REST handler: auth, origins, hosts.
	Access rest.Access
	// PTY returns the interactive terminal of the session with this id,
	// starting it when none runs (app.App.OpenPTY). It is called only
	// after the controller has found the session for the caller.
	PTY func(ctx context.Context, id string) (*terminal.PTY, error)
	// Events is the bus GET /v1/events streams (nil: the route answers
	// 503).
	Events *events.Bus
	// Take gives session id's shell to a person under the hold key key,
	// and HandBack ends it (app.App.TakeShell, HandBackShell). Called
	// only after the controller has found the session for the caller.
	Take     func(ctx context.Context, id, key string) error
	HandBack func(ctx context.Context, id, key string)
	Logger   *slog.Logger
	// ViewerQueue is how many output chunks a terminal viewer may lag
	// before it is dropped (0: the terminal's default).
	ViewerQueue int
	// StreamBuffer is how many bytes of output a stream holds for a slow
	// client before it drops output and says so (1 MiB). The result
	// always has the output as the capability returns it.
	StreamBuffer int
	// MaxMessage is the largest message a client may send (16 MiB).
	MaxMessage int64
	// Streams caps the connections each token holds, shared with the
	// other routes that hold streams (MCP's event streams); nil: no cap.
	Streams *streamcap.Limiter
	// IdleTimeout closes a connection that has not answered a ping for
	// this long (DefaultIdleTimeout); the server pings every quarter of
	// it. Browsers and WebSocket libraries answer pings by themselves, so
	// a client that is still there is never closed by it.
	IdleTimeout time.Duration
	// Peers, set on a cluster node (cluster.Router.PeerEvents), streams
	// the other nodes' live events for a caller whose credential is cred
	// (an Authorization value): GET /v1/events without replay merges them
	// with this node's, each marked with its Node. nil: this node's only.
	Peers func(ctx context.Context, cred string, ready func(joined, unanswered []string), send func(events.Event) bool)
	// Node is this node's name in a cluster: the Node of its own events
	// on a merged stream.
	Node string
}

// DefaultIdleTimeout is Options.IdleTimeout's default: pings every 30 s,
// each answered within 2 min.
const DefaultIdleTimeout = 2 * time.Minute

// Server serves the WebSocket routes (Handlers). GET /v1/stream/{capability}
// runs the capabilities the registry declares as streaming
// (capability.Capability.Streams).
type Server struct {
	ctl    *controller.Controller
	opts   Options
	log    *slog.Logger
	wg     sync.WaitGroup
	active atomic.Int64
}

// New returns a Server for ctl.
func New(ctl *controller.Controller, o *Options) *Server {
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.StreamBuffer <= 0 {
		opts.StreamBuffer = 1 << 20
	}
	if opts.MaxMessage <= 0 {
		opts.MaxMessage = 16 << 20
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{ctl: ctl, opts: opts, log: log}
}

// Handlers are the server's handlers of the REST table's WebSocket routes,
// for rest.Options.WebSocket.
func (s *Server) Handlers() map[rest.WebSocket]http.Handler {
	return map[rest.WebSocket]http.Handler{
		rest.WebSocketPTY:    http.HandlerFunc(s.servePTY),
		rest.WebSocketStream: http.HandlerFunc(s.serveStream),
		rest.WebSocketEvents: http.HandlerFunc(s.serveEvents),
	}
}

// Active is the number of handlers running.
func (s *Server) Active() int { return int(s.active.Load()) }

// Wait returns when every handler has returned (after the server stopped
// accepting, or in tests after the clients left).
func (s *Server) Wait() { s.wg.Wait() }

func (s *Server) track() func() {
	s.wg.Add(1)
	s.active.Add(1)
	return func() {
		s.active.Add(-1)
		s.wg.Done()
	}
}

// admit checks origin and host, then authenticates with the token from
// the Authorization header or, failing that, from a quro.bearer.<token>
// subprotocol entry (never from the URL).
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (controller.Caller, bool) {
	offered := subprotocols(r)
	var token string
	for _, p := range offered {
		if strings.HasPrefix(p, BearerPrefix) {
			token = strings.TrimPrefix(p, BearerPrefix)
		}
	}
	if token != "" {
		if !slices.Contains(offered, Protocol) {
			rest.WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument,
				"offer the subprotocol %s beside %s<token>", Protocol, BearerPrefix))
			return controller.Caller{}, false
		}
		if r.Header.Get("Authorization") == "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
		}
	}
	return s.opts.Access.Admit(w, r, "ws")
}

func subprotocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// hold counts the connection against its token's cap (Options.Streams)
// until release; past the cap it has answered 429 and returns false.
func (s *Server) hold(w http.ResponseWriter, caller controller.Caller) (release func(), ok bool) {
	release, e := s.opts.Streams.Acquire(caller)
	if e != nil {
		streamcap.Refuse(w, e, rest.WriteError)
		return nil, false
	}
	return release, true
}

// keepalive pings c every quarter of Options.IdleTimeout until ctx ends
// or stop is called; a ping not answered within IdleTimeout closes c (the
// handler's reads then fail, and it returns). The handlers read c all
// along, which is what takes in the pongs.
func (s *Server) keepalive(ctx context.Context, c *websocket.Conn) (stop func()) {
	return streamcap.KeepAlive(ctx, s.opts.IdleTimeout, c.Ping, func(err error) {
		s.log.Debug("ws: closing a connection that answered no ping", "after", s.opts.IdleTimeout, "err", err)
		c.CloseNow()
	})
}

func (s *Server) accept(w http.ResponseWriter, r *http.Request) (*websocket.Conn, error) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{Protocol},
		// Origin and Host were checked by Access before; its rule (same
		// origin or an allowed one) is the one that applies.
		InsecureSkipVerify: true,
	})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(s.opts.MaxMessage)
	return c, nil
}

func writeCallError(w http.ResponseWriter, err error) {
	ce := controller.Classify(err)
	rest.WriteError(w, rest.Status(ce.Code), ce)
}

// message is a text frame of quro.v1.
type message struct {
	Type    string            `json:"type"`
	Session string            `json:"session,omitempty"`
	Cols    int               `json:"cols,omitempty"`
	Rows    int               `json:"rows,omitempty"`
	Code    *int              `json:"code,omitempty"`
	Stream  string            `json:"stream,omitempty"`
	Data    string            `json:"data,omitempty"`
	Bytes   int64             `json:"bytes,omitempty"`
	Output  any               `json:"output,omitempty"`
	Text    *string           `json:"text,omitempty"`
	Error   *capability.Error `json:"error,omitempty"`
	Message string            `json:"message,omitempty"`
}

func sendJSON(ctx context.Context, c *websocket.Conn, m *message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return c.Write(ctx, websocket.MessageText, b)
}
