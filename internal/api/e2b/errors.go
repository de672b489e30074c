package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
)

// E2B's errors, in one place: the control plane and envd's HTTP API
// answer JSON {"code": HTTP status, "message": text} (the SDKs branch on
// code: 404 not found, 409 conflict, 401, 429, 502); Connect-RPC answers a
// Connect error whose code the SDKs map to their error classes.

// errorBody is E2B's error JSON.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// asCapError is err as a *capability.Error (an internal one when it is
// not: the controller classifies every failure, so that is a bug here).
func asCapError(err error) *capability.Error {
	var ce *capability.Error
	if errors.As(err, &ce) {
		return ce
	}
	return capability.Errorf(capability.Internal, "%v", err)
}

// messageOf is the message of a capability error, else err's text.
func messageOf(err error) string {
	return asCapError(err).Message
}

// statusOf is the HTTP status of a failed call: the same table as Quro's
// REST API.
func statusOf(err error) int {
	return rest.Status(asCapError(err).Code)
}

// writeError answers a failed capability call as E2B's error JSON.
func writeError(w http.ResponseWriter, err error) {
	ce := asCapError(err)
	if ce.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ce.RetryAfter))
	}
	writeJSONError(w, rest.Status(ce.Code), ce.Message)
}

// unsupported answers 501 naming the feature and Quro's version, never a
// bare 404 or 405.
func (s *Server) unsupported(w http.ResponseWriter, feature string) {
	writeJSONError(w, http.StatusNotImplemented, feature+" is not supported by Quro "+s.version()+" (docs/e2b.md lists what is)")
}

// connectCodes maps Quro's codes to Connect's.
var connectCodes = map[capability.Code]connect.Code{
	capability.InvalidArgument:   connect.CodeInvalidArgument,
	capability.NotFound:          connect.CodeNotFound,
	capability.AlreadyExists:     connect.CodeAlreadyExists,
	capability.PermissionDenied:  connect.CodePermissionDenied,
	capability.Unauthenticated:   connect.CodeUnauthenticated,
	capability.ResourceExhausted: connect.CodeResourceExhausted,
	capability.Busy:              connect.CodeFailedPrecondition,
	capability.Unavailable:       connect.CodeUnavailable,
	capability.Canceled:          connect.CodeCanceled,
	capability.DeadlineExceeded:  connect.CodeDeadlineExceeded,
	capability.Internal:          connect.CodeInternal,
}

// rpcError is a failed capability call as a Connect error.
func rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	c := asCapError(err)
	code, ok := connectCodes[c.Code]
	if !ok {
		code = connect.CodeUnknown
	}
	return connect.NewError(code, errors.New(c.Message))
}

// rpcErrorf is a Connect error of code with a message.
func rpcErrorf(code connect.Code, msg string) error {
	return connect.NewError(code, errors.New(msg))
}
