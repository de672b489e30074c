package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/progress"
	"github.com/quro-dev/quro/internal/runcode"
)

// maxForwardedReply is Router.MaxReply's default.
const maxForwardedReply = 64 << 20

// Forward is the controller's Forward (controller.Options.Forward): the
// one place where a capability call — from MCP, the WebSocket stream,
// the CLI or any path served in-process — goes to the node that owns its
// session, or for a create_session to the node placement picks. It sends
// the call to the owner's own REST route (POST /v1/{capability}, or the
// owner's /v1/stream/{capability} when the caller streams the output),
// with the caller's own credential (controller.WithCredential) and this
// node's signed HeaderForwardedBy: the owner authenticates the caller,
// checks its tenant and records the call as on any call of its own.
// A call that carries no credential (a server without tokens) is sent
// without one. The owner down: Unavailable with RetryAfter.
func (rt *Router) Forward(ctx context.Context, caller controller.Caller, name, ref string, args json.RawMessage) (json.RawMessage, bool, error) {
	rt.init()
	var node string
	if name == "create_session" {
		limit := 0
		if rt.TenantLimit != nil {
			limit = rt.TenantLimit(caller.Tenant)
		}
		n, err := rt.place(caller.Tenant, limit)
		if err == nil {
			// place counts the create until it answers: here, until the
			// owner has (forwarded), or until the local create is handed
			// back (it then counts on this node's own tenant limit).
			defer rt.created(caller.Tenant)
		}
		var tl *TenantLimitError
		switch {
		case errors.As(err, &tl):
			return nil, true, capability.Errorf(capability.ResourceExhausted, "%s", err.Error())
		case err != nil:
			return nil, true, unavailableError(err.Error())
		}
		if n.Name == rt.Table.Self() {
			return nil, false, nil
		}
		node = n.Name
	} else {
		s, ok := rt.Table.Resolve(ctx, caller.Tenant, ref)
		if !ok || s.Spec.Node == rt.Table.Self() {
			return nil, false, nil // this node's, or nobody's: the local answer is the true one
		}
		node = s.Spec.Node
	}
	n, ok := rt.Table.Node(node)
	if !ok || !n.Live(time.Now()) {
		return nil, true, unavailableError("the node that owns this session (" + node + ") is not running; it comes back with its sessions, try again shortly")
	}
	if out := runcode.OutputFrom(ctx); out != nil || progress.From(ctx) != nil {
		// The caller takes output or progress as it comes (the stream's
		// WebSocket, an MCP call with a progress token).
		if capb, ok := rt.capability(name); ok && capb.Streams {
			raw, err := rt.forwardStream(toNode(ctx, n.Name), caller, n.Address, name, args, out)
			return raw, true, err
		}
	}
	raw, err := rt.forwardCall(toNode(ctx, n.Name), caller, n.Address, name, args)
	return raw, true, err
}

// Served is the controller's served observer (controller.SetForward):
// a call that entered a session of this node's marks it alive (Used);
// a session this node created or destroyed for a call that came by any
// path but the REST routes serveThenRecord serves (MCP's, the CLI's) is
// in the API server's records before the caller sees the reply, so that
// its next call finds it through any node.
func (rt *Router) Served(ctx context.Context, rec *controller.Record) {
	if rt.Used != nil && rec.Session != "" {
		// Entered (or made) here for its authenticated caller: the
		// controller tells Served only of the calls this node ran, never
		// of one it forwarded. No lookup in the table: a session just made
		// has no record yet, and a miss would ask the API server.
		rt.Used(rec.Session)
	}
	if rt.Changed == nil || rec.Err != nil || ctx.Value(recordingKey{}) != nil {
		return
	}
	switch rec.Capability {
	case "create_session", "destroy_session", "fork_session":
		rt.Changed(ctx)
	}
}

// capability is the registry's capability name, when the Router has a
// Registry.
func (rt *Router) capability(name string) (*capability.Capability, bool) {
	if rt.Registry == nil {
		return nil, false
	}
	return rt.Registry.Get(name)
}

// unavailableError is the error of a call whose owner is down.
func unavailableError(msg string) *capability.Error {
	e := capability.Errorf(capability.Unavailable, "%s", msg)
	e.RetryAfter, _ = strconv.Atoi(RetryAfter)
	return e
}

// headers are what a forwarded call carries: the caller's credential,
// this node's signed mark and the caller's access path.
func (rt *Router) headers(ctx context.Context, caller controller.Caller, h http.Header) {
	if cred := controller.CredentialFrom(ctx); cred != "" {
		h.Set("Authorization", cred)
	}
	h.Set(HeaderForwardedBy, rt.forwardedBy())
	if validPath(caller.Path) {
		h.Set(HeaderForwardedPath, caller.Path)
	}
}

