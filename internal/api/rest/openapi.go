package rest

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/version"
)

// ErrorCodes are the values of error.code, for the Error schema.
var ErrorCodes = []capability.Code{
	capability.InvalidArgument, capability.NotFound, capability.AlreadyExists, capability.PermissionDenied,
	capability.Unauthenticated, capability.ResourceExhausted, capability.Busy, capability.Unavailable,
	capability.Canceled, capability.DeadlineExceeded, capability.Internal,
}

// statusDocs are the error statuses, in order, with their codes and
// meaning; StatusDoc renders them for the OpenAPI document (and the README
// repeats them).
var statusDocs = []struct {
	status  int
	code    string
	meaning string
}{
	{400, "invalid_argument", "bad input (the message says which field and why)"},
	{401, "unauthenticated", "no or bad token"},
	{403, "permission_denied", "missing scope or foreign origin"},
	{404, "not_found", "unknown session, capability or route (also another tenant's session)"},
	{405, "invalid_argument", "the path exists but not with this method; the Allow header lists the methods it takes"},
	{409, "already_exists / busy", "a session of that name exists already, or the session is still running something"},
	{413, "invalid_argument", "body over the limit (16 MiB)"},
	{415, "invalid_argument", "body not labelled as JSON"},
	{429, "resource_exhausted", "a tenant limit, with Retry-After"},
	{499, "canceled", "the caller went away"},
	{500, "internal", "a failure of the server (the message carries an id to find in the server log)"},
	{503, "unavailable", "an engine or the service is not available"},
	{504, "deadline_exceeded", "the call ran out of time"},
}

// StatusDoc lists the error statuses: "400 invalid_argument: bad input; ...".
func StatusDoc() string {
	parts := make([]string, len(statusDocs))
	for i, d := range statusDocs {
		parts[i] = strconv.Itoa(d.status) + " " + d.code + ": " + d.meaning
	}
	return "Statuses: " + strings.Join(parts, "; ") + "."
}

// OpenAPI generates the OpenAPI 3.1 document of the routes and of POST
// /v1/{capability} for every capability of reg. Schemas come from the
// registry: each capability's input and output are components named
// "<name>.input" and "<name>.output"; a route whose path fills input fields
// gets the input schema without them. Routes whose capability reg lacks are
// left out, as the server answers them 404.
func OpenAPI(reg *capability.Registry, routes []Route) map[string]any {
	schemas := map[string]any{
		"Error": map[string]any{
			"type":                 "object",
			"required":             []string{"error"},
			"additionalProperties": false,
			"properties": map[string]any{
				"error": map[string]any{
					"type":                 "object",
					"required":             []string{"code", "message"},
					"additionalProperties": false,
					"properties": map[string]any{
						"code":    map[string]any{"type": "string", "enum": ErrorCodes},
						"message": map[string]any{"type": "string", "description": "what went wrong and what to do about it"},
					},
				},
			},
		},
	}
	paths := map[string]map[string]any{}
	add := func(path, method string, op map[string]any) {
		if paths[path] == nil {
			paths[path] = map[string]any{}
		}
		paths[path][strings.ToLower(method)] = op
	}
	for _, c := range reg.List() {
		schemas[c.Name+".input"] = c.InputSchema
		schemas[c.Name+".output"] = c.OutputSchema
		op := map[string]any{
			"operationId":  c.Name,
			"summary":      firstSentence(c.Description),
			"description":  c.Description,
			"tags":         []string{"capabilities"},
			"x-quro-scope": string(c.Scope),
			"requestBody": map[string]any{
				"required": c.HasRequiredInput(),
				"content":  map[string]any{"application/json": map[string]any{"schema": ref(c.Name + ".input")}},
			},
			"responses": responses("200", "the capability's output", ref(c.Name+".output")),
		}
		add("/v1/"+c.Name, "POST", op)
	}
	for i := range routes {
		rt := &routes[i]
		op, ok := routeOperation(reg, rt)
		if ok {
			add(openAPIPath(rt.Pattern), rt.Method, op)
		}
	}
	if _, ok := reg.Get("read_file"); ok {
		for _, tr := range transferRoutes {
			add(openAPIPath(tr.Pattern), tr.Method, transferOperation(tr.Method, tr.Summary))
		}
	}
	add("/v1/openapi.json", "GET", map[string]any{
		"operationId": "openapi",
		"summary":     "This document",
		"tags":        []string{"meta"},
		"responses":   responses("200", "the OpenAPI document", map[string]any{"type": "object"}),
	})
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":   "Quro",
			"version": version.String(),
			"description": "Code execution and terminals for AI agents. Every capability is POST /v1/{name} with its input as the JSON body; " +
				"the resource routes below map onto the same capabilities. Errors are {\"error\":{\"code\",\"message\"}}.",
		},
		"security": []any{map[string]any{"bearer": []string{}}},
		"paths":    paths,
		"components": map[string]any{
			"schemas": schemas,
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer",
					"description": "a Quro token; WebSocket clients that cannot set headers offer the subprotocol quro.bearer.<token> beside quro.v1"},
			},
			"responses": map[string]any{
				"Error": map[string]any{
					"description": "the call failed; error.code is stable, error.message says what to do. " + StatusDoc(),
					"content":     map[string]any{"application/json": map[string]any{"schema": ref("Error")}},
				},
			},
		},
	}
}

