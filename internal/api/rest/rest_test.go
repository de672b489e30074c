package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
)

// testPython shares one extracted interpreter between test data dirs, as
// in internal/app.
var testPython = pythontest.Options()

func newApp(t testing.TB, observers ...controller.Observer) *app.App {
	t.Helper()
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: testPython, Observers: observers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

type result struct {
	status int
	body   string
	header http.Header
}

func (r result) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

func do(t testing.TB, method, url, ctype, body string, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, string(b), resp.Header}
}

type check struct {
	name, method, path, ctype, body string
	hdr                             []string
	status                          int
	want                            string // substring of the body
}

func run(t *testing.T, base string, checks []check) {
	t.Helper()
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, base+tc.path, tc.ctype, tc.body, tc.hdr...)
			if r.status != tc.status || !strings.Contains(r.body, tc.want) {
				t.Fatalf("%s %s: %d %s\nwant %d containing %q", tc.method, tc.path, r.status, trim(r.body), tc.status, tc.want)
			}
			if r.status >= 400 {
				var e struct {
					Error struct{ Code, Message string }
				}
				if json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
					t.Errorf("error body is not {error:{code,message}}: %s", trim(r.body))
				}
			}
		})
	}
}

func TestSessionRoutes(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	a := newApp(t, func(_ context.Context, r *controller.Record) {
		mu.Lock()
		paths = append(paths, r.Caller.Path)
		mu.Unlock()
	})
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{MaxBody: 4096}))
	defer srv.Close()
	const js = "application/json"

	created := do(t, "POST", srv.URL+"/v1/sessions", js, `{"name":"work"}`)
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	id, _ := created.json(t)["id"].(string)
	other := do(t, "POST", srv.URL+"/v1/sessions", "", `{"name":"other"}`).json(t)["id"].(string)
	s := "/v1/sessions/" + id

	run(t, srv.URL, []check{
		{"list", "GET", "/v1/sessions", "", "", nil, 200, `"name":"work"`},
		{"status by id", "GET", s, "", "", nil, 200, `"id":"` + id + `"`},
		{"status by name", "GET", "/v1/sessions/work", "", "", nil, 200, `"id":"` + id + `"`},
		{"status as text", "GET", s + "?format=text", "", "", nil, 200, id + " work"},
		{"exec", "POST", s + "/exec", js, `{"command":"cd /tmp 2>/dev/null; echo hi-$((6*7))"}`, nil, 200, `hi-42`},
		{"exec with the same session in the body", "POST", s + "/exec", js, `{"command":"echo same","session":"` + id + `"}`, nil, 200, `same`},
		{"run", "POST", s + "/run", js, `{"code":"echo ran; pwd","lang":"sh"}`, nil, 200, `"session":"` + id + `"`},
		{"set env", "PUT", s + "/env", js, `{"env":{"GREETING":"hello"}}`, nil, 200, `"GREETING":"hello"`},
		{"get env", "GET", s + "/env", "", "", nil, 200, `"GREETING":"hello"`},
		{"env reaches the shell", "POST", s + "/exec", js, `{"command":"echo $GREETING-there"}`, nil, 200, `hello-there`},
		{"input with nothing waiting", "POST", s + "/input", js, `{"data":"y\n"}`, nil, 400, "nothing in session work is waiting for input"},
		{"aliases: capabilities", "GET", "/v1/capabilities", "", "", nil, 200, `"name":"run_code"`},
		{"aliases: status", "GET", "/v1/status", "", "", nil, 200, `"pid":`},
		{"aliases: help", "GET", "/v1/help", "", "", nil, 200, `Quro runs code`},
		{"post any capability", "POST", "/v1/get_session_status", js, `{"session":"` + id + `"}`, nil, 200, `"name":"work"`},

		{"unknown field", "POST", s + "/exec", js, `{"command":"true","bogus":1}`, nil, 400, `unknown field \"bogus\"`},
		{"malformed", "POST", s + "/exec", js, `{"command":`, nil, 400, "not valid JSON: it ends at line 1, column 12"},
		{"not an object", "POST", s + "/exec", js, `["echo"]`, nil, 400, "must be a JSON object"},
		{"wrong type", "POST", s + "/exec", js, `{"command":5}`, nil, 400, `field \"command\" must be a string`},
		{"too large", "POST", s + "/exec", js, `{"command":"echo ` + strings.Repeat("x", 5000) + `"}`, nil, 413, "larger than 4096 bytes"},
		{"not json", "POST", s + "/exec", "text/plain", `echo hi`, nil, 415, "application/json"},
		{"unknown session", "GET", "/v1/sessions/ghost", "", "", nil, 404, `session not found: \"ghost\"`},
		{"unknown session exec", "POST", "/v1/sessions/ghost/exec", js, `{"command":"true"}`, nil, 404, `"not_found"`},
		{"path and body disagree", "POST", s + "/exec", js, `{"command":"true","session":"` + other + `"}`, nil, 400, "leave \\\"session\\\" out of the body"},
		{"body on a GET", "GET", s, js, `{"x":1}`, nil, 400, "takes no body"},
		{"query on a route without any", "GET", s + "?limit=3", "", "", nil, 400, "takes no query parameter"},
		{"unknown route", "GET", "/v1/sessions/" + id + "/nothing", "", "", nil, 404, "GET /v1/openapi.json"},
		{"unknown capability", "POST", "/v1/nope", js, `{}`, nil, 404, "no capability"},
		{"audit", "GET", "/v1/audit?limit=1&capability=create_session", "", "", nil, 200, `"capability":"create_session"`},

		{"snapshot", "POST", s + "/snapshots", js, `{"name":"snap1"}`, nil, 201, `"name":"snap1"`},
		{"list snapshots", "GET", "/v1/snapshots", "", "", nil, 200, `"session_name":"work"`},
		{"fork", "POST", "/v1/snapshots/snap1/fork", js, `{"count":2,"name_prefix":"f"}`, nil, 201, `"name":"f-2"`},
		{"fork a missing snapshot", "POST", "/v1/snapshots/ghost/fork", js, `{}`, nil, 404, `snapshot \"ghost\" not found`},
		{"delete snapshot", "DELETE", "/v1/snapshots/snap1", "", "", nil, 200, "deleted"},
		{"deleted snapshot is gone", "DELETE", "/v1/snapshots/snap1", "", "", nil, 404, "not_found"},
		{"destroy", "DELETE", "/v1/sessions/" + other, "", "", nil, 200, "destroyed"},
		{"destroyed is gone", "GET", "/v1/sessions/" + other, "", "", nil, 404, "not_found"},
	})
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if p != "rest" {
			t.Fatalf("caller path %q, want rest", p)
		}
	}
}

