// Package rest serves the controller over HTTP/JSON under /v1/: every
// capability as POST /v1/{name} with its input as the JSON body, and the
// resource routes of the table in routes.go (sessions, files, audit), from
// which GET /v1/openapi.json is generated. The package only translates:
// HTTP in, controller call, HTTP out. WebSocket routes are in the table too
// and are handed to their handlers in Options.WebSocket (package ws).
package rest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Options configure the handler. nil means defaults.
type Options struct {
	// MaxBody is the largest accepted request body (DefaultMaxBody).
	MaxBody int64
	Logger  *slog.Logger
	// Access: authentication (httpauth.Open by default), allowed origins
	// and Host names.
	Access Access
	// WebSocket serves the WebSocket routes of the table, each by the
	// handler of its Route.WebSocket (ws.Server.Handlers); a route without
	// one answers 404. The handlers check access themselves (the token
	// may come in a subprotocol).
	WebSocket map[WebSocket]http.Handler
}

type server struct {
	ctl     *controller.Controller
	maxBody int64
	log     *slog.Logger
	access  Access
	openapi []byte
}

// New returns the HTTP handler for ctl.
func New(ctl *controller.Controller, opts *Options) http.Handler {
	s := &server{ctl: ctl, maxBody: DefaultMaxBody, log: slog.New(slog.DiscardHandler)}
	var wsh map[WebSocket]http.Handler
	if opts != nil {
		if opts.MaxBody > 0 {
			s.maxBody = opts.MaxBody
		}
		if opts.Logger != nil {
			s.log = opts.Logger
		}
		s.access = opts.Access
		wsh = opts.WebSocket
	}
	doc, err := json.MarshalIndent(OpenAPI(ctl.Registry(), Routes), "", "  ")
	if err != nil {
		panic("rest: openapi: " + err.Error()) // the registry's schemas always marshal
	}
	s.openapi = doc
	mux := http.NewServeMux()
	for i := range Routes {
		rt := &Routes[i]
		pattern := rt.Method + " " + rt.Pattern
		if rt.WebSocket != "" {
			if h := wsh[rt.WebSocket]; h != nil {
				mux.Handle(pattern, h)
			}
			continue
		}
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { s.route(w, r, rt) })
	}
	mux.HandleFunc("GET /v1/sessions/{id}/download/{path...}", s.download)
	mux.HandleFunc("PUT /v1/sessions/{id}/upload/{path...}", s.upload)
	mux.HandleFunc("GET /v1/openapi.json", s.serveOpenAPI)
	mux.HandleFunc("POST /v1/{capability}", s.post)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.access.Admit(w, r, "rest"); !ok {
			return
		}
		if allow := s.allowed(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			WriteError(w, http.StatusMethodNotAllowed, capability.Errorf(capability.InvalidArgument,
				"%s does not take %s; it takes %s (GET /v1/openapi.json lists every route)", r.URL.Path, r.Method, strings.Join(allow, ", ")))
			return
		}
		WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound,
			"no route %s %s; POST /v1/{capability} with a JSON body, or GET /v1/openapi.json for every route", r.Method, r.URL.Path))
	})
	return mux
}

// methods are the methods a route of the table may have.
var methods = []string{"GET", "PUT", "POST", "DELETE", "PATCH"}

// allowed lists the methods that have a route for r's path, when r's own
// method has none (the catch-all answered): the mux matches the path
// with each method in turn. POST /v1/{capability} counts only for a
// capability the server has.
func (s *server) allowed(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range methods {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		_, pattern := mux.Handler(probe)
		if pattern == "" || pattern == "/v1/" {
			continue
		}
		if pattern == "POST /v1/{capability}" {
			name := strings.TrimPrefix(path.Clean(r.URL.Path), "/v1/")
			if _, ok := s.ctl.Registry().Get(name); !ok {
				continue
			}
		}
		allow = append(allow, m)
		if m == "GET" {
			allow = append(allow, "HEAD")
		}
	}
	return allow
}

func (s *server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.access.Admit(w, r, "rest"); !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.openapi)
}

