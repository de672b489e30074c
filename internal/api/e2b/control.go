package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
)

// The control plane: E2B's REST API (E2B_API_URL), sandboxes' lifecycle.
// A sandbox is a Quro session of the caller's tenant (the API key's): every
// operation is a capability call as that caller, so tenancy, scopes,
// limits and the audit log are the controller's as on every access path.
//
// Mapping, in short (docs/e2b.md has the matrix):
//   - templateID code-interpreter-v1 (and E2B's other code-interpreter
//     names) is the rootfs code-interpreter when it is installed (quro
//     rootfs install code-interpreter: numpy, pandas, matplotlib, …),
//     else the default userland; base and desktop are the default
//     userland; another name is the installed rootfs of that name.
//   - timeout is the session's lifetime (set_session_timeout); autoPause
//     makes its end a pause instead of a destroy. connect and refreshes only
//     extend a lifetime, setTimeout sets it, a pause removes it (a paused
//     sandbox waits, as on E2B, until it is resumed or killed).
//   - allow_internet_access true or absent (E2B's default) is network
//     policy "internet"; absent falls back to "none" when the operator's
//     maximum is none; false is "none". network.allowOut and denyOut are
//     Quro's allow_out and deny_out (e2bRules: E2B's allow wins over its
//     deny, Quro's deny wins, so the lists are translated); PUT
//     /sandboxes/{id}/network is set_session_network.
//   - a session with no lifetime (made through Quro's own API) has endAt
//     9999-12-31T23:59:59Z.

// clientID is what the control plane answers for E2B's deprecated clientID.
const clientID = "quro"

// neverEnds is endAt of a session with no lifetime.
var neverEnds = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// defaultTemplates are the names of E2B's own templates: Quro's default
// userland stands for them.
var defaultTemplates = []string{"base", "code-interpreter-v1", "code-interpreter", "code-interpreter-beta", "desktop"}

// codeInterpreterTemplates run on the rootfs of that name when it is
// installed: E2B's code-interpreter template has the data packages.
var codeInterpreterTemplates = []string{"code-interpreter-v1", "code-interpreter", "code-interpreter-beta"}

// codeInterpreterRootfs is the rootfs they run on (rootfs.CodeInterpreter).
const codeInterpreterRootfs = "code-interpreter"

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// listLimit is the default and the largest page of a list.
const listLimit = 100

