package rest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
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
	// DialPreview connects to the port inside the session's box.
	DialPreview(ctx context.Context, id string, port int) (net.Conn, error)
}

// Preview is the preview proxy: a request under PreviewPattern that
// passes access's origin and Host checks and carries a bearer token of
// the session's tenant, a valid signature (PreviewParam in the query,
// then a cookie scoped to the path), goes to the port on 127.0.0.1 in the
// session's box, the prefix stripped. HTTP, streamed responses and
// WebSocket upgrades pass; the Authorization header and the signature
// (query and cookie) do not. Each request dials its own connection: no
// connection is reused, across sessions or otherwise.
func Preview(access Access, b PreviewBackend, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
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
		ctx := r.Context()
		q := r.URL.Query()
		signed := false
		if q.Has(PreviewParam) {
			if err := b.PreviewBySignature(ctx, id, port, q.Get(PreviewParam)); err != nil {
				writeCallError(w, err)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: PreviewParam, Value: q.Get(PreviewParam), Path: prefix,
				HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
			signed = true
		} else if ck, err := r.Cookie(PreviewParam); err == nil && b.PreviewBySignature(ctx, id, port, ck.Value) == nil {
			signed = true
		}
		if !signed {
			caller, ok := access.Admit(w, r, "preview")
			if !ok {
				return
			}
			if err := b.PreviewByCaller(ctx, caller, id, port); err != nil {
				writeCallError(w, err)
				return
			}
		}
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
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return b.DialPreview(ctx, id, port)
				},
				DisableKeepAlives: true,
			},
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
	})
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
// prefix, as does a cookie's Path (none reaches outside the prefix), and
// a cookie of the proxy's own name is dropped.
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
