package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
)

func TestMain(m *testing.M) {
	// The tests keep the embedded Python in their data directories (seeded
	// from sharedPython, or extracted where a test says so), not in the
	// machine's cache: what a test finds prepared is what it made.
	os.Setenv(python.CacheEnv, python.CacheOff)
	main := func() { os.Exit(Main()) }
	// apt-get, apt and sudo: the names the binary stands in for them in a box.
	testscript.Main(removingSharedPython{m}, map[string]func(){"quro": main, "apt-get": main, "apt": main, "sudo": main})
}

// The tests that change nothing process-wide (environment variables, the
// working directory, signal handlers) and count nothing host-wide run in
// parallel (t.Parallel), each with its own data directory and port; go
// test runs them after the serial ones, so no t.Setenv overlaps them.

// removingSharedPython runs the tests, then removes sharedPython's tree
// and stops the shared browser (sharedBrowser).
type removingSharedPython struct{ m *testing.M }

func (r removingSharedPython) Run() int {
	code := r.m.Run()
	sharedBrowser.close()
	if sharedPython.dir != "" {
		os.RemoveAll(sharedPython.dir)
	}
	return code
}

// sharedPython is the embedded Python extracted and byte-compiled once for
// the test binary. A server on a fresh data directory does that in its
// start-up, seconds of CPU each time; startServerIn gives each
// data directory a hard-linked copy of this one instead, as the server
// finds it from its second start on. The extraction itself is tested by
// internal/engine/python (TestExtraction, TestFirstRunPreparesOnceWithProgress)
// and by the first run here: a new user's first `quro run` in a fresh
// data directory, which must print its answer and nothing on stderr (the
// transcripts, TestScripts, link this one as the servers do).
var sharedPython struct {
	once sync.Once
	dir  string // holds python/
	err  string
}

// seedPython links the shared Python into data, unless it has one.
func seedPython(t testing.TB, data string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(data, "python")); err == nil {
		return
	}
	sharedPython.once.Do(func() {
		dir, err := os.MkdirTemp("", "quro-cmd-test-python-")
		if err != nil {
			sharedPython.err = err.Error()
			return
		}
		sharedPython.dir = dir
		// The first run, with the default budget, waits for the
		// extraction (minutes on a loaded machine) before its 30 s start:
		// the runner's wait for an engine's preparation is not the run's.
		if out, errs, code := cli(t, "run", "--data", dir, "-c", "print(6 * 7)"); code != 0 || out != "42\n" || errs != "" {
			sharedPython.err = fmt.Sprintf("the first Python run: exit %d %q %q", code, out, errs)
		}
	})
	if sharedPython.err != "" {
		t.Fatalf("extracting the shared Python: %s", sharedPython.err)
	}
	if out, err := exec.Command("cp", "-al", filepath.Join(sharedPython.dir, "python"), filepath.Join(data, "python")).CombinedOutput(); err != nil {
		t.Fatalf("linking the shared Python into %s: %v %s", data, err, out)
	}
	// The lock file is each data directory's own (a link would make one
	// lock of them all).
	os.Remove(filepath.Join(data, "python", ".lock"))
}

// TestScripts runs the CLI transcripts in testdata/script. A transcript's
// data directory is fresh, and the first Python run in one would extract
// and byte-compile the interpreter (some 4 CPU-s): a transcript that runs
// Python starts with `seedpython`, which links the shared Python into
// $QURO_DATA as startServerIn does. The shared Python's own first run is
// a new user's first run (seedPython), once a test binary.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("QURO_DATA", env.WorkDir+"/data")
			env.Setenv(python.CacheEnv, python.CacheOff) // as TestMain
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"seedpython": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) != 0 {
					ts.Fatalf("usage: seedpython")
				}
				data := ts.Getenv("QURO_DATA")
				if err := os.MkdirAll(data, 0o755); err != nil {
					ts.Fatalf("%v", err)
				}
				seedPython(scriptTB{t, ts}, data)
			},
		},
	})
}