// fakeFiles is a registry with capabilities of the names the file and
// audit routes use, which echo the arguments they were called with.
type fileArgs struct {
	Session  string `json:"session"`
	Path     string `json:"path,omitempty"`
	Content  string `json:"content,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	Template string `json:"template,omitempty"`
}

type auditArgs struct {
	Limit      int    `json:"limit,omitempty"`
	Capability string `json:"capability,omitempty"`
	Since      string `json:"since,omitempty"`
}

type echo struct {
	Capability string `json:"capability"`
	Args       any    `json:"args"`
}

func fakeRegistry() *capability.Registry {
	reg := capability.NewRegistry()
	for _, name := range []string{"read_file", "write_file", "list_files"} {
		reg.Register(capability.New(name, "fake "+name, capability.ScopeRead, func(ctx context.Context, in fileArgs) (*echo, error) {
			if in.Session == "ghost" {
				return nil, capability.Errorf(capability.NotFound, "session not found: %q", in.Session)
			}
			return &echo{name, in}, nil
		}))
	}
	reg.Register(capability.New("get_audit_log", "fake audit", capability.ScopeRead, func(ctx context.Context, in auditArgs) (*echo, error) {
		return &echo{"get_audit_log", in}, nil
	}))
	return reg
}

func TestFileAndAuditRoutes(t *testing.T) {
	srv := httptest.NewServer(rest.New(controller.New(fakeRegistry(), nil), nil))
	defer srv.Close()
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		want                            string // the echoed call, exactly
	}{
		{"read", "GET", "/v1/sessions/s1/files/src/main.py", "", "", 200, `{"capability":"read_file","args":{"session":"s1","path":"src/main.py"}}`},
		{"list the workspace", "GET", "/v1/sessions/s1/files/", "", "", 200, `{"capability":"list_files","args":{"session":"s1"}}`},
		{"list a directory", "GET", "/v1/sessions/s1/files/src/", "", "", 200, `{"capability":"list_files","args":{"session":"s1","path":"src"}}`},
		{"write text", "PUT", "/v1/sessions/s1/files/a.txt", "text/plain", "héllo\n", 200, `{"capability":"write_file","args":{"session":"s1","path":"a.txt","content":"héllo\n"}}`},
		{"write bytes", "PUT", "/v1/sessions/s1/files/b.bin", "application/octet-stream", "\xff\x00\x01", 200, `{"capability":"write_file","args":{"session":"s1","path":"b.bin","content":"/wAB","encoding":"base64"}}`},
		{"audit", "GET", "/v1/audit?limit=5&capability=run_code&since=2026-01-01T00:00:00Z", "", "", 200, `{"capability":"get_audit_log","args":{"limit":5,"capability":"run_code","since":"2026-01-01T00:00:00Z"}}`},
		{"audit, no filters", "GET", "/v1/audit", "", "", 200, `{"capability":"get_audit_log","args":{}}`},
		{"audit, bad limit", "GET", "/v1/audit?limit=many", "", "", 400, `query parameter limit must be an integer, not \"many\"`},
		{"audit, unknown parameter", "GET", "/v1/audit?sort=asc", "", "", 400, `unknown query parameter \"sort\"`},
		{"another tenant's (or no) session", "GET", "/v1/sessions/ghost/files/x", "", "", 404, `session not found`},
		{"capability missing from this build", "GET", "/v1/sessions", "", "", 404, "needs capability list_sessions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, srv.URL+tc.path, tc.ctype, tc.body)
			if got := strings.TrimSpace(r.body); r.status != tc.status || (tc.status == 200 && got != tc.want) || !strings.Contains(got, tc.want) {
				t.Fatalf("%d %s\nwant %d %s", r.status, got, tc.status, tc.want)
			}
		})
	}
}