// forwardCall is POST /v1/{name} on the node at addr (ctx names the
// node meant, toNode).
func (rt *Router) forwardCall(ctx context.Context, caller controller.Caller, addr, name string, args json.RawMessage) (json.RawMessage, error) {
	u := (&url.URL{Scheme: rt.TLS.scheme("http"), Host: addr, Path: "/v1/" + name}).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(args))
	if err != nil {
		return nil, capability.Errorf(capability.Internal, "forwarding %s: %v", name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	rt.headers(ctx, caller, req.Header)
	resp, err := rt.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, capability.Errorf(capability.Canceled, "the call was canceled")
		}
		return nil, unavailableError("the node that owns this session did not answer (" + err.Error() + "); try again shortly")
	}
	defer resp.Body.Close()
	limit := rt.maxReply()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, unavailableError("the node that owns this session broke off its answer (" + err.Error() + "); try again shortly")
	case int64(len(body)) > limit:
		return nil, capability.Errorf(capability.Internal, "the node that owns this session answered more than %d bytes", limit)
	case resp.StatusCode/100 == 2:
		return body, nil
	}
	return nil, remoteError(resp.StatusCode, resp.Header.Get("Retry-After"), body)
}

// maxReply is MaxReply or its default.
func (rt *Router) maxReply() int64 {
	if rt.MaxReply > 0 {
		return rt.MaxReply
	}
	return maxForwardedReply
}

// remoteError is the error the owner answered (REST's {"error":{...}}).
func remoteError(status int, retryAfter string, body []byte) *capability.Error {
	var doc struct {
		Error *capability.Error `json:"error"`
	}
	if json.Unmarshal(body, &doc) != nil || doc.Error == nil || doc.Error.Code == "" {
		return capability.Errorf(capability.Internal, "the node that owns this session answered %d without an error document", status)
	}
	e := capability.Errorf(doc.Error.Code, "%s", doc.Error.Message)
	e.RetryAfter = doc.Error.RetryAfter
	if n, err := strconv.Atoi(retryAfter); err == nil && e.RetryAfter == 0 {
		e.RetryAfter = n
	}
	return e
}

// streamMessage is a message of /v1/stream/{capability} (internal/api/ws).
type streamMessage struct {
	Type    string            `json:"type"`
	Stream  string            `json:"stream,omitempty"`
	Data    string            `json:"data,omitempty"`
	Output  json.RawMessage   `json:"output,omitempty"`
	Error   *capability.Error `json:"error,omitempty"`
	Message string            `json:"message,omitempty"`
}

// forwardStream runs name on the node at addr (ctx names it, toNode) through its
// /v1/stream/{name}, passing each output message to out (and progress to
// ctx's progress.Func) as it arrives; canceling ctx closes the socket,
// which stops the run on the owner.
func (rt *Router) forwardStream(ctx context.Context, caller controller.Caller, addr, name string, args json.RawMessage, out runcode.OutputFunc) (json.RawMessage, error) {
	h := http.Header{}
	rt.headers(ctx, caller, h)
	u := (&url.URL{Scheme: rt.TLS.scheme("ws"), Host: addr, Path: "/v1/stream/" + name}).String()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, HTTPClient: rt.client})
	if err != nil {
		if resp != nil && resp.Body != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10)) // the library keeps at most 1 KiB of it
			resp.Body.Close()
			return nil, remoteError(resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if ctx.Err() != nil {
			return nil, capability.Errorf(capability.Canceled, "the call was canceled")
		}
		return nil, unavailableError("the node that owns this session did not answer (" + err.Error() + "); try again shortly")
	}
	defer c.CloseNow()
	c.SetReadLimit(rt.maxReply())
	if err := c.Write(ctx, websocket.MessageText, args); err != nil {
		return nil, unavailableError("the node that owns this session broke off the call (" + err.Error() + ")")
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, capability.Errorf(capability.Canceled, "the call was canceled")
			}
			return nil, unavailableError("the node that owns this session broke off the call (" + err.Error() + "); its result is lost")
		}
		var m streamMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, capability.Errorf(capability.Internal, "the node that owns this session sent a message that is not JSON: %v", err)
		}
		switch m.Type {
		case "output":
			if out != nil {
				out(m.Stream, []byte(m.Data))
			}
		case "progress":
			progress.Report(ctx, m.Message)
		case "result":
			c.Close(websocket.StatusNormalClosure, "done")
			return m.Output, nil
		case "error":
			if m.Error == nil || m.Error.Code == "" {
				return nil, capability.Errorf(capability.Internal, "the node that owns this session sent an error without a code")
			}
			e := capability.Errorf(m.Error.Code, "%s", m.Error.Message)
			e.RetryAfter = m.Error.RetryAfter
			return nil, e
		default:
			// "dropped": the owner's buffer fell behind this node; the
			// result holds the output as the capability keeps it.
		}
	}
}
