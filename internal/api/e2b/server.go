package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// The ports of a sandbox the SDKs address: envd and the code interpreter.
const (
	EnvdPort   = 49983
	InterpPort = 49999
)

// EnvdVersion is the envd version the control plane reports for every
// sandbox. The SDKs turn features on and off by it (e2b's
// src/envd/versions.ts), so it names the newest envd whose features Quro
// serves; docs/e2b.md lists them.
const EnvdVersion = "0.6.4"

// Headers the SDKs send with every request to a sandbox when
// E2B_SANDBOX_URL is set (one URL for every sandbox).
const (
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
	headerTraffic     = "E2B-Traffic-Access-Token"
	headerAPIKey      = "X-API-KEY"
)

// maxMessage bounds a Connect request message, after decompression (the
// largest the SDKs send are stdin chunks and paths): connect-go reads and
// decompresses a whole message into the server's memory.
const maxMessage = 4 << 20

// envdHandlerOptions are the options of envd's Connect handlers: the
// message bound, requests the client framed wrongly classified as its
// error, and every streaming call (Start, Connect, StreamInput, WatchDir)
// counted against its token's streams (Options.Streams).
func (s *Server) envdHandlerOptions() []connect.HandlerOption {
	return []connect.HandlerOption{connect.WithReadMaxBytes(maxMessage), connect.WithInterceptors(clientFraming{}, streamHold{s})}
}

// clientFraming turns connect-go's "protocol error" on reading a
// streaming call's request (an envelope cut short, a bad prefix), which
// it codes internal since it cannot tell whose fault it is, into
// invalid_argument: on a server, the request's framing is the client's.
type clientFraming struct{}

func (clientFraming) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (clientFraming) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (clientFraming) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeInternal && clientFramingError(ce.Message()) {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the request's framing: %s", ce.Message()))
		}
		return err
	}
}

// clientFramingError reports whether connect-go's internal error is about
// the request's envelopes: a bad prefix or a cut envelope ("protocol
// error"), or an end-of-stream envelope where a message was due.
func clientFramingError(msg string) bool {
	return strings.HasPrefix(msg, "protocol error:") || strings.HasPrefix(msg, "unmarshal end stream message:")
}

// PathAccess is the access path of every call made through this package,
// as the audit log and the metrics name it.
const PathAccess = "e2b"

