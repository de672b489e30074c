// Package httpauth is the seam between the HTTP access paths (REST,
// WebSocket, MCP over streamable HTTP) and authentication: each path asks a
// Func who is calling and never looks at credentials itself.
package httpauth

import (
	"net/http"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Func resolves the caller of r. It fails with a *capability.Error coded
// Unauthenticated (no or bad credentials). The access path sets
// Caller.Path itself.
type Func func(r *http.Request) (controller.Caller, error)

// Open trusts every request with the admin scope and the local tenant. It is
// for loopback servers started explicitly without authentication.
func Open(*http.Request) (controller.Caller, error) {
	return controller.Caller{Scope: capability.ScopeAdmin}, nil
}

// Bearer returns the token of an "Authorization: Bearer …" header, or "".
func Bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}
