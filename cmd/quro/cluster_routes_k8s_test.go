//go:build k8s

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/quro-dev/quro/internal/cluster"
)

// mcpConn is an MCP session over streamable HTTP, spoken by hand (a
// JSON-RPC batch is what no SDK client sends any more).
type mcpConn struct {
	t        testing.TB
	url, tok string
	sid      string
	id       int
}

// mcpOpen initializes an MCP session on the node at base as tok.
func mcpOpen(t testing.TB, base, tok string) *mcpConn {
	t.Helper()
	m := &mcpConn{t: t, url: base + "/mcp", tok: tok}
	status, msgs, hdr := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"cluster-test","version":"1"}}}`)
	if status != 200 || len(msgs) != 1 {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	m.sid = hdr.Get("Mcp-Session-Id")
	if m.sid == "" {
		t.Fatalf("initialize gave no session: %s", msgs)
	}
	if status, msgs, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status/100 != 2 {
		t.Fatalf("initialized: %d %s", status, msgs)
	}
	return m
}

// post sends body and returns the JSON-RPC messages of the answer (a
// batch's answers each as a message), from JSON or an event stream.
func (m *mcpConn) post(body string) (int, []json.RawMessage, http.Header) {
	m.t.Helper()
	req, _ := http.NewRequest("POST", m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+m.tok)
	if m.sid != "" {
		req.Header.Set("Mcp-Session-Id", m.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-03-26")
	}
	resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	defer resp.Body.Close()
	var raws []json.RawMessage
	add := func(data []byte) {
		data = []byte(strings.TrimSpace(string(data)))
		if len(data) == 0 {
			return
		}
		if data[0] == '[' {
			var batch []json.RawMessage
			if err := json.Unmarshal(data, &batch); err != nil {
				m.t.Fatalf("not JSON: %s", data)
			}
			raws = append(raws, batch...)
			return
		}
		raws = append(raws, json.RawMessage(data))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var plain strings.Builder
	for sc.Scan() {
		if !stream {
			plain.WriteString(sc.Text() + "\n")
			continue
		}
		if d, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
			add([]byte(d))
		}
	}
	if !stream {
		add([]byte(plain.String()))
	}
	return resp.StatusCode, raws, resp.Header
}

// toolResult is a tools/call answer.
type toolResult struct {
	ID     int `json:"id"`
	Result struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Structured json.RawMessage `json:"structuredContent"`
		IsError    bool            `json:"isError"`
	} `json:"result"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (r *toolResult) text() string {
	var b strings.Builder
	for _, c := range r.Content() {
		b.WriteString(c)
	}
	return b.String()
}

func (r *toolResult) Content() []string {
	var out []string
	for _, c := range r.Result.Content {
		out = append(out, c.Text)
	}
	return out
}

func (m *mcpConn) callMsg(name string, args any) string {
	m.id++
	a, _ := json.Marshal(args)
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, m.id, name, a)
}

// call is one tools/call.
func (m *mcpConn) call(name string, args any) *toolResult {
	m.t.Helper()
	status, msgs, _ := m.post(m.callMsg(name, args))
	if status != 200 || len(msgs) != 1 {
		m.t.Fatalf("tools/call %s: %d %s", name, status, msgs)
	}
	var r toolResult
	if err := json.Unmarshal(msgs[0], &r); err != nil || r.Error != nil {
		m.t.Fatalf("tools/call %s: %s", name, msgs[0])
	}
	return &r
}

