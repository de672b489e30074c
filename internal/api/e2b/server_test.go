package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

func get(t *testing.T, c *http.Client, url string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
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

// The edges of the access path: who may reach what, and what a request
// for nothing known gets.
func TestRoutingAndCredentials(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	other := newEnv(t, nil) // another server: another secret
	checks := []struct {
		name   string
		client *http.Client
		path   string
		hdr    []string
		status int
		want   string
	}{
		{"api without a key", nil, "/e2b/v2/sandboxes", nil, 401, "API key is required"},
		{"api with a wrong key", nil, "/e2b/v2/sandboxes", []string{"X-API-KEY", "quro_000000000000_nope"}, 401, "invalid API key"},
		{"api feature unknown", nil, "/e2b/volumes", []string{"X-API-KEY", e.Key}, 501, "is not supported by Quro test"},
		{"sandbox id malformed", nil, "/health", []string{e2b.HeaderSandboxID, "../x", e2b.HeaderSandboxPort, "49983"}, 502, "not a sandbox id"},
		{"sandbox unknown", nil, "/health", []string{e2b.HeaderSandboxID, strings.Repeat("ab", 16), e2b.HeaderSandboxPort, "49983"}, 502, "not found"},
		{"sandbox without token", nil, "/files?path=x", []string{e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "49983"}, 401, "access token"},
		{"sandbox with another server's token", other.sandboxClient(id, e2b.EnvdPort), "/files?path=x", nil, 401, "access token"},
		{"sandbox port not served", nil, "/", []string{e2b.HeaderSandboxID, id, e2b.HeaderSandboxPort, "8080"}, 502, "forwards no other port"},
		{"not an e2b request", nil, "/v1/x", nil, http.StatusTeapot, "not an E2B request"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			status, body := get(t, c.client, e.URL+c.path, c.hdr...)
			if status != c.status || !strings.Contains(body, c.want) {
				t.Fatalf("%d %s; want %d containing %q", status, body, c.status, c.want)
			}
			if status != http.StatusTeapot && !strings.HasPrefix(body, `{"code":`) {
				t.Fatalf("error body is not E2B's {code,message}: %s", body)
			}
		})
	}
}

// A paused sandbox is not running to the SDKs (envd's /health answers
// 502, as E2B's proxy does) until something resumes it.
func TestHealthOfAPausedSandbox(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	caller := controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}
	health := func() (int, string) { return get(t, e.sandboxClient(id, e2b.EnvdPort), e.URL+"/health") }
	if status, body := health(); status == http.StatusBadGateway {
		t.Fatalf("a running sandbox: %d %s", status, body)
	}
	if _, err := e.App.Controller.Call(context.Background(), caller, "pause_session", json.RawMessage(`{"session":"`+id+`"}`)); err != nil {
		t.Fatal(err)
	}
	if status, body := health(); status != http.StatusBadGateway || !strings.Contains(body, "paused") {
		t.Fatalf("a paused sandbox: %d %s", status, body)
	}
	if _, err := e.App.Controller.Call(context.Background(), caller, "resume_session", json.RawMessage(`{"session":"`+id+`"}`)); err != nil {
		t.Fatal(err)
	}
	if status, body := health(); status == http.StatusBadGateway {
		t.Fatalf("a resumed sandbox: %d %s", status, body)
	}
}

// The access path reads each capability's output as the handler's own
// typed value: one of another type than the one it reads (the capability
// changed and the access path did not) is an internal error that says
// so, never a zero value served as E2B's answer.
func TestTypedOutputMismatch(t *testing.T) {
	reg := capability.NewRegistry()
	reg.Register(capability.New("get_session_status", "answers the wrong type", capability.ScopeRead,
		func(ctx context.Context, in app.SessionRef) (*app.Done, error) {
			return &app.Done{Message: in.Session}, nil
		}))
	reg.Register(capability.New("list_sessions", "answers the wrong type", capability.ScopeRead,
		func(ctx context.Context, in app.ListSessionsInput) (app.SessionList, error) {
			return app.SessionList{}, nil
		}))
	srv, err := e2b.New(controller.New(reg, nil), &e2b.Options{
		Secret:  make([]byte, 32),
		Sandbox: func(context.Context, string) (e2b.Sandbox, error) { return e2b.Sandbox{}, e2b.ErrNoSandbox },
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	id := strings.Repeat("ab", 16)
	for path, want := range map[string]string{
		"/e2b/sandboxes/" + id: "get_session_status answered *app.Done; the E2B access path reads *app.SessionInfo",
		"/e2b/sandboxes":       "list_sessions answered app.SessionList; the E2B access path reads *app.SessionList",
	} {
		status, body := get(t, nil, hs.URL+path)
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(body), &eb); err != nil || status != http.StatusInternalServerError || eb.Code != status || !strings.Contains(eb.Message, want) {
			t.Errorf("GET %s: %d %s; want 500 saying %q", path, status, body, want)
		}
	}
}

// TestHostSandbox: the sandbox a request names by its Host alone
// (PORT-ID.DOMAIN), which a cluster node forwards to its owner; the
// API's host, other domains and the header form name none by Host.
func TestHostSandbox(t *testing.T) {
	t.Parallel()
	srv, err := e2b.New(controller.New(capability.NewRegistry(), nil), &e2b.Options{
		Secret: make([]byte, 32), Domain: "e2b.example",
		Sandbox: func(context.Context, string) (e2b.Sandbox, error) { return e2b.Sandbox{}, e2b.ErrNoSandbox },
	})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{
		"49983-sbx1.e2b.example":      "sbx1",
		"3000-sbx2.E2B.example:443":   "sbx2",
		"api.e2b.example":             "",
		"49983-sbx1.other.example":    "",
		"a.49983-sbx1.e2b.example":    "",
		"49983-sbx1.e2b.example.evil": "",
	} {
		r := httptest.NewRequest("GET", "/files", nil)
		r.Host = host
		if got := srv.HostSandbox(r); got != want {
			t.Errorf("Host %s: %q, want %q", host, got, want)
		}
	}
	r := httptest.NewRequest("GET", "/files", nil)
	r.Header.Set(e2b.HeaderSandboxID, "sbx3")
	if got := srv.HostSandbox(r); got != "" {
		t.Errorf("the header form: %q (the router reads the header itself)", got)
	}
}