// Options configure a Server. Every zero field means the default.
type Options struct {
	// Logger gets the failures that are the server's (nil: discarded).
	Logger *slog.Logger
	// Prefix is the path under which the control plane is served when
	// the request is not routed by host (default "/e2b"): the SDKs keep
	// the path of E2B_API_URL.
	Prefix string
	// Domain, when set, also routes by host: api.DOMAIN is the control
	// plane and PORT-ID.DOMAIN a sandbox's port, as E2B's own hosts.
	Domain string
	// Preview, when set, serves a sandbox's other ports (getHost) through
	// Quro's preview proxy; nil: only envd's and the interpreter's.
	Preview rest.PreviewBackend
	// APIKey names the caller of an API key (X-API-KEY): a Quro token.
	// nil: every caller is the local admin (quro serve --no-auth).
	APIKey func(ctx context.Context, key string) (controller.Caller, error)
	// Sandbox describes the live session id, whatever the caller, or
	// returns an error: one wrapping ErrNoSandbox when there is none
	// (required).
	Sandbox func(ctx context.Context, id string) (Sandbox, error)
	// Secret keys the sandboxes' access tokens (HMAC-SHA256): at least 32
	// random bytes, kept by the server (required).
	Secret []byte
	// Key and Keys, required with APIKey, tie each access token (and so
	// each signed URL made with it) to the API key that obtained it: a
	// token names that key's id, and is refused once the key is revoked.
	// Key is the caller of the live key with id, or an error (unknown,
	// revoked); it is asked at every request with an access token, so it
	// should not query a database each time (quro serve: the token
	// store's cache). Keys lists the ids of tenant's live keys that may
	// run code: a signed URL names no key, so it is checked against the
	// access token of each.
	Key  func(ctx context.Context, id string) (controller.Caller, error)
	Keys func(ctx context.Context, tenant string) ([]string, error)
	// Sandboxes lists every live sandbox with its tenant. With
	// E2B_SANDBOX_URL set, the SDKs' signed URLs (uploadUrl, downloadUrl)
	// are SANDBOX_URL/files?… and name no sandbox: the one whose access
	// token made the signature is found among these. nil: such URLs are
	// answered 404 (domain mode and the E2b-Sandbox-Id header still work).
	Sandboxes func(ctx context.Context) ([]SandboxRef, error)
	// Version is the Quro version that unsupported features name.
	Version string
	// Check refuses a request before anything else is done with it (403),
	// or returns nil: quro serve passes the rest.Access.Check of every
	// other route (a foreign browser Origin, a Host name the server does
	// not answer to), with Hosts(Domain) allowed, so one place decides.
	// nil: that check with nothing else allowed: the server's own origin,
	// loopback names and Hosts(Domain).
	Check func(*http.Request) *capability.Error
	// WatcherIdle ends a polling watcher (CreateWatcher) that was not
	// polled (GetWatcherEvents) for this long (default
	// DefaultWatcherIdle): it is detached from the request that made it,
	// and would otherwise hold its watch until the sandbox ends.
	WatcherIdle time.Duration
	// Streams counts the long requests of the sandbox plane (Long: envd's
	// streams, /files, /execute) against the streams of the API key whose
	// access token (or signed URL) they carry; past its cap one is refused
	// (resource_exhausted, 429). quro serve shares one Limiter with its
	// WebSocket routes and MCP's event streams. nil: no cap; requests
	// without API keys (quro serve --no-auth) are never counted.
	Streams *streamcap.Limiter
	// StreamIdle bounds the silences of a long request (default
	// DefaultStreamIdle, as quro serve's --stream-idle-timeout): its body
	// must send something within it (StreamInput's data or keepalives,
	// an upload's bytes), and each write of its response must be taken
	// within it — a stream's keepalives to a client that is gone fail
	// then, and end it.
	StreamIdle time.Duration
}

// DefaultStreamIdle is Options.StreamIdle's default.
const DefaultStreamIdle = 2 * time.Minute

// ErrNoSandbox is what Options.Sandbox wraps when no live session has the
// id: the sandbox plane answers 502, which the SDKs read as "not running".
var ErrNoSandbox = errors.New("no such sandbox")

// Sandbox is what the sandbox plane needs to know of a session.
type Sandbox struct {
	Tenant string // its owner
	// Paused: the session was paused (pause_session, or a lifetime that
	// ends in a pause). envd's /health answers 502 for it, as E2B's proxy
	// does, so the SDKs' isRunning() is false; any other request resumes
	// it (Quro resumes a paused session on use: E2B's autoResume).
	Paused bool
}

// SandboxRef names a live sandbox and its owner (Options.Sandboxes).
type SandboxRef struct{ ID, Tenant string }

// Server serves the E2B planes. Safe for concurrent use.
type Server struct {
	ctrl *controller.Controller
	opts Options
	log  *slog.Logger

	api    *http.ServeMux // the control plane, paths without the prefix
	envd   *http.ServeMux // a sandbox's envd (port 49983)
	interp *http.ServeMux // a sandbox's code interpreter (port 49999)

	searches chan struct{} // serveSigned's lookups under way (maxSignedSearches)
}