// controlRoutes serves E2B's control plane (the REST API of
// E2B_API_URL): sandboxes' lifecycle. Every call that changes something
// takes a JSON body or none (jsonCall).
func (s *Server) controlRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /sandboxes", jsonCall(s.createSandbox(false)))
	m.HandleFunc("POST /v2/sandboxes", jsonCall(s.createSandbox(true)))
	m.HandleFunc("GET /sandboxes", s.listSandboxes(false))
	m.HandleFunc("GET /v2/sandboxes", s.listSandboxes(true))
	m.HandleFunc("GET /sandboxes/{id}", s.withSandbox(s.getSandbox))
	m.HandleFunc("DELETE /sandboxes/{id}", jsonCall(s.withSandbox(s.killSandbox)))
	m.HandleFunc("POST /sandboxes/{id}/timeout", jsonCall(s.withSandbox(s.setTimeout)))
	m.HandleFunc("POST /sandboxes/{id}/refreshes", jsonCall(s.withSandbox(s.refresh)))
	m.HandleFunc("POST /sandboxes/{id}/connect", jsonCall(s.withSandbox(s.connectSandbox)))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", jsonCall(s.withSandbox(s.connectSandbox)))
	m.HandleFunc("POST /sandboxes/{id}/pause", jsonCall(s.withSandbox(s.pauseSandbox)))
	m.HandleFunc("POST /sandboxes/{id}/resume", jsonCall(s.withSandbox(s.resumeSandbox)))
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.withSandbox(s.sandboxMetrics))
	m.HandleFunc("GET /sandboxes/metrics", s.manyMetrics)
	m.HandleFunc("POST /sandboxes/{id}/fork", jsonCall(s.withSandbox(s.forkSandbox)))
	m.HandleFunc("PUT /sandboxes/{id}/network", jsonCall(s.withSandbox(s.updateNetwork)))

	for pattern, feature := range map[string]string{
		"GET /sandboxes/{id}/logs":       "sandbox logs (E2B's envd system log; Quro's audit log has the calls: quro audit)",
		"GET /v2/sandboxes/{id}/logs":    "sandbox logs (E2B's envd system log; Quro's audit log has the calls: quro audit)",
		"POST /sandboxes/{id}/snapshots": "snapshots as templates (Quro has snapshot_session and fork_session, which E2B's templates do not map onto)",
		"GET /snapshots":                 "listing snapshots as templates",
		"/templates":                     "templates (Quro's are rootfs names: quro rootfs install)",
		"/templates/":                    "templates (Quro's are rootfs names: quro rootfs install)",
		"/v2/templates":                  "templates (Quro's are rootfs names: quro rootfs install)",
		"/v2/templates/":                 "templates (Quro's are rootfs names: quro rootfs install)",
		"/v3/templates":                  "templates (Quro's are rootfs names: quro rootfs install)",
		"/v3/templates/":                 "templates (Quro's are rootfs names: quro rootfs install)",
		"/volumes":                       "volumes",
		"/volumes/":                      "volumes",
		"/volumecontent/":                "volumes",
		"/secrets":                       "secrets",
		"/secrets/":                      "secrets",
		"/teams/":                        "team metrics",
	} {
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			drain(r)
			s.unsupported(w, feature)
		})
	}
}

// sandboxJSON is E2B's Sandbox (create and connect answer it).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedJSON is E2B's ListedSandbox.
type listedJSON struct {
	SandboxID    string            `json:"sandboxID"`
	TemplateID   string            `json:"templateID"`
	ClientID     string            `json:"clientID"`
	Metadata     map[string]string `json:"metadata"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	State        string            `json:"state"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int               `json:"memoryMB"`
	DiskSizeMB   int               `json:"diskSizeMB"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []struct{}        `json:"volumeMounts"`
}

// detailJSON is E2B's SandboxDetail.
type detailJSON struct {
	listedJSON
	EnvdAccessToken     string        `json:"envdAccessToken"`
	Domain              *string       `json:"domain"`
	AllowInternetAccess bool          `json:"allowInternetAccess"`
	Lifecycle           lifecycleJSON `json:"lifecycle"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"` // kill or pause
	AutoResume bool   `json:"autoResume"`
}

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// template is the E2B template of session x: its rootfs, or base for
// the default userland.
func template(x *app.SessionInfo) string {
	if x.Rootfs == "" {
		return "base"
	}
	return x.Rootfs
}

func endAt(x *app.SessionInfo) time.Time {
	if x.ExpiresAt == nil {
		return neverEnds
	}
	return x.ExpiresAt.UTC()
}

func cpuCount(x *app.SessionInfo) int {
	if x.Resources == nil || x.Resources.CPUPercentLimit == 0 {
		return 1
	}
	return max(1, int(math.Ceil(float64(x.Resources.CPUPercentLimit)/100)))
}

// listed is session x as E2B's ListedSandbox.
func listed(x *app.SessionInfo) listedJSON {
	l := listedJSON{SandboxID: x.ID, TemplateID: template(x), ClientID: clientID, Metadata: x.Metadata,
		StartedAt: x.CreatedAt.UTC(), EndAt: endAt(x), State: x.SessionState, CPUCount: cpuCount(x),
		EnvdVersion: EnvdVersion, VolumeMounts: []struct{}{}}
	if l.Metadata == nil {
		l.Metadata = map[string]string{}
	}
	if r := x.Resources; r != nil {
		l.MemoryMB = int(r.MemoryLimit >> 20)
		l.DiskSizeMB = int(r.DiskLimit >> 20)
	}
	return l
}

