package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// HeaderForwardedBy marks a request one node forwarded to another: the
// owner serves it locally, never forwards it again. It carries no
// authority over sessions: the owner authenticates the caller's own
// credential as on any call. With the cluster's forwarding key (Router.
// Key) it is "NODE SIGNATURE", and a request whose header is not signed
// with the key came from outside the cluster and is refused: else it
// would skip placement and the cluster-wide tenant limit of a create
// (docs/security.md).
const HeaderForwardedBy = "Quro-Forwarded-By"

// HeaderForwardedPath is the access path ("mcp", "ws") of a call the
// controller forwarded (Forward): the owner records the call under it.
// Read only on a request whose HeaderForwardedBy is signed, and only a
// short lowercase word (validPath); it labels the record, nothing more.
const HeaderForwardedPath = "Quro-Forwarded-Path"

// validPath: a path name as access paths are named.
func validPath(p string) bool {
	if p == "" || len(p) > 16 {
		return false
	}
	for _, c := range p {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// RetryAfter is what a call to a session whose owner is down is told.
const RetryAfter = "5"

// Table is what the Router reads of the cluster (Cluster is one).
type Table interface {
	Self() string
	// Cached finds a record by ID in the node's table only.
	Cached(id string) (*Session, bool)
	// Lookup finds a record by ID, for a call no one authenticated.
	Lookup(ctx context.Context, id string) (*Session, bool)
	// Resolve finds the record of the session ref (an ID, or a name of
	// tenant's) names for an authenticated caller of tenant, waiting a
	// bounded time for a table that lags the API server.
	Resolve(ctx context.Context, tenant, ref string) (*Session, bool)
	TenantSessions(tenant string) int
	Nodes() []Node
	Node(name string) (Node, bool)
}

// Router sends each call for a session to its owner: the one place where
// every access path (REST, WebSocket, MCP's per-session routes, E2B's,
// preview URLs) names its session over HTTP. Calls for a session of this
// node, and calls that name none, go to Next. Responses stream through
// (ReverseProxy flushes at once; WebSocket upgrades are spliced).
type Router struct {
	Table Table
	Next  http.Handler
	// Auth resolves the caller of a create (the tenant's cluster-wide
	// limit) and of a session named by name; the owner authenticates
	// every forwarded call again.
	Auth httpauth.Func
	// TenantLimit is a tenant's cluster-wide session cap (<= 0: none).
	TenantLimit func(tenant string) int
	// Changed, when set, runs after this node served a create or a
	// destroy, before the response leaves: the node's records are then
	// in the API server when the client sees the new session.
	Changed func(ctx context.Context)
	// TLS, when set, is this node's identity on the node port (NodeTLS):
	// every request to another node goes there over mutual TLS, and a
	// request that carries HeaderForwardedBy is taken from the node port
	// alone (NodePortContext); nil: plain HTTP, for tests of the routing alone.
	TLS *NodeTLS
	// Key, when set, is the cluster's forwarding key (Cluster.ForwardKey):
	// it signs this node's HeaderForwardedBy and checks every one that
	// arrives; a request whose header it did not sign is refused (403).
	Key []byte
	// Used, when set, hears of each call this node's controller ran in
	// one of this node's sessions (Served): the caller was authenticated
	// and the session entered as its own, never for a request alone.
	Used func(id string)
	// Refs, when set, find the session of a request whose path names
	// none: a Host of its own (E2B's PORT-ID.DOMAIN, a preview's). The
	// first that names one wins.
	Refs []func(*http.Request) string
	// MaxBody bounds what is read of a POST /v1/{capability} body to find
	// the session it names (rest.DefaultMaxBody when 0): the REST server's own
	// limit, so that a body the owner would take is never cut here.
	MaxBody int64
	// MaxReply bounds the answer of a call Forward sent, read into
	// memory (maxForwardedReply when 0): a capability's output is
	// budgeted far below it (what a model reads), and a node that sends
	// more is answered as broken.
	MaxReply int64
	// Registry, when set, says which capabilities stream their output
	// (Forward streams those through the owner's /v1/stream).
	Registry *capability.Registry
	// Quiesced, when set, reports a session (by ID) of this node's that
	// is being moved to another (Drainer.Quiesced): a call for it is
	// told 503 with Retry-After, through any node.
	Quiesced func(ref string) bool
	// SignedFiles, when set, reports a request whose session only its
	// signature names (E2B's signed /files URLs under E2B_SANDBOX_URL),
	// and SignedLocal finds which of this node's sessions signed it (""
	// for none): such a request goes to the node whose session signed it,
	// found by asking every live node (HeaderSignedProbe); that node
	// checks the signature again as it serves it.
	SignedFiles func(*http.Request) bool
	SignedLocal func(*http.Request) string
	Logger      *slog.Logger

	once   sync.Once
	proxy  *httputil.ReverseProxy
	client *http.Client // Forward's

	mu      sync.Mutex
	assumed map[string]assumption // by node: see place
	// creating is, by tenant, the creates this node placed that have not
	// answered yet: their records are written when they are done, so the
	// table counts none of them until then (see place).
	creating map[string]int

	fanOuts fanOuts // the audit fan-outs in flight
}

// assumption is how many sessions this node believes a node holds after
// placing one there, until the node's Lease and records can say so. It
// is about one start of the node (acquired, its Lease's acquireTime): a
// node that restarted holds what its new Lease says, not what this node
// placed on its previous start (whose sessions its preStop drain moved
// away).
type assumption struct {
	sessions int
	at       time.Time
	acquired time.Time
}

// assumeFor is how long a placement counts before the table shows it: a
// Lease is renewed and a record reaches every node's informer well
// within it.
const assumeFor = 30 * time.Second

type targetKey struct{}

func (rt *Router) init() {
	rt.once.Do(func() {
		if rt.Logger == nil {
			rt.Logger = slog.New(slog.DiscardHandler)
		}
		// Forward's calls: no timeout of their own (a run lasts as long
		// as its budget; the caller's context ends it), connections kept.
		var tr http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
		if rt.TLS != nil {
			tr = rt.TLS.Transport()
		}
		rt.client = &http.Client{Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		rt.proxy = &httputil.ReverseProxy{
			Transport: tr,
			Rewrite: func(pr *httputil.ProxyRequest) {
				target := pr.In.Context().Value(targetKey{}).(*url.URL)
				pr.SetURL(target)
				pr.Out.Host = pr.In.Host // the owner checks the Host the client named
				if h, _, err := net.SplitHostPort(pr.In.Host); err == nil && net.ParseIP(h) != nil {
					// An address, which this node answered to as its own
					// (rest.Access): the owner's own address means the same
					// to the owner, which would refuse this node's.
					pr.Out.Host = target.Host
				}
				pr.SetXForwarded()
				pr.Out.Header.Set(HeaderForwardedBy, rt.forwardedBy())
			},
			FlushInterval: -1, // streamed runs and event streams as they come
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				rt.Logger.Warn("cluster: forwarding failed", "to", r.Context().Value(targetKey{}), "path", r.URL.Path, "err", err)
				unavailable(w, "the node that owns this session did not answer ("+err.Error()+"); try again shortly")
			},
		}
	})
}

// unavailable answers 503 with Retry-After.
func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", RetryAfter)
	rest.WriteError(w, http.StatusServiceUnavailable, capability.Errorf(capability.Unavailable, "%s", msg))
}

func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt.init()
	if cred := r.Header.Get("Authorization"); cred != "" {
		// A call this request makes that another node owns (Forward) is
		// authenticated there with the caller's own credential.
		r = r.WithContext(controller.WithCredential(r.Context(), cred))
	}
	if _, forwarded := r.Header[http.CanonicalHeaderKey(HeaderForwardedBy)]; forwarded {
		// With TLS, a node's request comes over the node port, from a
		// node whose certificate its Lease pins: on any other it is a
		// client's, whatever its signature.
		if rt.TLS != nil && !fromNode(r) || !rt.signed(r.Header.Values(HeaderForwardedBy)) ||
			rt.TLS != nil && rt.claimed(r) != PeerNode(r) {
			if rt.Auth != nil {
				if _, err := rt.Auth(r); err != nil {
					// No caller at all: this node's answer (401), as
					// without the header.
					r.Header.Del(HeaderForwardedBy)
					rt.Next.ServeHTTP(w, r)
					return
				}
			}
			msg := "%s is set by the cluster's nodes only, on their node port; a client does not send it"
			if fromNode(r) {
				msg = "%s names another node than the one whose certificate sent it"
			}
			rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied, msg, HeaderForwardedBy))
			return
		}
		// Signed by a node: served here, its calls never forwarded again
		// (a record that lags cannot send it back and forth).
		ctx := controller.ServeHere(r.Context())
		if p := r.Header.Get(HeaderForwardedPath); validPath(p) {
			ctx = controller.WithPath(ctx, p)
		}
		r = r.WithContext(ctx)
		if m := r.Header.Get(HeaderSignedProbe); m != "" {
			rt.answerProbe(w, r, m)
			return
		}
		ref, err := rt.ref(r)
		if err != nil {
			badRef(w, err)
			return
		}
		if rt.moving(w, rt.idOf(r, ref)) {
			return
		}
		// Checked: it goes no further. The signature names only the
		// node, so whoever reads it can replay it; the local handler
		// hands a preview's headers on to the box's own web server.
		r.Header.Del(HeaderForwardedBy)
		rt.local(w, r)
		return
	}
	if isCreate(r) {
		rt.create(w, r)
		return
	}
	if isAuditQuery(r) {
		rt.auditFanOut(w, r)
		return
	}
	// A probe is a node's question, answered only under a signed header
	// (above): one a client sent goes no further.
	r.Header.Del(HeaderSignedProbe)
	if rt.SignedFiles != nil && rt.SignedFiles(r) {
		rt.signedFiles(w, r)
		return
	}
	ref, err := rt.ref(r)
	if err != nil {
		badRef(w, err)
		return
	}
	if ref == "" {
		rt.local(w, r)
		return
	}
	s, ok := rt.find(r, ref)
	if !ok || s.Spec.Node == rt.Table.Self() {
		if ok && rt.moving(w, s.Name) {
			return
		}
		// This node's, or nobody's: the local answer is the true one.
		if ok {
			r = r.WithContext(controller.ServeHere(r.Context()))
		}
		rt.local(w, r)
		return
	}
	rt.forward(w, r, s.Spec.Node)
}