// New returns a Server calling ctrl.
func New(ctrl *controller.Controller, opts *Options) (*Server, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "/e2b"
	}
	o.Prefix = "/" + strings.Trim(o.Prefix, "/")
	o.Domain = strings.Trim(strings.ToLower(o.Domain), ".")
	if o.WatcherIdle <= 0 {
		o.WatcherIdle = DefaultWatcherIdle
	}
	if o.StreamIdle <= 0 {
		o.StreamIdle = DefaultStreamIdle
	}
	if o.Sandbox == nil {
		return nil, errors.New("e2b: Options.Sandbox is required")
	}
	if o.APIKey != nil && (o.Key == nil || o.Keys == nil) {
		return nil, errors.New("e2b: Options.Key and Options.Keys are required with Options.APIKey")
	}
	if len(o.Secret) < 32 {
		return nil, errors.New("e2b: Options.Secret must be at least 32 bytes")
	}
	if o.Check == nil {
		o.Check = rest.Access{Hosts: Hosts(o.Domain)}.Check
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{ctrl: ctrl, opts: o, log: log,
		api: http.NewServeMux(), envd: http.NewServeMux(), interp: http.NewServeMux(),
		searches: make(chan struct{}, maxSignedSearches)}
	s.controlRoutes(s.api)
	s.envdProcessRoutes(s.envd)
	s.envdFSRoutes(s.envd)
	s.interpRoutes(s.interp)
	s.api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.unsupported(w, r.Method+" "+r.URL.Path+" of E2B's API")
	})
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.unsupported(w, r.Method+" "+r.URL.Path+" of envd")
	})
	s.interp.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.unsupported(w, r.Method+" "+r.URL.Path+" of the code interpreter")
	})
	return s, nil
}

// Hosts are the Host names (rest.Access.Hosts) that domain routes to
// E2B's planes, as E2B's own hosts: api.DOMAIN and PORT-ID.DOMAIN. None
// without a domain.
func Hosts(domain string) []string {
	domain = strings.Trim(strings.ToLower(domain), ".")
	if domain == "" {
		return nil
	}
	return []string{"api." + domain, "*." + domain}
}

// plane is where a request goes.
type plane int

const (
	planeNone plane = iota
	planeAPI
	planeSandbox
	// planeSigned: SANDBOX_URL/files with a signature and no sandbox id
	// (E2B_SANDBOX_URL's signed URLs); the signature finds the sandbox.
	planeSigned
)

// target is what a request addresses.
type target struct {
	plane plane
	path  string // the path within the plane
	id    string // the sandbox (planeSandbox)
	port  int    // the sandbox's port (planeSandbox)
	// byHost: routed by its Host, PORT-ID.DOMAIN, a name of the port's
	// own (not by the sandbox headers, on the server's own name).
	byHost bool
}

// route says what r addresses.
func (s *Server) route(r *http.Request) target {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		port, err := strconv.Atoi(r.Header.Get(HeaderSandboxPort))
		if err != nil {
			port = -1
		}
		return target{plane: planeSandbox, path: r.URL.Path, id: id, port: port}
	}
	if s.opts.Domain != "" {
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if host == "api."+s.opts.Domain {
			return target{plane: planeAPI, path: r.URL.Path}
		}
		if label, ok := strings.CutSuffix(host, "."+s.opts.Domain); ok && !strings.Contains(label, ".") {
			if p, id, ok := strings.Cut(label, "-"); ok {
				port, err := strconv.Atoi(p)
				if err != nil {
					port = -1
				}
				return target{plane: planeSandbox, path: r.URL.Path, id: id, port: port, byHost: true}
			}
		}
	}
	if r.URL.Path == "/files" && s.opts.Sandboxes != nil && r.URL.Query().Has("signature") {
		return target{plane: planeSigned, path: r.URL.Path, port: EnvdPort}
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, s.opts.Prefix); ok && (rest == "" || rest[0] == '/') {
		if rest == "" {
			rest = "/"
		}
		return target{plane: planeAPI, path: rest}
	}
	return target{}
}

// HostSandbox is the sandbox r names by its Host (PORT-ID.DOMAIN), ""
// for none: a cluster node forwards such a request to the sandbox's
// owner (the header form and the /e2b/sandboxes paths name theirs where
// any router finds them).
func (s *Server) HostSandbox(r *http.Request) string {
	if t := s.route(r); t.plane == planeSandbox && t.byHost {
		return t.id
	}
	return ""
}

// Match reports whether r is for this server (quro serve sends it here
// before its own routes).
func (s *Server) Match(r *http.Request) bool { return s.route(r).plane != planeNone }

