package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestServeStreamsPerToken: quro serve's --max-streams-per-token is one
// count over the WebSocket routes and MCP's event streams: with a cap of
// 1, a token's WebSocket makes its next WebSocket and its MCP event
// stream 429s naming the flag; once it closes, the event stream is let in.
func TestServeStreamsPerToken(t *testing.T) {
	srv := startServer(t, "--max-streams-per-token", "1")
	settled(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/v1/stream/run_code"
	hdr := http.Header{"Authorization": {"Bearer " + srv.token}}
	dial := func() (*websocket.Conn, *http.Response, error) {
		return websocket.Dial(ctx, wsURL, &websocket.DialOptions{Subprotocols: []string{"quro.v1"}, HTTPHeader: hdr})
	}

	// The stream waits for its arguments: it is held until closed.
	held, resp, err := dial()
	if err != nil {
		t.Fatalf("first WebSocket: %v (%v)", err, resp)
	}
	defer held.CloseNow()
	_, resp, err = dial()
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second WebSocket: %v (%v); want 429", err, resp)
	}

	// MCP: a session by hand, then its event stream.
	post := func(session, body string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+srv.token)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return r
	}
	ir := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	session := ir.Header.Get("Mcp-Session-Id")
	if ir.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d %q", ir.StatusCode, session)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	stream := func() (*http.Response, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.url+"/mcp", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+srv.token)
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.StatusCode == http.StatusOK {
			return r, ""
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return r, string(b)
	}
	if r, body := stream(); r.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "--max-streams-per-token") {
		t.Fatalf("event stream while the WebSocket is held: %d %s; want 429 naming the flag", r.StatusCode, body)
	}

	held.Close(websocket.StatusNormalClosure, "bye")
	for {
		r, body := stream()
		if r.StatusCode == http.StatusOK {
			r.Body.Close()
			break
		}
		if r.StatusCode != http.StatusTooManyRequests || ctx.Err() != nil {
			t.Fatalf("event stream after the WebSocket closed: %d %s", r.StatusCode, body)
		}
		time.Sleep(20 * time.Millisecond) // the WebSocket's handler returns after the close
	}
}

// TestServeStreamsPerTokenE2B: the same count covers E2B's long requests,
// against the API key whose access token they carry: with a cap of 1
// and the key's WebSocket held, the interpreter's /execute and envd's
// /files are 429s naming the flag; once the WebSocket closes, /execute
// runs.
func TestServeStreamsPerTokenE2B(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--max-streams-per-token", "1")
	settled(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := do(t, "POST", srv.url+"/e2b/v2/sandboxes", "application/json", `{"templateID":"base"}`, "X-API-KEY", srv.token)
	var sb struct{ SandboxID, EnvdAccessToken string }
	if r.status != 201 || json.Unmarshal([]byte(r.body), &sb) != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	sandbox := func(port string) []string {
		return []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port, "X-Access-Token", sb.EnvdAccessToken}
	}
	execute := func() httpResult {
		return do(t, "POST", srv.url+"/execute", "application/json", `{"code":"print(6*7)"}`, sandbox("49999")...)
	}

	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/v1/stream/run_code"
	held, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{Subprotocols: []string{"quro.v1"},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + srv.token}}})
	if err != nil {
		t.Fatalf("WebSocket: %v (%v)", err, resp)
	}
	defer held.CloseNow()
	if r := execute(); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "--max-streams-per-token") {
		t.Fatalf("/execute while the WebSocket is held: %d %s; want 429 naming the flag", r.status, trim(r.body))
	}
	if r := do(t, "GET", srv.url+"/files?path=/home/user/x", "", "", sandbox("49983")...); r.status != http.StatusTooManyRequests ||
		!strings.Contains(r.body, "--max-streams-per-token") {
		t.Fatalf("/files while the WebSocket is held: %d %s; want 429 naming the flag", r.status, trim(r.body))
	}

	held.Close(websocket.StatusNormalClosure, "bye")
	for {
		r := execute()
		if r.status == http.StatusOK {
			if !strings.Contains(r.body, "42") {
				t.Fatalf("/execute: %s", trim(r.body))
			}
			break
		}
		if r.status != http.StatusTooManyRequests || ctx.Err() != nil {
			t.Fatalf("/execute after the WebSocket closed: %d %s", r.status, trim(r.body))
		}
		time.Sleep(20 * time.Millisecond) // the WebSocket's handler returns after the close
	}
}