// idOf is the ID of the session ref names for r's caller (a name is
// resolved only while sessions are being moved from this node, Quiesced
// being set), else ref.
func (rt *Router) idOf(r *http.Request, ref string) string {
	if ref == "" || rt.Quiesced == nil {
		return ref
	}
	if s, ok := rt.find(r, ref); ok {
		return s.Name
	}
	return ref
}

// find is the record of the session ref names: the node's table's, else
// for an authenticated caller the one its ID or its tenant's name for it
// resolves to (Table.Resolve: read from the API server, or awaited from
// the informer, when the table lags it), else for a call no one
// authenticated here (a preview's, an E2B access token's: the owner
// checks it) the one its ID names (Table.Lookup).
func (rt *Router) find(r *http.Request, ref string) (*Session, bool) {
	if s, ok := rt.Table.Cached(ref); ok {
		return s, true
	}
	if rt.Auth != nil {
		if caller, err := rt.Auth(r); err == nil {
			return rt.Table.Resolve(r.Context(), caller.Tenant, ref)
		}
	}
	return rt.Table.Lookup(r.Context(), ref)
}

// moving answers 503 with Retry-After for a session being moved from
// this node (Quiesced), and reports whether it did.
func (rt *Router) moving(w http.ResponseWriter, ref string) bool {
	if ref == "" || rt.Quiesced == nil || !rt.Quiesced(ref) {
		return false
	}
	unavailable(w, "session "+ref+" is being moved to another node of the cluster; try again in a few seconds")
	return true
}