// Long reports the requests that may last as long as their client wants:
// the server streams (Connect server streams, /execute) and uploads. The
// HTTP server's write timeout does not apply to them.
func (s *Server) Long(r *http.Request) bool {
	t := s.route(r)
	return (t.plane == planeSandbox || t.plane == planeSigned) && longPath(t.path)
}

// longPath reports the sandbox plane's long requests (Long).
func longPath(path string) bool {
	switch path {
	case "/execute", "/files",
		"/process.Process/Start", "/process.Process/Connect",
		"/process.Process/StreamInput", "/filesystem.Filesystem/WatchDir":
		return true
	}
	return false
}

// Authenticated reports whether r carries a valid credential: an access
// token of the sandbox it addresses, or an API key. Connections that sent
// one are not evicted for unauthenticated ones (connlimit).
func (s *Server) Authenticated(r *http.Request) bool {
	t := s.route(r)
	switch t.plane {
	case planeAPI:
		if s.opts.APIKey == nil {
			return true
		}
		key := apiKey(r)
		if key == "" {
			return false
		}
		_, err := s.opts.APIKey(r.Context(), key)
		return err == nil
	case planeSandbox:
		if !validID(t.id) {
			return false
		}
		sb, err := s.opts.Sandbox(r.Context(), t.id)
		if err != nil {
			return false
		}
		_, ok := s.tokenKey(t.id, sb.Tenant, r)
		return ok
	}
	return false
}

// ServeHTTP serves a request Match accepted. Options.Check comes first,
// on every plane, with or without API keys: E2B's SDKs send no Origin; a
// browser sends its page's with every cross-origin POST.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e := s.opts.Check(r); e != nil {
		writeJSONError(w, http.StatusForbidden, e.Message)
		return
	}
	t := s.route(r)
	switch t.plane {
	case planeAPI:
		s.serveAPI(w, r, t)
	case planeSandbox:
		s.serveSandbox(w, r, t)
	case planeSigned:
		s.serveSigned(w, r, t)
	default:
		writeJSONError(w, http.StatusNotFound, "not an E2B request")
	}
}

func apiKey(r *http.Request) string {
	if k := r.Header.Get(headerAPIKey); k != "" {
		return strings.TrimSpace(k)
	}
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, t target) {
	caller := controller.Caller{Scope: capability.ScopeAdmin}
	if s.opts.APIKey != nil {
		key := apiKey(r)
		if key == "" {
			writeJSONError(w, http.StatusUnauthorized, "an API key is required: set E2B_API_KEY to a Quro token (quro token create)")
			return
		}
		c, err := s.opts.APIKey(r.Context(), key)
		if err != nil {
			writeJSONError(w, http.StatusUnauthorized, "invalid API key: "+messageOf(err))
			return
		}
		caller = c
	}
	caller.Path = PathAccess
	r2 := r.Clone(withCaller(r.Context(), caller))
	r2.URL.Path = t.path
	r2.URL.RawPath = ""
	s.api.ServeHTTP(w, r2)
}

