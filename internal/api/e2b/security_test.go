package e2b_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem/filesystemconnect"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/session"
)

// sign is the SDK's signature of a /files URL (e2b's
// src/sandbox/signature.ts), without expiry.
func sign(path, op, user, token string) string {
	sum := sha256.Sum256([]byte(path + ":" + op + ":" + user + ":" + token))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

func workspaceOf(t *testing.T, e *env, id string) string {
	t.Helper()
	s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return (&session.Session{Dir: s.Dir}).Workspace()
}

// Attack: a signed upload URL (uploadUrl) covers one path. Parts of a
// multipart body that name other files, or a signed URL without a path,
// must write nothing else.
func TestSignedUploadWritesOnlyItsPath(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	ws := workspaceOf(t, e, id)
	const allowed = "/home/user/allowed.txt"
	q := url.Values{"path": {allowed}, "username": {"user"}, "signature": {sign(allowed, "write", "user", e.accessToken(id))}}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, name := range []string{"/home/user/.bashrc", "/home/user/sub/other.py"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte("pwned\n"))
	}
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/files?"+q.Encode(), &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set(e2b.HeaderSandboxID, id)
	req.Header.Set(e2b.HeaderSandboxPort, "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("%d %s", resp.StatusCode, b)
	for _, f := range []string{".bashrc", "sub/other.py"} {
		if _, err := os.Stat(filepath.Join(ws, f)); err == nil {
			t.Errorf("a signed URL for %s wrote %s", allowed, f)
		}
	}
	// The same signature on a URL without the path: refused.
	q.Del("path")
	status, body2 := get(t, nil, e.URL+"/files?"+q.Encode(), e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49983")
	if status != http.StatusUnauthorized {
		t.Errorf("a signed URL without its path: %d %s", status, body2)
	}
}

// Attack: a read-only API key may look at a sandbox but not run code in
// it: the access token (which lets its holder run code) is not given.
func TestReadOnlyKeyGetsNoAccessToken(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	ro, err := e.App.CreateToken(context.Background(), "cli", e.Tenant, []string{"read"}, "read only")
	if err != nil {
		t.Fatal(err)
	}
	status, body := get(t, nil, e.URL+"/e2b/sandboxes/"+id, "X-API-KEY", ro.Token)
	if status != http.StatusOK {
		t.Fatalf("get with a read key: %d %s", status, body)
	}
	var info struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatal(err)
	}
	if info.EnvdAccessToken != "" || strings.Contains(body, e.accessToken(id)) {
		t.Fatalf("a read-only key got the sandbox's access token: %s", body)
	}
	status, body = get(t, nil, e.URL+"/e2b/sandboxes/"+id, "X-API-KEY", e.Key)
	if status != http.StatusOK || !strings.Contains(body, e.accessToken(id)) {
		t.Fatalf("an exec key did not get the access token: %d %s", status, body)
	}
}

// Attack: connect-go reads (and decompresses) a whole request message
// into the server's memory; a huge one, or a small gzip body that expands
// to hundreds of MiB, is refused before it is read whole.
func TestConnectMessagesAreBounded(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.sandboxClient(id, e2b.EnvdPort)
	big := `{"process":{"pid":1},"input":{"stdin":"` + strings.Repeat("A", 8<<20) + `"}}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"process":{"pid":1},"input":{"stdin":"`))
	chunk := bytes.Repeat([]byte("A"), 1<<20)
	for range 256 { // 256 MiB expanded
		zw.Write(chunk)
	}
	zw.Write([]byte(`"}}`))
	zw.Close()
	for _, tc := range []struct {
		name string
		body []byte
		gzip bool
	}{{"plain 8 MiB", []byte(big), false}, {"gzip to 256 MiB", gz.Bytes(), true}} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, e.URL+"/process.Process/SendInput", bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.gzip {
				req.Header.Set("Content-Encoding", "gzip")
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), "resource_exhausted") {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

// send makes one request with c (nil: the default client) and returns its
// status and body; hdr are header name, value pairs (an empty value is
// not sent).
func send(t *testing.T, c *http.Client, method, url, ctype, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] != "" {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const evil = "https://evil.example"

// Attack: a page of another site drives the E2B API through its
// visitor's browser, which sends what a page may send without asking
// first (no CORS preflight): a text/plain or form POST creating a sandbox
// with network full and a day's lifetime, with API keys and without them
// (quro serve --no-auth). A foreign Origin is refused on every plane
// (control plane, envd's HTTP and Connect routes, the code interpreter),
// and a body not labelled JSON never reaches a state-changing call;
// nothing is created. The SDKs (no Origin) and the server's own origin
// are served.
func TestE2BCrossSiteOrigin(t *testing.T) {
	const attack = `{"templateID":"base","timeout":86400,"allow_internet_access":true}`
	for _, keys := range []bool{true, false} {
		name := "api keys"
		if !keys {
			name = "no auth"
		}
		t.Run(name, func(t *testing.T) {
			var noKeys func(*e2b.Options)
			if !keys {
				noKeys = func(o *e2b.Options) { o.APIKey = nil }
			}
			e := newEnvWith(t, nil, noKeys)
			ctx := context.Background()
			count := func() int {
				t.Helper()
				n, err := e.App.Sessions.CountAll(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := count()
			key := []string{"X-API-KEY", e.Key}
			for _, tc := range []struct {
				name, method, path, ctype, body string
				hdr                             []string
				status                          int
				want                            string
			}{
				{"cross-site text/plain create", "POST", "/e2b/sandboxes", "text/plain", attack, []string{"Origin", evil}, 403, "origin https://evil.example"},
				{"cross-site text/plain create v2", "POST", "/e2b/v2/sandboxes", "text/plain;charset=UTF-8", attack, append([]string{"Origin", evil}, key...), 403, "origin"},
				{"cross-site JSON create", "POST", "/e2b/v2/sandboxes", "application/json", attack, append([]string{"Origin", evil}, key...), 403, "origin"},
				{"Origin null", "POST", "/e2b/v2/sandboxes", "application/json", attack, append([]string{"Origin", "null"}, key...), 403, "origin"},
				{"text/plain create", "POST", "/e2b/v2/sandboxes", "text/plain", attack, key, 415, "application/json"},
				{"form create", "POST", "/e2b/sandboxes", "application/x-www-form-urlencoded", attack, key, 415, "application/json"},
				{"multipart create", "POST", "/e2b/sandboxes", "multipart/form-data; boundary=x", "--x\r\n\r\n" + attack + "\r\n--x--\r\n", key, 415, "application/json"},
				{"unlabelled create", "POST", "/e2b/sandboxes", "", attack, key, 415, "Content-Type: application/json"},
				{"cross-site list", "GET", "/e2b/v2/sandboxes", "", "", append([]string{"Origin", evil}, key...), 403, "origin"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					status, body := send(t, nil, tc.method, e.URL+tc.path, tc.ctype, tc.body, tc.hdr...)
					if status != tc.status || !strings.Contains(body, tc.want) || !strings.HasPrefix(body, `{"code":`) {
						t.Fatalf("%d %s; want %d containing %q in E2B's {code,message}", status, body, tc.status, tc.want)
					}
				})
			}
			if n := count(); n != before {
				t.Fatalf("the refused calls made %d sandboxes", n-before)
			}

			// The SDKs' own requests: no Origin, JSON (with a charset too);
			// and the server's own origin.
			for _, tc := range []struct{ ctype, origin string }{
				{"application/json", ""}, {"application/json; charset=utf-8", ""}, {"application/json", e.URL},
			} {
				status, body := send(t, nil, "POST", e.URL+"/e2b/v2/sandboxes", tc.ctype, `{"templateID":"base"}`, append([]string{"Origin", tc.origin}, key...)...)
				if status != http.StatusCreated {
					t.Fatalf("create as %s from %q: %d %s", tc.ctype, tc.origin, status, body)
				}
			}
			if n := count(); n != before+3 {
				t.Fatalf("%d sandboxes made, want 3", n-before)
			}
			id := e.newSession(t)

			// A state-changing call without a body needs no label, but a
			// label must be JSON's.
			status, body := send(t, nil, "POST", e.URL+"/e2b/sandboxes/"+id+"/timeout", "text/plain", `{"timeout":86400}`, key...)
			if status != http.StatusUnsupportedMediaType {
				t.Fatalf("text/plain setTimeout: %d %s", status, body)
			}

			// envd and the code interpreter: a foreign Origin is refused
			// even with the access token, and what it asked is not done.
			envd := e.sandboxClient(id, e2b.EnvdPort)
			interp := e.sandboxClient(id, e2b.InterpPort)
			ws := workspaceOf(t, e, id)
			const file = "/home/user/planted.txt"
			signed := url.Values{"path": {file}, "username": {"user"}, "signature": {sign(file, "write", "user", e.accessToken(id))}}
			var mp bytes.Buffer
			mw := multipart.NewWriter(&mp)
			pw, _ := mw.CreateFormFile("file", "planted.txt")
			pw.Write([]byte("pwned\n"))
			mw.Close()
			for _, tc := range []struct {
				name         string
				c            *http.Client
				method, path string
				ctype, body  string
				hdr          []string
			}{
				{"envd health", nil, "GET", "/health", "", "", []string{e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49983"}},
				{"envd upload", envd, "POST", "/files?path=" + file, "application/octet-stream", "pwned\n", nil},
				{"envd signed multipart upload", nil, "POST", "/files?" + signed.Encode(), mw.FormDataContentType(), mp.String(), []string{e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49983"}},
				{"envd download", envd, "GET", "/files?path=/home/user", "", "", nil},
				{"connect unary", envd, "POST", "/filesystem.Filesystem/MakeDir", "application/json", `{"path":"/home/user/planted"}`, nil},
				{"connect stream", envd, "POST", "/process.Process/Start", "application/connect+json", "\x00\x00\x00\x00\x02{}", nil},
				{"interp execute", interp, "POST", "/execute", "application/json", `{"code":"open('planted.txt','w')"}`, nil},
			} {
				t.Run("foreign origin: "+tc.name, func(t *testing.T) {
					status, body := send(t, tc.c, tc.method, e.URL+tc.path, tc.ctype, tc.body, append([]string{"Origin", evil}, tc.hdr...)...)
					if status != http.StatusForbidden || !strings.Contains(body, "origin") {
						t.Fatalf("%d %s; want 403", status, body)
					}
				})
			}
			for _, f := range []string{"planted.txt", "planted"} {
				if _, err := os.Stat(filepath.Join(ws, f)); err == nil {
					t.Errorf("a foreign page made %s", f)
				}
			}
			// The interpreter's calls take JSON too.
			status, body = send(t, interp, "POST", e.URL+"/execute", "text/plain", `{"code":"open('planted.txt','w')"}`)
			if status != http.StatusUnsupportedMediaType {
				t.Fatalf("text/plain /execute: %d %s", status, body)
			}

			// Without an Origin (the SDKs), or with the server's own, the
			// same calls are served: Connect with its JSON and binary
			// codecs, an upload.
			fs := e.fsClient(id)
			mk := rpc(&filesystem.MakeDirRequest{Path: "/home/user/made"})
			mk.Header().Set("Origin", e.URL)
			if _, err := fs.MakeDir(ctx, mk); err != nil {
				t.Fatalf("MakeDir from the server's own origin: %v", err)
			}
			bin := filesystemconnect.NewFilesystemClient(envd, e.URL)
			if _, err := bin.ListDir(ctx, rpc(&filesystem.ListDirRequest{Path: "/home/user", Depth: 1})); err != nil {
				t.Fatalf("ListDir (application/proto): %v", err)
			}
			bad := rpc(&filesystem.ListDirRequest{Path: "/home/user", Depth: 1})
			bad.Header().Set("Origin", evil)
			if _, err := bin.ListDir(ctx, bad); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Fatalf("ListDir (application/proto) from a foreign origin: %v", err)
			}
			status, body = send(t, envd, "POST", e.URL+"/files?path=/home/user/up.txt", "application/octet-stream", "hi\n")
			if status != http.StatusOK {
				t.Fatalf("upload: %d %s", status, body)
			}
			if _, err := os.Stat(filepath.Join(ws, "made")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// With a domain (quro serve --e2b-domain), api.DOMAIN and PORT-ID.DOMAIN
// are names of the server; a page on one of them is still another
// origin to the rest: a sandbox's host cannot drive the control plane.
func TestE2BDomainOrigin(t *testing.T) {
	e := newEnvWith(t, nil, func(o *e2b.Options) { o.Domain = "quro.test" })
	id := e.newSession(t)
	call := func(path, host, origin string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", e.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("X-API-KEY", e.Key)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path, host, origin string
		status             int
		want               string
	}{
		{"/v2/sandboxes", "api.quro.test", "", 200, id},
		{"/v2/sandboxes", "api.quro.test", "http://api.quro.test", 200, id},
		{"/v2/sandboxes", "api.quro.test", "https://49983-" + id + ".quro.test", 403, "origin"},
		{"/v2/sandboxes", "api.quro.test", evil, 403, "origin"},
		{"/e2b/v2/sandboxes", "api.evil.example", "", 403, "Host"},
	} {
		if status, body := call(tc.path, tc.host, tc.origin); status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s, Host %s, Origin %q: %d %s; want %d containing %q", tc.path, tc.host, tc.origin, status, body, tc.status, tc.want)
		}
	}
}

// Attack: an API key leaks and is revoked (revoke_token, what quro token
// revoke calls). The sandbox access tokens and signed URLs obtained with
// it die with it, at the next request, on envd and the code interpreter;
// the tokens and URLs of the tenant's other keys go on working, and a
// token of one key never passes as another's.
func TestRevokedKeyEndsItsAccessTokensAndSignedURLs(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	fresh, err := e.App.CreateToken(ctx, "cli", e.Tenant, []string{"read", "exec"}, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	sb := e.create(t, map[string]any{"templateID": "base"})
	id := sb.SandboxID
	old := sb.EnvdAccessToken
	a := e.api(t, fresh.E2BKey, "POST", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300})
	if a.status != http.StatusOK && a.status != http.StatusCreated {
		t.Fatalf("connect with the fresh key: %d %s", a.status, a.body)
	}
	var conn sandboxAnswer
	a.json(t, &conn)
	cur := conn.EnvdAccessToken
	if old == "" || cur == "" || old == cur || !strings.HasSuffix(old, "_"+e.KeyID) || !strings.HasSuffix(cur, "_"+fresh.ID) {
		t.Fatalf("access tokens %q (create) and %q (connect with another key): want one per key, naming it", old, cur)
	}
	ws := workspaceOf(t, e, id)
	if err := os.WriteFile(filepath.Join(ws, "f.txt"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	const file = "/home/user/f.txt"
	files := func(token, signature string) int {
		t.Helper()
		q := url.Values{"path": {file}, "username": {"user"}}
		hdr := []string{e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49983"}
		if signature != "" {
			q.Set("signature", signature)
		}
		if token != "" {
			hdr = append(hdr, "X-Access-Token", token)
		}
		status, _ := get(t, nil, e.URL+"/files?"+q.Encode(), hdr...)
		return status
	}
	interp := func(token string) int {
		t.Helper()
		status, _ := get(t, nil, e.URL+"/contexts", e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49999", "E2B-Traffic-Access-Token", token)
		return status
	}
	check := func(when string, token string, want int) {
		t.Helper()
		if got := files(token, ""); got != want {
			t.Errorf("%s: /files with access token %.12s…: %d, want %d", when, token, got, want)
		}
		if got := files("", sign(file, "read", "user", token)); got != want {
			t.Errorf("%s: a URL signed with %.12s…: %d, want %d", when, token, got, want)
		}
		if got := interp(token); got != want {
			t.Errorf("%s: the code interpreter with %.12s…: %d, want %d", when, token, got, want)
		}
	}
	check("before", old, http.StatusOK)
	check("before", cur, http.StatusOK)
	// One key's token with another key's id: refused.
	mac, _, _ := strings.Cut(strings.TrimPrefix(old, "qa_"), "_")
	check("swapped key id", "qa_"+mac+"_"+fresh.ID, http.StatusUnauthorized)

	admin := controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeAdmin}
	args, _ := json.Marshal(app.RevokeTokenInput{ID: e.KeyID})
	if _, err := e.App.Controller.Call(ctx, admin, "revoke_token", args); err != nil {
		t.Fatal(err)
	}
	check("after the revoke", old, http.StatusUnauthorized)
	check("after the revoke, the other key's", cur, http.StatusOK)
	// The revoked key gets no new token.
	e.api(t, e.Key, "GET", "/sandboxes/"+id, nil).want(t, http.StatusUnauthorized, "revoked")
}

// Attack: with E2B_SANDBOX_URL the SDK's signed URLs are
// SANDBOX_URL/files?path=…&signature=… with no sandbox id; the sandbox is
// the one whose access token made the signature. A signature opens only
// its sandbox, path and operation: not another sandbox's file at the same
// path, not another path, not a write for a read; an expired or forged
// one opens nothing.
func TestSignedURLWithoutSandboxID(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.newSession(t), e.newSession(t)
	const file = "/home/user/hello.txt"
	for _, id := range []string{a, b} {
		if err := os.WriteFile(filepath.Join(workspaceOf(t, e, id), "hello.txt"), []byte("I am "+id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	expiring := func(path, op, token string, exp int64) url.Values {
		s := strconv.FormatInt(exp, 10)
		sum := sha256.Sum256([]byte(path + ":" + op + "::" + token + ":" + s))
		return url.Values{"path": {path}, "signature": {"v1_" + base64.RawStdEncoding.EncodeToString(sum[:])}, "signature_expiration": {s}}
	}
	for _, id := range []string{a, b} {
		q := url.Values{"path": {file}, "signature": {sign(file, "read", "", e.accessToken(id))}}
		status, body := get(t, nil, e.URL+"/files?"+q.Encode())
		if status != http.StatusOK || body != "I am "+id {
			t.Fatalf("a signed read of %s: %d %q", id, status, body)
		}
	}
	q := expiring(file, "read", e.accessToken(a), time.Now().Unix()+600)
	if status, body := get(t, nil, e.URL+"/files?"+q.Encode()); status != http.StatusOK || body != "I am "+a {
		t.Fatalf("an expiring signed read: %d %q", status, body)
	}
	// An exec key of another tenant: its token for a is no token of a's.
	other, err := e.App.CreateToken(context.Background(), "cli", "t2", []string{"read", "exec"}, "intruder")
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]url.Values{
		"another tenant":  {"path": {file}, "signature": {sign(file, "read", "", e.Server.KeyAccessToken(a, other.ID))}},
		"expired":         expiring(file, "read", e.accessToken(a), time.Now().Unix()-10),
		"another path":    {"path": {"/home/user/.bashrc"}, "signature": {sign(file, "read", "", e.accessToken(a))}},
		"another user":    {"path": {file}, "username": {"root"}, "signature": {sign(file, "read", "", e.accessToken(a))}},
		"write signature": {"path": {file}, "signature": {sign(file, "write", "", e.accessToken(a))}},
		"forged":          {"path": {file}, "signature": {sign(file, "read", "", "qa_guess")}},
		"malformed":       {"path": {file}, "signature": {"v1_AAAA"}},
		"no path":         {"signature": {sign(file, "read", "", e.accessToken(a))}},
	} {
		status, body := get(t, nil, e.URL+"/files?"+q.Encode())
		if status != http.StatusUnauthorized || strings.Contains(body, "I am") {
			t.Errorf("%s: %d %s", name, status, body)
		}
		if name == "expired" && strings.TrimSpace(body) != `{"code":401,"message":"signature is already expired"}` {
			t.Errorf("expired: %s", body)
		}
	}
	// A signed upload writes its one path in its one sandbox.
	q = url.Values{"path": {"/home/user/up.txt"}, "signature": {sign("/home/user/up.txt", "write", "", e.accessToken(b))}}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	pw, _ := mw.CreateFormFile("file", "up.txt")
	pw.Write([]byte("uploaded"))
	mw.Close()
	resp, err := http.Post(e.URL+"/files?"+q.Encode(), mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), `"path":"/home/user/up.txt"`) {
		t.Fatalf("a signed upload: %d %s", resp.StatusCode, got)
	}
	if c, err := os.ReadFile(filepath.Join(workspaceOf(t, e, b), "up.txt")); err != nil || string(c) != "uploaded" {
		t.Fatalf("the signed upload did not land in its sandbox: %q %v", c, err)
	}
	if _, err := os.Stat(filepath.Join(workspaceOf(t, e, a), "up.txt")); err == nil {
		t.Fatal("a signed upload for one sandbox wrote another")
	}
}