// forwardedBy is this node's HeaderForwardedBy: its name, signed with
// Key when there is one.
func (rt *Router) forwardedBy() string {
	self := rt.Table.Self()
	if rt.Key == nil {
		return self
	}
	return self + " " + base64.RawURLEncoding.EncodeToString(forwardMAC(rt.Key, self))
}

// forwardMAC is the signature of a node's forwarding header.
func forwardMAC(key []byte, node string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("quro-forwarded-by\x00" + node))
	return m.Sum(nil)
}

// signed reports whether vs, the HeaderForwardedBy values of a request,
// are one header a node of this cluster signed (any one, without Key).
func (rt *Router) signed(vs []string) bool {
	if len(vs) != 1 || vs[0] == "" {
		return false
	}
	if rt.Key == nil {
		return true
	}
	node, sig, ok := strings.Cut(vs[0], " ")
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	return err == nil && hmac.Equal(got, forwardMAC(rt.Key, node))
}

// claimed is the node r's HeaderForwardedBy names: with TLS it must be
// the node whose certificate r came with (PeerNode), as one node may not
// speak as another.
func (rt *Router) claimed(r *http.Request) string {
	node, _, _ := strings.Cut(r.Header.Get(HeaderForwardedBy), " ")
	return node
}

// ref is the session r names: in its path, a header, its Host (Refs) or,
// for POST /v1/{capability}, its body's "session" (bodyRef, whose error
// is the only one).
func (rt *Router) ref(r *http.Request) (string, error) {
	if ref := sessionRef(r); ref != "" {
		return ref, nil
	}
	for _, f := range rt.Refs {
		if ref := f(r); ref != "" {
			return ref, nil
		}
	}
	if isCapabilityPost(r) {
		return rt.bodyRef(r)
	}
	if r.Method == http.MethodGet && r.URL.Path == auditPath {
		return r.URL.Query().Get("session"), nil // its calls are in its owner's log
	}
	if r.Method == http.MethodGet && r.URL.Path == eventsPath {
		// A page that watches one session: its events (the replay ring
		// and the live ones) are on its owner, where a take of its
		// shell holds too.
		return r.URL.Query().Get("replay"), nil
	}
	return "", nil
}

