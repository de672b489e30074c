package rest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// PreviewPattern is the preview proxy's route, as quro serve mounts it:
// everything under it goes to the port of the session's box.
const PreviewPattern = "/v1/sessions/{id}/ports/{port}/"

// PreviewParam is a signed preview URL's query parameter, and the name of
// the cookie the proxy sets from it.
const PreviewParam = "quro_preview"

// PreviewBackend decides who reaches a session's port and dials it (the
// app).
type PreviewBackend interface {
	// PreviewByCaller lets a caller authenticated by its token reach
	// session id's port, or says why not.
	PreviewByCaller(ctx context.Context, c controller.Caller, id string, port int) error
	// PreviewBySignature checks a signed URL's signature for session
	// id's port.
	PreviewBySignature(ctx context.Context, id string, port int, sig string) error
	// PreviewPublic reports whether session id's port answers anyone,
	// with no credential, on its host form (its creator made it public
	// and the operator allows it). The path form never asks.
	PreviewPublic(ctx context.Context, id string, port int) bool
	// DialPreview connects to the port inside the session's box.
	DialPreview(ctx context.Context, id string, port int) (net.Conn, error)
}

// Preview is the preview proxy's path form: a request under
// PreviewPattern that passes access's origin and Host checks and carries a
// bearer token of the session's tenant, a valid signature (PreviewParam in
// the query, then a cookie scoped to the path), goes to the port on
// 127.0.0.1 in the session's box, the prefix stripped. HTTP, streamed
// responses and WebSocket upgrades pass; the Authorization header and the
// signature (query and cookie) do not. Each request dials its own
// connection: no connection is reused, across sessions or otherwise.
func Preview(access Access, b PreviewBackend, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := access.Check(r); e != nil {
			WriteError(w, http.StatusForbidden, e)
			return
		}
		id, portS := r.PathValue("id"), r.PathValue("port")
		port, err := strconv.Atoi(portS)
		if err != nil || strconv.Itoa(port) != portS {
			WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "port %q: want a number", portS))
			return
		}
		prefix := "/v1/sessions/" + id + "/ports/" + portS + "/"
		if !strings.HasPrefix(r.URL.EscapedPath(), prefix) {
			WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "not a preview path"))
			return
		}
		if !previewAuth(w, r, access, b, id, port, prefix, false) {
			return
		}
		ProxyPreview(w, r, b, id, port, prefix, log)
	})
}

// PreviewHost is the preview proxy's host form: every request whose Host
// is PORT-ID.DOMAIN (Match) goes, whatever its path, to that port of
// session ID's box, authenticated as the path form (a bearer token of the
// session's tenant or a signature), the signature's cookie scoped to that
// host alone (no Domain attribute, Path /). Each preview is then an origin
// of its own: its page's scripts reach neither the server's origin (the
// web UI's token) nor another preview's cookie. A public port
// (PreviewBackend.PreviewPublic) needs no credential here, and only here:
// the path form, on the server's own origin, never serves one without.
// Host names below DOMAIN are allowed here only: every other route keeps
// refusing them.
type PreviewHost struct {
	// Secure marks the signature's cookie Secure whatever the request
	// came over: the preview URLs are https (TLS in front of the server,
	// where a request reaches it over plain HTTP), so that the browser
	// never sends the cookie over plain HTTP to the preview's name.
	Secure bool
	domain string // lower case, no port, no dots around
	access Access
	b      PreviewBackend
	log    *slog.Logger
}

// NewPreviewHost serves PORT-ID.domain (domain may carry a port, which
// Match ignores, as the Host check does).
func NewPreviewHost(access Access, domain string, b PreviewBackend, log *slog.Logger) *PreviewHost {
	d := hostOnly(strings.Trim(domain, "."))
	access.Hosts = append(slices.Clone(access.Hosts), "*."+d)
	return &PreviewHost{domain: d, access: access, b: b, log: log}
}

// Match says whether r's Host is the host form's, and which session and
// port it names. A label that is not PORT-ID with a port number matches
// nothing (such a request goes to the other routes, whose Host check
// refuses it).
func (p *PreviewHost) Match(r *http.Request) (id string, port int, ok bool) {
	label, found := strings.CutSuffix(hostOnly(r.Host), "."+p.domain)
	if !found || label == "" || strings.Contains(label, ".") {
		return "", 0, false
	}
	portS, id, cut := strings.Cut(label, "-")
	port, err := strconv.Atoi(portS)
	if !cut || err != nil || strconv.Itoa(port) != portS || id == "" {
		return "", 0, false
	}
	return id, port, true
}

func (p *PreviewHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok := p.Match(r)
	if !ok {
		WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "not a preview host"))
		return
	}
	if e := p.access.Check(r); e != nil {
		WriteError(w, http.StatusForbidden, e)
		return
	}
	// A public port takes no credential, and whatever the request
	// carries (a token, a signature, our cookie) is still stripped
	// before the box.
	if !p.b.PreviewPublic(r.Context(), id, port) && !previewAuth(w, r, p.access, p.b, id, port, "/", p.Secure) {
		return
	}
	ProxyPreview(w, r, p.b, id, port, "/", p.log)
}

