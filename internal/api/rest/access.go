package rest

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Access is who may reach the HTTP access paths and from where. REST and
// the WebSocket share one.
type Access struct {
	// Auth resolves the caller of each request (httpauth.Open when nil).
	Auth httpauth.Func
	// Origins are the browser origins ("https://ui.example:8443") allowed
	// besides the server's own; "*" allows any. A request without an
	// Origin header (curl, SDKs) is not a browser's and passes.
	Origins []string
	// Hosts are the names (without port) a request's Host may carry
	// besides the loopback names and the address the connection came in
	// on; "*" allows any. Refusing other names defends a loopback server
	// against DNS rebinding.
	Hosts []string
}

func (a Access) auth() httpauth.Func {
	if a.Auth == nil {
		return httpauth.Open
	}
	return a.Auth
}

// Check refuses a request from a foreign browser origin or to a Host name
// this server does not answer to. It runs before authentication and before
// a WebSocket upgrade.
func (a Access) Check(r *http.Request) *capability.Error {
	if e := a.CheckHost(r); e != nil {
		return e
	}
	if origin := r.Header.Get("Origin"); origin != "" && !a.originAllowed(r, origin) {
		return capability.Errorf(capability.PermissionDenied,
			"origin %s may not use this server (same-origin only); start the server with that origin allowed", origin)
	}
	return nil
}

// CheckHost refuses a request to a Host name this server does not answer
// to (the defence against DNS rebinding), whatever its origin. Check does
// this and more; CheckHost alone suits public static files, such as the
// web UI's, which a sandboxed frame (Origin: null) must be able to load.
func (a Access) CheckHost(r *http.Request) *capability.Error {
	if !a.hostAllowed(r) {
		return capability.Errorf(capability.PermissionDenied,
			"Host %q is not a name of this server; use its address, or start the server with that name allowed", r.Host)
	}
	return nil
}

func (a Access) hostAllowed(r *http.Request) bool {
	host := hostOnly(r.Host)
	if host == "" {
		return false
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return true
		}
		// The address the client connected to is always a name of ours.
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if tcp, ok := la.(*net.TCPAddr); ok && tcp.IP.Equal(ip) {
				return true
			}
		}
	}
	for _, h := range a.Hosts {
		if h == "*" || strings.EqualFold(h, host) {
			return true
		}
		// "*.example.com": every name below example.com (E2B's
		// PORT-ID.DOMAIN sandbox hosts).
		if sub, ok := strings.CutPrefix(h, "*."); ok && len(host) > len(sub)+1 &&
			strings.EqualFold(host[len(host)-len(sub)-1:], "."+sub) {
			return true
		}
	}
	return false
}

func (a Access) originAllowed(r *http.Request, origin string) bool {
	for _, o := range a.Origins {
		if o == "*" || strings.EqualFold(strings.TrimRight(o, "/"), origin) {
			return true
		}
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false // "null" (sandboxed frames, files) and nonsense
	}
	return strings.EqualFold(u.Host, r.Host)
}

// hostOnly strips the port and IPv6 brackets from a Host header.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return strings.ToLower(host)
	}
	return strings.ToLower(strings.Trim(h, "[]"))
}

// Admit checks r (Check), then authenticates it with Auth and returns the
// caller with Path set to path. On failure it has written the error
// response (403, or 401 with WWW-Authenticate) and returns false.
func (a Access) Admit(w http.ResponseWriter, r *http.Request, path string) (controller.Caller, bool) {
	if e := a.Check(r); e != nil {
		WriteError(w, http.StatusForbidden, e)
		return controller.Caller{}, false
	}
	caller, err := a.auth()(r)
	if err != nil {
		ce := controller.Classify(err)
		if ce.Code == capability.Internal {
			WriteError(w, http.StatusInternalServerError, ce)
			return controller.Caller{}, false
		}
		if ce.Code != capability.PermissionDenied {
			ce = &capability.Error{Code: capability.Unauthenticated, Message: ce.Message}
		}
		if ce.Code == capability.Unauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="quro"`)
		}
		WriteError(w, Status(ce.Code), ce)
		return controller.Caller{}, false
	}
	caller.Path = path
	return caller, true
}