// badRef answers 400 for a request whose session ref could not be read
// as one (ErrDuplicateSession).
func badRef(w http.ResponseWriter, err error) {
	rest.WriteError(w, http.StatusBadRequest, capability.Errorf(capability.InvalidArgument, "%v: send it once", err))
}

// ErrDuplicateSession is the error of a body that names its session
// twice: the route would follow one and the owner's decoder take the
// other, so it is refused (400) before either.
var ErrDuplicateSession = errors.New(`the body names "session" more than once`)

// bodyRef is the top-level "session" of r's JSON body, read whole (at
// most MaxBody bytes) to make sure it names only one: a second member
// whose key is "session" in any case is ErrDuplicateSession (Go's
// decoder on the owner would take the last, in any case, where this
// route follows the first). r.Body is replaced by the same bytes, so
// the node that serves r reads them all as they came. A body that is no
// JSON object, names no session or is too large names none here: the
// local REST server then gives its own answer (400, 413).
func (rt *Router) bodyRef(r *http.Request) (string, error) {
	limit := rt.MaxBody
	if limit <= 0 {
		limit = rest.DefaultMaxBody
	}
	var seen bytes.Buffer
	body := r.Body
	defer func() {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(seen.Bytes()), body), body}
	}()
	dec := json.NewDecoder(io.TeeReader(io.LimitReader(body, limit), &seen))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", nil
	}
	var ref string
	named := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", nil
		}
		if key, _ := tok.(string); strings.EqualFold(key, "session") {
			if named {
				return "", ErrDuplicateSession
			}
			named = true
			if key == "session" {
				if err := dec.Decode(&ref); err != nil {
					return "", nil
				}
				continue
			}
		}
		if err := skipValue(dec); err != nil {
			return "", nil
		}
	}
	return ref, nil
}

// skipValue reads past the next JSON value of dec, token by token.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// local serves r on this node.
func (rt *Router) local(w http.ResponseWriter, r *http.Request) {
	if rt.Changed != nil && (isCreate(r) || isDestroy(r)) {
		rt.serveThenRecord(w, r)
		return
	}
	rt.Next.ServeHTTP(w, r)
}

// create places a new session: here, or forwarded to the node with the
// most headroom.
func (rt *Router) create(w http.ResponseWriter, r *http.Request) {
	tenant := ""
	if rt.Auth != nil {
		caller, err := rt.Auth(r)
		if err != nil {
			rt.Next.ServeHTTP(w, r) // its answer: 401
			return
		}
		tenant = caller.Tenant
	}
	limit := 0
	if rt.TenantLimit != nil {
		limit = rt.TenantLimit(tenant)
	}
	n, err := rt.place(tenant, limit)
	if err == nil {
		defer rt.created(tenant)
	}
	var tl *TenantLimitError
	switch {
	case errors.As(err, &tl):
		rest.WriteError(w, http.StatusTooManyRequests, capability.Errorf(capability.ResourceExhausted, "%s", err.Error()))
		return
	case err != nil:
		unavailable(w, err.Error())
		return
	}
	if n.Name == rt.Table.Self() {
		// Placed: the controller does not place it again (Forward).
		rt.local(w, r.WithContext(controller.ServeHere(r.Context())))
		return
	}
	rt.forward(w, r, n.Name)
}