// tokenAuth accepts "Bearer good" as tenant alice with the read scope.
func tokenAuth(r *http.Request) (controller.Caller, error) {
	switch httpauth.Bearer(r) {
	case "good":
		return controller.Caller{Tenant: "alice", Scope: capability.ScopeRead, TokenID: "t1"}, nil
	case "":
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "send a token: Authorization: Bearer <token>")
	}
	return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "the token is not valid")
}

func TestAuthAndAccess(t *testing.T) {
	reg := fakeRegistry()
	var got controller.Caller
	reg.Register(capability.New("whoami", "the caller", capability.ScopeRead, func(ctx context.Context, _ struct{}) (*echo, error) {
		got, _ = controller.CallerFrom(ctx)
		return &echo{Capability: "whoami"}, nil
	}))
	reg.Register(capability.New("boom", "needs exec", capability.ScopeExec, func(ctx context.Context, _ struct{}) (*echo, error) {
		return nil, errors.New("must not run")
	}))
	srv := httptest.NewServer(rest.New(controller.New(reg, nil), &rest.Options{Access: rest.Access{
		Auth: tokenAuth, Origins: []string{"https://ui.example"},
	}}))
	defer srv.Close()
	good := []string{"Authorization", "Bearer good"}
	run(t, srv.URL, []check{
		{"no token", "POST", "/v1/whoami", "", "", nil, 401, "send a token"},
		{"bad token", "POST", "/v1/whoami", "", "", []string{"Authorization", "Bearer bad"}, 401, "not valid"},
		{"no token on a resource route", "GET", "/v1/sessions/s1/files/x", "", "", nil, 401, "send a token"},
		{"no token for the document", "GET", "/v1/openapi.json", "", "", nil, 401, "unauthenticated"},
		{"good token", "POST", "/v1/whoami", "", "", good, 200, "whoami"},
		{"scope too narrow", "POST", "/v1/boom", "", "", good, 403, `boom needs scope \"exec\"`},
		{"foreign origin", "POST", "/v1/whoami", "", "", append([]string{"Origin", "https://evil.example"}, good...), 403, "origin https://evil.example may not use this server"},
		{"null origin", "POST", "/v1/whoami", "", "", append([]string{"Origin", "null"}, good...), 403, "origin null"},
		{"allowed origin", "POST", "/v1/whoami", "", "", append([]string{"Origin", "https://ui.example"}, good...), 200, "whoami"},
		{"same origin", "POST", "/v1/whoami", "", "", append([]string{"Origin", srv.URL}, good...), 200, "whoami"},
		{"rebound host name", "POST", "/v1/whoami", "", "", append([]string{"Host", "evil.example:80"}, good...), 403, `Host \"evil.example:80\" is not a name of this server`},
		{"localhost", "POST", "/v1/whoami", "", "", append([]string{"Host", "localhost:1"}, good...), 200, "whoami"},
	})
	if got.Path != "rest" || got.Tenant != "alice" || got.TokenID != "t1" {
		t.Fatalf("caller %+v", got)
	}
	r := do(t, "POST", srv.URL+"/v1/whoami", "", "")
	if h := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
		t.Fatalf("401 without WWW-Authenticate: Bearer (%q)", h)
	}
}

func trim(s string) string {
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return s
}

