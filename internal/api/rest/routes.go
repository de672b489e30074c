package rest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/capability"
)

// Body says what a route's request body is.
type Body int

const (
	// BodyNone means the route takes no body.
	BodyNone Body = iota
	// BodyJSON is a JSON object of the capability's input; path parameters
	// are merged into it.
	BodyJSON
	// BodyFile is the raw bytes of a file, sent as the input's "content":
	// UTF-8 text as it is, anything else base64 with "encoding":"base64".
	BodyFile
)

// WebSocket names what a WebSocket route of the table serves; the handler
// of each is Options.WebSocket[name] (package ws provides them). The value
// is the route's x-quro-websocket in the OpenAPI document.
type WebSocket string

const (
	// WebSocketPTY is the session's interactive terminal.
	WebSocketPTY WebSocket = "pty"
	// WebSocketStream is a run of a capability that streams its output
	// (capability.Capability.Streams), named by the {capability} wildcard.
	WebSocketStream WebSocket = "stream"
	// WebSocketEvents is the live events of the caller's tenant's
	// sessions, and a person's take-over of a session's shell.
	WebSocketEvents WebSocket = "events"
)

// Route is one resource-style route: a method and pattern (net/http
// syntax) mapped to a capability and to how its arguments are built.
type Route struct {
	Method, Pattern string
	// Capability answers the route. DirCapability, when set, answers it
	// instead when the {path...} wildcard is empty or ends in "/".
	Capability    string
	DirCapability string
	Summary       string
	// Path maps a pattern wildcard to the input field it fills.
	Path map[string]string
	// Query lists the query parameters that become input fields of the same
	// name, typed by the input schema ("?limit=5" → {"limit":5}).
	Query []string
	Body  Body
	// Status is the success status (200 when zero).
	Status int
	// WebSocket, when set, makes the route a WebSocket upgrade served by
	// Options.WebSocket[WebSocket] (see docs/architecture.md) instead of a
	// capability call.
	WebSocket WebSocket
}

// Routes is the route table: every resource route besides POST
// /v1/{capability}, which serves every capability with its input as the
// body. OpenAPI is generated from it.
var Routes = []Route{
	{Method: "GET", Pattern: "/v1/capabilities", Capability: "list_capabilities", Summary: "List the capabilities"},
	{Method: "GET", Pattern: "/v1/status", Capability: "get_service_status", Summary: "Service status"},
	{Method: "GET", Pattern: "/v1/help", Capability: "help", Summary: "A guide for models"},
	{Method: "GET", Pattern: "/v1/sessions", Capability: "list_sessions", Summary: "List sessions"},
	{Method: "POST", Pattern: "/v1/sessions", Capability: "create_session", Body: BodyJSON, Status: http.StatusCreated, Summary: "Create a session"},
	{Method: "GET", Pattern: "/v1/sessions/{id}", Capability: "get_session_status", Path: sessionParam, Summary: "A session's status"},
	{Method: "DELETE", Pattern: "/v1/sessions/{id}", Capability: "destroy_session", Path: sessionParam, Summary: "Destroy a session"},
	{Method: "POST", Pattern: "/v1/sessions/{id}/exec", Capability: "terminal_exec", Path: sessionParam, Body: BodyJSON, Summary: "Run a command in the session's shell"},
	{Method: "POST", Pattern: "/v1/sessions/{id}/input", Capability: "send_input", Path: sessionParam, Body: BodyJSON, Summary: "Type into the session"},
	{Method: "POST", Pattern: "/v1/sessions/{id}/run", Capability: "run_code", Path: sessionParam, Body: BodyJSON, Summary: "Run code in the session"},
	{Method: "GET", Pattern: "/v1/sessions/{id}/env", Capability: "get_session_env", Path: sessionParam, Summary: "The session's variables"},
	{Method: "PUT", Pattern: "/v1/sessions/{id}/env", Capability: "set_session_env", Path: sessionParam, Body: BodyJSON, Summary: "Set or unset the session's variables"},
	{Method: "GET", Pattern: "/v1/sessions/{id}/files/{path...}", Capability: "read_file", DirCapability: "list_files", Path: fileParams,
		Summary: "Read a workspace file, or list a directory when the path is empty or ends in /"},
	{Method: "PUT", Pattern: "/v1/sessions/{id}/files/{path...}", Capability: "write_file", Path: fileParams, Body: BodyFile,
		Summary: "Write a workspace file from the raw body"},
	{Method: "POST", Pattern: "/v1/sessions/{id}/snapshots", Capability: "snapshot_session", Path: sessionParam, Body: BodyJSON, Status: http.StatusCreated,
		Summary: "Snapshot the session's workspace and settings"},
	{Method: "GET", Pattern: "/v1/snapshots", Capability: "list_snapshots", Summary: "List snapshots"},
	{Method: "DELETE", Pattern: "/v1/snapshots/{id}", Capability: "delete_snapshot", Path: snapshotParam, Summary: "Delete a snapshot"},
	{Method: "POST", Pattern: "/v1/snapshots/{id}/fork", Capability: "fork_session", Path: snapshotParam, Body: BodyJSON, Status: http.StatusCreated,
		Summary: "Make new sessions from a snapshot, all or nothing"},
	{Method: "GET", Pattern: "/v1/audit", Capability: "get_audit_log", Query: []string{"limit", "capability", "since", "outcome", "session", "include_background"}, Summary: "The audit log, latest first"},
	{Method: "GET", Pattern: "/v1/sessions/{id}/pty", Path: sessionParam, WebSocket: WebSocketPTY,
		Summary: "WebSocket: the session's interactive terminal"},
	{Method: "GET", Pattern: "/v1/stream/{capability}", WebSocket: WebSocketStream,
		Summary: "WebSocket: run a capability that streams, with its output as it arrives"},
	{Method: "GET", Pattern: "/v1/events", WebSocket: WebSocketEvents,
		Summary: "WebSocket: live events of your sessions' calls; take over a session's shell"},
}