// route serves one route of the table.
func (s *server) route(w http.ResponseWriter, r *http.Request, rt *Route) {
	caller, ok := s.access.Admit(w, r, "rest")
	if !ok {
		return
	}
	caller.Background = background(r)
	name := rt.capabilityFor(r)
	capb, ok := s.ctl.Registry().Get(name)
	if !ok {
		WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound,
			"%s %s needs capability %s, which this server does not have", rt.Method, rt.Pattern, name))
		return
	}
	var body []byte
	if rt.Body == BodyJSON && !s.jsonType(w, r) {
		return
	}
	body, ok = s.readBody(w, r)
	if !ok {
		return
	}
	args, cerr := rt.args(r, capb, body)
	if cerr != nil {
		WriteError(w, http.StatusBadRequest, cerr)
		return
	}
	s.call(w, r, caller, name, args, rt.Status)
}

func (s *server) post(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.access.Admit(w, r, "rest")
	if !ok {
		return
	}
	caller.Background = background(r)
	name := r.PathValue("capability")
	if _, ok := s.ctl.Registry().Get(name); !ok {
		// Refused before the body is read, but through the controller, so
		// that the audit log and the metrics see the attempt too.
		s.call(w, r, caller, name, nil, 0)
		return
	}
	if !s.jsonType(w, r) {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument, "request body is %s", notJSON(body, err)))
			return
		}
	}
	s.call(w, r, caller, name, body, 0)
}

// notJSON says where body stops being JSON: "not valid JSON at line 2,
// column 5: invalid character ...".
func notJSON(body []byte, err error) string {
	return "not valid JSON" + strings.TrimPrefix(capability.JSONError(body, err).Error(), "invalid JSON")
}

// jsonType refuses a body labelled as anything but JSON (415). curl -d
// labels its body as a form; the body must still be JSON.
func (s *server) jsonType(w http.ResponseWriter, r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" || strings.HasPrefix(ct, "application/json") || strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		return true
	}
	WriteError(w, http.StatusUnsupportedMediaType, capability.Errorf(capability.InvalidArgument,
		"send the arguments as application/json, not %s", ct))
	return false
}

// DefaultMaxBody is the largest request body when Options say none.
const DefaultMaxBody = 16 << 20

// readBody reads the body up to the limit (413 beyond it).
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, capability.Errorf(capability.InvalidArgument,
				"request body is larger than %d bytes; put large data in files of the workspace", mbe.Limit))
			return nil, false
		}
		WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument, "cannot read body: %v", err))
		return nil, false
	}
	return body, true
}

func (s *server) call(w http.ResponseWriter, r *http.Request, caller controller.Caller, name string, body []byte, status int) {
	reply, err := s.ctl.Call(r.Context(), caller, name, body)
	if err != nil {
		ce := controller.Classify(err)
		WriteError(w, Status(ce.Code), ce)
		return
	}
	if status == 0 {
		status = http.StatusOK
	}
	if WantsText(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		io.WriteString(w, reply.Text+"\n")
		return
	}
	WriteJSON(w, status, reply.Output)
}

// WantsText is true when the client asks for the model-facing text
// (?format=text or Accept: text/plain).
func WantsText(r *http.Request) bool {
	if r.URL.Query().Get("format") == "text" {
		return true
	}
	accept := r.Header.Get("Accept")
	return strings.HasPrefix(accept, "text/plain")
}

// Status maps an error code to its HTTP status, in one place.
func Status(code capability.Code) int {
	switch code {
	case capability.InvalidArgument:
		return http.StatusBadRequest
	case capability.NotFound:
		return http.StatusNotFound
	case capability.AlreadyExists, capability.Busy:
		return http.StatusConflict
	case capability.PermissionDenied:
		return http.StatusForbidden
	case capability.Unauthenticated:
		return http.StatusUnauthorized
	case capability.ResourceExhausted:
		return http.StatusTooManyRequests
	case capability.Unavailable:
		return http.StatusServiceUnavailable
	case capability.Canceled:
		return 499
	case capability.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// WriteJSON writes v as the JSON response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// WriteError writes {"error":{"code","message"}}, with Retry-After when the
// error says how long to wait.
func WriteError(w http.ResponseWriter, status int, e *capability.Error) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	WriteJSON(w, status, map[string]any{"error": e})
}

// BackgroundHeader marks a request the client made by itself (the web UI
// refreshing a page), not for a person's action: "1". The controller
// honours it for read-scope calls only, whose audit entries it marks.
const BackgroundHeader = "Quro-Background"

func background(r *http.Request) bool { return r.Header.Get(BackgroundHeader) == "1" }
