package mcp_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// listTools returns the names tools/list gives cs, and the tools by name.
func listTools(t *testing.T, cs *mcp.ClientSession) ([]string, map[string]*mcp.Tool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	byName := map[string]*mcp.Tool{}
	for tl, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tl.Name)
		byName[tl.Name] = tl
	}
	return names, byName
}

// The profile listed: the server's default (agent), a client's ?tools=,
// a token's default; an unknown one is refused naming the profiles. A
// tool outside the profile may still be called when the scope allows it,
// and a tool the scope does not allow is listed in no profile.
func TestToolProfiles(t *testing.T) {
	a := newApp(t)
	reg := a.Controller.Registry()
	caller := func(scope capability.Scope, tools string) func(*http.Request) (controller.Caller, error) {
		return func(*http.Request) (controller.Caller, error) {
			return controller.Caller{Tenant: "acme", Scope: scope, TokenID: "t-" + string(scope) + tools, Tools: tools}, nil
		}
	}
	agentProfile, _ := reg.Profile(capability.DefaultProfile)
	var agent []string
	for _, c := range reg.Members(agentProfile, capability.ScopeExec) {
		agent = append(agent, c.Name)
	}

	cs, err := connectHTTP(t, serveHTTP(t, a, caller(capability.ScopeExec, ""), nil), http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	names, tools := listTools(t, cs)
	if !slices.Equal(names, agent) {
		t.Errorf("an exec token is listed %v, want the agent profile %v", names, agent)
	}
	rc := tools["run_code"]
	if rc == nil || strings.Contains(rc.Description, "QuickJS") || len(rc.Description) > 400 {
		t.Errorf("run_code is not listed in its short form: %+v", rc)
	}
	// list_sessions is in no agent listing, and callable all the same.
	if o, err := callTool(t, cs, "list_sessions", nil); err != nil || o.IsError {
		t.Errorf("list_sessions outside the profile: %v %+v", err, o)
	}
	// A field the compact schema leaves unsaid is still accepted.
	if o, err := callTool(t, cs, "run_code", map[string]any{"lang": "bash", "code": "echo 42", "compile_timeout_ms": 5000}); err != nil || o.IsError || !strings.Contains(o.text(), "42") {
		t.Errorf("run_code with compile_timeout_ms through the agent profile: %v %+v", err, o)
	}

	// The client's ?tools= comes first, then the token's default.
	url := serveHTTP(t, a, caller(capability.ScopeExec, "admin"), nil)
	cs, err = connectHTTP(t, url, http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	names, _ = listTools(t, cs)
	if slices.Contains(names, "run_code") || !slices.Contains(names, "get_service_status") {
		t.Errorf("a token whose default is admin is listed %v", names)
	}
	for _, n := range names {
		if c, _ := reg.Get(n); !capability.ScopeExec.Covers(c.Scope) {
			t.Errorf("an exec token is listed %s (scope %s)", n, c.Scope)
		}
	}
	cs, err = connectHTTP(t, url+"/?tools=full", http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	names, _ = listTools(t, cs)
	if slices.Contains(names, "create_token") || !slices.Contains(names, "run_code") || len(names) < 40 {
		t.Errorf("an exec token's full profile is %v", names)
	}

	resp, err := http.Post(url+"/?tools=bogus", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("?tools=bogus: %s, want 400", resp.Status)
	}
}

// The annotations say what a tool does, not the scope it needs.
func TestAnnotationsByMeaning(t *testing.T) {
	a := newApp(t)
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, &quroOptionsFull), http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, tools := listTools(t, cs)
	for _, tc := range []struct {
		name                                     string
		readOnly, destructive, idempotent, world bool
	}{
		{"list_tokens", true, false, true, false},
		{"read_file", true, false, true, false},
		{"destroy_session", false, true, true, false},
		{"remove_file", false, true, true, false},
		{"write_file", false, true, false, false},
		{"create_session", false, false, false, false},
		{"run_code", false, true, false, true},
		{"install_packages", false, false, true, true},
	} {
		tl := tools[tc.name]
		if tl == nil || tl.Annotations == nil {
			t.Errorf("%s: not listed with annotations", tc.name)
			continue
		}
		an := tl.Annotations
		destructive := an.DestructiveHint == nil || *an.DestructiveHint // MCP's default: true
		world := an.OpenWorldHint == nil || *an.OpenWorldHint
		if an.ReadOnlyHint != tc.readOnly || (!tc.readOnly && destructive != tc.destructive) || an.IdempotentHint != tc.idempotent || world != tc.world {
			t.Errorf("%s: annotations %+v (destructive %v, open world %v), want read-only %v destructive %v idempotent %v open world %v",
				tc.name, an, destructive, world, tc.readOnly, tc.destructive, tc.idempotent, tc.world)
		}
	}
}

var quroOptionsFull = quromcp.Options{Tools: capability.FullProfile}