// validID: Quro session ids are 32 lowercase hex digits; anything else
// names no sandbox (and never reaches a lookup).
func validID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, t target) {
	// E2B's proxy answers 502 for a sandbox that is not running; the
	// SDKs read 502 as "the sandbox is gone" (isRunning() false, a
	// broken stream becomes "the sandbox was killed").
	if !validID(t.id) {
		// The id is the client's, of any length: the answer shows its start.
		show := t.id
		if len(show) > 64 {
			show = show[:64] + "…"
		}
		writeJSONError(w, http.StatusBadGateway, "sandbox not found: "+strconv.Quote(show)+" is not a sandbox id")
		return
	}
	sb, err := s.opts.Sandbox(r.Context(), t.id)
	if errors.Is(err, ErrNoSandbox) {
		writeJSONError(w, http.StatusBadGateway, "sandbox "+t.id+" not found (killed, timed out, or never made)")
		return
	}
	if err != nil {
		// Not "gone": the SDKs would report a killed sandbox.
		s.log.Error("e2b: looking up a sandbox", "sandbox", t.id, "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "the server could not look the sandbox up; try again")
		return
	}
	if sb.Paused && t.path == "/health" {
		writeJSONError(w, http.StatusBadGateway, "sandbox "+t.id+" is paused: connect resumes it (as does any other request to it)")
		return
	}
	tenant := sb.Tenant
	var mux *http.ServeMux
	switch t.port {
	case EnvdPort:
		mux = s.envd
	case InterpPort:
		mux = s.interp
	default:
		s.servePort(w, r, t, tenant)
		return
	}
	open := t.port == EnvdPort && t.path == "/health" || t.port == InterpPort && t.path == "/health"
	key, ok := s.tokenKey(t.id, tenant, r)
	// A signed URL covers its path and operation only: /files reads and
	// writes that one path (the path parameter, which a signed request
	// must have).
	if !ok && t.port == EnvdPort && t.path == "/files" && r.URL.Query().Get("path") != "" {
		if _, expired, _ := parseSigned(r); expired {
			writeJSONError(w, http.StatusUnauthorized, "signature is already expired")
			return
		}
		key, ok = s.signatureKey(t.id, tenant, r)
	}
	if !open && !ok {
		writeJSONError(w, http.StatusUnauthorized,
			"this sandbox needs its access token (X-Access-Token: the envdAccessToken that create and connect return) or a signed URL")
		return
	}
	// The API key whose access token (or signed URL) the request carries
	// is the token that made the call: the audit log names it, and the
	// long requests count against its streams.
	caller := controller.Caller{Path: PathAccess, Tenant: tenant, TokenID: key, Scope: capability.ScopeExec, Session: t.id}
	if longPath(t.path) {
		release, refused := s.holdHTTP(w, caller, t)
		if refused {
			return
		}
		defer release()
		w, r = s.idleBounded(w, r)
	}
	r2 := r.Clone(withCaller(r.Context(), caller))
	r2.URL.Path = t.path
	r2.URL.RawPath = ""
	mux.ServeHTTP(w, r2)
}

// servePort serves a request to another port of the sandbox (getHost's
// PORT-ID.DOMAIN) through Quro's preview proxy (Options.Preview): with
// the sandbox's access token, as E2B's trafficAccessToken in the
// E2B-Traffic-Access-Token header (or X-Access-Token), never forwarded to
// the box. E2B's public traffic (create's network.allowPublicTraffic) is
// served with no token on the port's own name (PORT-ID.DOMAIN) alone,
// never through the sandbox headers on the server's own name.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, t target, tenant string) {
	if s.opts.Preview == nil {
		writeJSONError(w, http.StatusBadGateway, fmt.Sprintf(
			"port %d of sandbox %s: Quro %s serves only envd (%d) and the code interpreter (%d) here: this server forwards no other port (getHost)",
			t.port, t.id, s.version(), EnvdPort, InterpPort))
		return
	}
	if !(t.byHost && s.opts.Preview.PreviewPublic(r.Context(), t.id, t.port)) {
		key, ok := s.tokenKey(t.id, tenant, r)
		if !ok {
			writeJSONError(w, http.StatusUnauthorized, fmt.Sprintf(
				"port %d of sandbox %s needs the sandbox's traffic access token: send header %s with the trafficAccessToken that create and connect return (sandbox.trafficAccessToken); only a sandbox created with network.allowPublicTraffic true, on a server that allows public previews, answers without it",
				t.port, t.id, headerTraffic))
			return
		}
		caller := controller.Caller{Path: PathAccess, Tenant: tenant, TokenID: key, Scope: capability.ScopeExec}
		if err := s.opts.Preview.PreviewByCaller(r.Context(), caller, t.id, t.port); err != nil {
			ce := controller.Classify(err)
			writeJSONError(w, rest.Status(ce.Code), ce.Message)
			return
		}
	}
	r2 := r.Clone(r.Context())
	r2.Header.Del(headerTraffic)
	r2.Header.Del(headerAccessToken)
	rest.ProxyPreview(w, r2, s.opts.Preview, t.id, t.port, "/", s.log)
}