func routeOperation(reg *capability.Registry, rt *Route) (map[string]any, bool) {
	op := map[string]any{
		"operationId": operationID(rt),
		"summary":     rt.Summary,
		"tags":        []string{"resources"},
	}
	var capb *capability.Capability
	if rt.Capability != "" {
		c, ok := reg.Get(rt.Capability)
		if !ok {
			return nil, false
		}
		capb = c
		op["x-quro-capability"] = rt.Capability
		op["x-quro-scope"] = string(c.Scope)
		op["description"] = c.Description
	}
	var params []any
	for _, name := range wildcards(rt.Pattern) {
		p := map[string]any{"name": name, "in": "path", "required": true, "schema": map[string]any{"type": "string"}}
		if field := rt.Path[name]; capb != nil && field != "" {
			if s, ok := capb.InputSchema.Properties[field]; ok {
				p["schema"] = s
			}
			p["description"] = "fills the input field " + field
		}
		if name == "path" {
			p["description"] = "a workspace-relative path; it may contain /. Empty or ending in / lists a directory"
		}
		params = append(params, p)
	}
	for _, name := range rt.Query {
		p := map[string]any{"name": name, "in": "query", "required": false, "schema": map[string]any{"type": "string"}}
		if s, ok := capb.InputSchema.Properties[name]; ok {
			p["schema"] = s
		}
		params = append(params, p)
	}
	if params != nil {
		op["parameters"] = params
	}
	if rt.WebSocket != "" {
		return websocketOperation(reg, rt, op)
	}
	status := "200"
	if rt.Status != 0 {
		status = strconv.Itoa(rt.Status)
	}
	switch rt.Body {
	case BodyJSON:
		var schema any = ref(capb.Name + ".input")
		required := capb.HasRequiredInput()
		if len(rt.Path) > 0 {
			body := withoutFields(capb.InputSchema, rt.Path)
			schema, required = body, len(body.Required) > 0
		}
		op["requestBody"] = map[string]any{
			"required": required,
			"content":  map[string]any{"application/json": map[string]any{"schema": schema}},
		}
	case BodyFile:
		op["requestBody"] = map[string]any{
			"required":    true,
			"description": "the file's bytes: UTF-8 text is written as it is, anything else is sent to " + capb.Name + " base64-encoded",
			"content": map[string]any{
				"application/octet-stream": map[string]any{"schema": map[string]any{"type": "string", "contentMediaType": "application/octet-stream"}},
				"text/plain":               map[string]any{"schema": map[string]any{"type": "string"}},
			},
		}
	}
	var out any = ref(capb.Name + ".output")
	if rt.DirCapability != "" {
		if _, ok := reg.Get(rt.DirCapability); ok {
			out = map[string]any{"oneOf": []any{out, ref(rt.DirCapability + ".output")}}
			op["x-quro-dir-capability"] = rt.DirCapability
		}
	}
	op["responses"] = responses(status, "the output of "+capb.Name, out)
	return op, true
}

