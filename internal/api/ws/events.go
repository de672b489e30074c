package ws

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/terminal"
)

// eventsQueue is how many events a viewer may lag before it drops.
const eventsQueue = events.DefaultQueue

// control is a text frame a client sends on GET /v1/events.
type control struct {
	Type    string `json:"type"`
	Session string `json:"session"`
	Command string `json:"command,omitempty"`
	Data    string `json:"data,omitempty"`
	ID      string `json:"id,omitempty"` // echoed in the answer
}

// reply is the server's answer to a control message.
type reply struct {
	Type    string            `json:"type"` // taken, released, result, error
	ID      string            `json:"id,omitempty"`
	Session string            `json:"session,omitempty"`
	Output  any               `json:"output,omitempty"`
	Error   *capability.Error `json:"error,omitempty"`
	// The hello of a stream that merges the cluster's nodes: the nodes
	// whose events it carries, and those that did not answer (asked
	// again in the background).
	Nodes      []string `json:"nodes,omitempty"`
	Unanswered []string `json:"nodes_unanswered,omitempty"`
}

// serveEvents streams the caller's tenant's events (events.Bus) and lets
// a person take over a session's shell, run commands and type input in
// it under the connection's own hold key, and hand it back. The holds of
// a connection end with it.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	defer s.track()()
	caller, ok := s.admit(w, r)
	if !ok {
		return
	}
	if caller.Session != "" {
		// Code in a session watches no one: it would see its tenant's
		// other sessions' commands.
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"the event stream is for people and their clients, not for code in a session"))
		return
	}
	if s.opts.Events == nil {
		rest.WriteError(w, http.StatusServiceUnavailable, capability.Errorf(capability.Unavailable, "this server has no event stream"))
		return
	}
	// ?replay=<session id>: the session's recent events first (its ring,
	// each marked replay), for a page opened while the agent works. The
	// ring is found by id and only in the caller's tenant.
	replay := r.URL.Query().Get("replay")
	if replay != "" && !sessionID(replay) {
		rest.WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument,
			"replay: give a session's id (32 lowercase hex digits, as get_session_status answers it), not its name"))
		return
	}
	release, held := s.hold(w, caller)
	if !held {
		return
	}
	defer release()
	c, err := s.accept(w, r)
	if err != nil {
		return
	}
	defer c.CloseNow()
	defer s.keepalive(r.Context(), c)()
	// The caller's credential goes with the calls this stream makes
	// (a take's status, its commands): on a cluster node, one for a
	// session of another node is sent there with it (the header's is set
	// by the router already; a browser's is in the subprotocol).
	ctx, cancel := context.WithCancel(controller.WithCredential(r.Context(), credential(r)))
	defer cancel()
	sub := s.opts.Events.SubscribeReplay(caller.Tenant, eventsQueue, replay)
	defer sub.Close()

	var kb [16]byte
	rand.Read(kb[:])
	h := &holder{s: s, caller: caller, key: hex.EncodeToString(kb[:]), held: map[string]bool{}, c: c}
	defer h.releaseAll()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel()
		h.read(ctx)
	}()
	defer func() { <-readDone }()
	hello := &reply{Type: "hello"}
	send := func(ev *events.Event) error { return h.send(ctx, ev) }
	var m *merged
	if replay == "" && s.opts.Peers != nil && !controller.IsServeHere(r.Context()) {
		// A cluster node: the other nodes' events too, once each
		// node's stream is subscribed (or found not answering). A
		// stream another node asked for (signed, served here) is this
		// node's own events: that node merges.
		m = &merged{h: h, node: s.opts.Node, hello: make(chan struct{})}
		send = func(ev *events.Event) error { return m.send(ctx, ev) }
		ready := make(chan struct{})
		peersDone := make(chan struct{})
		go func() {
			defer close(peersDone)
			s.opts.Peers(ctx, credential(r), func(joined, unanswered []string) {
				hello.Nodes, hello.Unanswered = append([]string{s.opts.Node}, joined...), unanswered
				close(ready)
			}, func(ev events.Event) bool {
				if send(&ev) != nil {
					cancel() // the connection failed: it ends
					return false
				}
				return true
			})
		}()
		defer func() { cancel(); <-peersDone }()
		select {
		case <-ready:
		case <-peersDone:
			select {
			case <-ready:
			default:
				return // the connection ended first
			}
		}
	}
	if h.send(ctx, hello) != nil {
		return
	}
	if m != nil {
		m.open()
	}
	for {
		evs, err := sub.Next(ctx)
		if err != nil {
			c.CloseNow()
			return
		}
		for i := range evs {
			if send(&evs[i]) != nil {
				c.CloseNow()
				return
			}
		}
	}
}