// AccessToken is sandbox id's access token on a server without API keys:
// the SDKs send it as X-Access-Token to envd and as
// E2B-Traffic-Access-Token to the code interpreter. It is derived
// (HMAC-SHA256 of the id under the server's secret), so nothing is stored
// and it dies with the secret.
func (s *Server) AccessToken(id string) string {
	m := hmac.New(sha256.New, s.opts.Secret)
	m.Write([]byte("quro e2b access token\x00" + id))
	return "qa_" + hex.EncodeToString(m.Sum(nil))
}

// KeyAccessToken is sandbox id's access token for the API key with id
// key (a Quro token's id): qa_<HMAC-SHA256 of both under the secret>_<key>.
// It is good while the key is live, so it dies with the key's revocation
// as with the secret. The MAC comes first: the audit log's redaction of
// qa_<hex> then hides it and leaves the key's id.
func (s *Server) KeyAccessToken(id, key string) string {
	m := hmac.New(sha256.New, s.opts.Secret)
	m.Write([]byte("quro e2b access token\x00" + id + "\x00" + key))
	return "qa_" + hex.EncodeToString(m.Sum(nil)) + "_" + key
}

// tokenKey checks the access token r carries for sandbox id of tenant:
// with API keys, one of a live key of tenant that may run code, whose id
// it returns (without API keys, "").
func (s *Server) tokenKey(id, tenant string, r *http.Request) (key string, ok bool) {
	tok := r.Header.Get(headerAccessToken)
	if tok == "" {
		tok = r.Header.Get(headerTraffic)
	}
	if tok == "" || !validID(id) {
		return "", false
	}
	if s.opts.APIKey == nil {
		return "", subtle.ConstantTimeCompare([]byte(tok), []byte(s.AccessToken(id))) == 1
	}
	_, key, ok = strings.Cut(strings.TrimPrefix(tok, "qa_"), "_")
	if !ok || key == "" || !strings.HasPrefix(tok, "qa_") ||
		subtle.ConstantTimeCompare([]byte(tok), []byte(s.KeyAccessToken(id, key))) != 1 {
		return "", false
	}
	if !s.keyOK(r.Context(), key, tenant) {
		return "", false
	}
	return key, true
}

// keyOK reports whether the API key with id key is live, of tenant and may
// run code. A failure to look it up refuses (and is logged).
func (s *Server) keyOK(ctx context.Context, key, tenant string) bool {
	c, err := s.opts.Key(ctx, key)
	if err != nil {
		var ce *capability.Error
		if !errors.As(err, &ce) && ctx.Err() == nil {
			s.log.Error("e2b: looking up the API key of an access token", "key", key, "err", err)
		}
		return false
	}
	return c.Tenant == tenant && c.Scope.Covers(capability.ScopeExec)
}

// signedURL is what a signed /files URL (the SDK's uploadUrl and
// downloadUrl) claims: signature = "v1_" + base64(sha256(raw + ":" +
// token)) without padding, raw "path:op:user", op "read" for GET and
// "write" for POST, and ":" + signature_expiration (unix seconds) after
// the token when the URL expires.
type signedURL struct {
	sig, raw, exp string
}

