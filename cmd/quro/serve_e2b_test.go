package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestServeE2BOrigin: quro serve's E2B routes get the Origin and Host
// check of /v1, with and without --no-auth. The cross-site attack — a
// page's text/plain POST (no CORS preflight) creating a sandbox with
// network full and a day's lifetime — is refused and makes nothing; a
// foreign Origin on a sandbox's envd (HTTP and Connect) is refused; the
// SDKs' requests (no Origin) and an --allow-origin origin are served.
func TestServeE2BOrigin(t *testing.T) {
	t.Parallel()
	const (
		evil    = "https://evil.example"
		allowed = "https://ui.example"
		attack  = `{"templateID":"base","timeout":86400,"allow_internet_access":true}`
		js      = "application/json"
	)
	for _, noAuth := range []bool{false, true} {
		name := "tokens"
		if noAuth {
			name = "no-auth"
		}
		t.Run(name, func(t *testing.T) {
			flags := []string{"--allow-origin", allowed}
			if noAuth {
				flags = append(flags, "--no-auth")
			}
			srv := startServer(t, flags...)
			var key []string
			if srv.token != "" {
				key = []string{"X-API-KEY", srv.token}
			}
			api := srv.url + "/e2b"
			with := func(hdr ...string) []string { return append(hdr, key...) }
			sandboxes := func() int {
				t.Helper()
				r := do(t, "GET", api+"/v2/sandboxes", "", "", key...)
				var list []struct{ SandboxID string }
				if r.status != 200 || json.Unmarshal([]byte(r.body), &list) != nil {
					t.Fatalf("list: %d %s", r.status, r.body)
				}
				return len(list)
			}
			before := sandboxes()
			for _, tc := range []struct {
				name, path, ctype string
				hdr               []string
				status            int
				want              string
			}{
				{"cross-site text/plain create", "/sandboxes", "text/plain", []string{"Origin", evil}, 403, "origin"},
				{"cross-site text/plain create with a key", "/v2/sandboxes", "text/plain;charset=UTF-8", with("Origin", evil), 403, "origin"},
				{"cross-site form create", "/v2/sandboxes", "application/x-www-form-urlencoded", with("Origin", evil), 403, "origin"},
				{"text/plain create without an Origin", "/v2/sandboxes", "text/plain", with(), 415, "application/json"},
			} {
				r := do(t, "POST", api+tc.path, tc.ctype, attack, tc.hdr...)
				if r.status != tc.status || !strings.Contains(r.body, tc.want) {
					t.Errorf("%s: %d %s; want %d containing %q", tc.name, r.status, trim(r.body), tc.status, tc.want)
				}
			}
			if n := sandboxes(); n != before {
				t.Fatalf("the refused creates made %d sandboxes", n-before)
			}
			// The SDK's create: JSON, no Origin.
			r := do(t, "POST", api+"/v2/sandboxes", js, `{"templateID":"base"}`, key...)
			var sb struct{ SandboxID, EnvdAccessToken string }
			if r.status != 201 || json.Unmarshal([]byte(r.body), &sb) != nil || sb.EnvdAccessToken == "" {
				t.Fatalf("create: %d %s", r.status, r.body)
			}
			if r := do(t, "GET", api+"/v2/sandboxes", "", "", with("Origin", allowed)...); r.status != 200 {
				t.Fatalf("list from an allowed origin: %d %s", r.status, r.body)
			}
			envd := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49983",
				"X-Access-Token", sb.EnvdAccessToken, "Authorization", "Basic dXNlcjo="} // user:
			foreign := append([]string{"Origin", evil}, envd...)
			for _, tc := range []struct {
				name, method, path, ctype, body string
				hdr                             []string
				status                          int
			}{
				{"envd files from a foreign origin", "GET", "/files?path=/home/user", "", "", foreign, 403},
				{"envd upload from a foreign origin", "POST", "/files?path=/home/user/x.txt", "application/octet-stream", "x", foreign, 403},
				{"Connect from a foreign origin", "POST", "/filesystem.Filesystem/MakeDir", js, `{"path":"/home/user/d"}`, foreign, 403},
				{"Connect (the SDK)", "POST", "/filesystem.Filesystem/ListDir", js, `{"path":"/home/user"}`, envd, 200},
				{"Connect from an allowed origin", "POST", "/filesystem.Filesystem/ListDir", js, `{"path":"/home/user"}`, append([]string{"Origin", allowed}, envd...), 200},
			} {
				r := do(t, tc.method, srv.url+tc.path, tc.ctype, tc.body, tc.hdr...)
				if r.status != tc.status || tc.status == 403 && !strings.Contains(r.body, "origin") {
					t.Errorf("%s: %d %s; want %d", tc.name, r.status, trim(r.body), tc.status)
				}
			}
			if r := do(t, "GET", srv.url+"/files?path=/home/user/x.txt", "", "", envd...); r.status != 404 {
				t.Errorf("the foreign upload wrote: %d %s", r.status, trim(r.body))
			}
		})
	}
}

