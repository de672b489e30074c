package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The direct path: a plain tools/call on an initialized session is served
// here, on the request's own goroutine, and answered with one JSON object
// (application/json, which the client accepts with text/event-stream; the
// spec lets the server pick either). Everything else — and any call that
// may need the event stream: one with a progress token or any other _meta,
// a batch, an unknown tool, a protocol version this handler does not know —
// goes to the SDK unchanged.
//
// Why: the SDK serves a call through its session's connection (the
// request goes through a channel to a reader goroutine, then to a handler
// goroutine, and the answer back to the request's goroutine as an event
// stream) and decodes the message several times, each decode allocating
// and zeroing a 32 KiB buffer in its JSON decoder (go-sdk v1.8.0
// internal/json.Unmarshal over a bytes.Reader): 0.2 MB of garbage per
// call, and MCP at 1.3-1.4x REST for the same warm call with a plain HTTP
// client (BenchmarkToolsCallVsREST), 1.1x with this path. The direct path
// runs the same tool handler (tool.call) with the same caller, after the
// same authentication and pin check (ServeHTTP), so what a call may do and
// who it runs as do not change.

// directCall is a tools/call request the direct path serves.
type directCall struct {
	id        json.RawMessage // a JSON string or integer, as sent
	name      string
	arguments json.RawMessage
}

// parseDirectCall reads a POST's body (putting it back for the SDK) and
// returns the call if the direct path may serve it, or nil.
func parseDirectCall(r *http.Request) *directCall {
	if r.Header.Get("Last-Event-ID") != "" || !acceptsJSONAndStream(r.Header.Values("Accept")) {
		return nil
	}
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return nil
	}
	// The version the session negotiated travels on every request after
	// initialize; without it the SDK assumes 2025-03-26, and a version at
	// or past modernVersion carries per-request metadata the SDK checks.
	v := r.Header.Get("Mcp-Protocol-Version")
	if v == "" || v >= modernVersion || !slices.Contains(mcp.SupportedProtocolVersions(), v) {
		return nil
	}
	body := peekBody(r)
	if len(body) == 0 || body[0] != '{' {
		return nil // a batch, or nothing
	}
	// Exact keys only: the SDK matches them case-sensitively, encoding/json
	// does not, so any other key sends the request to the SDK.
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil || len(msg) != 4 ||
		string(msg["jsonrpc"]) != `"2.0"` || string(msg["method"]) != `"tools/call"` {
		return nil
	}
	id, ok := msg["id"]
	if !ok || !validID(id) {
		return nil
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil {
		return nil
	}
	c := &directCall{id: id}
	for k, v := range params {
		switch k {
		case "name":
			if json.Unmarshal(v, &c.name) != nil {
				return nil
			}
		case "arguments":
			c.arguments = v
		default: // _meta (a progress token: the call streams), or anything new
			return nil
		}
	}
	if c.name == "" {
		return nil
	}
	return c
}

// peekBody reads the request body up to the SDK's limit and puts it back
// whole for the SDK; a longer body is not the direct path's (nil).
func peekBody(r *http.Request) []byte {
	if r.Body == nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
	r.Body = readCloser{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
	if err != nil || len(b) > mcp.DefaultMaxRequestBodyBytes {
		return nil
	}
	return bytes.TrimLeft(b, " \t\r\n")
}

type readCloser struct {
	io.Reader
	io.Closer
}

// validID: a JSON-RPC id the SDK accepts, a string or an integer.
func validID(id json.RawMessage) bool {
	if len(id) > 0 && id[0] == '"' {
		var s string
		return json.Unmarshal(id, &s) == nil
	}
	_, err := strconv.ParseInt(string(id), 10, 64)
	return err == nil
}

// acceptsJSONAndStream is the SDK's check of Accept for a POST: both
// application/json and text/event-stream (or a wildcard).
func acceptsJSONAndStream(values []string) bool {
	var jsonOK, streamOK bool
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			base, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				jsonOK = true
			case "text/event-stream", "text/*":
				streamOK = true
			case "*/*":
				jsonOK, streamOK = true, true
			}
		}
	}
	return jsonOK && streamOK
}

// serveDirect serves c on p's initialized session and reports whether it
// did; false leaves the request (body intact) to the SDK.
func (h *httpHandler) serveDirect(w http.ResponseWriter, r *http.Request, p *pin, c *directCall) bool {
	ss := p.session.Load()
	if ss == nil {
		// The client may send its next request as soon as it has read the
		// answer to initialize, before ServeHTTP records the session.
		for s := range p.server.Sessions() {
			ss = s
		}
		if ss != nil {
			p.session.Store(ss)
		}
	}
	t := p.tools[c.name]
	if ss == nil || t == nil || ss.InitializeParams() == nil {
		return false // not initialized yet, or an unknown tool: the SDK's errors
	}
	// The call ends when the client goes (its request's context), or when
	// it cancels the call by id (notifications/cancelled, see cancelDirect).
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	key := string(c.id)
	p.callsMu.Lock()
	if _, dup := p.calls[key]; dup {
		p.callsMu.Unlock()
		return false // the SDK refuses an id already in flight
	}
	p.calls[key] = cancel
	p.callsMu.Unlock()
	defer func() {
		p.callsMu.Lock()
		delete(p.calls, key)
		p.callsMu.Unlock()
	}()

	res, _ := t.call(ctx, &mcp.CallToolRequest{
		Session: ss,
		Params:  &mcp.CallToolParamsRaw{Name: c.name, Arguments: c.arguments},
		Extra:   &mcp.RequestExtra{Header: r.Header},
	}) // tool.call's failures are results (isError)
	if res.Content == nil {
		res.Content = []mcp.Content{} // as the SDK: never "null"
	}
	result, err := json.Marshal(res)
	if err != nil {
		h.opts.Logger.Error("mcp: result does not encode", "tool", c.name, "err", err)
		result = []byte(`{"content":[{"type":"text","text":"⚠️ error internal: the result does not encode as JSON"}],"isError":true}`)
	}
	out := make([]byte, 0, len(result)+len(c.id)+40)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, c.id...)
	out = append(out, `,"result":`...)
	out = append(out, result...)
	out = append(out, '}')
	w.Header().Set("Cache-Control", "no-cache, no-transform")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.Write(out)
	return true
}

// cancelDirect cancels the direct call a notifications/cancelled names, if
// it is one of p's (the request then goes on to the SDK, which cancels a
// call of its own by that id, if any).
func cancelDirect(r *http.Request, p *pin) {
	body := peekBody(r)
	if len(body) == 0 || body[0] != '{' || !bytes.Contains(body, []byte("notifications/cancelled")) {
		return
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			RequestID json.RawMessage `json:"requestId"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "notifications/cancelled" {
		return
	}
	p.callsMu.Lock()
	cancel := p.calls[string(msg.Params.RequestID)]
	p.callsMu.Unlock()
	if cancel != nil {
		cancel()
	}
}
