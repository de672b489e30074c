package app

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// previewServer is an HTTP server for a box: GET answers the path and
// headers it was sent as JSON; a WebSocket upgrade gets a raw handshake
// and an echo ("echo:" before each message).
const previewServer = `import http.server, base64, hashlib, struct, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        if self.headers.get('Upgrade', '').lower() == 'websocket':
            k = self.headers['Sec-WebSocket-Key']
            acc = base64.b64encode(hashlib.sha1((k + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
            self.send_response(101)
            self.send_header('Upgrade', 'websocket')
            self.send_header('Connection', 'Upgrade')
            self.send_header('Sec-WebSocket-Accept', acc)
            self.end_headers()
            self.wfile.flush()
            r, w = self.rfile, self.wfile
            while True:
                h = r.read(2)
                if len(h) < 2:
                    break
                op, n = h[0] & 15, h[1] & 127
                if n == 126:
                    n = struct.unpack('>H', r.read(2))[0]
                elif n == 127:
                    n = struct.unpack('>Q', r.read(8))[0]
                m = r.read(4) if h[1] & 128 else b'\0\0\0\0'
                d = bytes(b ^ m[i % 4] for i, b in enumerate(r.read(n)))
                if op == 8:
                    w.write(b'\x88\x00'); w.flush(); break
                if op in (1, 2):
                    d = b'echo:' + d
                    w.write(bytes([0x80 | op]) + (bytes([len(d)]) if len(d) < 126 else b'\x7e' + struct.pack('>H', len(d))) + d)
                    w.flush()
            self.close_connection = True
            return
        body = json.dumps({'path': self.path, 'headers': {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8765), H)
open('ready', 'w').write('up\n')
s.serve_forever()
`

// boxSaw is what previewServer answered.
type boxSaw struct {
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
}