// place picks a new session's node. The table's counts lag this node's
// own placements (a Lease is renewed on a timer, a record reaches the
// informer after the create answered), and nodes alike in memory differ
// only by count: without its own placements counted, a burst of creates
// through one node would all go to the same node. So a node counts as
// holding at least what this node last believed of it, for assumeFor,
// unless it restarted since (its Lease acquired anew): that floor would
// be the sessions of its previous start, which its drain moved away, and
// the restarted node, the emptiest, would be passed over.
// Likewise a tenant's creates that this node placed count against its
// limit until they have answered (created): a burst of creates at once
// would otherwise all see the count from before any of them.
func (rt *Router) place(tenant string, limit int) (*Node, error) {
	nodes := rt.Table.Nodes()
	now := time.Now()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for i := range nodes {
		if a, ok := rt.assumed[nodes[i].Name]; ok && now.Sub(a.at) < assumeFor && a.acquired.Equal(nodes[i].Acquired) {
			nodes[i].Sessions = max(nodes[i].Sessions, a.sessions)
		}
	}
	n, err := Place(nodes, now, tenant, rt.Table.TenantSessions(tenant)+rt.creating[tenant], limit)
	if err != nil {
		return nil, err
	}
	if rt.creating == nil {
		rt.creating = map[string]int{}
	}
	rt.creating[tenant]++
	if rt.assumed == nil {
		rt.assumed = map[string]assumption{}
	}
	rt.assumed[n.Name] = assumption{sessions: n.Sessions + 1, at: now, acquired: n.Acquired}
	return n, nil
}

// created ends the count of one of tenant's creates that place let
// through: it has answered, and its record (written before the answer)
// is the table's to count.
func (rt *Router) created(tenant string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.creating[tenant]--; rt.creating[tenant] <= 0 {
		delete(rt.creating, tenant)
	}
}

// forward sends r to node, or answers 503 when node is not live.
func (rt *Router) forward(w http.ResponseWriter, r *http.Request, node string) {
	n, ok := rt.Table.Node(node)
	if !ok || !n.Live(time.Now()) {
		unavailable(w, "the node that owns this session ("+node+") is not running; it comes back with its sessions, try again shortly")
		return
	}
	target := &url.URL{Scheme: rt.TLS.scheme("http"), Host: n.Address}
	rt.proxy.ServeHTTP(w, r.WithContext(toNode(context.WithValue(r.Context(), targetKey{}, target), n.Name)))
}

// serveThenRecord serves a create or destroy into a buffer, runs Changed,
// then sends the response: a client that sees a new session's ID finds it
// on every node.
func (rt *Router) serveThenRecord(w http.ResponseWriter, r *http.Request) {
	rec := &held{header: http.Header{}, status: http.StatusOK}
	rt.Next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), recordingKey{}, true)))
	rt.Changed(r.Context())
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// recordingKey marks a request whose records serveThenRecord writes
// (Served leaves them to it).
type recordingKey struct{}

// held is a response kept until its records are written (creates and
// destroys answer a small JSON document).
type held struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (h *held) Header() http.Header { return h.header }
func (h *held) WriteHeader(code int) {
	if !h.wrote {
		h.status, h.wrote = code, true
	}
}
func (h *held) Write(b []byte) (int, error) { h.WriteHeader(http.StatusOK); return h.body.Write(b) }

// eventsPath is the WebSocket of live events (?replay=ID: one session's).
const eventsPath = "/v1/events"

// isCreate: a request that creates a session (REST, its capability
// route, or E2B's).
func isCreate(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	return p == "/v1/sessions" || p == "/v1/create_session" || p == "/e2b/sandboxes"
}

// isDestroy: a request that destroys a session.
func isDestroy(r *http.Request) bool {
	return r.Method == http.MethodDelete && isSessionRoot(r.URL.Path) ||
		r.Method == http.MethodPost && strings.TrimSuffix(r.URL.Path, "/") == "/v1/destroy_session"
}