func (s *Server) domain() *string {
	if s.opts.Domain == "" {
		return nil
	}
	d := s.opts.Domain
	return &d
}

// accessToken is sandbox id's access token for the request's caller: only
// a caller that may run code (exec scope) gets it, since the token lets
// its holder run code in the sandbox; a read-only key sees "" (the SDK
// then sends none, and envd refuses). With API keys it is tied to the
// caller's key (KeyAccessToken): revoking the key ends it.
func (s *Server) accessToken(ctx context.Context, id string) string {
	c := callerOf(ctx)
	if !c.Scope.Covers(capability.ScopeExec) {
		return ""
	}
	if s.opts.APIKey == nil {
		return s.AccessToken(id)
	}
	if c.TokenID == "" {
		return "" // no key to tie it to (never with API keys)
	}
	return s.KeyAccessToken(id, c.TokenID)
}

func (s *Server) sandbox(ctx context.Context, id, template string) sandboxJSON {
	tok := s.accessToken(ctx, id)
	return sandboxJSON{SandboxID: id, TemplateID: template, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: tok, TrafficAccessToken: tok, Domain: s.domain()}
}

// readBody decodes the JSON body of r into v; an empty body leaves v as
// it is.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over %d bytes", maxBody))
		return false
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return true
	}
	if err := json.Unmarshal(b, v); err != nil {
		writeJSONError(w, http.StatusBadRequest, "the request body is not the JSON this endpoint takes: "+err.Error())
		return false
	}
	return true
}