// testClusterRoutes: the paths that name their session inside a call
// (MCP's tools/call, a JSON-RPC batch, the WebSocket stream's first
// message), each through node a, which does not own session onB.
func testClusterRoutes(t *testing.T, a, b *node, dyn dynamic.Interface, onB, acme, other string) {
	ownerOf := func(t *testing.T, id string) string {
		u, err := dyn.Resource(cluster.SessionsGVR).Namespace("default").Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("session %s has no record: %v", id, err)
		}
		n, _, _ := unstructured.NestedString(u.Object, "spec", "node")
		return n
	}

	t.Run("MCP tools/call for a session of another node", func(t *testing.T) {
		m := mcpOpen(t, a.url, acme)
		if r := m.call("write_file", map[string]any{"session": onB, "path": "mcp.txt", "content": "written over mcp"}); r.Result.IsError {
			t.Fatalf("write_file through a: %s", r.text())
		}
		r := m.call("terminal_exec", map[string]any{"session": onB, "command": "cat mcp.txt; echo; cat note.txt"})
		if r.Result.IsError || !strings.Contains(r.text(), "written over mcp") || !strings.Contains(r.text(), "kept on b") {
			t.Fatalf("terminal_exec through a: %s", r.text())
		}
		// The owner ran it: its own REST route reads the file.
		got := do(t, "GET", b.url+"/v1/sessions/"+onB+"/files/mcp.txt", "", "", "Authorization", "Bearer "+acme)
		if got.status != 200 || !strings.Contains(got.body, "written over mcp") {
			t.Fatalf("the owner has no file written over MCP through a: %d %s", got.status, got.body)
		}
		// The owner recorded the call once, under the path its caller
		// used; a client's own Quro-Forwarded-Path labels nothing.
		do(t, "PUT", b.url+"/v1/sessions/"+onB+"/files/rest.txt", "application/octet-stream", "x",
			"Authorization", "Bearer "+acme, cluster.HeaderForwardedPath, "cli")
		got = do(t, "GET", b.url+"/v1/audit?session="+onB+"&capability=write_file&limit=100", "", "", "Authorization", "Bearer "+acme)
		var log struct {
			Entries []struct {
				Path string `json:"path"`
				Args string `json:"args"`
			} `json:"entries"`
		}
		if got.status != 200 || json.Unmarshal([]byte(got.body), &log) != nil {
			t.Fatalf("audit: %d %s", got.status, got.body)
		}
		paths := map[string]string{}
		for _, e := range log.Entries {
			for _, f := range []string{"mcp.txt", "rest.txt"} {
				if strings.Contains(e.Args, f) {
					paths[f] += e.Path + " "
				}
			}
		}
		if paths["mcp.txt"] != "mcp " || paths["rest.txt"] != "rest " {
			t.Fatalf("audit paths %q (entries %s)", paths, got.body)
		}
	})

	t.Run("MCP tools/call with a progress token for a session of another node", func(t *testing.T) {
		// The SDK serves it (progress needs the event stream) and the
		// call goes to the owner's streamed route.
		m := mcpOpen(t, a.url, acme)
		m.id++
		status, msgs, _ := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_code","arguments":{"session":%q,"code":"print(open('note.txt').read() + ' via progress')"},"_meta":{"progressToken":"p1"}}}`, m.id, onB))
		if status != 200 {
			t.Fatalf("tools/call: %d %s", status, msgs)
		}
		for _, raw := range msgs {
			var r toolResult
			if json.Unmarshal(raw, &r) == nil && r.ID == m.id && r.Error == nil && r.Result.Content != nil {
				if r.Result.IsError || !strings.Contains(r.text(), "kept on b via progress") {
					t.Fatalf("result: %s", raw)
				}
				return
			}
		}
		t.Fatalf("no result among %s", msgs)
	})

	t.Run("MCP JSON-RPC batch for a session of another node", func(t *testing.T) {
		m := mcpOpen(t, a.url, acme)
		batch := "[" + m.callMsg("read_file", map[string]any{"session": onB, "path": "note.txt"}) + "," +
			m.callMsg("terminal_exec", map[string]any{"session": onB, "command": "echo batch-$((40+2))"}) + "]"
		status, msgs, _ := m.post(batch)
		if status != 200 || len(msgs) != 2 {
			t.Fatalf("batch: %d %s", status, msgs)
		}
		seen := map[int]string{}
		for _, raw := range msgs {
			var r toolResult
			if err := json.Unmarshal(raw, &r); err != nil || r.Error != nil || r.Result.IsError {
				t.Fatalf("batch answer: %s", raw)
			}
			seen[r.ID] = r.text()
		}
		if !strings.Contains(seen[m.id-1], "kept on b") || !strings.Contains(seen[m.id], "batch-42") {
			t.Fatalf("batch answers: %v", seen)
		}
	})

	t.Run("MCP create_session places on another node and its calls reach it", func(t *testing.T) {
		m := mcpOpen(t, a.url, acme)
		var onOther string
		for i := 0; i < 6 && onOther == ""; i++ {
			r := m.call("create_session", map[string]any{"name": fmt.Sprintf("mcp%d", i)})
			var out struct {
				ID string `json:"id"`
			}
			if r.Result.IsError || json.Unmarshal(r.Result.Structured, &out) != nil || out.ID == "" {
				t.Fatalf("create_session over MCP: %s", r.text())
			}
			if ownerOf(t, out.ID) == "node-b" {
				onOther = out.ID
			}
		}
		if onOther == "" {
			t.Fatal("no create_session over MCP through node a was placed on node b")
		}
		r := m.call("terminal_exec", map[string]any{"session": onOther, "command": "echo placed > p.txt; cat p.txt"})
		if r.Result.IsError || !strings.Contains(r.text(), "placed") {
			t.Fatalf("a call on the new session through a: %s", r.text())
		}
		got := do(t, "GET", b.url+"/v1/sessions/"+onOther+"/files/p.txt", "", "", "Authorization", "Bearer "+acme)
		if got.status != 200 || !strings.Contains(got.body, "placed") {
			t.Fatalf("the new session's file on its owner: %d %s", got.status, got.body)
		}
	})

	t.Run("MCP: another tenant cannot reach the session through a", func(t *testing.T) {
		m := mcpOpen(t, a.url, other)
		r := m.call("read_file", map[string]any{"session": onB, "path": "note.txt"})
		if !r.Result.IsError || strings.Contains(r.text(), "kept on b") {
			t.Fatalf("tenant other read acme's file over MCP through a: %s", r.text())
		}
		r = m.call("terminal_exec", map[string]any{"session": onB, "command": "cat note.txt"})
		if !r.Result.IsError || strings.Contains(r.text(), "kept on b") {
			t.Fatalf("tenant other ran in acme's session over MCP through a: %s", r.text())
		}
	})

	t.Run("a forged forwarding header on MCP is refused", func(t *testing.T) {
		for _, forged := range []string{"node-b", "node-b AAAA"} {
			r := do(t, "POST", a.url+"/mcp", "application/json", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				"Authorization", "Bearer "+acme, cluster.HeaderForwardedBy, forged, "Accept", "application/json, text/event-stream")
			if r.status != http.StatusForbidden {
				t.Fatalf("forged %q: %d %s", forged, r.status, r.body)
			}
		}
	})

	t.Run("the WebSocket stream of a call on a session of another node", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		h := http.Header{"Authorization": {"Bearer " + acme}}
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.url, "http")+"/v1/stream/terminal_exec", &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		// The second line is written only once the first has reached
		// this client: output streams through node a as it comes.
		args, _ := json.Marshal(map[string]any{"session": onB, "command": "echo first-line; while [ ! -e go ]; do sleep 0.05; done; echo second-line"})
		if err := c.Write(ctx, websocket.MessageText, args); err != nil {
			t.Fatal(err)
		}
		var outs strings.Builder
		released := false
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("stream ended: %v (output %q)", err, outs.String())
			}
			var msg struct {
				Type, Data string
				Text       *string
				Error      any
			}
			json.Unmarshal(data, &msg)
			switch msg.Type {
			case "output":
				outs.WriteString(msg.Data)
				if !released && strings.Contains(outs.String(), "first-line") {
					released = true
					r := do(t, "PUT", b.url+"/v1/sessions/"+onB+"/files/go", "application/octet-stream", "", "Authorization", "Bearer "+acme)
					if r.status/100 != 2 {
						t.Fatalf("release: %d %s", r.status, r.body)
					}
				}
			case "result":
				if !released || msg.Text == nil || !strings.Contains(*msg.Text, "second-line") {
					t.Fatalf("result %s (released %v, output %q)", data, released, outs.String())
				}
				return
			case "error":
				t.Fatalf("stream error: %s", data)
			}
		}
	})

	t.Run("the events of a session of another node", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		h := http.Header{"Authorization": {"Bearer " + acme}}
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.url, "http")+"/v1/events?replay="+onB, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		c.SetReadLimit(16 << 20)
		_, hello, err := c.Read(ctx)
		if err != nil || !strings.Contains(string(hello), `"hello"`) {
			t.Fatalf("no hello: %s %v", hello, err)
		}
		// Subscribed (hello follows the subscription): a call made now
		// through node a is seen live on this stream through node a.
		marker := fmt.Sprintf("evt-%d", time.Now().UnixNano())
		req, _ := http.NewRequestWithContext(ctx, "POST", a.url+"/v1/sessions/"+onB+"/exec", strings.NewReader(`{"command":"echo `+marker+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+acme)
		called := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			called <- err
		}()
		defer func() {
			if err := <-called; err != nil {
				t.Errorf("the call: %v", err)
			}
		}()
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("the event stream ended before the call's event: %v", err)
			}
			if strings.Contains(string(data), marker) {
				return
			}
		}
	})
}
