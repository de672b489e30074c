package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

func wantCode(t *testing.T, err error, code capability.Code) *capability.Error {
	t.Helper()
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("want %s, got %v", code, err)
	}
	return ce
}

// sessionArgs completes, for every capability that takes a session, an
// argument set that would be valid for the owner of the session. A new
// capability with a session argument must be added here, so that tenancy
// is tested for it.
var sessionArgs = map[string]map[string]any{
	"run_code":            {"code": "print(1)"},
	"python_run":          {"code": "print(1)"},
	"install_packages":    {"packages": []string{"jq"}},
	"terminal_exec":       {"command": "true"},
	"send_input":          {"data": "x\n"},
	"destroy_session":     {},
	"get_audit_log":       {},
	"get_session_status":  {},
	"set_default_session": {},
	"set_session_env":     {"env": map[string]any{"A": "1"}},
	"set_session_network": {"network": "none"},
	"set_session_secret":  {"name": "API_KEY", "value": "v", "hosts": []string{"api.example.com"}},
	"get_egress_log":      {},
	"get_preview_url":     {"port": 8080},
	"list_ports":          {},
	"set_session_timeout": {"timeout_s": 3600},
	"get_session_env":     {},
	"export_session_log":  {"path": "log.txt"},
	"reset_python":        {},
	"pause_session":       {},
	"resume_session":      {},
	"read_screen":         {},
	"run_js_file":         {"path": "a.js"},
	"call_js_function":    {"path": "a.js", "function": "f"},
	"read_file":           {"path": "a.txt"},
	"write_file":          {"path": "a.txt", "content": "x"},
	"edit_file":           {"command": "view", "path": "a.txt"},
	"list_files":          {},
	"stat_file":           {"path": "a.txt"},
	"make_dir":            {"path": "d"},
	"move_file":           {"source": "a.txt", "destination": "b.txt"},
	"remove_file":         {"path": "a.txt"},
	"watch_dir":           {"timeout_ms": 1},
	"create_project":      {"template": "shell", "name": "p"},
	"snapshot_session":    {"name": "snap"},
	"fork_session":        {"count": 1},
	"open_terminal":       {},
	"start_process":       {"command": "true"},
	"connect_process":     {"pid": 1},
	"read_process_output": {"pid": 1},
	"list_processes":      {},
	"send_process_input":  {"pid": 1, "data": "x"},
	"close_process_stdin": {"pid": 1},
	"signal_process":      {"pid": 1},
	"resize_process":      {"pid": 1, "cols": 80, "rows": 24},
	// An id bob could not know either way: the session is what is refused.
	"create_code_context":  {"language": "python"},
	"list_code_contexts":   {},
	"restart_code_context": {"id": "0b9d1c1e-0000-0000-0000-000000000000"},
	"remove_code_context":  {"id": "0b9d1c1e-0000-0000-0000-000000000000"},
}