// TestRequestErrorsSayWhatToFix sends the mistakes a newcomer makes to the
// real handler of the real app and checks the answer names the fix.
func TestRequestErrorsSayWhatToFix(t *testing.T) {
	data := t.TempDir()
	a, err := app.New(context.Background(), data, &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	srv := httptest.NewServer(rest.New(a.Controller, nil))
	defer srv.Close()
	const js = "application/json"
	created := do(t, "POST", srv.URL+"/v1/sessions", js, `{"name":"dup"}`)
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	s := "/v1/sessions/" + created.json(t)["id"].(string)

	run(t, srv.URL, []check{
		{"invalid JSON says where", "POST", "/v1/run_code", js, "{\n  \"code\": \"print(1)\",\n  \"lang\": \"python\",,\n}", nil, 400,
			`request body is not valid JSON at line 3, column 20: invalid character ','`},
		{"JSON that ends early", "POST", "/v1/run_code", js, `{"code":"print(1)"`, nil, 400,
			`not valid JSON: it ends at line 1, column 19 before the value is complete`},
		{"invalid JSON on a resource route", "POST", s + "/run", js, "{\"code\":\n'x'}", nil, 400,
			`the body is not valid JSON at line 2, column 1: invalid character '\\''`},
		{"empty body names the required field", "POST", "/v1/run_code", js, ``, nil, 400,
			`run_code needs \"code\" (the source code to run or render)`},
		{"empty object names the required field", "POST", s + "/exec", js, `{}`, nil, 400, `terminal_exec needs \"command\"`},
		{"unknown field names the closest", "POST", "/v1/run_code", js, `{"code":"1","lang_":"python"}`, nil, 400,
			`unknown field \"lang_\"; did you mean \"lang\"?`},
		{"unknown field in another case", "POST", s + "/run", js, `{"Code":"1"}`, nil, 400, `unknown field \"Code\"; did you mean \"code\"?`},
		{"no validator jargon", "POST", "/v1/create_session", js, `{"name":5}`, nil, 400, `field \"name\" must be a string`},
		{"duplicate name is 409", "POST", "/v1/sessions", js, `{"name":"dup"}`, nil, 409, `"already_exists"`},
		{"export outside the workspace is 400", "POST", "/v1/export_session_log", js, `{"session":"dup","path":"../../escaped.log"}`, nil, 400,
			`leaves the workspace`},
		{"export to an absolute path is 400", "POST", "/v1/export_session_log", js, `{"session":"dup","path":"/etc/escaped.log"}`, nil, 400,
			`must be relative to the workspace`},
		{"export inside works", "POST", "/v1/export_session_log", js, `{"session":"dup","path":"logs/x.log"}`, nil, 200, `logs/x.log`},
	})
	for _, tc := range []struct {
		method, path, allow string
	}{
		{"DELETE", "/v1/capabilities", "GET, HEAD"},
		{"GET", "/v1/run_code", "POST"},
		{"PATCH", s, "GET, HEAD, DELETE"},
		{"POST", s + "/env", "GET, HEAD, PUT"},
		{"DELETE", "/v1/openapi.json", "GET, HEAD"},
	} {
		r := do(t, tc.method, srv.URL+tc.path, "", "")
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != tc.allow || !strings.Contains(r.body, "it takes "+tc.allow) {
			t.Errorf("%s %s: %d Allow=%q %s; want 405 with Allow %q", tc.method, tc.path, r.status, r.header.Get("Allow"), trim(r.body), tc.allow)
		}
	}
	// A path no method serves stays 404, and so does an unknown capability.
	for _, p := range []string{"/v1/nope", s + "/nothing"} {
		if r := do(t, "GET", srv.URL+p, "", ""); r.status != http.StatusNotFound || r.header.Get("Allow") != "" {
			t.Errorf("GET %s: %d Allow=%q; want 404", p, r.status, r.header.Get("Allow"))
		}
	}
	filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "escaped.log" {
			t.Errorf("the export escaped the workspace: %s", p)
		}
		return nil
	})
}

// TestStatusDocCoversEveryCode: every error code's status is in the
// documented list, 409 included, so the docs cannot fall behind Status.
func TestStatusDocCoversEveryCode(t *testing.T) {
	doc := rest.StatusDoc()
	for _, code := range rest.ErrorCodes {
		found := false
		for _, part := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(doc, "Statuses: "), "."), "; ") {
			head, _, _ := strings.Cut(part, ":")
			if strings.HasPrefix(head, strconv.Itoa(rest.Status(code))+" ") && strings.Contains(head, string(code)) {
				found = true
			}
		}
		if !found {
			t.Errorf("status %d (%s) is not documented in %q", rest.Status(code), code, doc)
		}
	}
}
