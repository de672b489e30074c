package insession_test

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
	"github.com/quro-dev/quro/internal/session"
)

// fuzzWithin bounds each fuzzed request, well inside the 10 seconds Go's
// fuzz worker gives an input before it panics: a request that runs code
// or waits on the box ends there with its error, which is as good an
// answer for what the target checks (nothing of alpha's in it). A run of
// `sleep 30` ended 5.1 s after it started with a bound of 5 s, a Python
// busy loop 7.2 s (its worker is interrupted, then stopped), at a load
// of 60: hence 3.
const fuzzWithin = 3 * time.Second

// reachWithin bounds the requests that start beta's box and its file
// server before the fuzzing: seconds, a minute and more at load.
const reachWithin = 5 * time.Minute

// FuzzInSessionRequest sends arbitrary requests (method, path, headers,
// body, and the uid the kernel would report) to the handler of session
// beta's socket, as `quro serve` builds it: the real REST handler and
// controller over a real store and sandbox. Whatever comes in, nothing
// panics, every caller the resolver lets through is beta of tenant c23,
// and no answer carries anything of alpha (tenant c5): its id, its name,
// the secret in its workspace or its variables.
func FuzzInSessionRequest(f *testing.F) {
	ctx := context.Background()
	a, err := app.New(ctx, f.TempDir(), &app.Options{
		Python: pythontest.Options()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.Close() })
	alpha, err := a.Sessions.Create(session.WithTenant(ctx, "c5"), "alpha-c5")
	if err != nil {
		f.Fatal(err)
	}
	beta, err := a.Sessions.Create(session.WithTenant(ctx, "c23"), "beta-c23")
	if err != nil {
		f.Fatal(err)
	}
	const secret = "C5-SECRET-7f3a"
	if err := os.WriteFile(filepath.Join(alpha.Workspace(), "secret.txt"), []byte(secret), 0o600); err != nil {
		f.Fatal(err)
	}
	v := secret
	if _, err := a.Sessions.UpdateEnv(ctx, alpha, map[string]*string{"ALPHA_KEY": &v}); err != nil {
		f.Fatal(err)
	}
	admin, err := a.CreateToken(ctx, "test", "", []string{"admin"}, "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	r := &insession.Resolver{Sessions: a.Sessions}
	var fuzzT testing.TB = f // the current input's T while fuzzing
	auth := func(req *http.Request) (controller.Caller, error) {
		c, err := r.Auth(req)
		if err == nil && (c.Session != beta.ID || c.Tenant != "c23") {
			fuzzT.Errorf("beta's socket resolved caller %+v", c)
		}
		return c, err
	}
	h := insession.ForSession(beta.ID, rest.New(a.Controller, &rest.Options{Access: rest.Access{Auth: auth}}))
	// serve sends one request to beta's socket as the given uid, bounded
	// by within.
	serve := func(method, path, headers string, body []byte, uid uint32, within time.Duration) (*httptest.ResponseRecorder, bool) {
		ctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, bytes.NewReader(body))
		if err != nil || !strings.HasPrefix(path, "/") {
			return nil, false
		}
		sc := bufio.NewScanner(strings.NewReader(headers))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && k != "" {
				req.Header.Add(k, strings.TrimSpace(v))
			}
		}
		req = req.WithContext(insession.WithPeer(req.Context(), &syscall.Ucred{Pid: 1, Uid: uid, Gid: uid}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, true
	}

	const js = "Content-Type: application/json\n"
	for _, seed := range []struct {
		method, path, headers, body string
		who                         uint8
	}{
		{"POST", "/v1/get_session_status", js, `{}`, 0},
		{"POST", "/v1/get_session_status", js, `{"session":"` + alpha.ID + `"}`, 0},
		{"POST", "/v1/get_session_status", js, `{"session":"alpha-c5"}`, 0},
		{"POST", "/v1/list_sessions", js, `{}`, 0},
		{"POST", "/v1/read_file", js, `{"path":"secret.txt"}`, 0},
		{"POST", "/v1/read_file", js, `{"path":"../../` + alpha.ID + `/workspace/secret.txt"}`, 0},
		{"POST", "/v1/read_file", js, `{"path":"` + alpha.Workspace() + `/secret.txt"}`, 0},
		{"POST", "/v1/read_file", js, `{"session":"` + alpha.ID + `","path":"secret.txt"}`, 0},
		{"POST", "/v1/write_file", js, `{"session":"alpha-c5","path":"x","content":"pwned"}`, 0},
		{"POST", "/v1/get_env", js, `{"session":"` + alpha.ID + `"}`, 0},
		{"POST", "/v1/run_code", js, `{"lang":"sh","code":"cat ` + alpha.Workspace() + `/secret.txt; echo $ALPHA_KEY"}`, 0},
		{"POST", "/v1/destroy_session", js, `{"session":"` + alpha.ID + `"}`, 0},
		{"POST", "/v1/create_session", js, `{"name":"escape","network":"host"}`, 0},
		{"GET", "/v1/sessions/" + alpha.ID, "", "", 0},
		{"GET", "/v1/sessions", "Authorization: Bearer " + admin.Token + "\n", "", 0},
		{"POST", "/v1/read_file", js + "Authorization: Bearer " + admin.Token + "\n", `{"session":"alpha-c5","path":"secret.txt"}`, 0},
		{"POST", "/v1/read_file", js, `{"path":"secret.txt"}`, 1}, // alpha's uid on beta's socket
		{"POST", "/v1/list_sessions", js, `{}`, 2},
		{"POST", "/v1/list_sessions", js, `{}`, 3},
		{"POST", "/v1/list_sessions", "Content-Type: text/plain\nX-Quro-Session: " + alpha.ID + "\n", `{}`, 0},
		{"GET", "/v1/openapi.json", "", "", 0},
		{"DELETE", "/v1/sessions/alpha-c5", "", "", 0},
		{"POST", "/v1/%2e%2e/sessions", js, `{"name":"x"}`, 0},
		{"POST", "/v1/read_file", js, `{"path":"secret.txt","session":"beta-c23","session":"alpha-c5"}`, 0},
		{"POST", "/mcp", js, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 0},
	} {
		f.Add(seed.method, seed.path, seed.headers, []byte(seed.body), seed.who)
	}
	// What the seeds start once is started here, outside the fuzz
	// function: beta's box and its file server (the first file
	// operation). Not a Python worker: no seed runs Python, and an input
	// that does is bounded like any other (fuzzWithin). Go's fuzz worker gives each input 10 seconds
	// and then panics ("deadlocked!", exit status 2, its message on a
	// stderr Go discards); at a load of 50 or more the box's start alone
	// took longer, and the seed that first reached it failed.
	for _, warm := range []struct{ path, body string }{
		{"/v1/run_code", `{"lang":"sh","code":"echo $((6*7))"}`},
		{"/v1/write_file", `{"path":"warm.txt","content":"42"}`},
		{"/v1/read_file", `{"path":"/home/user/warm.txt"}`},
	} {
		rec, _ := serve("POST", warm.path, js, []byte(warm.body), uint32(beta.UID), reachWithin)
		if rec.Code != http.StatusOK || (warm.path != "/v1/write_file" && !strings.Contains(rec.Body.String(), "42")) {
			f.Fatalf("beta's %s %s: %d %s", warm.path, warm.body, rec.Code, rec.Body)
		}
	}
	f.Fuzz(func(t *testing.T, method, path, headers string, body []byte, who uint8) {
		fuzzT = t
		var uid uint32
		switch who % 5 {
		case 0:
			uid = uint32(beta.UID)
		case 1:
			uid = uint32(alpha.UID)
		case 2:
			uid = 0
		case 3:
			uid = uint32(os.Geteuid())
		default:
			uid = 2_000_000 + uint32(who)
		}
		rec, ok := serve(method, path, headers, body, uid, fuzzWithin)
		if !ok {
			return
		}
		out := rec.Body.String()
		for _, leak := range []string{secret, alpha.ID, "alpha-c5", "pwned"} {
			if strings.Contains(out, leak) && !strings.Contains(string(body)+path+headers, leak) {
				t.Fatalf("%s %s (uid %d) answered with alpha's %q:\n%s", method, path, uid, leak, out)
			}
		}
		if strings.Contains(out, secret) {
			t.Fatalf("%s %s (uid %d) answered with alpha's secret:\n%s", method, path, uid, out)
		}
		if b, err := os.ReadFile(filepath.Join(alpha.Workspace(), "x")); err == nil {
			t.Fatalf("beta wrote into alpha's workspace: %q", b)
		}
		if !a.Sessions.Exists(ctx, alpha.ID) {
			t.Fatalf("%s %s destroyed alpha", method, path)
		}
	})
}