// Tenant B can neither see nor touch tenant A's sessions, by id or by
// name, through any capability; its own names and default are its own.
func TestTenantsAreInvisibleToEachOther(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "ta"}
	bob := controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeAdmin, TokenID: "tb"}

	reply, err := callAs(t, a, alice, "create_session", CreateSessionInput{Name: "work"})
	if err != nil {
		t.Fatal(err)
	}
	work := reply.Output.(*SessionInfo)
	if _, err := callAs(t, a, alice, "run_code", RunCodeInput{Lang: "sh", Code: "echo mine > f.txt", Session: "work"}); err != nil {
		t.Fatal(err)
	}

	// Every capability with a session argument says not found to bob,
	// for the id and for the name.
	tested := 0
	for _, c := range a.Controller.Registry().List() {
		if _, ok := c.InputSchema.Properties["session"]; !ok {
			continue
		}
		tested++
		extra, ok := sessionArgs[c.Name]
		if !ok {
			t.Errorf("capability %s takes a session but has no entry in sessionArgs", c.Name)
			continue
		}
		for _, ref := range []string{work.ID, "work"} {
			args := map[string]any{"session": ref}
			for k, v := range extra {
				args[k] = v
			}
			_, err := callAs(t, a, bob, c.Name, args)
			var ce *capability.Error
			if !errors.As(err, &ce) || ce.Code != capability.NotFound {
				t.Errorf("%s on alice's session %s as bob: %v", c.Name, ref, err)
			} else if strings.Contains(ce.Message, "alice") {
				t.Errorf("%s: the error names the other tenant: %s", c.Name, ce.Message)
			}
		}
	}

	if tested < 12 {
		t.Fatalf("only %d capabilities take a session?", tested)
	}

	reply, err = callAs(t, a, bob, "list_sessions", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range reply.Output.(*SessionList).Sessions {
		if s.ID == work.ID {
			t.Fatal("bob lists alice's session")
		}
	}
	// Bob may use the same name; his default session is not alice's.
	if _, err := callAs(t, a, bob, "create_session", CreateSessionInput{Name: "work"}); err != nil {
		t.Fatalf("bob cannot have his own \"work\": %v", err)
	}
	ad, _ := callAs(t, a, alice, "get_session_status", SessionRef{})
	bd, _ := callAs(t, a, bob, "get_session_status", SessionRef{})
	local, _ := callAs(t, a, admin, "get_session_status", SessionRef{})
	ids := map[string]bool{ad.Output.(*SessionInfo).ID: true, bd.Output.(*SessionInfo).ID: true, local.Output.(*SessionInfo).ID: true}
	if len(ids) != 3 {
		t.Fatalf("tenants share a default session: %v", ids)
	}
	// Alice's session is untouched by all of bob's attempts.
	if r, err := callAs(t, a, alice, "run_code", RunCodeInput{Lang: "sh", Code: "cat f.txt", Session: work.ID}); err != nil ||
		r.Output.(interface{ Text() string }).Text() == "" || !strings.Contains(r.Text, "mine") {
		t.Fatalf("alice's session changed: %v %v", r, err)
	}

	// Each tenant's audit log holds its own calls only.
	reply, err = callAs(t, a, bob, "get_audit_log", AuditInput{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range reply.Output.(*AuditLog).Entries {
		if e.TokenID != "tb" {
			t.Fatalf("bob sees %+v", e)
		}
	}
	reply, _ = callAs(t, a, alice, "get_audit_log", AuditInput{Capability: "run_code"})
	entries := reply.Output.(*AuditLog).Entries
	if len(entries) != 2 || entries[0].Outcome != "ok" || !strings.Contains(entries[0].Args, "echo mine") {
		t.Fatalf("alice's run_code entries: %+v", entries)
	}
}

func TestSessionLimitPerTenant(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Limits: Limits{SessionsPerTenant: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	carol := controller.Caller{Path: "test", Tenant: "carol", Scope: capability.ScopeAdmin}
	for _, n := range []string{"one", "two"} {
		if _, err := callAs(t, a, carol, "create_session", CreateSessionInput{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = callAs(t, a, carol, "create_session", CreateSessionInput{Name: "three"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	if ce.RetryAfter == 0 || !strings.Contains(ce.Message, "destroy") {
		t.Fatalf("%+v", ce)
	}
	for _, want := range []string{"session ceiling of 2", "quro serve --max-sessions-per-tenant N", "quro tenant limits set --sessions N"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the refusal %q does not say %q", ce.Message, want)
		}
	}
	// Another tenant is not held back by carol's sessions.
	if _, err := callAs(t, a, admin, "create_session", CreateSessionInput{Name: "three"}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, carol, "destroy_session", SessionRef{Session: "one"}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, carol, "create_session", CreateSessionInput{Name: "three"}); err != nil {
		t.Fatalf("after destroying one: %v", err)
	}
}

// With one run allowed per tenant, a second run of the same tenant is
// refused while the first is in flight; another tenant still runs.
func TestRunLimitPerTenant(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Limits: Limits{RunsPerTenant: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	dave := controller.Caller{Path: "test", Tenant: "dave", Scope: capability.ScopeExec}
	// create_session runs no code: it takes no run slot.
	reply, err := callAs(t, a, dave, "create_session", CreateSessionInput{Name: "d"})
	if err != nil {
		t.Fatal(err)
	}
	ws := reply.Output.(*SessionInfo).Workspace
	started, release := filepath.Join(ws, "started"), filepath.Join(ws, "release")
	for _, f := range []string{started, release} {
		if err := syscall.Mkfifo(f, 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(f, 0o666)
	}
	done := make(chan error, 1)
	go func() {
		r, err := callAs(t, a, dave, "run_code", RunCodeInput{Lang: "sh", Session: "d", Code: "echo up > started; read line < release; echo \"$line\""})
		if err == nil && r.Output.(*runcode.Result).Stdout != "go\n" {
			err = fmt.Errorf("the run did not finish as planned: %s", r.Text)
		}
		done <- err
	}()
	// Reading the fifo to its end returns once the run has written it: the
	// run holds dave's one slot now. (Closing before the end would kill the
	// writer with SIGPIPE.)
	f, err := os.Open(started)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "up\n" {
		t.Fatalf("started: %q %v", b, err)
	}
	f.Close()
	_, err = callAs(t, a, dave, "terminal_exec", TerminalExecInput{Command: "true", Session: "d"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	if ce.RetryAfter != 1 {
		t.Fatalf("%+v", ce)
	}
	// Reading is not a run; another tenant runs.
	if _, err := callAs(t, a, dave, "list_sessions", Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, admin, "run_code", RunCodeInput{Lang: "sh", Code: "true"}); err != nil {
		t.Fatal(err)
	}
	// Opened read-write, the fifo does not block when the run has died;
	// it is closed only after the run ended, so cat sees the line.
	w, err := os.OpenFile(release, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("go\n")
	err = <-done
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, dave, "terminal_exec", TerminalExecInput{Command: "true", Session: "d"}); err != nil {
		t.Fatalf("after the first run ended: %v", err)
	}
}
