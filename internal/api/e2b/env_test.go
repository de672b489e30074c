package e2b_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
	"github.com/quro-dev/quro/internal/session"
)

// testPython shares one extracted interpreter between test data dirs, as
// in internal/app.
var testPython = pythontest.Options()

// env is a real App served by a real e2b.Server over HTTP on loopback, as
// quro serve wires it: API keys are the App's tokens, sandboxes its
// sessions.
type env struct {
	App    *app.App
	Server *e2b.Server
	URL    string // the listener's origin: the control plane is URL+"/e2b"
	Key    string // an API key (exec scope) of tenant "t1"
	KeyID  string // its id
	Tenant string
	keyed  bool // the server has API keys

	mu     sync.Mutex
	others map[string]string // tenant → the id of an exec key of its (accessToken)
}

// accessToken is the access token of sandbox id that e.Key obtains, or,
// for a sandbox of another tenant, an exec key of that tenant (made once);
// without API keys, the one token of id.
func (e *env) accessToken(id string) string {
	if !e.keyed {
		return e.Server.AccessToken(id)
	}
	key := e.KeyID
	if s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id); err == nil && s.Tenant != e.Tenant {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.others == nil {
			e.others = map[string]string{}
		}
		if key = e.others[s.Tenant]; key == "" {
			tok, err := e.App.CreateToken(context.Background(), "cli", s.Tenant, []string{"read", "exec"}, "e2b test")
			if err != nil {
				panic(err)
			}
			key, e.others[s.Tenant] = tok.ID, tok.ID
		}
	}
	return e.Server.KeyAccessToken(id, key)
}

// newEnv starts an env; opts (nil: defaults) configure the App.
func newEnv(t testing.TB, opts *app.Options) *env {
	t.Helper()
	return newEnvWith(t, opts, nil)
}

// newEnvWith is newEnv with edit (nil: none) changing the E2B server's
// options before it is made.
func newEnvWith(t testing.TB, opts *app.Options, edit func(*e2b.Options)) *env {
	t.Helper()
	if opts == nil {
		opts = &app.Options{}
	}
	if opts.Python == nil {
		opts.Python = testPython
	}
	if opts.Logger == nil && os.Getenv("QURO_DEBUG_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx := context.Background()
	a, err := app.New(ctx, t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	const tenant = "t1"
	tok, err := a.CreateToken(ctx, "cli", tenant, []string{"read", "exec"}, "e2b test")
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	eopts := &e2b.Options{
		Secret:  secret,
		Version: "test",
		APIKey: func(ctx context.Context, key string) (controller.Caller, error) {
			return a.VerifyToken(ctx, key)
		},
		Key: a.LiveToken,
		Keys: func(ctx context.Context, tenant string) ([]string, error) {
			return a.LiveTokenIDs(ctx, tenant, capability.ScopeExec)
		},
		Sandbox: func(ctx context.Context, id string) (e2b.Sandbox, error) {
			s, err := a.Sessions.ByIDAnyTenant(ctx, id)
			if errors.Is(err, session.ErrNotFound) || err == nil && s.Tenant == session.SpareTenant {
				return e2b.Sandbox{}, fmt.Errorf("%w: %s", e2b.ErrNoSandbox, id)
			}
			if err != nil {
				return e2b.Sandbox{}, err
			}
			return e2b.Sandbox{Tenant: s.Tenant, Paused: s.Paused}, nil
		},
		Sandboxes: func(ctx context.Context) ([]e2b.SandboxRef, error) {
			owners, err := a.Sessions.Owners(ctx)
			out := make([]e2b.SandboxRef, 0, len(owners))
			for id, tenant := range owners {
				out = append(out, e2b.SandboxRef{ID: id, Tenant: tenant})
			}
			return out, err
		},
	}
	if edit != nil {
		edit(eopts)
	}
	srv, err := e2b.New(a.Controller, eopts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !srv.Match(r) {
			http.Error(w, "not an E2B request", http.StatusTeapot)
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return &env{App: a, Server: srv, URL: hs.URL, Key: tok.Token, KeyID: tok.ID, Tenant: tenant, keyed: eopts.APIKey != nil}
}

// newSession makes a session of the env's tenant through the controller
// (not through the E2B API) and returns its id.
func (e *env) newSession(t testing.TB) string {
	t.Helper()
	reply, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "create_session", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(reply.Output)
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		t.Fatalf("create_session: %s (%v)", b, err)
	}
	return out.ID
}

// sandboxTransport adds what the SDKs add to every request to a sandbox
// when E2B_SANDBOX_URL is set: its id, the port, and its access token.
type sandboxTransport struct {
	id, token string
	port      int
}

func (s sandboxTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(e2b.HeaderSandboxID, s.id)
	r.Header.Set(e2b.HeaderSandboxPort, strconv.Itoa(s.port))
	if s.token != "" {
		r.Header.Set("X-Access-Token", s.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// sandboxClient is an HTTP client for port of sandbox id (e2b.EnvdPort or
// e2b.InterpPort) that sends its access token; requests go to e.URL.
// Use it with the generated Connect clients:
//
//	processconnect.NewProcessClient(e.sandboxClient(id, e2b.EnvdPort), e.URL, connect.WithProtoJSON())
func (e *env) sandboxClient(id string, port int) *http.Client {
	return &http.Client{Transport: sandboxTransport{id: id, port: port, token: e.accessToken(id)}}
}