// websocketOperation completes op for a WebSocket route. The stream route
// lists the capabilities of reg that stream; with none it is left out.
func websocketOperation(reg *capability.Registry, rt *Route, op map[string]any) (map[string]any, bool) {
	op["x-quro-websocket"] = string(rt.WebSocket)
	op["description"] = websocketDescription[rt.WebSocket]
	if rt.WebSocket == WebSocketStream {
		streaming := reg.Streaming()
		if len(streaming) == 0 {
			return nil, false
		}
		op["parameters"] = []any{map[string]any{"name": "capability", "in": "path", "required": true,
			"description": "a capability that streams its output",
			"schema":      map[string]any{"type": "string", "enum": streaming}}}
	}
	op["responses"] = map[string]any{
		"101":     map[string]any{"description": "switching to the WebSocket protocol quro.v1"},
		"default": ref2("Error"),
	}
	return op, true
}

var websocketDescription = map[WebSocket]string{
	WebSocketPTY: "Upgrade to a WebSocket attached to the session's interactive terminal. Binary frames carry terminal bytes both ways; " +
		"text frames carry JSON control messages: the client sends {\"type\":\"resize\",\"cols\":N,\"rows\":M}; the server sends " +
		"{\"type\":\"hello\",...} first, then the scrollback as binary, and {\"type\":\"exit\",\"code\":N} when the shell ends. " +
		"A viewer that falls behind is closed with code 1013.",
	WebSocketStream: "Upgrade to a WebSocket, send the capability's input as the first text message, and receive " +
		"{\"type\":\"output\",\"stream\":\"stdout\"|\"stderr\",\"data\":\"...\"} as output arrives, then " +
		"{\"type\":\"result\",\"output\":{...},\"text\":\"...\"} or {\"type\":\"error\",\"error\":{...}}. Closing the socket cancels the run.",
	WebSocketEvents: "Upgrade to a WebSocket of your tenant's live events: {\"type\":\"call\"|\"output\"|\"end\",\"call\",\"session\",\"capability\",\"path\",...} " +
		"for every call on a session that may change or run something, from any access path, {\"type\":\"hold\",\"session\",\"held\"} when a person takes a shell or hands it back, " +
		"and {\"type\":\"dropped\",\"dropped\":N} when this connection fell behind and lost N events. The client may send {\"type\":\"take\",\"session\":ID} " +
		"(scope exec), then {\"type\":\"exec\",\"session\",\"command\"} and {\"type\":\"input\",\"session\",\"data\"}, and {\"type\":\"release\",\"session\"}; " +
		"while a person holds a session's shell every other call's terminal_exec and send_input is refused (busy: a person holds this session). Closing the socket hands back its shells.",
}

func responses(status, desc string, schema any) map[string]any {
	return map[string]any{
		status: map[string]any{
			"description": desc,
			"content":     map[string]any{"application/json": map[string]any{"schema": schema}},
		},
		"default": ref2("Error"),
	}
}

func ref(name string) map[string]any { return map[string]any{"$ref": "#/components/schemas/" + name} }

func ref2(name string) map[string]any {
	return map[string]any{"$ref": "#/components/responses/" + name}
}

// withoutFields is a copy of s without the properties that path
// parameters fill.
func withoutFields(s *jsonschema.Schema, path map[string]string) *jsonschema.Schema {
	c := *s
	c.Properties = maps.Clone(s.Properties)
	c.Required = slices.Clone(s.Required)
	for _, field := range path {
		delete(c.Properties, field)
		c.Required = slices.DeleteFunc(c.Required, func(f string) bool { return f == field })
	}
	return &c
}

// openAPIPath turns a net/http pattern into an OpenAPI path template.
func openAPIPath(pattern string) string { return strings.ReplaceAll(pattern, "...}", "}") }

// wildcards lists the names of a pattern's {wildcards}.
func wildcards(pattern string) []string {
	var out []string
	for _, seg := range strings.Split(pattern, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, strings.TrimSuffix(strings.Trim(seg, "{}"), "..."))
		}
	}
	return out
}

func operationID(rt *Route) string {
	var parts []string
	for _, seg := range strings.Split(strings.TrimPrefix(openAPIPath(rt.Pattern), "/v1/"), "/") {
		parts = append(parts, strings.Trim(seg, "{}"))
	}
	return strings.ToLower(rt.Method) + "_" + strings.Join(parts, "_")
}

func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}