// newSandboxBody is E2B's NewSandbox and NewSandboxV2.
type newSandboxBody struct {
	TemplateID          string                  `json:"templateID"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           bool                    `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *struct {
		AllowOut           []string        `json:"allowOut"`
		DenyOut            []string        `json:"denyOut"`
		AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
		MaskRequestHost    string          `json:"maskRequestHost"`
		Rules              json.RawMessage `json:"rules"`
		EgressProxy        json.RawMessage `json:"egressProxy"`
		HTTPSPorts         []int           `json:"httpsPorts"`
	} `json:"network"`
	IAM json.RawMessage `json:"iam"`
	// MCP is not read: E2B's API only records it, and the SDK itself
	// starts the gateway in the box (mcp-gateway, run as root), failing
	// and killing the sandbox where the userland lacks it, as on E2B's
	// base template.
	MCP          json.RawMessage   `json:"mcp"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

func present(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return t != "" && t != "null" && t != "{}" && t != "[]"
}

// unsupportedCreate names the first option of b Quro cannot honour.
func unsupportedCreate(b *newSandboxBody) string {
	if n := b.Network; n != nil {
		switch {
		case present(n.Rules):
			return "network.rules (per-destination transforms; Quro's rules are network.allowOut and denyOut)"
		case n.MaskRequestHost != "":
			return "network.maskRequestHost"
		case present(n.EgressProxy):
			return "network.egressProxy"
		case len(n.HTTPSPorts) > 0:
			return "network.httpsPorts (Quro does not forward a sandbox's ports)"
		}
	}
	switch {
	case present(b.IAM):
		return "workload identity (iam)"
	case len(b.VolumeMounts) > 0:
		return "volumes (volumeMounts)"
	}
	return ""
}

func (s *Server) createSandbox(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var b newSandboxBody
		if !readBody(w, r, &b) {
			return
		}
		if b.TemplateID == "" {
			writeJSONError(w, http.StatusBadRequest, "templateID is required: base (or code-interpreter-v1) is Quro's default userland; another name is an installed rootfs")
			return
		}
		if f := unsupportedCreate(&b); f != "" {
			s.unsupported(w, f)
			return
		}
		// E2B's defaults: 15 s for v1, 300 s for v2 (the SDKs always send one).
		def := int64(defaultLifetime)
		if v2 {
			def = 300
		}
		timeout, ok := lifetime(w, b.Timeout, def, "the sandbox's lifetime")
		if !ok {
			return
		}
		in := app.CreateSessionInput{TimeoutS: timeout, Metadata: b.Metadata, Env: b.EnvVars}
		if b.AutoPause {
			in.OnTimeout = "pause"
		}
		preferred := slices.Contains(codeInterpreterTemplates, b.TemplateID)
		switch {
		case preferred:
			in.Rootfs = codeInterpreterRootfs
		case !slices.Contains(defaultTemplates, b.TemplateID):
			in.Rootfs = b.TemplateID
		}
		var allowOut, denyOut []string
		if b.Network != nil {
			allowOut, denyOut = b.Network.AllowOut, b.Network.DenyOut
		}
		in.Network, in.AllowOut, in.DenyOut = e2bRules(b.AllowInternetAccess, allowOut, denyOut)
		// E2B's public traffic: every port answers getHost's name with
		// no traffic token (where the operator allows public previews;
		// otherwise create_session refuses, 403, naming the flag).
		in.PublicPreviews = b.Network != nil && b.Network.AllowPublicTraffic != nil && *b.Network.AllowPublicTraffic
		create := func() (*app.SessionInfo, error) {
			out, err := invoke[*app.SessionInfo](r.Context(), s, "create_session", in)
			if err != nil && preferred && in.Rootfs != "" && asCapError(err).Code == capability.NotFound {
				// The data userland is not installed: the default one
				// stands for the template, as for base.
				in.Rootfs = ""
				out, err = invoke[*app.SessionInfo](r.Context(), s, "create_session", in)
			}
			return out, err
		}
		out, err := create()
		if err != nil && b.AllowInternetAccess == nil && b.Network == nil && asCapError(err).Code == capability.PermissionDenied && strings.Contains(err.Error(), "network policy") {
			// E2B's default asks for the internet; where the operator
			// allows no network, the default is what the server allows.
			in.Network = "none"
			out, err = create()
		}
		if err != nil {
			ce := asCapError(err)
			if ce.Code == capability.NotFound && in.Rootfs != "" {
				writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("template %q: %s; %s are Quro's default userland",
					b.TemplateID, ce.Message, strings.Join(defaultTemplates, ", ")))
				return
			}
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.sandbox(r.Context(), out.ID, b.TemplateID))
	}
}

// listQuery is what GET /sandboxes and /v2/sandboxes filter by.
type listQuery struct {
	metadata     map[string]string
	states       []string
	template     string
	startedAfter time.Time
	asc          bool
	limit        int // 0: every sandbox (v1)
	after        *cursor
}

// cursor is the position after the last sandbox of a page: X-Next-Token
// and nextToken carry it (opaque to clients).
type cursor struct {
	at time.Time
	id string
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.at.UnixNano(), 10) + ":" + c.id))
}

func parseCursor(tok string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, errors.New("nextToken is not one this server gave")
	}
	ns, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !validID(id) {
		return nil, errors.New("nextToken is not one this server gave")
	}
	return &cursor{at: time.Unix(0, n), id: id}, nil
}

// before reports whether a sorts before b in the list's order.
func (q *listQuery) before(a, b cursor) bool {
	switch {
	case !a.at.Equal(b.at):
		return a.at.Before(b.at) == q.asc
	case a.id == b.id:
		return false
	}
	return (a.id < b.id) == q.asc
}

func parseList(r *http.Request, v2 bool) (*listQuery, error) {
	v := r.URL.Query()
	q := &listQuery{limit: listLimit}
	if md := v.Get("metadata"); md != "" {
		// The SDKs send metadata=<k=v&k2=v2, form-encoded>, whose keys and
		// values are percent-encoded once more (encodeURIComponent).
		pairs, err := url.ParseQuery(md)
		if err != nil {
			return nil, fmt.Errorf("metadata %q is not key=value pairs joined by &: %v", md, err)
		}
		q.metadata = map[string]string{}
		for k, vs := range pairs {
			key, err1 := url.QueryUnescape(k)
			val, err2 := url.QueryUnescape(vs[len(vs)-1])
			if err1 != nil || err2 != nil {
				key, val = k, vs[len(vs)-1]
			}
			q.metadata[key] = val
		}
	}
	for _, st := range v["state"] {
		for _, one := range strings.Split(st, ",") {
			switch one = strings.TrimSpace(one); one {
			case "running", "paused":
				q.states = append(q.states, one)
			case "":
			default:
				return nil, fmt.Errorf("state %q: use running or paused", one)
			}
		}
	}
	if !v2 {
		// The v1 list is of running sandboxes, all of them (E2B's has no
		// pages: no limit, no nextToken; a tenant's sessions are bounded).
		q.states = []string{"running"}
	}
	q.template = v.Get("template")
	if sa := v.Get("startedAfter"); sa != "" {
		t, err := time.Parse(time.RFC3339Nano, sa)
		if err != nil {
			return nil, fmt.Errorf("startedAfter %q is not an RFC 3339 time", sa)
		}
		q.startedAfter = t
	}
	switch o := v.Get("order"); o {
	case "", "desc":
	case "asc":
		q.asc = true
	default:
		return nil, fmt.Errorf("order %q: use asc or desc", o)
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > listLimit {
			return nil, fmt.Errorf("limit %q: give a number from 1 to %d", l, listLimit)
		}
		q.limit = n
	}
	if t := v.Get("nextToken"); t != "" {
		c, err := parseCursor(t)
		if err != nil {
			return nil, err
		}
		q.after = c
	}
	if !v2 {
		q.limit, q.after = 0, nil
	}
	return q, nil
}

func (s *Server) listSandboxes(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := parseList(r, v2)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error())
			return
		}
		out, err := invoke[*app.SessionList](r.Context(), s, "list_sessions", app.ListSessionsInput{Metadata: q.metadata, State: q.states})
		if err != nil {
			writeError(w, err)
			return
		}
		var all []*app.SessionInfo
		running := 0
		for _, x := range out.Sessions {
			if q.template != "" && template(x) != q.template {
				continue
			}
			if !q.startedAfter.IsZero() && x.CreatedAt.Before(q.startedAfter) { // inclusive, as E2B's
				continue
			}
			if x.SessionState == app.StateRunning {
				running++
			}
			all = append(all, x)
		}
		key := func(x *app.SessionInfo) cursor { return cursor{at: x.CreatedAt, id: x.ID} }
		slices.SortFunc(all, func(a, b *app.SessionInfo) int {
			switch {
			case q.before(key(a), key(b)):
				return -1
			case q.before(key(b), key(a)):
				return 1
			}
			return 0
		})
		page := []listedJSON{}
		var last *app.SessionInfo
		more := false
		for _, x := range all {
			if q.after != nil && !q.before(*q.after, key(x)) {
				continue
			}
			if q.limit > 0 && len(page) == q.limit {
				more = true
				break
			}
			page = append(page, listed(x))
			last = x
		}
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
		if more && v2 {
			w.Header().Set("X-Next-Token", key(last).token())
		}
		writeJSON(w, http.StatusOK, page)
	}
}

// withSandbox checks the {id} of the path (a session id: 32 hex digits;
// never a session's name, nor "" for the default session) before h.
func (s *Server) withSandbox(h func(w http.ResponseWriter, r *http.Request, id string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !validID(id) {
			drain(r)
			writeJSONError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found: sandbox ids are 32 hex digits", id))
			return
		}
		h(w, r, id)
	}
}

func (s *Server) status(ctx context.Context, id string) (*app.SessionInfo, error) {
	return invoke[*app.SessionInfo](ctx, s, "get_session_status", app.SessionRef{Session: id})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, id string) {
	x, err := s.status(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	onTimeout := "kill"
	if x.OnTimeout == "pause" {
		onTimeout = "pause"
	}
	writeJSON(w, http.StatusOK, detailJSON{
		listedJSON: listed(x), EnvdAccessToken: s.accessToken(r.Context(), id), Domain: s.domain(),
		AllowInternetAccess: x.Network != "none",
		// Any use of a paused Quro session resumes it.
		Lifecycle: lifecycleJSON{OnTimeout: onTimeout, AutoResume: true},
	})
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request, id string) {
	drain(r)
	if _, err := invoke[*app.Done](r.Context(), s, "destroy_session", app.SessionRef{Session: id}); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// defaultLifetime is E2B's default timeout, in seconds, of a v1 create, a
// resume and a fork.
const defaultLifetime = 15

// lifetime is a request's timeout in seconds: given, else def; one that
// is not more than 0 is answered 400 (ok false), naming what it sets.
func lifetime(w http.ResponseWriter, given *int64, def int64, what string) (seconds int64, ok bool) {
	seconds = def
	if given != nil {
		seconds = *given
	}
	if seconds <= 0 {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("timeout is %d: give %s in seconds (more than 0)", seconds, what))
		return 0, false
	}
	return seconds, true
}

// timeoutBody is E2B's {timeout} (seconds) of setTimeout, connect and
// resume; refreshes has {duration}.
type timeoutBody struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
}

func (s *Server) setLifetime(ctx context.Context, id string, seconds int64) error {
	_, err := invoke[*app.SessionInfo](ctx, s, "set_session_timeout", app.SetTimeoutInput{Session: id, TimeoutS: seconds})
	return err
}

// resume resumes paused sandbox id.
func (s *Server) resume(ctx context.Context, id string) error {
	_, err := invoke[*app.PauseResult](ctx, s, "resume_session", app.SessionRef{Session: id})
	return err
}

// extend makes the lifetime of x end no sooner than seconds from now: a
// lifetime that ends later, or none, is kept (E2B's connect and refresh
// never shorten one).
func (s *Server) extend(ctx context.Context, x *app.SessionInfo, seconds int64) error {
	if seconds <= 0 || x.ExpiresAt == nil || !x.ExpiresAt.Before(time.Now().Add(time.Duration(seconds)*time.Second)) {
		return nil
	}
	return s.setLifetime(ctx, x.ID, seconds)
}

// e2bRules turns E2B's network settings into Quro's policy and rules.
// E2B allows what allowOut names even when denyOut also names it, and
// everything else not denied; Quro's deny wins and a non-empty allow list
// means only what it names. So: denying all traffic (ALL_TRAFFIC,
// 0.0.0.0/0, or allow_internet_access false) with an allowOut is Quro's
// allow list; without one it is network none; otherwise denyOut is Quro's
// deny list less what allowOut names again (E2B's exceptions to a deny,
// as far as they name the same destination).
func e2bRules(internet *bool, allowOut, denyOut []string) (network string, allow, deny []string) {
	denyAll := internet != nil && !*internet
	for _, d := range denyOut {
		if d == allTraffic || d == "::/0" {
			denyAll = true
		}
	}
	switch {
	case denyAll && len(allowOut) == 0:
		return "none", nil, nil
	case denyAll:
		return "internet", allowOut, nil
	}
	for _, d := range denyOut {
		if !slices.Contains(allowOut, d) {
			deny = append(deny, d)
		}
	}
	return "internet", nil, deny
}

// allTraffic is E2B's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// networkBody is PUT /sandboxes/{id}/network's body (E2B's
// updateNetwork: the rules replace the sandbox's).
type networkBody struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	AllowInternetCamel  *bool           `json:"allowInternetAccess"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
}