// scriptTB is the test's testing.TB with its failures reported by the
// transcript that is running (a transcript runs in a subtest of its own,
// whose goroutine must be the one that stops).
type scriptTB struct {
	testing.TB
	ts *testscript.TestScript
}

func (s scriptTB) Helper()                           {}
func (s scriptTB) Fatal(args ...any)                 { s.ts.Fatalf("%s", fmt.Sprint(args...)) }
func (s scriptTB) Fatalf(format string, args ...any) { s.ts.Fatalf(format, args...) }

// server is a running `quro serve`.
type server struct {
	url   string // http://127.0.0.1:PORT
	token string // the first admin token it printed ("" with --no-auth)
	data  string // its data directory
}

// startServer runs `quro serve --addr 127.0.0.1:0` in-process with extra
// flags and returns its base URL and admin token; the server stops when
// the test ends. It keeps no spare sessions (testServeFlags).
func startServer(t *testing.T, flags ...string) *server {
	t.Helper()
	return startServerIn(t, t.TempDir(), flags...)
}

// startServerIn is startServer on the data directory data.
func startServerIn(t *testing.T, data string, flags ...string) *server {
	t.Helper()
	return startServerAtDefaults(t, data, testServeFlags(flags)...)
}

// testServeFlags is flags with --spare-sessions 0 before them, unless
// they set --spare-sessions themselves. A spare session is a box and a
// started Python worker kept ready per tenant and network policy, made
// as the server starts and again after each use: CPU that no test of a
// server's other behaviour needs (one test fell from 29.5 to 24.0 CPU-s
// without it, and cmd/quro starts some fifty servers). The spare pool is
// tested in internal/app (TestSpare*); the tests that claim to work at the
// server's defaults use startServerAtDefaults: TestE2BSDK (its areas,
// limits included, share one server), the default case of
// TestServeLogsO1LinesAtDefault; TestServePreparesPythonAtStart and
// the README's transcripts start their servers as a user would.
func testServeFlags(flags []string) []string {
	for _, f := range flags {
		if f == "--spare-sessions" || strings.HasPrefix(f, "--spare-sessions=") {
			return flags
		}
	}
	return append([]string{"--spare-sessions", "0"}, flags...)
}

// startServerAtDefaults is startServerIn with the server's own defaults,
// spare sessions included.
func startServerAtDefaults(t *testing.T, data string, flags ...string) *server {
	t.Helper()
	seedPython(t, data)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	root := newRoot(strings.NewReader(""), pw, io.Discard)
	srv := &server{data: data}
	root.SetArgs(append([]string{"serve", "--addr", "127.0.0.1:0", "--data", srv.data}, flags...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	br := bufio.NewReader(pr)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("serve printed no address: %v", err)
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "quro_") {
			srv.token = line
		}
		if url, ok := strings.CutPrefix(line, "quro listening on "); ok {
			srv.url = url
			break
		}
	}
	go io.Copy(io.Discard, br)
	return srv
}

type httpResult struct {
	status int
	body   string
	ctype  string
}