// isCapabilityPost: POST /v1/{capability}, REST's route for every
// capability, whose session is named in the body.
func isCapabilityPost(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	return ok && name != "" && !strings.Contains(name, "/")
}

// isSessionRoot: /v1/sessions/{id} or /e2b/sandboxes/{id}.
func isSessionRoot(p string) bool {
	for _, pre := range []string{"/v1/sessions/", "/e2b/sandboxes/"} {
		if rest, ok := strings.CutPrefix(p, pre); ok {
			return rest != "" && !strings.Contains(strings.TrimSuffix(rest, "/"), "/")
		}
	}
	return false
}

// sessionRef is the session a request names: its path's
// /v1/sessions/{ref}/..., /e2b/sandboxes/{id}/... or E2B's sandbox
// header; "" for one that names none.
func sessionRef(r *http.Request) string {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id
	}
	p := r.URL.Path
	for _, pre := range []string{"/v1/sessions/", "/e2b/sandboxes/", "/e2b/v2/sandboxes/"} {
		if rest, ok := strings.CutPrefix(p, pre); ok {
			ref, _, _ := strings.Cut(rest, "/")
			if u, err := url.PathUnescape(ref); err == nil {
				return u
			}
			return ref
		}
	}
	return ""
}

// HeaderSignedProbe asks a node, on a request signed with the cluster's
// key (HeaderForwardedBy), which of its sessions signed the signed
// /files URL of the request's path and query, for the method it names
// (GET or POST: a signature covers the operation); the node answers the
// session's ID, or 404. Nothing is served.
const HeaderSignedProbe = "Quro-Signed-Probe"

// probeTimeout bounds a probe of the other nodes for a signed URL.
const probeTimeout = 10 * time.Second

// answerProbe answers a HeaderSignedProbe of another node.
func (rt *Router) answerProbe(w http.ResponseWriter, r *http.Request, method string) {
	if method != http.MethodGet && method != http.MethodPost || rt.SignedLocal == nil {
		http.NotFound(w, r)
		return
	}
	pr := r.Clone(r.Context())
	pr.Method, pr.Body = method, http.NoBody
	id := rt.SignedLocal(pr)
	if id == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, id)
}

// signedFiles serves a signed /files URL that names no session: here
// when one of this node's sessions signed it, else on the node whose
// session did (asked of every other live node at once); a URL no node
// knows gets this node's answer (401).
func (rt *Router) signedFiles(w http.ResponseWriter, r *http.Request) {
	if id := rt.SignedLocal(r); id != "" {
		if rt.moving(w, id) {
			return
		}
		rt.local(w, r.WithContext(controller.ServeHere(r.Context())))
		return
	}
	if node := rt.probe(r); node != "" {
		rt.forward(w, r, node)
		return
	}
	rt.local(w, r)
}

// probe asks every other live node which one's session signed r (see
// HeaderSignedProbe) and returns that node, "" for none.
func (rt *Router) probe(r *http.Request) string {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	now := time.Now()
	found := make(chan string)
	n := 0
	for _, node := range rt.Table.Nodes() {
		if node.Name == rt.Table.Self() || !node.Live(now) {
			continue
		}
		n++
		go func(node Node) {
			u := url.URL{Scheme: rt.TLS.scheme("http"), Host: node.Address, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
			got := ""
			defer func() {
				select {
				case found <- got:
				case <-ctx.Done():
				}
			}()
			req, err := http.NewRequestWithContext(toNode(ctx, node.Name), http.MethodGet, u.String(), nil)
			if err != nil {
				return
			}
			req.Host = r.Host
			req.Header.Set(HeaderForwardedBy, rt.forwardedBy())
			req.Header.Set(HeaderSignedProbe, r.Method)
			resp, err := rt.client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
			if id := string(b); resp.StatusCode == http.StatusOK && validObjectName(id) {
				if s, ok := rt.Table.Lookup(ctx, id); ok && s.Spec.Node == node.Name {
					got = node.Name // the node that answers is the one the record names
				}
			}
		}(node)
	}
	for range n {
		select {
		case name := <-found:
			if name != "" {
				return name
			}
		case <-ctx.Done():
			return ""
		}
	}
	return ""
}
