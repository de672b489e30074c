// Package rest serves the controller over HTTP/JSON under /v1/. Every
// capability is reachable as POST /v1/{name} with its input as the JSON body;
// a few read-only ones also have GET routes. The package only translates:
// HTTP in, controller call, HTTP out.
package rest

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Options configure the handler. nil means defaults.
type Options struct {
	// MaxBody is the largest accepted request body (16 MiB).
	MaxBody int64
	Logger  *slog.Logger
}

type server struct {
	ctl     *controller.Controller
	maxBody int64
	log     *slog.Logger
}

// getRoutes are the GET aliases of capabilities that take no arguments.
var getRoutes = map[string]string{
	"/v1/capabilities": "list_capabilities",
	"/v1/status":       "get_service_status",
	"/v1/help":         "help",
}

// New returns the HTTP handler for ctl.
func New(ctl *controller.Controller, opts *Options) http.Handler {
	s := &server{ctl: ctl, maxBody: 16 << 20, log: slog.New(slog.DiscardHandler)}
	if opts != nil {
		if opts.MaxBody > 0 {
			s.maxBody = opts.MaxBody
		}
		if opts.Logger != nil {
			s.log = opts.Logger
		}
	}
	mux := http.NewServeMux()
	for path, name := range getRoutes {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { s.call(w, r, name, nil) })
	}
	mux.HandleFunc("POST /v1/{capability}", s.post)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, capability.Errorf(capability.NotFound,
			"no route %s %s; POST /v1/{capability} with a JSON body, or GET /v1/capabilities", r.Method, r.URL.Path))
	})
	return mux
}

func (s *server) post(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("capability")
	if _, ok := s.ctl.Registry().Get(name); !ok {
		writeError(w, http.StatusNotFound, capability.Errorf(capability.NotFound,
			"no capability %q; GET /v1/capabilities lists them", name))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, capability.Errorf(capability.InvalidArgument,
			"send the arguments as application/json, not %s", ct))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, capability.Errorf(capability.InvalidArgument,
				"request body is larger than %d bytes", mbe.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument, "cannot read body: %v", err))
		return
	}
	if len(strings.TrimSpace(string(body))) > 0 && !json.Valid(body) {
		writeError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument, "request body is not valid JSON"))
		return
	}
	s.call(w, r, name, body)
}

func (s *server) call(w http.ResponseWriter, r *http.Request, name string, body []byte) {
	caller := controller.Caller{Path: "rest", Scope: capability.ScopeAdmin}
	reply, err := s.ctl.Call(r.Context(), caller, name, body)
	if err != nil {
		ce := controller.Classify(err)
		writeError(w, Status(ce.Code), ce)
		return
	}
	if wantsText(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, reply.Text+"\n")
		return
	}
	writeJSON(w, http.StatusOK, reply.Output)
}

// wantsText is true when the client asks for the model-facing text.
func wantsText(r *http.Request) bool {
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, e *capability.Error) {
	writeJSON(w, status, map[string]any{"error": e})
}