func do(t testing.TB, method, url, ctype, body string, hdr ...string) httpResult {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	// The call's own budget (a run's timeout_ms, an install) bounds it;
	// this only stops a hung server: an apt or pip install at a load of
	// 30 on 2 cores passed a minute.
	client := &http.Client{Timeout: 10 * time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpResult{resp.StatusCode, string(b), resp.Header.Get("Content-Type")}
}

func TestHTTPServer(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	base := srv.url
	const js = "application/json"
	for _, tc := range []struct {
		name, method, path, ctype, body string
		hdr                             []string
		status                          int
		want                            string // substring of the body
	}{
		{"run python", "POST", "/v1/run_code", js, `{"code":"print(6*7)"}`, nil, 200, `"stdout":"42\n"`},
		{"run shell exit code", "POST", "/v1/run_code", js, `{"code":"exit 5","lang":"sh"}`, nil, 200, `"exit_code":5`},
		{"model text", "POST", "/v1/run_code", js, `{"code":"print('hi')"}`, []string{"Accept", "text/plain"}, 200, "hi\n"},
		{"text via query", "POST", "/v1/run_code?format=text", js, `{"code":"import sys; sys.stderr.write('bad')"}`, nil, 200, "⚠️ stderr:\nbad"},
		{"no content type is json", "POST", "/v1/run_code", "", `{"code":"print(1)"}`, nil, 200, `"exit_code":0`},
		{"curl -d form label with a JSON body", "POST", "/v1/run_code", "application/x-www-form-urlencoded", `{"code":"print(1)"}`, nil, 200, `"exit_code":0`},
		{"form body that is not JSON", "POST", "/v1/run_code", "application/x-www-form-urlencoded", `code=print(1)`, nil, 400, "not valid JSON"},
		{"capabilities", "GET", "/v1/capabilities", "", "", nil, 200, `"name":"run_code"`},
		{"status", "GET", "/v1/status", "", "", nil, 200, `"pid":`},
		{"help", "GET", "/v1/help", "", "", nil, 200, `"text":"Quro runs code`},
		{"post a no-arg capability", "POST", "/v1/get_service_status", js, ``, nil, 200, `"version"`},
		{"malformed json", "POST", "/v1/run_code", js, `{"code":`, nil, 400, `"code":"invalid_argument"`},
		{"unknown field", "POST", "/v1/run_code", js, `{"code":"1","extra":1}`, nil, 400, `unknown field \"extra\"`},
		{"empty code", "POST", "/v1/run_code", js, `{"code":""}`, nil, 400, "code is empty"},
		{"unknown lang", "POST", "/v1/run_code", js, `{"code":"1","lang":"cobol"}`, nil, 400, "supported: python"},
		{"missing session", "POST", "/v1/run_code", js, `{"code":"1","session":"ghost"}`, nil, 404, `"code":"not_found"`},
		{"unknown capability", "POST", "/v1/nope", js, `{}`, nil, 404, "no capability"},
		{"unknown route", "GET", "/v1/nope/deeper", "", "", nil, 404, "no route"},
		{"wrong content type", "POST", "/v1/run_code", "text/plain", `print(1)`, nil, 415, "application/json"},
		{"too large", "POST", "/v1/run_code", js, `{"code":"` + strings.Repeat("x", 17<<20) + `"}`, nil, 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, base+tc.path, tc.ctype, tc.body, append(tc.hdr, "Authorization", "Bearer "+srv.token)...)
			if r.status != tc.status || !strings.Contains(r.body, tc.want) {
				t.Fatalf("%d %s\nwant %d containing %q", r.status, trim(r.body), tc.status, tc.want)
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

// TestServeAuth: the first start prints an admin token and keeps it in a
// 0600 file; every access path refuses a missing, wrong, revoked or
// under-scoped token, and a foreign browser origin.
func TestServeAuth(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	if !strings.HasPrefix(srv.token, "quro_") {
		t.Fatalf("no admin token printed: %q", srv.token)
	}
	file := filepath.Join(srv.data, AdminTokenFile)
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", file, fi, err)
	}
	if b, _ := os.ReadFile(file); strings.TrimSpace(string(b)) != srv.token {
		t.Fatal("the token file does not hold the printed token")
	}
	admin := []string{"Authorization", "Bearer " + srv.token}
	// A reader of tenant acme and an exec token of tenant acme.
	reader, _, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "read")
	runner, _, code2 := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "read,exec")
	installer, _, code3 := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "read,exec,install")
	acmeAdmin, _, code4 := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "admin")
	if code != 0 || code2 != 0 || code3 != 0 || code4 != 0 {
		t.Fatal("token create failed")
	}
	// A token's default MCP tool profile must be one there is.
	if _, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tools", "everything"); code == 0 || !strings.Contains(errs, "the profiles are") {
		t.Errorf("token create --tools everything: exit %d, %s", code, errs)
	}
	reader, runner, installer, acmeAdmin = strings.TrimSpace(reader), strings.TrimSpace(runner), strings.TrimSpace(installer), strings.TrimSpace(acmeAdmin)
	const js = "application/json"
	run := `{"code":"echo ok","lang":"sh"}`
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		want                     string
	}{
		{"no token", "POST", "/v1/run_code", run, nil, 401, "no token"},
		{"garbage token", "POST", "/v1/run_code", run, []string{"Authorization", "Bearer xyz"}, 401, "malformed"},
		{"wrong secret", "POST", "/v1/run_code", run, []string{"Authorization", "Bearer " + srv.token + "x"}, 401, "unknown token"},
		{"admin runs", "POST", "/v1/run_code", run, admin, 200, `"stdout":"ok\n"`},
		{"reader cannot run", "POST", "/v1/run_code", run, []string{"Authorization", "Bearer " + reader}, 403, `needs scope \"exec\"`},
		{"reader lists", "GET", "/v1/sessions", "", []string{"Authorization", "Bearer " + reader}, 200, `"sessions"`},
		{"runner runs", "POST", "/v1/run_code", run, []string{"Authorization", "Bearer " + runner}, 200, `"stdout":"ok\n"`},
		// Changing a shared rootfs is not exec's: install (or admin) only.
		{"runner cannot install", "POST", "/v1/install_packages", `{"packages":["cowsa."]}`, []string{"Authorization", "Bearer " + runner}, 403, `needs scope \"install\"`},
		{"installer passes the scope check", "POST", "/v1/install_packages", `{"packages":["jq"]}`, []string{"Authorization", "Bearer " + installer}, 400, "rootfs=NAME"},
		{"installer cannot repair", "POST", "/v1/repair_rootfs", `{"rootfs":"default"}`, []string{"Authorization", "Bearer " + installer}, 403, `needs scope \"admin\"`},
		{"reader cannot destroy", "DELETE", "/v1/sessions/default", "", []string{"Authorization", "Bearer " + reader}, 403, `needs scope \"exec\"`},
		{"foreign origin", "POST", "/v1/run_code", run, append([]string{"Origin", "https://evil.example"}, admin...), 403, "origin"},
		{"metrics need a token", "GET", "/metrics", "", nil, 401, "no token"},
		{"metrics are the operator's", "GET", "/metrics", "", []string{"Authorization", "Bearer " + reader}, 403, "needs the operator's token"},
		{"metrics refuse another tenant's admin", "GET", "/metrics", "", []string{"Authorization", "Bearer " + acmeAdmin}, 403, "every tenant"},
		{"metrics refuse an exec token", "GET", "/metrics", "", []string{"Authorization", "Bearer " + runner}, 403, "every tenant"},
		{"metrics refuse a foreign origin", "GET", "/metrics", "", append([]string{"Origin", "https://evil.example"}, admin...), 403, "origin"},
		{"metrics", "GET", "/metrics", "", admin, 200, "quro_calls_total"},
		{"mcp needs a token", "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nil, 401, "no token"},
		{"mcp refuses a foreign origin", "POST", "/mcp", `{}`, append([]string{"Origin", "https://evil.example"}, admin...), 403, "origin"},
		{"mcp refuses an unknown tool profile", "POST", "/mcp?tools=everything",
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
			append([]string{"Accept", "application/json, text/event-stream"}, admin...), 400, "the profiles are"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctype := ""
			if tc.body != "" {
				ctype = js
			}
			r := do(t, tc.method, srv.url+tc.path, ctype, tc.body, tc.hdr...)
			if r.status != tc.status || !strings.Contains(r.body, tc.want) {
				t.Fatalf("%d %s\nwant %d containing %q", r.status, trim(r.body), tc.status, tc.want)
			}
		})
	}
	// The runner's session is acme's: the admin (local tenant) does not see it.
	r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"acme-work"}`, "Authorization", "Bearer "+runner)
	if r.status != 201 {
		t.Fatalf("create as acme: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", srv.url+"/v1/sessions/acme-work", "", "", admin...); r.status != 404 {
		t.Fatalf("local tenant sees acme's session: %d %s", r.status, r.body)
	}
	// Revoked: refused at once, with the reason.
	list, _, _ := quro(t, "", "token", "list", "--json", "--data", srv.data)
	var infos []struct{ ID, Tenant string }
	if err := json.Unmarshal([]byte(list), &infos); err != nil || len(infos) != 5 {
		t.Fatalf("token list: %v %s", err, list)
	}
	runnerID := strings.SplitN(strings.TrimPrefix(runner, "quro_"), "_", 2)[0]
	if out, errs, code := quro(t, "", "token", "revoke", runnerID, "--data", srv.data); code != 0 {
		t.Fatalf("revoke: %s %s", out, errs)
	}
	if r := do(t, "POST", srv.url+"/v1/run_code", js, run, "Authorization", "Bearer "+runner); r.status != 401 || !strings.Contains(r.body, "revoked") {
		t.Fatalf("revoked token: %d %s", r.status, r.body)
	}
	// An unknown capability is refused, and recorded all the same.
	if r := do(t, "POST", srv.url+"/v1/no_such_thing", js, `{}`, admin...); r.status != 404 {
		t.Fatalf("unknown capability: %d %s", r.status, r.body)
	}
	if out, _, _ := quro(t, "", "audit", "--data", srv.data, "--capability", "no_such_thing"); !strings.Contains(out, "rest no_such_thing not_found") {
		t.Fatalf("the unknown capability is not in the audit log:\n%s", out)
	}
	// The audit log of the local tenant holds the admin's calls with the
	// token id and path, and none of acme's.
	out, errs, code := quro(t, "", "audit", "--data", srv.data, "--json", "--capability", "run_code")
	if code != 0 || !strings.Contains(out, `"path": "rest"`) || strings.Contains(out, runnerID) {
		t.Fatalf("audit: %d %s %s", code, out, errs)
	}
	out, _, _ = quro(t, "", "audit", "--data", srv.data, "--tenant", "acme")
	if !strings.Contains(out, "create_session ok") || !strings.Contains(out, "run_code permission_denied") {
		t.Fatalf("acme's audit:\n%s", out)
	}
}

// A second start prints no token: the first is still live.
func TestServeSecondStartPrintsNoToken(t *testing.T) {
	t.Parallel() // its own two servers on one data directory of its own
	srv := startServer(t)
	again := startServerIn(t, srv.data)
	if again.token != "" {
		t.Fatal("a second admin token was printed")
	}
	if r := do(t, "GET", again.url+"/v1/status", "", "", "Authorization", "Bearer "+srv.token); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestServeNoAuthOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--no-auth")
	if srv.token != "" {
		t.Fatal("--no-auth printed a token")
	}
	if r := do(t, "POST", srv.url+"/v1/run_code", "application/json", `{"code":"echo free","lang":"sh"}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	_, errs, code := quro(t, "", "serve", "--no-auth", "--addr", "0.0.0.0:0", "--data", t.TempDir())
	if code == 0 || !strings.Contains(errs, "not a loopback address") {
		t.Fatalf("--no-auth on 0.0.0.0: %d %s", code, errs)
	}
}

func TestServeRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7070", ":7070", "192.0.2.1:80", "example.com:80"} {
		if err := checkLoopback(addr); err == nil {
			t.Errorf("%s accepted", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:7070", "localhost:7070"} {
		if err := checkLoopback(addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// innerSession creates the session "inner" on srv as the admin and returns
// a function that runs sh code in it through REST, answering the text.
func innerSession(t *testing.T, srv *server) func(code string) string {
	t.Helper()
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	if r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"inner"}`, admin...); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	return func(code string) string {
		t.Helper()
		// Five minutes, not run_code's default 30 s: a script of twenty
		// quro calls passed that at a load of 30.
		body, _ := json.Marshal(map[string]any{"lang": "sh", "session": "inner", "code": code, "timeout_ms": 300000})
		r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return r.body
	}
}

// TestInSessionCall: code in a session calls the service back with quro
// call, as its own session, without a token; it reaches nothing else.
func TestInSessionCall(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session); this test runs as uid", os.Geteuid())
	}
	srv := startServer(t)
	run := innerSession(t, srv)
	out := run(`quro call run_code '{"code":"print(6*7)"}'; echo "exit=$?"`)
	if !strings.Contains(out, "42") || !strings.Contains(out, "exit=0") {
		t.Fatalf("quro call inside the session:\n%s", out)
	}
	// It is the session itself: the default is inner, the list holds only
	// it, and the default session of the tenant is out of reach.
	out = run(`quro call --json get_session_status | grep '"name"'; quro call list_sessions; quro call get_session_status '{"session":"default"}'; echo "exit=$?"`)
	if !strings.Contains(out, `"name": "inner"`) || strings.Contains(out, " default") && !strings.Contains(out, "not_found") || !strings.Contains(out, "exit=1") {
		t.Fatalf("confinement:\n%s", out)
	}
	out = run(`quro call create_session '{"name":"escape","network":"host"}'; echo "exit=$?"`)
	if !strings.Contains(out, "permission_denied") || !strings.Contains(out, "exit=1") {
		t.Fatalf("a session made a session:\n%s", out)
	}
	out = run(`quro call destroy_session '{"session":"inner"}'; echo "exit=$?"`)
	if !strings.Contains(out, "permission_denied") {
		t.Fatalf("a session destroyed itself:\n%s", out)
	}
	// The calls are in the audit log under the session's name for itself.
	out, _, _ = quro(t, "", "audit", "--data", srv.data, "--json", "--capability", "create_session")
	if !strings.Contains(out, `"token_id": "session:`) || !strings.Contains(out, `"outcome": "permission_denied"`) {
		t.Fatalf("audit:\n%s", out)
	}
}

// TestAptInsideARootfsSession: `apt-get install` typed in a session on a
// rootfs is refused with what to do instead: code in a session calls as
// the session, with scope exec, and changing a rootfs every session (and
// tenant) on it shares needs scope install. A caller with install then
// installs for the session, through the server, into the rootfs (a copy
// of the test one), and the package serves every session of that rootfs.
func TestAptInsideARootfsSession(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a uid per session, and the rootfs install box)")
	}
	data := dataWithTestRootfs(t)
	srv := startServerIn(t, data)
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	for _, body := range []string{`{"name":"deb","rootfs":"default","network":"internet"}`, `{"name":"offline","rootfs":"default"}`} {
		if r := do(t, "POST", srv.url+"/v1/sessions", js, body, admin...); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	exec := func(sess, cmd string) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"command": cmd, "timeout_ms": 600000})
		r := do(t, "POST", srv.url+"/v1/sessions/"+sess+"/exec", js, string(body), admin...)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		var res struct{ Output string }
		json.Unmarshal([]byte(r.body), &res)
		return res.Output
	}
	for _, sess := range []string{"offline", "deb"} {
		if out := exec(sess, "apt-get install -y jq; echo exit=$?; command -v jq || echo no-jq"); !strings.Contains(out, "this session may not change its rootfs") ||
			!strings.Contains(out, "scope install") || !strings.Contains(out, "exit=100") || !strings.Contains(out, "no-jq") {
			t.Fatalf("apt-get install in session %s:\n%s", sess, out)
		}
	}
	// A caller with install scope (here admin) installs for the session.
	if r := do(t, "POST", srv.url+"/v1/install_packages", js, `{"session":"deb","packages":["jq"]}`, admin...); r.status != 200 || !strings.Contains(r.body, `"exit_code":0`) {
		t.Fatalf("install_packages: %d %s", r.status, r.body)
	}
	// Another session of the rootfs, even without network, has it.
	if out := exec("offline", "echo '{\"a\":[1,2]}' | jq -c .a"); !strings.Contains(out, "[1,2]") {
		t.Fatalf("jq in another session:\n%s", out)
	}
	// Other apt commands are apt's own.
	if out := exec("offline", "apt-cache policy jq | head -2"); !strings.Contains(out, "Installed:") {
		t.Fatalf("apt-cache:\n%s", out)
	}
}

// dataWithTestRootfs is a data directory holding a copy of the shared
// test rootfs "default" (built first when the machine has none yet), so a
// test may change it.
func dataWithTestRootfs(t *testing.T) string {
	t.Helper()
	data := t.TempDir()
	rootfstest.Copy(t, rootfs.DirIn(data))
	return data
}