// TestPreviewURLs: a port a session's code listens on in its box (network
// none), reached through the proxy as quro serve mounts it: with the
// tenant's token, with a signed URL and then its cookie alone, and a
// WebSocket; refused without credentials, with another tenant's token,
// with an expired or tampered signature, once the token that asked is
// revoked, and for a session with network host. The box never sees the
// Authorization header nor the signature.
func TestPreviewURLs(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	ctx := t.Context()
	alice, aliceTok := callerOfToken(t, a, "alice", "read", "exec")
	_, bobTok := callerOfToken(t, a, "bob", "read", "exec")

	s := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "web", Network: "none"}).(*SessionInfo)
	if reply, err := callAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "mkfifo ready"}); err != nil ||
		reply.Output.(*runcode.Result).ExitCode != 0 {
		t.Fatalf("mkfifo: %v %+v", err, reply)
	}
	mustCallAs(t, a, alice, "start_process", StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", previewServer}, Background: true})
	if reply, err := callAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "read up < ready && echo $up"}); err != nil ||
		!strings.Contains(reply.Output.(*runcode.Result).Stdout, "up") {
		t.Fatalf("the server in the box did not start: %v %+v", err, reply)
	}

	// Mounted as quro serve mounts it.
	access := rest.Access{Auth: a.Authenticate()}
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Access: access}))
	mux.Handle(rest.PreviewPattern, rest.Preview(access, a, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	get := func(path string, hdr http.Header) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	saw := func(body string) boxSaw {
		t.Helper()
		var b boxSaw
		if err := json.Unmarshal([]byte(body), &b); err != nil {
			t.Fatalf("not the box's answer: %q", body)
		}
		return b
	}
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	base := "/v1/sessions/" + s.ID + "/ports/8765/"

	// The tenant's token: the page, the prefix stripped, no Authorization.
	resp, body := get(base+"hello?x=1", bearer(aliceTok))
	if resp.StatusCode != 200 {
		t.Fatalf("with the token: %d %s", resp.StatusCode, body)
	}
	if b := saw(body); b.Path != "/hello?x=1" || b.Headers["authorization"] != "" {
		t.Errorf("the box saw %+v", b)
	}
	// A paused session: the request is a use of it and resumes it, as
	// E2B's sandboxes resume on a request to their ports.
	mustCallAs(t, a, alice, "pause_session", SessionRef{Session: s.ID})
	if st := mustCallAs(t, a, alice, "get_session_status", SessionRef{Session: s.ID}).(*SessionInfo); st.SessionState != StatePaused {
		t.Fatalf("not paused: %+v", st)
	}
	if resp, body := get(base+"again", bearer(aliceTok)); resp.StatusCode != 200 || saw(body).Path != "/again" {
		t.Fatalf("a paused session's port: %d %s", resp.StatusCode, body)
	}
	if st := mustCallAs(t, a, alice, "get_session_status", SessionRef{Session: s.ID}).(*SessionInfo); st.SessionState == StatePaused {
		t.Errorf("the request to its port did not resume the session: %+v", st)
	}
	// No credentials; another tenant's token.
	if resp, body := get(base, nil); resp.StatusCode != 401 {
		t.Errorf("without a token: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(base, bearer(bobTok)); resp.StatusCode != 404 && resp.StatusCode != 403 {
		t.Errorf("another tenant's token: %d %s", resp.StatusCode, body)
	}
	// Nothing listens on that port: the box is reached, the port is not.
	if resp, body := get("/v1/sessions/"+s.ID+"/ports/8766/", bearer(aliceTok)); resp.StatusCode != 502 {
		t.Errorf("a port nothing listens on: %d %s", resp.StatusCode, body)
	}

	// The signed URL: no token, a cookie for the path, and the box sees
	// neither the signature nor the cookie.
	u := mustCallAs(t, a, alice, "get_preview_url", PreviewURLInput{Session: s.ID, Port: 8765}).(*PreviewURL)
	if u.Path != base || !strings.HasPrefix(u.SignedURL, base+"?quro_preview=") || strings.Contains(u.SignedURL, aliceTok) ||
		time.Until(u.ExpiresAt) < 59*time.Minute || time.Until(u.ExpiresAt) > time.Hour {
		t.Fatalf("get_preview_url: %+v", u)
	}
	resp, body = get(u.SignedURL, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("signed URL: %d %s", resp.StatusCode, body)
	}
	if b := saw(body); b.Path != "/" || strings.Contains(body, "quro_preview") {
		t.Errorf("the box saw %+v", b)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == rest.PreviewParam {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode || cookie.Path != base {
		t.Fatalf("the signed URL's cookie: %+v", cookie)
	}
	withCookie := http.Header{"Cookie": {rest.PreviewParam + "=" + cookie.Value + "; theirs=1"}}
	resp, body = get(base+"page", withCookie)
	if resp.StatusCode != 200 {
		t.Fatalf("the cookie alone: %d %s", resp.StatusCode, body)
	}
	if b := saw(body); b.Path != "/page" || b.Headers["cookie"] != "theirs=1" {
		t.Errorf("the box saw %+v", b)
	}

	// Expired, and tampered: another port, another session, a later
	// expiry.
	sig := strings.TrimPrefix(u.SignedURL, base+"?quro_preview=")
	expired, err := a.signPreview(s.ID, 8765, time.Now().Add(-time.Second), alice.TokenID)
	if err != nil {
		t.Fatal(err)
	}
	other := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "other", Network: "none"}).(*SessionInfo)
	parts := strings.SplitN(sig, ".", 2)
	for what, path := range map[string]string{
		"expired":         base + "?quro_preview=" + expired,
		"another port":    "/v1/sessions/" + s.ID + "/ports/8766/?quro_preview=" + sig,
		"another session": "/v1/sessions/" + other.ID + "/ports/8765/?quro_preview=" + sig,
		"a later expiry":  base + "?quro_preview=" + "9" + parts[0] + "." + parts[1],
		"garbage":         base + "?quro_preview=x",
	} {
		if resp, body := get(path, nil); resp.StatusCode != 401 {
			t.Errorf("%s signature: %d %s", what, resp.StatusCode, body)
		}
	}
	if resp, body := get("/v1/sessions/"+s.ID+"/ports/8766/", withCookie); resp.StatusCode != 401 {
		t.Errorf("the cookie on another port: %d %s", resp.StatusCode, body)
	}

	// A WebSocket through the proxy.
	wsCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(wsCtx, "ws"+strings.TrimPrefix(srv.URL, "http")+base+"ws", &websocket.DialOptions{HTTPHeader: bearer(aliceTok)})
	if err != nil {
		t.Fatalf("WebSocket through the proxy: %v", err)
	}
	if err := conn.Write(wsCtx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := conn.Read(wsCtx); err != nil || string(msg) != "echo:hi" {
		t.Errorf("WebSocket echo: %q %v", msg, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")

	// Code in another session may not ask for this one's; a session
	// with network host has no preview.
	if _, err := callAs(t, a, controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec, Session: other.ID},
		"get_preview_url", PreviewURLInput{Session: s.ID, Port: 8765}); err == nil {
		t.Error("code in another session got this session's preview URL")
	}
	host := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "hosted", Network: "host"}).(*SessionInfo)
	if _, err := callAs(t, a, alice, "get_preview_url", PreviewURLInput{Session: host.ID, Port: 8765}); err == nil ||
		!strings.Contains(err.Error(), "network host") {
		t.Errorf("a host session's preview URL: %v", err)
	}
	// Nor does the sandbox dial into a box without a namespace of the
	// server's (the host's 127.0.0.1), nor into a session with no box.
	if _, err := a.Sandbox.DialBox(ctx, other.ID, 8765); err == nil || !strings.Contains(err.Error(), "no box") {
		t.Errorf("DialBox into a session with no box: %v", err)
	}
	mustCallAs(t, a, alice, "run_code", RunCodeInput{Session: host.ID, Lang: "bash", Code: "true"})
	if c, err := a.Sandbox.DialBox(ctx, host.ID, 8765); !errors.Is(err, sandbox.ErrNoBoxNamespace) {
		if c != nil {
			c.Close()
		}
		t.Errorf("DialBox into a host session's box: %v", err)
	}
	for _, p := range []int{0, 1, 53, 65536} {
		if _, err := callAs(t, a, alice, "get_preview_url", PreviewURLInput{Session: s.ID, Port: p}); err == nil {
			t.Errorf("port %d was given a preview URL", p)
		}
	}

	// Revoking the token that asked revokes its URLs and cookies.
	if err := a.tokens.Revoke(ctx, alice.TokenID); err != nil {
		t.Fatal(err)
	}
	if resp, body := get(u.SignedURL, nil); resp.StatusCode != 401 {
		t.Errorf("signed URL of a revoked token: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(base, withCookie); resp.StatusCode != 401 {
		t.Errorf("cookie of a revoked token: %d %s", resp.StatusCode, body)
	}
}

// TestPreviewHostForm: with a preview domain, get_preview_url also gives
// PORT-ID.DOMAIN, and a request with that Host, whatever its path, goes
// to the port (mounted as quro serve mounts it): with the tenant's token,
// with the signed URL and then its cookie alone (host-only, Path /), and a
// WebSocket; refused without credentials, for another tenant (404), with
// an expired signature, with the cookie of another port's host, once the
// token that asked is revoked. Names below the domain that are not a
// preview's, and the domain itself, are foreign Hosts to every other route
// (403), and a preview host never reaches Quro's own API.
func TestPreviewHostForm(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Network: NetworkOptions{PreviewDomain: "http://preview.test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	ctx := t.Context()
	alice, aliceTok := callerOfToken(t, a, "alice", "read", "exec")
	_, bobTok := callerOfToken(t, a, "bob", "read", "exec")
	s := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "web", Network: "none"}).(*SessionInfo)
	mustCallAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "mkfifo ready"})
	mustCallAs(t, a, alice, "start_process", StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", previewServer}, Background: true})
	if reply, err := callAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "read up < ready && echo $up"}); err != nil ||
		!strings.Contains(reply.Output.(*runcode.Result).Stdout, "up") {
		t.Fatalf("the server in the box did not start: %v %+v", err, reply)
	}

	// Mounted as quro serve mounts it.
	access := rest.Access{Auth: a.Authenticate()}
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Access: access}))
	mux.Handle(rest.PreviewPattern, rest.Preview(access, a, nil))
	ph := rest.NewPreviewHost(access, "preview.test", a, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := ph.Match(r); ok {
			ph.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	name := "8765-" + s.ID + ".preview.test"
	get := func(host, path string, hdr http.Header) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	saw := func(body string) boxSaw {
		t.Helper()
		var b boxSaw
		if err := json.Unmarshal([]byte(body), &b); err != nil {
			t.Fatalf("not the box's answer: %q", body)
		}
		return b
	}
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

	u := mustCallAs(t, a, alice, "get_preview_url", PreviewURLInput{Session: s.ID, Port: 8765}).(*PreviewURL)
	if u.HostURL != "http://"+name+"/" || u.SignedHostURL != u.HostURL+"?quro_preview="+strings.TrimPrefix(u.SignedURL, u.Path+"?quro_preview=") ||
		!strings.Contains(u.Text(), u.SignedHostURL) {
		t.Fatalf("get_preview_url: %+v", u)
	}
	// The token: the path as the box serves it, even Quro's own routes.
	for _, p := range []string{"/hello?x=1", "/v1/list_sessions", "/v1/sessions/" + s.ID + "/ports/8765/"} {
		resp, body := get(name, p, bearer(aliceTok))
		if resp.StatusCode != 200 {
			t.Fatalf("host form %s with the token: %d %s", p, resp.StatusCode, body)
		}
		if b := saw(body); b.Path != p || b.Headers["authorization"] != "" {
			t.Errorf("the box saw %+v", b)
		}
	}
	if resp, body := get(name, "/", nil); resp.StatusCode != 401 {
		t.Errorf("host form without a token: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(name, "/", bearer(bobTok)); resp.StatusCode != 404 {
		t.Errorf("host form with another tenant's token: %d %s", resp.StatusCode, body)
	}
	// Another page's origin may not script this one's.
	if resp, body := get(name, "/", http.Header{"Authorization": {"Bearer " + aliceTok}, "Origin": {"http://8766-" + s.ID + ".preview.test"}}); resp.StatusCode != 403 {
		t.Errorf("host form from another preview's origin: %d %s", resp.StatusCode, body)
	}

	// The signed URL, then its cookie alone: host-only, the whole host.
	signed := strings.TrimPrefix(u.SignedHostURL, "http://"+name)
	resp, body := get(name, signed, nil)
	if resp.StatusCode != 200 || strings.Contains(body, "quro_preview") {
		t.Fatalf("signed host URL: %d %s", resp.StatusCode, body)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == rest.PreviewParam {
			cookie = c
		}
	}
	if cookie == nil || cookie.Path != "/" || cookie.Domain != "" || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode {
		t.Fatalf("the host form's cookie: %+v", cookie)
	}
	withCookie := http.Header{"Cookie": {rest.PreviewParam + "=" + cookie.Value}}
	if resp, body := get(name, "/deep/page", withCookie); resp.StatusCode != 200 || saw(body).Path != "/deep/page" {
		t.Errorf("the cookie alone: %d %s", resp.StatusCode, body)
	}
	if resp, body := get("8766-"+s.ID+".preview.test", "/", withCookie); resp.StatusCode != 401 {
		t.Errorf("the cookie on another port's host: %d %s", resp.StatusCode, body)
	}
	expired, err := a.signPreview(s.ID, 8765, time.Now().Add(-time.Second), alice.TokenID)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := get(name, "/?quro_preview="+expired, nil); resp.StatusCode != 401 {
		t.Errorf("expired signature on the host form: %d %s", resp.StatusCode, body)
	}

	// Other names below the domain are not the server's for its routes.
	for _, h := range []string{"preview.test", "api.preview.test", "x-" + s.ID + ".preview.test", "8765-" + s.ID + ".x.preview.test", "08765-" + s.ID + ".preview.test"} {
		if resp, body := get(h, "/v1/list_sessions", bearer(aliceTok)); resp.StatusCode != 403 {
			t.Errorf("Host %s on a Quro route: %d %s", h, resp.StatusCode, body)
		}
	}
	if resp, body := get("127.0.0.1", "/v1/list_sessions", bearer(aliceTok)); resp.StatusCode == 403 { // reached the route
		t.Errorf("the server's own Host: %d %s", resp.StatusCode, body)
	}

	// A WebSocket through the host form.
	wsCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dialer := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}}
	conn, _, err := websocket.Dial(wsCtx, "ws://"+name+"/ws", &websocket.DialOptions{HTTPClient: dialer, HTTPHeader: bearer(aliceTok)})
	if err != nil {
		t.Fatalf("WebSocket through the host form: %v", err)
	}
	if err := conn.Write(wsCtx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := conn.Read(wsCtx); err != nil || string(msg) != "echo:hi" {
		t.Errorf("WebSocket echo: %q %v", msg, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")

	// Revoking the token that asked revokes the host form's URL and cookie.
	if err := a.tokens.Revoke(ctx, alice.TokenID); err != nil {
		t.Fatal(err)
	}
	if resp, body := get(name, signed, nil); resp.StatusCode != 401 {
		t.Errorf("signed host URL of a revoked token: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(name, "/", withCookie); resp.StatusCode != 401 {
		t.Errorf("host cookie of a revoked token: %d %s", resp.StatusCode, body)
	}
	// A preview domain that is not one is refused at start.
	for _, d := range []string{"http://preview.test/path", "ftp://preview.test", "127.0.0.1", "user@preview.test", "test"} {
		if _, err := New(context.Background(), t.TempDir(), &Options{Network: NetworkOptions{PreviewDomain: d}}); err == nil || !strings.Contains(err.Error(), "preview domain") {
			t.Errorf("preview domain %q: %v", d, err)
		}
	}
}

// TestPublicPreview: with the operator's --preview-public (and a preview
// domain), the session's creator makes a port public: its host form then
// answers anyone with no token (a WebSocket too), and whatever credential
// the request carries still does not reach the box; the path form, on the
// server's own origin, keeps asking for one; another port and another
// session's port are not public; public false makes it private again
// (401); create_session's public_previews opens every port, and public
// false closes one of them. Code in the session cannot make its port
// public; a server without --preview-public refuses public naming the
// flag, one without a preview domain refuses it for the path form.
func TestPublicPreview(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Network: NetworkOptions{PreviewDomain: "http://preview.test", PreviewPublic: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	ctx := t.Context()
	alice, aliceTok := callerOfToken(t, a, "alice", "read", "exec")
	s := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "web", Network: "none"}).(*SessionInfo)
	other := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "other", Network: "none"}).(*SessionInfo)
	mustCallAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "mkfifo ready"})
	mustCallAs(t, a, alice, "start_process", StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", previewServer}, Background: true})
	if reply, err := callAs(t, a, alice, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "read up < ready && echo $up"}); err != nil ||
		!strings.Contains(reply.Output.(*runcode.Result).Stdout, "up") {
		t.Fatalf("the server in the box did not start: %v %+v", err, reply)
	}

	access := rest.Access{Auth: a.Authenticate()}
	mux := http.NewServeMux()
	mux.Handle(rest.PreviewPattern, rest.Preview(access, a, nil))
	ph := rest.NewPreviewHost(access, "preview.test", a, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := ph.Match(r); ok {
			ph.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	get := func(host, path string, hdr http.Header) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	name := "8765-" + s.ID + ".preview.test"
	setPublic := func(c controller.Caller, sess string, port int, public bool) (*PreviewURL, error) {
		t.Helper()
		reply, err := callAs(t, a, c, "get_preview_url", PreviewURLInput{Session: sess, Port: port, Public: &public})
		if err != nil {
			return nil, err
		}
		return reply.Output.(*PreviewURL), nil
	}

	if code, body := get(name, "/", nil); code != 401 {
		t.Fatalf("a private port with no token: %d %s", code, body)
	}
	// Code in the session may not open its own port.
	inSession := controller.Caller{Path: "insession", Tenant: "alice", TokenID: "session:" + s.ID, Scope: capability.ScopeExec, Session: s.ID}
	if _, err := setPublic(inSession, s.ID, 8765, true); capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), "code in a session") {
		t.Fatalf("an in-session caller made its port public: %v", err)
	}
	if code, _ := get(name, "/", nil); code != 401 {
		t.Fatalf("after the in-session attempt the port answers with no token: %d", code)
	}

	u, err := setPublic(alice, s.ID, 8765, true)
	if err != nil || !u.Public || !strings.Contains(u.Text(), "public") {
		t.Fatalf("public true: %+v %v", u, err)
	}
	// No token; and what a visitor sends of ours is still stripped.
	code, body := get(name, "/page?quro_preview=forged", http.Header{"Authorization": {"Bearer " + aliceTok}, "Cookie": {"quro_preview=x; theirs=1"}})
	if code != 200 {
		t.Fatalf("a public port with no token: %d %s", code, body)
	}
	var saw boxSaw
	if err := json.Unmarshal([]byte(body), &saw); err != nil {
		t.Fatalf("not the box's answer: %q", body)
	}
	if saw.Path != "/page" || saw.Headers["authorization"] != "" || saw.Headers["cookie"] != "theirs=1" {
		t.Errorf("the box saw %+v", saw)
	}
	if code, body := get(name, "/", http.Header{"Origin": {"http://8766-" + s.ID + ".preview.test"}}); code != 403 {
		t.Errorf("a public port from another preview's origin: %d %s", code, body)
	}
	// A WebSocket with no token.
	wsCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dialer := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}}
	conn, _, err := websocket.Dial(wsCtx, "ws://"+name+"/ws", &websocket.DialOptions{HTTPClient: dialer})
	if err != nil {
		t.Fatalf("WebSocket to a public port: %v", err)
	}
	if err := conn.Write(wsCtx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := conn.Read(wsCtx); err != nil || string(msg) != "echo:hi" {
		t.Errorf("WebSocket echo: %q %v", msg, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")

	// The path form never serves a public port without a credential.
	if code, body := get("127.0.0.1", PreviewPath(s.ID, 8765), nil); code != 401 {
		t.Errorf("the path form of a public port with no token: %d %s", code, body)
	}
	// Another port of the session, the same port of another session.
	for _, h := range []string{"8766-" + s.ID + ".preview.test", "8765-" + other.ID + ".preview.test"} {
		if code, body := get(h, "/", nil); code != 401 {
			t.Errorf("%s with no token: %d %s", h, code, body)
		}
	}
	// Private again.
	if u, err := setPublic(alice, s.ID, 8765, false); err != nil || u.Public {
		t.Fatalf("public false: %+v %v", u, err)
	}
	if code, body := get(name, "/", nil); code != 401 {
		t.Errorf("a port made private again, with no token: %d %s", code, body)
	}

	// public_previews: every port of the new session (502: reached, and
	// nothing listens), until public false closes one.
	all := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "open", Network: "none", PublicPreviews: true}).(*SessionInfo)
	for _, p := range []string{"3000", "8080"} {
		if code, body := get(p+"-"+all.ID+".preview.test", "/", nil); code != 502 {
			t.Errorf("port %s of a public_previews session with no token: %d %s", p, code, body)
		}
	}
	if _, err := setPublic(alice, all.ID, 3000, false); err != nil {
		t.Fatal(err)
	}
	if code, body := get("3000-"+all.ID+".preview.test", "/", nil); code != 401 {
		t.Errorf("a port closed under public_previews: %d %s", code, body)
	}
	if code, body := get("8080-"+all.ID+".preview.test", "/", nil); code != 502 {
		t.Errorf("another port under public_previews after one closed: %d %s", code, body)
	}
	// Nothing public outlives its session.
	mustCallAs(t, a, alice, "destroy_session", SessionRef{Session: all.ID})
	if a.isPublic(all.ID, 8080) {
		t.Error("a destroyed session's ports are still public")
	}

	// The operator's flag off: refused, naming it; so is create's.
	for _, c := range []struct {
		net  NetworkOptions
		want string
	}{
		{NetworkOptions{PreviewDomain: "http://preview.test"}, "--preview-public"},
		{NetworkOptions{PreviewPublic: true}, "--preview-domain"},
	} {
		b, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: c.net})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs := mustCall(t, b, "create_session", CreateSessionInput{Name: "web", Network: "none"}).(*SessionInfo)
		yes := true
		_, err = call(t, b, "get_preview_url", PreviewURLInput{Session: bs.ID, Port: 8765, Public: &yes})
		if capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: get_preview_url public: %v", c.net, err)
		}
		if c.want == "--preview-public" {
			_, err = call(t, b, "create_session", CreateSessionInput{Name: "open", PublicPreviews: true})
			if capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), c.want) {
				t.Errorf("create_session public_previews without the flag: %v", err)
			}
		}
	}
}