// credential is the caller's credential as an Authorization value: the
// header, else the token of the bearer subprotocol (a browser's).
func credential(r *http.Request) string {
	if a := r.Header.Get("Authorization"); a != "" {
		return a
	}
	for _, p := range subprotocols(r) {
		if tok, ok := strings.CutPrefix(p, BearerPrefix); ok && tok != "" {
			return "Bearer " + tok
		}
	}
	return ""
}

// merged sends the events of a stream that merges the cluster's nodes:
// one at a time, each marked with its node and numbered anew by this
// connection — the nodes' own numbers are unrelated, and a client takes
// a number not above the last it saw as one it has handled (a replay
// after a reconnect). The numbers grow on the connection and across
// reconnections to this node: the microseconds of its clock, or the
// last one's next.
type merged struct {
	h     *holder
	node  string
	hello chan struct{} // closed once the hello is sent (open): no event goes before it
	once  sync.Once
	mu    sync.Mutex
	last  uint64
}

// open lets the events go, once the hello is out.
func (m *merged) open() { m.once.Do(func() { close(m.hello) }) }

func (m *merged) send(ctx context.Context, ev *events.Event) error {
	select {
	case <-m.hello:
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ev.Node == "" {
		ev.Node = m.node
	}
	m.last = max(m.last+1, uint64(time.Now().UnixMicro()))
	ev.Seq = m.last
	return m.h.send(ctx, ev)
}

// sessionID reports whether v has the form of a session's id.
func sessionID(v string) bool {
	if len(v) != 32 {
		return false
	}
	for _, c := range []byte(v) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// holder is one connection's side of take-over: its hold key (random,
// the server's own, never sent to the client) and the sessions it holds.
type holder struct {
	s      *Server
	caller controller.Caller
	key    string
	c      *websocket.Conn
	wg     sync.WaitGroup

	mu   sync.Mutex
	held map[string]bool // session ids
}

func (h *holder) send(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return h.c.Write(wctx, websocket.MessageText, b)
}

// answer sends r; a write that fails has closed the connection, whose
// reads then end the handler, so its error needs no other answer.
func (h *holder) answer(ctx context.Context, r *reply) {
	_ = h.send(ctx, r)
}

func (h *holder) fail(ctx context.Context, m *control, err error) {
	h.answer(ctx, &reply{Type: "error", ID: m.ID, Session: m.Session, Error: controller.Classify(err)})
}

// read handles the client's control messages until the connection ends;
// it returns once the commands it started have returned.
func (h *holder) read(ctx context.Context) {
	defer h.wg.Wait()
	for {
		typ, data, err := h.c.Read(ctx)
		if err != nil {
			return
		}
		var m control
		if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil {
			h.answer(ctx, &reply{Type: "error", Error: capability.Errorf(capability.InvalidArgument,
				"send JSON text messages: {\"type\":\"take\"|\"exec\"|\"input\"|\"release\",\"session\":ID,...}")})
			continue
		}
		switch m.Type {
		case "take":
			h.take(ctx, &m)
		case "release":
			id := h.holding(m.Session)
			if id == "" {
				h.fail(ctx, &m, capability.Errorf(capability.InvalidArgument, "this connection does not hold session %q", m.Session))
				continue
			}
			h.handBack(id)
			h.answer(ctx, &reply{Type: "released", ID: m.ID, Session: id})
		case "exec", "input":
			id := h.holding(m.Session)
			if id == "" {
				h.fail(ctx, &m, capability.Errorf(capability.InvalidArgument,
					"take over session %q first ({\"type\":\"take\",\"session\":ID}): only its holder types into a session's shell here", m.Session))
				continue
			}
			name, args := "terminal_exec", map[string]string{"session": id, "command": m.Command}
			if m.Type == "input" {
				name, args = "send_input", map[string]string{"session": id, "data": m.Data}
			}
			b, _ := json.Marshal(args)
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				out, err := h.s.ctl.Call(terminal.WithHolder(ctx, h.key), h.caller, name, b)
				if err != nil {
					h.fail(ctx, &m, err)
					return
				}
				h.answer(ctx, &reply{Type: "result", ID: m.ID, Session: id, Output: out.Output})
			}()
		default:
			h.answer(ctx, &reply{Type: "error", ID: m.ID, Error: capability.Errorf(capability.InvalidArgument,
				"unknown message type %q; the client may send take, exec, input and release", m.Type)})
		}
	}
}

// take looks the session up as the caller (another tenant's is not
// found) and takes its shell under the connection's key.
func (h *holder) take(ctx context.Context, m *control) {
	if !h.caller.Scope.Covers(capability.ScopeExec) {
		h.fail(ctx, m, capability.Errorf(capability.PermissionDenied, "taking over a shell needs scope %q", capability.ScopeExec))
		return
	}
	if h.s.opts.Take == nil {
		h.fail(ctx, m, capability.Errorf(capability.Unavailable, "this server cannot give a shell to a person"))
		return
	}
	args, _ := json.Marshal(map[string]string{"session": m.Session})
	out, err := h.s.ctl.Call(ctx, h.caller, "get_session_status", args)
	if err != nil {
		h.fail(ctx, m, h.elsewhere(err, m.Session))
		return
	}
	so, ok := out.Output.(sessionOutput)
	if !ok || so.SessionID() == "" {
		h.fail(ctx, m, capability.Errorf(capability.Internal, "get_session_status answered with no session id"))
		return
	}
	id := so.SessionID()
	if err := h.s.opts.Take(ctx, id, h.key); err != nil {
		h.fail(ctx, m, h.elsewhere(err, id))
		return
	}
	h.mu.Lock()
	h.held[id] = true
	h.mu.Unlock()
	yes := true
	h.s.opts.Events.Publish(h.caller.Tenant, events.Event{Type: events.TypeHold, Session: id, Held: &yes})
	h.answer(ctx, &reply{Type: "taken", ID: m.ID, Session: id})
}

// elsewhere is err of a take of session ref, which on a cluster node
// (Options.Peers) says, when ref is not found here, where the take of a
// session of another node is done: a hold is a node's own, of its own
// sessions' shells, and the merged stream's node is not the session's.
func (h *holder) elsewhere(err error, ref string) error {
	ce := controller.Classify(err)
	if h.s.opts.Peers == nil || ce.Code != capability.NotFound {
		return err
	}
	return capability.Errorf(capability.NotFound,
		"%s; a person takes over the shell of a session of another node of the cluster on the session's own event stream, GET /v1/events?replay=%s (through any node: it goes to the session's node)",
		ce.Message, url.QueryEscape(ref))
}

// holding is the id of the session ref names if this connection holds
// it ("" if not): ref is the id the take answered with.
func (h *holder) holding(ref string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[ref] {
		return ref
	}
	return ""
}

func (h *holder) handBack(id string) {
	h.mu.Lock()
	delete(h.held, id)
	h.mu.Unlock()
	if h.s.opts.HandBack != nil {
		h.s.opts.HandBack(context.Background(), id, h.key)
	}
	no := false
	h.s.opts.Events.Publish(h.caller.Tenant, events.Event{Type: events.TypeHold, Session: id, Held: &no})
}

func (h *holder) releaseAll() {
	h.mu.Lock()
	ids := make([]string, 0, len(h.held))
	for id := range h.held {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.handBack(id)
	}
}