var (
	sessionParam  = map[string]string{"id": "session"}
	snapshotParam = map[string]string{"id": "snapshot"}
	fileParams    = map[string]string{"id": "session", "path": "path"}
)

// capabilityFor is the capability that answers rt for r.
func (rt *Route) capabilityFor(r *http.Request) string {
	if rt.DirCapability != "" {
		if p := r.PathValue("path"); p == "" || strings.HasSuffix(p, "/") {
			return rt.DirCapability
		}
	}
	return rt.Capability
}

// args builds the capability's input for r from the path, the query and
// body (already read). The error is one the caller must fix.
func (rt *Route) args(r *http.Request, capb *capability.Capability, body []byte) (json.RawMessage, *capability.Error) {
	fields := map[string]json.RawMessage{}
	switch rt.Body {
	case BodyNone:
		if len(bytes.TrimSpace(body)) > 0 {
			return nil, capability.Errorf(capability.InvalidArgument, "%s %s takes no body", rt.Method, rt.Pattern)
		}
	case BodyJSON:
		if len(bytes.TrimSpace(body)) > 0 {
			var v any
			if err := json.Unmarshal(body, &v); err != nil {
				return nil, capability.Errorf(capability.InvalidArgument, "the body is %s; it must be a JSON object of %s's arguments", notJSON(body, err), capb.Name)
			}
			if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
				return nil, capability.Errorf(capability.InvalidArgument, "the body must be a JSON object of %s's arguments", capb.Name)
			}
		}
	case BodyFile:
		if utf8.Valid(body) {
			fields["content"], _ = json.Marshal(string(body))
		} else {
			fields["content"], _ = json.Marshal(base64.StdEncoding.EncodeToString(body))
			fields["encoding"] = json.RawMessage(`"base64"`)
		}
	}
	q := r.URL.Query()
	for name := range q {
		if name != "format" && !contains(rt.Query, name) {
			if len(rt.Query) == 0 {
				return nil, capability.Errorf(capability.InvalidArgument, "%s %s takes no query parameter %q", rt.Method, rt.Pattern, name)
			}
			return nil, capability.Errorf(capability.InvalidArgument, "unknown query parameter %q; %s %s takes %s", name, rt.Method, rt.Pattern, strings.Join(rt.Query, ", "))
		}
	}
	for _, name := range rt.Query {
		if !q.Has(name) {
			continue
		}
		v, err := queryValue(capb, name, q.Get(name))
		if err != nil {
			return nil, err
		}
		fields[name] = v
	}
	for param, field := range rt.Path {
		val := r.PathValue(param)
		if param == "path" {
			if val = strings.TrimSuffix(val, "/"); val == "" {
				continue // the workspace itself: the capability's default
			}
		}
		enc, _ := json.Marshal(val)
		if prev, ok := fields[field]; ok {
			var s string
			if json.Unmarshal(prev, &s) != nil || s != val {
				return nil, capability.Errorf(capability.InvalidArgument,
					"the path gives %s %q but the body gives %s; leave %q out of the body", field, val, prev, field)
			}
		}
		fields[field] = enc
	}
	if len(fields) == 0 {
		return nil, nil
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	return out, nil
}

// queryValue converts a query string to the JSON type the input schema
// gives the field.
func queryValue(capb *capability.Capability, name, raw string) (json.RawMessage, *capability.Error) {
	typ := "string"
	if p := capb.InputSchema.Properties[name]; p != nil {
		typ = p.Type
		for _, t := range p.Types {
			if t != "null" {
				typ = t
			}
		}
	}
	switch typ {
	case "integer":
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return nil, capability.Errorf(capability.InvalidArgument, "query parameter %s must be an integer, not %q", name, raw)
		}
		return json.RawMessage(strconv.FormatInt(n, 10)), nil
	case "number":
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return nil, capability.Errorf(capability.InvalidArgument, "query parameter %s must be a number, not %q", name, raw)
		}
		b, _ := json.Marshal(f)
		return b, nil
	case "boolean":
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return nil, capability.Errorf(capability.InvalidArgument, "query parameter %s must be true or false, not %q", name, raw)
		}
		return json.RawMessage(fmt.Sprint(b)), nil
	}
	b, _ := json.Marshal(raw)
	return b, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