func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, id string) {
	var b networkBody
	if !readBody(w, r, &b) {
		return
	}
	switch {
	case present(b.Rules):
		s.unsupported(w, "network.rules (per-destination transforms; Quro's rules are allowOut and denyOut)")
		return
	case present(b.EgressProxy):
		s.unsupported(w, "network.egressProxy")
		return
	}
	internet := b.AllowInternetAccess
	if internet == nil {
		internet = b.AllowInternetCamel
	}
	in := app.SetNetworkInput{Session: id}
	in.Network, in.AllowOut, in.DenyOut = e2bRules(internet, b.AllowOut, b.DenyOut)
	if _, err := invoke[*app.SessionInfo](r.Context(), s, "set_session_network", in); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, id string) {
	var b timeoutBody
	if !readBody(w, r, &b) {
		return
	}
	if b.Timeout == nil {
		writeJSONError(w, http.StatusBadRequest, "timeout (seconds from now) is required")
		return
	}
	if err := s.setLifetime(r.Context(), id, *b.Timeout); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, id string) {
	var b timeoutBody
	if !readBody(w, r, &b) {
		return
	}
	seconds := int64(60) // E2B's default refresh
	if b.Duration != nil {
		seconds = *b.Duration
	}
	if seconds < 0 || seconds > 3600 {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("duration %d: give 0 to 3600 seconds", seconds))
		return
	}
	x, err := s.status(r.Context(), id)
	if err == nil {
		err = s.extend(r.Context(), x, seconds)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connectSandbox resumes a paused sandbox (201) or finds it running (200)
// and answers its Sandbox; the lifetime is then at least timeout.
func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request, id string) {
	var b timeoutBody
	if !readBody(w, r, &b) {
		return
	}
	seconds := int64(300)
	if b.Timeout != nil {
		seconds = *b.Timeout
	}
	if seconds < 0 {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d: give seconds from now", seconds))
		return
	}
	ctx := r.Context()
	x, err := s.status(ctx, id)
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	if x.SessionState == app.StatePaused {
		if err := s.resume(ctx, id); err != nil {
			writeError(w, err)
			return
		}
		status = http.StatusCreated
		// A pause removed the lifetime: the resumed sandbox gets one
		// again, as on E2B.
		if seconds > 0 {
			err = s.setLifetime(ctx, id, seconds)
		}
	} else {
		err = s.extend(ctx, x, seconds)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, s.sandbox(r.Context(), id, template(x)))
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, id string) {
	drain(r)
	ctx := r.Context()
	x, err := s.status(ctx, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if x.SessionState == app.StatePaused {
		writeJSONError(w, http.StatusConflict, "sandbox "+id+" is already paused")
		return
	}
	if _, err := invoke[*app.PauseResult](ctx, s, "pause_session", app.SessionRef{Session: id}); err != nil {
		if ce := asCapError(err); ce.Code == capability.Busy {
			// Code runs in it (a runCode, a command being started): never
			// frozen under it. Not 409, which the SDKs read as "already
			// paused" (pause returns false): 503 is an error they raise,
			// with the reason.
			writeJSONError(w, http.StatusServiceUnavailable, ce.Message)
			return
		}
		writeError(w, err)
		return
	}
	// A paused sandbox waits until it is resumed or killed (E2B's
	// semantics): its lifetime ends with the pause; connect sets another.
	if x.ExpiresAt != nil {
		if err := s.setLifetime(ctx, id, 0); err != nil {
			writeError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeSandbox is E2B's deprecated POST /sandboxes/{id}/resume: 409 when
// the sandbox is not paused; else it resumes it, with a lifetime of
// timeout (default 15 s, E2B's).
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, id string) {
	var b struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
	}
	if !readBody(w, r, &b) {
		return
	}
	seconds, ok := lifetime(w, b.Timeout, defaultLifetime, "the lifetime")
	if !ok {
		return
	}
	ctx := r.Context()
	x, err := s.status(ctx, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if x.SessionState != app.StatePaused {
		writeJSONError(w, http.StatusConflict, "sandbox "+id+" is not paused")
		return
	}
	if err := s.resume(ctx, id); err != nil {
		writeError(w, err)
		return
	}
	in := app.SetTimeoutInput{Session: id, TimeoutS: seconds}
	if b.AutoPause != nil {
		in.OnTimeout = map[bool]string{true: "pause", false: "destroy"}[*b.AutoPause]
	}
	if _, err := invoke[*app.SessionInfo](ctx, s, "set_session_timeout", in); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandbox(r.Context(), id, template(x)))
}

// metric is one sample of x's box now. cpuUsedPct is not measured (0):
// Quro reads the CPU time used, not a rate.
func metric(x *app.SessionInfo, now time.Time) metricJSON {
	m := metricJSON{Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: cpuCount(x)}
	if r := x.Resources; r != nil {
		m.MemUsed, m.MemTotal = r.MemoryBytes, r.MemoryLimit
		m.DiskUsed, m.DiskTotal = r.DiskBytes, r.DiskLimit
	}
	return m
}

// sandboxMetrics answers one sample, now (Quro keeps no history), or none
// when now is outside [start, end].
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request, id string) {
	now := time.Now()
	inRange := true
	for _, p := range []string{"start", "end"} {
		v := r.URL.Query().Get(p)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, p+" is not a unix time in seconds: "+strconv.Quote(v))
			return
		}
		if p == "start" && now.Unix() < n || p == "end" && now.Unix() > n {
			inRange = false
		}
	}
	x, err := s.status(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	out := []metricJSON{}
	if inRange {
		out = append(out, metric(x, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// manyMetrics is GET /sandboxes/metrics?sandbox_ids=a,b: the latest
// sample of each (of the caller's sandboxes; others are left out, as
// unknown ones).
func (s *Server) manyMetrics(w http.ResponseWriter, r *http.Request) {
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > listLimit {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("sandbox_ids: give 1 to %d sandbox ids, comma-separated", listLimit))
		return
	}
	now := time.Now()
	out := struct {
		Sandboxes map[string]metricJSON `json:"sandboxes"`
	}{Sandboxes: map[string]metricJSON{}}
	for _, id := range ids {
		if !validID(id) {
			continue
		}
		x, err := s.status(r.Context(), id)
		if err != nil {
			if asCapError(err).Code == capability.NotFound {
				continue
			}
			writeError(w, err)
			return
		}
		out.Sandboxes[id] = metric(x, now)
	}
	writeJSON(w, http.StatusOK, out)
}

// forkSandbox is E2B's fork through Quro's fork_session: each new
// sandbox gets a copy of the workspace, variables, working directory,
// network policy and rootfs, but not the running processes or memory
// (docs/e2b.md: partial). All or nothing, as fork_session; each copy gets
// a lifetime of timeout (E2B's default: 15 s).
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request, id string) {
	var b struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if !readBody(w, r, &b) {
		return
	}
	seconds, ok := lifetime(w, b.Timeout, defaultLifetime, "the forks' lifetime")
	if !ok {
		return
	}
	count := 1
	if b.Count != nil {
		count = *b.Count
	}
	ctx := r.Context()
	x, err := s.status(ctx, id)
	if err != nil {
		writeError(w, err)
		return
	}
	out, err := invoke[*app.ForkResult](ctx, s, "fork_session", app.ForkInput{Session: id, Count: count})
	if err != nil {
		writeError(w, err)
		return
	}
	type result struct {
		Sandbox *sandboxJSON `json:"sandbox,omitempty"`
		Error   *errorBody   `json:"error,omitempty"`
	}
	res := []result{}
	for _, c := range out.Copies {
		if err := s.setLifetime(ctx, c.Session, seconds); err != nil {
			res = append(res, result{Error: &errorBody{Code: statusOf(err), Message: messageOf(err)}})
			continue
		}
		sb := s.sandbox(r.Context(), c.Session, template(x))
		res = append(res, result{Sandbox: &sb})
	}
	writeJSON(w, http.StatusCreated, res)
}
