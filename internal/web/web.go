// Package web serves the browser UI: the files built from web/ (see
// web/build.mjs) into dist and embedded here, with a strict
// Content-Security-Policy on every response. The UI is a client of the
// same REST and WebSocket routes as every other caller; this package
// serves only static files and needs no token (the sign-in page must load
// without one).
package web

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed dist
var dist embed.FS

// Files is the built UI (index.html, app.js, app.css, frame.html, frame.js).
var Files, _ = fs.Sub(dist, "dist")

// nonceMark is replaced in index.html by each response's style nonce.
const nonceMark = "__CSP_NONCE__"

// PageCSP is the policy of the UI's pages: scripts and styles from this
// server only (plus, for styles, the per-response nonce that xterm.js's
// generated <style> elements carry), images from here and data:/blob:
// URLs (SVG and PNG artifacts), frames only from here (the artifact frame),
// fetch and WebSocket to this origin only, and no framing of the UI.
const PageCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'nonce-%s'; img-src 'self' data: blob:; " +
	"font-src 'self'; connect-src 'self'; frame-src 'self'; child-src 'self'; worker-src 'none'; object-src 'none'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// FrameCSP is the policy of frame.html, where HTML artifacts run: a
// sandbox with scripts but without same-origin (an opaque origin: no
// cookies, storage or API of this server, no access to the page), inline
// scripts and styles allowed because artifacts are pages, and no network
// at all (default-src 'none': an artifact cannot send anything anywhere).
// Only this server's pages may embed it.
const FrameCSP = "sandbox allow-scripts; default-src 'none'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; " +
	"style-src 'unsafe-inline'; img-src data: blob:; font-src data:; media-src data: blob:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'self'"

// Handler serves the UI at /: index.html for "/", the built files by
// name, 404 for anything else. GET and HEAD only.
func Handler() http.Handler {
	index, err := fs.ReadFile(Files, "index.html")
	if err != nil {
		panic("web: dist/index.html is missing: build the UI with `make web`")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(path.Clean(r.URL.Path), "/")
		switch name {
		case "", "index.html":
			nonce := newNonce()
			h.Set("Content-Security-Policy", strings.Replace(PageCSP, "%s", nonce, 1))
			h.Set("X-Frame-Options", "DENY")
			h.Set("Content-Type", "text/html; charset=utf-8")
			h.Set("Cache-Control", "no-store")
			http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(bytes.ReplaceAll(index, []byte(nonceMark), []byte(nonce))))
			return
		case "frame.html":
			h.Set("Content-Security-Policy", FrameCSP)
			h.Set("X-Frame-Options", "SAMEORIGIN")
		default:
			h.Set("Content-Security-Policy", strings.Replace(PageCSP, " 'nonce-%s'", "", 1))
			h.Set("X-Frame-Options", "DENY")
		}
		b, err := fs.ReadFile(Files, name)
		if err != nil || strings.HasPrefix(name, ".") {
			http.NotFound(w, r)
			return
		}
		if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
			h.Set("Content-Type", ct)
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	})
}

func newNonce() string {
	var b [18]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