// parseSigned reads r's signature. ok is false without a well-formed one
// or without the path parameter it covers; expired reports a
// signature_expiration that is past (E2B answers that apart).
func parseSigned(r *http.Request) (u signedURL, expired, ok bool) {
	q := r.URL.Query()
	u.sig, u.exp = q.Get("signature"), q.Get("signature_expiration")
	if len(u.sig) != len("v1_")+base64.RawStdEncoding.EncodedLen(sha256.Size) || !strings.HasPrefix(u.sig, "v1_") ||
		q.Get("path") == "" {
		return u, false, false
	}
	if u.exp != "" {
		n, err := strconv.ParseInt(u.exp, 10, 64)
		if err != nil {
			return u, false, false
		}
		if time.Now().Unix() > n {
			return u, true, false
		}
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	u.raw = q.Get("path") + ":" + op + ":" + q.Get("username")
	return u, false, true
}

// by reports whether the access token token made the signature.
func (u signedURL) by(token string) bool {
	raw := u.raw + ":" + token
	if u.exp != "" {
		raw += ":" + u.exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(u.sig), []byte(want)) == 1
}

// signatureKey checks a signed /files URL (signedURL) for sandbox id of
// tenant. token is the access token the SDK signed with: with API keys,
// that of one of tenant's live keys that may run code (the URL names none:
// each is tried, and the one that signed it is returned), so a URL dies
// with the key, as its token does.
func (s *Server) signatureKey(id, tenant string, r *http.Request) (key string, ok bool) {
	u, _, ok := parseSigned(r)
	if !ok {
		return "", false
	}
	keys, err := s.signingKeys(r.Context(), tenant)
	if err != nil {
		return "", false
	}
	return s.signedBy(u, id, keys)
}

// signingKeys are the ids of tenant's keys whose access tokens may sign
// (nil without API keys: the sandbox's one token).
func (s *Server) signingKeys(ctx context.Context, tenant string) ([]string, error) {
	if s.opts.APIKey == nil {
		return nil, nil
	}
	keys, err := s.opts.Keys(ctx, tenant)
	if err != nil && ctx.Err() == nil {
		s.log.Error("e2b: listing the API keys of a signed URL's tenant", "tenant", tenant, "err", err)
	}
	return keys, err
}

// signedBy reports whether u was signed with sandbox id's access token:
// that of one of keys with API keys (the key returned), the only one
// without.
func (s *Server) signedBy(u signedURL, id string, keys []string) (key string, ok bool) {
	if s.opts.APIKey == nil {
		return "", u.by(s.AccessToken(id))
	}
	for _, key := range keys {
		if u.by(s.KeyAccessToken(id, key)) {
			return key, true
		}
	}
	return "", false
}

// serveSigned serves SANDBOX_URL/files?…&signature=…: with
// E2B_SANDBOX_URL the SDKs' signed URLs name no sandbox (a browser or
// curl given one sends no E2b-Sandbox-Id). The sandbox is the live one
// whose access token made the signature — the same check as with an id,
// tried against each sandbox, so a URL opens only the sandbox, path and
// operation it was signed for. At most maxSignedSearches run at once.
func (s *Server) serveSigned(w http.ResponseWriter, r *http.Request, t target) {
	u, expired, ok := parseSigned(r)
	if expired {
		writeJSONError(w, http.StatusUnauthorized, "signature is already expired")
		return
	}
	if !ok {
		writeJSONError(w, http.StatusUnauthorized,
			"a signed /files URL needs its path, a v1_ signature and, if it expires, a numeric signature_expiration: make it with the SDK's downloadUrl or uploadUrl")
		return
	}
	select {
	case s.searches <- struct{}{}:
		defer func() { <-s.searches }()
	case <-r.Context().Done():
		return
	}
	id, err := s.signer(r.Context(), u)
	if r.Context().Err() != nil {
		return // the client went away
	}
	if err != nil {
		s.log.Error("e2b: listing the sandboxes for a signed URL", "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "the server could not look the sandboxes up; try again")
		return
	}
	if id != "" {
		t.plane, t.id = planeSandbox, id
		s.serveSandbox(w, r, t)
		return
	}
	writeJSONError(w, http.StatusUnauthorized,
		"invalid signature: no live sandbox's access token made it (a signed URL dies with its sandbox and its API key); make a new one with downloadUrl or uploadUrl")
}

// signer is the live sandbox whose access token made u ("" for none).
func (s *Server) signer(ctx context.Context, u signedURL) (string, error) {
	sbs, err := s.opts.Sandboxes(ctx)
	if err != nil {
		return "", err
	}
	keys := map[string][]string{}
	for _, sb := range sbs {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		k, seen := keys[sb.Tenant]
		if !seen {
			k, _ = s.signingKeys(ctx, sb.Tenant)
			keys[sb.Tenant] = k
		}
		if _, ok := s.signedBy(u, sb.ID, k); ok {
			return sb.ID, nil
		}
	}
	return "", nil
}

// SignedFiles reports whether r is a signed /files URL that names no
// sandbox (E2B_SANDBOX_URL's uploadUrl and downloadUrl): only its
// signature tells whose it is.
func (s *Server) SignedFiles(r *http.Request) bool { return s.route(r).plane == planeSigned }

// SignedSandbox is the sandbox of this server whose access token made
// the signature of r, a signed /files URL (SignedFiles), or "" for none
// (expired, malformed, or another server's). A cluster node that holds
// none asks the others, then forwards r to the one that does, which
// checks the signature again as it serves it (serveSigned).
func (s *Server) SignedSandbox(r *http.Request) string {
	if !s.SignedFiles(r) {
		return ""
	}
	u, _, ok := parseSigned(r)
	if !ok {
		return ""
	}
	select {
	case s.searches <- struct{}{}:
		defer func() { <-s.searches }()
	case <-r.Context().Done():
		return ""
	}
	id, _ := s.signer(r.Context(), u) // an error: none found here
	return id
}

// maxSignedSearches bounds the signed URLs without a sandbox id being
// looked up at once (serveSigned): each tries every live sandbox.
const maxSignedSearches = 4

type callerKey struct{}

func withCaller(ctx context.Context, c controller.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// callerOf is the caller this package resolved for the request of ctx.
func callerOf(ctx context.Context) controller.Caller {
	c, _ := ctx.Value(callerKey{}).(controller.Caller)
	return c
}

// sandboxOf is the sandbox (session id) a sandbox-plane request addresses.
func sandboxOf(ctx context.Context) string { return callerOf(ctx).Session }

// invoke calls capability name with in, a value of its input type (an
// internal/app input struct), as the request's caller, and returns its
// output, the handler's own value: no JSON between them. An output of
// another type than Out (the capability changed and this package did not)
// is an internal error, as is none. A failure is a *capability.Error.
func invoke[Out any](ctx context.Context, s *Server, name string, in any) (Out, error) {
	var zero Out
	reply, err := s.ctrl.Invoke(ctx, callerOf(ctx), name, in)
	if err != nil {
		return zero, err
	}
	out, ok := reply.Output.(Out)
	if !ok {
		return zero, capability.Errorf(capability.Internal, "%s answered %T; the E2B access path reads %T", name, reply.Output, zero)
	}
	if v := reflect.ValueOf(reply.Output); v.Kind() == reflect.Pointer && v.IsNil() {
		return zero, capability.Errorf(capability.Internal, "%s answered nothing (a nil %T)", name, zero)
	}
	return out, nil
}

// user is the envd user a request names (Authorization: Basic
// base64("user:")), "" when it names none.
func user(r *http.Request) string {
	u, _, ok := r.BasicAuth()
	if !ok {
		return ""
	}
	return u
}

func (s *Server) version() string {
	if s.opts.Version == "" {
		return "(unknown version)"
	}
	return s.opts.Version
}

// jsonCall refuses, before h, a state-changing call whose body is not
// labelled JSON (415): the SDKs send application/json with a body and no
// Content-Type without one. A body labelled text/plain, a form or
// nothing is what a page of another site may send without the browser
// asking first (a CORS preflight), so it never reaches h, whatever the
// Origin check made of the request.
func jsonCall(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if msg := notJSONBody(r); msg != "" {
			drain(r)
			writeJSONError(w, http.StatusUnsupportedMediaType, msg)
			return
		}
		h(w, r)
	}
}

// notJSONBody says why r's body is not labelled JSON, or "" when it is
// (application/json, with parameters such as charset) or there is none.
func notJSONBody(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if r.ContentLength == 0 || r.ContentLength < 0 && emptyBody(r) {
			return ""
		}
		return "a request body needs Content-Type: application/json"
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return ""
	}
	return "Content-Type " + strconv.Quote(ct) + ": send the body as application/json"
}

// emptyBody reads a body of unknown length to its first byte: it is
// empty when there is none. A body that is not is refused, never read
// further.
func emptyBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	var b [1]byte
	n, _ := io.ReadFull(r.Body, b[:])
	return n == 0
}

// drain reads what is left of a request body, bounded, so that the
// connection can be reused.
func drain(r *http.Request) {
	_, _ = io.CopyN(io.Discard, r.Body, 64<<10)
}