// previewAuth admits r to session id's port: a valid signature in the
// query (which sets the cookie, Path cookiePath, host-only), or in that
// cookie, or a bearer token of the session's tenant; the cookie is Secure
// when secure is or r came over TLS. On refusal it has written the error
// and returns false.
func previewAuth(w http.ResponseWriter, r *http.Request, access Access, b PreviewBackend, id string, port int, cookiePath string, secure bool) bool {
	ctx := r.Context()
	if q := r.URL.Query(); q.Has(PreviewParam) {
		if err := b.PreviewBySignature(ctx, id, port, q.Get(PreviewParam)); err != nil {
			writeCallError(w, err)
			return false
		}
		http.SetCookie(w, &http.Cookie{Name: PreviewParam, Value: q.Get(PreviewParam), Path: cookiePath,
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure || r.TLS != nil})
		return true
	}
	// Every cookie of the name, not the first alone: a page of another
	// preview below the same domain can set one from its scripts with a
	// Domain attribute (and a longer Path, so that browsers send it
	// first), which must not shadow this host's own.
	for _, ck := range r.CookiesNamed(PreviewParam) {
		if b.PreviewBySignature(ctx, id, port, ck.Value) == nil {
			return true
		}
	}
	caller, ok := access.Admit(w, r, "preview")
	if !ok {
		return false
	}
	if err := b.PreviewByCaller(ctx, caller, id, port); err != nil {
		writeCallError(w, err)
		return false
	}
	return true
}

// ProxyPreview reverse-proxies r, admitted already, to port on 127.0.0.1
// in session id's box over its own connection (b.DialPreview), prefix
// stripped from the path ("/": none), the Authorization header and the
// signature (query and cookie) removed, and the box's redirects and
// cookies put back under prefix.
func ProxyPreview(w http.ResponseWriter, r *http.Request, b PreviewBackend, id string, port int, prefix string, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	ctx := r.Context()
	portS := strconv.Itoa(port)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "127.0.0.1:" + portS
			pr.Out.Host = ""
			rest := "/" + strings.TrimPrefix(pr.In.URL.EscapedPath(), prefix)
			if u, err := url.Parse(rest); err == nil && u.Host == "" {
				pr.Out.URL.Path, pr.Out.URL.RawPath = u.Path, u.RawPath
			} else {
				pr.Out.URL.Path, pr.Out.URL.RawPath = rest, ""
			}
			if oq := pr.Out.URL.Query(); oq.Has(PreviewParam) {
				oq.Del(PreviewParam)
				pr.Out.URL.RawQuery = oq.Encode()
			}
			pr.Out.Header.Del("Authorization")
			stripCookie(pr.Out, PreviewParam)
			pr.SetXForwarded()
		},
		Transport: informational{&http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return b.DialPreview(ctx, id, port)
			},
			DisableKeepAlives: true,
		}},
		ModifyResponse: func(resp *http.Response) error {
			rebase(resp, prefix)
			return nil
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if ctx.Err() == nil {
				log.Debug("preview", "session", id, "port", port, "error", err)
			}
			WriteError(w, http.StatusBadGateway, capability.Errorf(capability.Unavailable,
				"session %s, port %d: %v", id, port, err))
		},
	}
	proxy.ServeHTTP(w, r)
}

// informational drops the cookies of the informational (1xx) responses
// a box sends (103 Early Hints), which the proxy passes on as they come,
// before ModifyResponse could take their Domain off: its hook runs first
// and edits the header the proxy then copies.
type informational struct{ http.RoundTripper }

func (t informational) RoundTrip(r *http.Request) (*http.Response, error) {
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		delete(h, "Set-Cookie")
		return nil
	}}
	return t.RoundTripper.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
}

// stripCookie removes the cookie name from r's Cookie headers.
func stripCookie(r *http.Request, name string) {
	if !strings.Contains(strings.Join(r.Header.Values("Cookie"), ";"), name) {
		return
	}
	var kept []string
	for _, c := range r.Cookies() {
		if c.Name != name {
			kept = append(kept, c.Name+"="+c.Value)
		}
	}
	r.Header.Del("Cookie")
	if len(kept) > 0 {
		r.Header.Set("Cookie", strings.Join(kept, "; "))
	}
}

// writeCallError writes err as its code's status (401 with
// WWW-Authenticate for Unauthenticated).
func writeCallError(w http.ResponseWriter, err error) {
	ce := controller.Classify(err)
	if ce.Code == capability.Unauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="quro"`)
	}
	WriteError(w, Status(ce.Code), ce)
}

// rebase maps the box's root onto the preview's prefix in what the box
// answers: a redirect to an absolute path ("/login") goes under the
// prefix, as does a cookie's Path (none reaches outside the prefix), a
// cookie's Domain attribute is removed (every cookie of the box is
// host-only: one for DOMAIN or a parent would reach every other preview,
// of every tenant, and the server's own host), and a cookie of the
// proxy's own name is dropped.
func rebase(resp *http.Response, prefix string) {
	if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") && !strings.HasPrefix(loc, `/\`) {
		resp.Header.Set("Location", prefix+strings.TrimPrefix(loc, "/"))
	}
	sets := resp.Header.Values("Set-Cookie")
	if len(sets) == 0 {
		return
	}
	resp.Header.Del("Set-Cookie")
	for _, line := range sets {
		c, err := http.ParseSetCookie(line)
		if err != nil || c.Name == PreviewParam {
			continue
		}
		c.Domain = ""
		if c.Path == "" || !strings.HasPrefix(c.Path, "/") {
			c.Path = prefix
		} else {
			c.Path = prefix + strings.TrimPrefix(c.Path, "/")
		}
		if v := c.String(); v != "" {
			resp.Header.Add("Set-Cookie", v)
		}
	}
}
