package ws_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/terminal"
)

type liveMsg struct {
	events.Event
	ID     string `json:"id"`
	Output any    `json:"output"`
	Error  *struct{ Code, Message string }
}

func readLive(t *testing.T, c *websocket.Conn) liveMsg {
	t.Helper()
	_, data, err := c.Read(ctxT(t))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var m liveMsg
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("not JSON: %q", data)
	}
	return m
}

// TestEventsTenancyAndTakeOver: on GET /v1/events a tenant sees its own
// sessions' calls live (the command, its output, its exit code, no host
// path) and another tenant sees none of them and cannot take over their
// shell; a person who takes over a shell makes the agent's terminal_exec
// fail with "a person holds this session", runs a command in it, and
// closing the socket hands it back.
func TestEventsTenancyAndTakeOver(t *testing.T) {
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	access := rest.Access{Auth: tokenAuth}
	w := ws.New(a.Controller, &ws.Options{Access: access, Events: a.Events, Take: a.TakeShell, HandBack: a.HandBackShell})
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: access, WebSocket: w.Handlers()}))
	t.Cleanup(srv.Close)
	e := &env{a: a, ws: w, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
	sess := e.session(t, "watched")
	alice := controller.Caller{Path: "rest", Tenant: "alice", Scope: capability.ScopeExec}
	bob := controller.Caller{Path: "rest", Tenant: "bob", Scope: capability.ScopeAdmin}
	call := func(ctx context.Context, who controller.Caller, name string, args map[string]string) (*controller.Reply, error) {
		b, _ := json.Marshal(args)
		return a.Controller.Call(ctx, who, name, b)
	}

	ac, _, err := e.dial(t, "/v1/events", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.CloseNow()
	bc, _, err := e.dial(t, "/v1/events", []string{ws.Protocol, ws.BearerPrefix + "bob-token"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.CloseNow()
	for _, c := range []*websocket.Conn{ac, bc} {
		if m := readLive(t, c); m.Type != "hello" {
			t.Fatalf("first message %+v", m)
		}
	}

	// The attack: bob takes over alice's shell by its id, and types in it.
	ctl := func(c *websocket.Conn, v map[string]string) {
		t.Helper()
		if err := c.Write(ctxT(t), websocket.MessageText, mustJSON(v)); err != nil {
			t.Fatal(err)
		}
	}
	ctl(bc, map[string]string{"type": "take", "session": sess.ID, "id": "b1"})
	if m := readLive(t, bc); m.Type != "error" || m.ID != "b1" || m.Error == nil || m.Error.Code != "not_found" {
		t.Fatalf("bob's take of alice's session: %+v %+v", m, m.Error)
	}
	ctl(bc, map[string]string{"type": "exec", "session": sess.ID, "command": "touch bob-was-here", "id": "b2"})
	if m := readLive(t, bc); m.Type != "error" || m.ID != "b2" {
		t.Fatalf("bob's exec in alice's session: %+v", m)
	}

	// alice's agent runs a command: alice's viewer sees it live.
	if _, err := call(ctxT(t), alice, "terminal_exec", map[string]string{"session": sess.ID, "command": "echo alice-secret; pwd; (exit 3)"}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for done := false; !done; {
		m := readLive(t, ac)
		if m.Session != sess.ID || m.Capability != "terminal_exec" || m.Path != "rest" || m.Person {
			t.Fatalf("alice's event %+v", m)
		}
		switch m.Type {
		case "call":
			if m.Input["command"] != "echo alice-secret; pwd; (exit 3)" {
				t.Fatalf("call event's input %v", m.Input)
			}
		case "output":
			out.WriteString(m.Data)
		case "end":
			if m.ExitCode == nil || *m.ExitCode != 3 || m.Outcome != "ok" {
				t.Fatalf("end event %+v", m)
			}
			done = true
		}
	}
	if out.String() != "alice-secret\n/home/user\n" || strings.Contains(out.String(), a.DataDir) {
		t.Fatalf("streamed output %q", out.String())
	}
	// A page opened after the call (?replay=<id>) is sent it first, marked
	// replay; bob naming alice's session replays nothing of it (his first
	// event below is his own call), and a name is not an id.
	late, _, err := e.dial(t, "/v1/events?replay="+sess.ID, withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer late.CloseNow()
	if m := readLive(t, late); m.Type != "hello" {
		t.Fatalf("first message %+v", m)
	}
	var replayed strings.Builder
	for done := false; !done; {
		m := readLive(t, late)
		if !m.Replay || m.Session != sess.ID {
			t.Fatalf("replayed event %+v", m)
		}
		switch m.Type {
		case "call":
			if m.Input["command"] != "echo alice-secret; pwd; (exit 3)" {
				t.Fatalf("replayed call %+v", m)
			}
		case "output":
			replayed.WriteString(m.Data)
		case "end":
			done = m.ExitCode != nil && *m.ExitCode == 3
		}
	}
	if replayed.String() != out.String() {
		t.Fatalf("replayed output %q, live %q", replayed.String(), out.String())
	}
	late.Close(websocket.StatusNormalClosure, "")
	bobLate, _, err := e.dial(t, "/v1/events?replay="+sess.ID, []string{ws.Protocol, ws.BearerPrefix + "bob-token"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bobLate.CloseNow()
	if m := readLive(t, bobLate); m.Type != "hello" {
		t.Fatalf("first message %+v", m)
	}
	if _, resp, err := e.dial(t, "/v1/events?replay=watched", withToken, nil); err == nil || resp == nil || resp.StatusCode != 400 {
		t.Fatalf("replay by name: %v %v", err, resp)
	}
	// bob's next event is his own call: nothing of alice's came before.
	bs := func() string {
		r, err := call(ctxT(t), bob, "create_session", map[string]string{"name": "bobs"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Output.(*app.SessionInfo).ID
	}()
	if _, err := call(ctxT(t), bob, "terminal_exec", map[string]string{"session": bs, "command": "true"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*websocket.Conn{bc, bobLate} {
		if m := readLive(t, c); m.Type != "call" || m.Session != bs || m.Replay {
			t.Fatalf("bob's first event is not his own call: %+v", m)
		}
	}
	bobLate.Close(websocket.StatusNormalClosure, "")

	// alice takes over: her agent is refused, her command runs.
	ctl(ac, map[string]string{"type": "take", "session": "watched", "id": "a1"})
	// The hold event (from the bus) and the answer (from the reader) come
	// in either order.
	for got := map[string]bool{}; !got["hold"] || !got["taken"]; {
		m := readLive(t, ac)
		if m.Session != sess.ID || (m.Type == "hold" && (m.Held == nil || !*m.Held)) || (m.Type != "hold" && m.Type != "taken") {
			t.Fatalf("take: %+v", m)
		}
		got[m.Type] = true
	}
	_, err = call(ctxT(t), alice, "terminal_exec", map[string]string{"session": sess.ID, "command": "touch agent-ran"})
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.Busy || !strings.Contains(ce.Message, "a person holds this session") {
		t.Fatalf("the agent's command while held: %v", err)
	}
	for m := readLive(t, ac); m.Type != "end"; m = readLive(t, ac) { // the refused call's events
	}
	ctl(ac, map[string]string{"type": "exec", "session": sess.ID, "command": "echo by-hand", "id": "a2"})
	var result *liveMsg
	for result == nil {
		m := readLive(t, ac)
		switch {
		case m.Type == "call" && (!m.Person || m.Path != "ws"):
			t.Fatalf("the person's call event %+v", m)
		case m.Type == "result":
			result = &m
		case m.Type == "error":
			t.Fatalf("the person's command: %+v", m.Error)
		}
	}
	if !strings.Contains(string(mustJSON(result.Output)), `"output":"by-hand\n"`) {
		t.Fatalf("the person's result %s", mustJSON(result.Output))
	}
	// Closing the socket hands the shell back.
	ac.Close(websocket.StatusNormalClosure, "")
	bc.Close(websocket.StatusNormalClosure, "")
	w.Wait()
	s, err := a.Sessions.ByIDAnyTenant(ctxT(t), sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Terminals.Held(s) {
		t.Fatal("the shell is still held after its holder's socket closed")
	}
	r, err := call(ctxT(t), alice, "terminal_exec", map[string]string{"session": sess.ID, "command": "echo agent-again"})
	if err != nil || r.Output.(*terminal.Result).Output != "agent-again\n" {
		t.Fatalf("the agent after the hand back: %v %+v", err, r)
	}
}

// TestEventsMergedWithPeers: on a cluster node (Options.Peers) a stream
// without replay says hello once the other nodes' streams are in, naming
// the nodes merged and those that did not answer; the other nodes are
// asked with the caller's credential (a browser's, from its bearer
// subprotocol); every event, the peers' and this node's, is marked with
// its node and numbered anew, growing on the connection (the nodes' own
// numbers are unrelated: a client drops a number not above the last).
func TestEventsMergedWithPeers(t *testing.T) {
	t.Parallel()
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	creds := make(chan string, 1)
	peers := func(ctx context.Context, cred string, ready func(joined, unanswered []string), send func(events.Event) bool) {
		creds <- cred
		ready([]string{"node-b"}, []string{"node-c"})
		send(events.Event{Seq: 1, Type: events.TypeCall, Session: "of-node-b", Capability: "terminal_exec", Node: "node-b"})
		<-ctx.Done()
	}
	access := rest.Access{Auth: tokenAuth}
	w := ws.New(a.Controller, &ws.Options{Access: access, Events: a.Events, Peers: peers, Node: "node-a"})
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: access, WebSocket: w.Handlers()}))
	t.Cleanup(srv.Close)
	e := &env{a: a, ws: w, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
	sess := e.session(t, "merged")

	c, _, err := e.dial(t, "/v1/events", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	_, data, err := c.Read(ctxT(t))
	var hello struct {
		Type       string
		Nodes      []string
		Unanswered []string `json:"nodes_unanswered"`
	}
	if err != nil || json.Unmarshal(data, &hello) != nil || hello.Type != "hello" ||
		strings.Join(hello.Nodes, ",") != "node-a,node-b" || strings.Join(hello.Unanswered, ",") != "node-c" {
		t.Fatalf("hello %s %v", data, err)
	}
	if cred := <-creds; cred != "Bearer exec-token" {
		t.Fatalf("the other nodes were asked with %q", cred)
	}
	m := readLive(t, c)
	if m.Type != "call" || m.Session != "of-node-b" || m.Node != "node-b" || m.Seq <= 1 {
		t.Fatalf("the other node's event %+v", m.Event)
	}
	last := m.Seq
	args, _ := json.Marshal(map[string]string{"session": sess.ID, "command": "echo merged"})
	if _, err := a.Controller.Call(ctxT(t), controller.Caller{Path: "rest", Tenant: "alice", Scope: capability.ScopeExec}, "terminal_exec", args); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		m := readLive(t, c)
		if m.Session != sess.ID || m.Node != "node-a" || m.Seq <= last {
			t.Fatalf("this node's event after seq %d: %+v", last, m.Event)
		}
		last, done = m.Seq, m.Type == "end"
	}
}
