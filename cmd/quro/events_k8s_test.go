//go:build k8s

package main

// GET /v1/events without replay on a cluster node streams the caller's
// tenant's live events of every node, merged (the harness of
// cluster_k8s_test.go: two nodes in this process on a real API server).
// Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterEventsMerged ./cmd/quro/

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/ws"
)

func TestClusterEventsMerged(t *testing.T) {
	acme, other := quroToken(), quroToken()
	a, b, _, owner := twoNodes(t, acme+" acme exec\n"+other+" other exec\n")
	// A session of each tenant on each node, made through node a.
	sessions := map[string]string{} // "tenant node" -> id
	for _, tc := range []struct{ name, tok string }{{"acme", acme}, {"other", other}} {
		for i := 0; sessions[tc.name+" node-a"] == "" || sessions[tc.name+" node-b"] == ""; i++ {
			if i == 10 {
				t.Fatalf("10 sessions of %s, not one on each node: %v", tc.name, sessions)
			}
			r := do(t, "POST", a.url+"/v1/sessions", "application/json", fmt.Sprintf(`{"name":"e%d"}`, i), "Authorization", "Bearer "+tc.tok)
			var out struct{ ID string }
			if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &out) != nil || out.ID == "" {
				t.Fatalf("create: %d %s", r.status, r.body)
			}
			if k := tc.name + " " + owner(out.ID); sessions[k] == "" {
				sessions[k] = out.ID
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type msg struct {
		Type       string
		Seq        uint64
		Session    string
		Node       string
		Input      map[string]any
		Nodes      []string
		Unanswered []string `json:"nodes_unanswered"`
	}
	// open subscribes through node a; its hello comes once every node's
	// stream is subscribed.
	open := func(opts *websocket.DialOptions) *websocket.Conn {
		t.Helper()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.url, "http")+"/v1/events", opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseNow() })
		c.SetReadLimit(16 << 20)
		_, data, err := c.Read(ctx)
		var hello msg
		if err != nil || json.Unmarshal(data, &hello) != nil || hello.Type != "hello" ||
			!slices.Equal(hello.Nodes, []string{"node-a", "node-b"}) || len(hello.Unanswered) != 0 {
			t.Fatalf("the hello of a merged stream: %s %v", data, err)
		}
		return c
	}
	// acme as a browser (the token in the subprotocol), other by header.
	acmeC := open(&websocket.DialOptions{Subprotocols: []string{ws.Protocol, ws.BearerPrefix + acme}})
	otherC := open(&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + other}}})

	exec := func(via *node, tok, id, cmd string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"command": cmd})
		if r := do(t, "POST", via.url+"/v1/sessions/"+id+"/exec", "application/json", string(body), "Authorization", "Bearer "+tok); r.status != 200 {
			t.Fatalf("exec %q: %d %s", cmd, r.status, r.body)
		}
	}
	// read reads c's events until the call events of every marker in
	// want have come, and returns every event read.
	read := func(c *websocket.Conn, want ...string) []msg {
		t.Helper()
		var got []msg
		left := slices.Clone(want)
		for len(left) > 0 {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("the stream ended before the calls %q: %v", left, err)
			}
			var m msg
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatalf("an event that is no JSON: %s", data)
			}
			got = append(got, m)
			if cmd, _ := m.Input["command"].(string); m.Type == "call" {
				left = slices.DeleteFunc(left, func(w string) bool { return strings.Contains(cmd, w) })
			}
		}
		return got
	}
	// acme's calls: on node b through node b (node a only merges its
	// events), on node a through node a.
	exec(b, acme, sessions["acme node-b"], "echo acme-on-b")
	exec(a, acme, sessions["acme node-a"], "echo acme-on-a")
	// Then other's, on both nodes: on other's stream they come after
	// acme's would have come, from each node's stream in its order.
	exec(b, other, sessions["other node-b"], "echo other-on-b")
	exec(a, other, sessions["other node-a"], "echo other-on-a")

	evs := read(acmeC, "acme-on-b", "acme-on-a")
	var last uint64
	for _, m := range evs {
		if m.Seq <= last {
			t.Errorf("the merged stream's numbers do not grow: %d after %d", m.Seq, last)
		}
		last = m.Seq
		cmd, _ := m.Input["command"].(string)
		if m.Type == "call" && strings.Contains(cmd, "acme-on-b") && (m.Node != "node-b" || m.Session != sessions["acme node-b"]) {
			t.Errorf("the call on node b's session: %+v", m)
		}
		if m.Type == "call" && strings.Contains(cmd, "acme-on-a") && (m.Node != "node-a" || m.Session != sessions["acme node-a"]) {
			t.Errorf("the call on node a's session: %+v", m)
		}
		if strings.Contains(cmd, "other-on") || m.Session == sessions["other node-a"] || m.Session == sessions["other node-b"] {
			t.Errorf("acme's stream has an event of tenant other: %+v", m)
		}
	}
	for _, m := range read(otherC, "other-on-b", "other-on-a") {
		cmd, _ := m.Input["command"].(string)
		if strings.Contains(cmd, "acme-on") || m.Session == sessions["acme node-a"] || m.Session == sessions["acme node-b"] {
			t.Errorf("other's stream has an event of tenant acme: %+v", m)
		}
	}
	// One more call of acme's, on node b: each earlier call came once
	// (the node asked for its events merges no one's).
	exec(b, acme, sessions["acme node-b"], "echo acme-again")
	evs = append(evs, read(acmeC, "acme-again")...)
	count := map[string]int{}
	for _, m := range evs {
		if cmd, _ := m.Input["command"].(string); m.Type == "call" {
			count[cmd]++
		}
	}
	if count["echo acme-on-b"] != 1 || count["echo acme-on-a"] != 1 || count["echo acme-again"] != 1 {
		t.Fatalf("the calls' events on the merged stream: %v", count)
	}

	// A person's take-over of a shell: on the merged stream, of a
	// session of the node called only; for node b's session it answers
	// where it is done — the session's own stream (?replay=), which
	// node a sends to node b, where the take holds.
	type answer struct {
		Type, ID, Session string
		Error             *struct{ Code, Message string }
	}
	control := func(c *websocket.Conn, m map[string]string) answer {
		t.Helper()
		b, _ := json.Marshal(m)
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("the stream ended before the answer to %v: %v", m, err)
			}
			var a answer
			if json.Unmarshal(data, &a) == nil && a.ID == m["id"] {
				return a
			}
		}
	}
	onB := sessions["acme node-b"]
	if a := control(acmeC, map[string]string{"type": "take", "session": onB, "id": "t1"}); a.Type != "error" || a.Error == nil ||
		!strings.Contains(a.Error.Message, "/v1/events?replay="+onB) {
		t.Fatalf("a take of node b's session on node a's merged stream: %+v %+v", a, a.Error)
	}
	page, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.url, "http")+"/v1/events?replay="+onB,
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + acme}}})
	if err != nil {
		t.Fatal(err)
	}
	defer page.CloseNow()
	page.SetReadLimit(16 << 20)
	if a := control(page, map[string]string{"type": "take", "session": onB, "id": "t2"}); a.Type != "taken" || a.Session != onB {
		t.Fatalf("a take on the session's own stream through node a: %+v", a)
	}
	if a := control(page, map[string]string{"type": "release", "session": onB, "id": "t3"}); a.Type != "released" {
		t.Fatalf("the hand-back: %+v", a)
	}

	// A stream asked for with no credential gets nothing of anyone's.
	if _, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.url, "http")+"/v1/events", nil); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a stream without a token: %v %v", resp, err)
	}
}