// TestServePreviewDomain: quro serve --preview-domain sends PORT-ID.DOMAIN,
// whatever the path, to the preview proxy (Quro's /v1 paths included, which
// then need the preview's credentials), and keeps refusing the domain and
// other names below it on its own routes; with --e2b-domain the same, E2B's
// hosts stay E2B's.
func TestServePreviewDomain(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--preview-domain", "http://preview.test", "--e2b-domain", "sandbox.test")
	get := func(host, path string, auth bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", srv.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if auth {
			req.Header.Set("Authorization", "Bearer "+srv.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	id := strings.Repeat("ab", 16) // no such session
	for _, c := range []struct {
		host, path string
		auth       bool
		status     int
		want       string
	}{
		{"preview.test", "/v1/openapi.json", true, 403, "is not a name of this server"},
		{"api.preview.test", "/v1/openapi.json", true, 403, "is not a name of this server"},
		{"x-" + id + ".preview.test", "/v1/openapi.json", true, 403, "is not a name of this server"},
		{"8080-" + id + ".preview.test", "/v1/openapi.json", false, 401, ""},          // the preview's, not the API's
		{"8080-" + id + ".preview.test", "/v1/openapi.json", true, 404, "no session"}, // the preview's, not the API's
		{"8080-" + id + ".sandbox.test", "/", false, 502, "not found"},                // E2B's host: its sandbox plane
		{"127.0.0.1", "/v1/openapi.json", true, 200, "openapi"},
	} {
		if status, body := get(c.host, c.path, c.auth); status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("Host %s %s: %d %s, want %d %q", c.host, c.path, status, body, c.status, c.want)
		}
	}
	if _, errs, code := quro(t, "", "serve", "--data", t.TempDir(), "--preview-domain", "http://preview.test/x"); code == 0 || !strings.Contains(errs, "preview domain") {
		t.Errorf("a preview domain with a path: exit %d: %s", code, errs)
	}
}

// TestServePreviewPublic: quro serve --preview-public, refused at start
// without a host form; with one, code in a session cannot make its own
// port public (quro call from inside the box: permission_denied), its
// creator can, and the port's host name then reaches the box with no
// token (502: nothing listens there) while the path form still asks for
// one; public false closes it again.
func TestServePreviewPublic(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session)")
	}
	if _, errs, code := quro(t, "", "serve", "--data", t.TempDir(), "--preview-public"); code == 0 || !strings.Contains(errs, "--preview-domain") {
		t.Errorf("--preview-public without a preview domain: exit %d: %s", code, errs)
	}
	srv := startServer(t, "--preview-domain", "http://preview.test", "--preview-public")
	run := innerSession(t, srv)
	if out := run(`quro call get_preview_url '{"port":8765,"public":true}'; echo "exit=$?"`); !strings.Contains(out, "permission_denied") || !strings.Contains(out, "exit=1") {
		t.Fatalf("code in the session made its port public:\n%s", out)
	}
	admin := []string{"Authorization", "Bearer " + srv.token}
	public := func(on bool) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"session": "inner", "port": 8765, "public": on})
		r := do(t, "POST", srv.url+"/v1/get_preview_url", "application/json", string(body), admin...)
		var u struct {
			HostURL string `json:"host_url"`
			Path    string `json:"path"`
			Public  bool   `json:"public"`
		}
		if r.status != 200 || json.Unmarshal([]byte(r.body), &u) != nil || u.Public != on || u.HostURL == "" {
			t.Fatalf("get_preview_url public %v: %d %s", on, r.status, r.body)
		}
		return u.HostURL
	}
	get := func(host, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", srv.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(public(true), "http://"), "/")
	id := strings.TrimSuffix(strings.TrimPrefix(host, "8765-"), ".preview.test")
	if status, body := get(host, "/"); status != 502 {
		t.Errorf("a public port's host name with no token: %d %s", status, body)
	}
	if status, body := get("127.0.0.1", "/v1/sessions/"+id+"/ports/8765/"); status != 401 {
		t.Errorf("a public port's path form with no token: %d %s", status, body)
	}
	public(false)
	if status, body := get(host, "/"); status != 401 {
		t.Errorf("a port made private again, with no token: %d %s", status, body)
	}
}
