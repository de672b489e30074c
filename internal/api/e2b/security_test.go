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
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
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
	q := url.Values{"path": {allowed}, "username": {"user"}, "signature": {sign(allowed, "write", "user", e.Server.AccessToken(id))}}
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
	if info.EnvdAccessToken != "" || strings.Contains(body, e.Server.AccessToken(id)) {
		t.Fatalf("a read-only key got the sandbox's access token: %s", body)
	}
	status, body = get(t, nil, e.URL+"/e2b/sandboxes/"+id, "X-API-KEY", e.Key)
	if status != http.StatusOK || !strings.Contains(body, e.Server.AccessToken(id)) {
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

const evil = "https://evil.example"

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
