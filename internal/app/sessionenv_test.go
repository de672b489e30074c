package app

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
)

// TestSessionEnvRefusesLoaderVariables: the attack of the issue — a
// session sets LD_PRELOAD to a library in its workspace so that the next
// run loads it — and every other name the loader, libc or a shell obey is
// refused by set_session_env with invalid_argument naming the variable;
// nothing is stored, no library loads anywhere, and the audit log shows
// the names but never the values.
func TestSessionEnvRefusesLoaderVariables(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	info := mustCall(t, a, "get_session_status", SessionRef{}).(*SessionInfo)
	so := filepath.Join(info.Workspace, "x.so")
	marker := filepath.Join(info.Workspace, "loaded")
	if gcc, err := exec.LookPath("gcc"); err == nil {
		src := filepath.Join(t.TempDir(), "x.c")
		os.WriteFile(src, []byte(`#include <stdio.h>
__attribute__((constructor)) static void f(void) { FILE *m = fopen("`+marker+`", "a"); if (m) { fputs("loaded\n", m); fclose(m); } }
`), 0o644)
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
	} else {
		os.WriteFile(so, []byte("not a library"), 0o644)
	}
	for _, name := range sandbox.RefusedEnvExamples {
		_, err := call(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{name: &so}})
		ce := wantCode(t, err, capability.InvalidArgument)
		if !strings.Contains(ce.Message, "variable "+name+" cannot be set") || !strings.Contains(ce.Message, "nothing was changed") {
			t.Errorf("%s: %q", name, ce.Message)
		}
	}
	// One refused name among good ones: nothing of the call is stored.
	ok := "1"
	_, err := call(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{"GOOD": &ok, "LD_PRELOAD": &so}})
	wantCode(t, err, capability.InvalidArgument)
	if env := mustCall(t, a, "get_session_env", SessionRef{}).(*EnvOutput); len(env.Env) != 0 {
		t.Fatalf("stored after a refusal: %v", env.Env)
	}
	// Unsetting a refused name is allowed (one stored before the fix).
	mustCall(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{"LD_PRELOAD": nil}})
	texec(t, a, "", "true")
	runCode(t, a, RunCodeInput{Code: "true", Lang: "sh"})
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the workspace library was loaded")
	}
	reply, err := call(t, a, "get_audit_log", AuditInput{Capability: "set_session_env", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	entries := reply.Output.(*AuditLog).Entries
	if len(entries) != len(sandbox.RefusedEnvExamples)+2 {
		t.Fatalf("%d entries", len(entries))
	}
	for _, e := range entries {
		if strings.Contains(e.Args, so) {
			t.Errorf("a value in the audit log: %q", e.Args)
		}
	}
	if e := entries[0]; e.Outcome != "invalid_argument" || !strings.Contains(e.Args, `env=names["`+sandbox.RefusedEnvExamples[0]+`"]`) {
		t.Errorf("%+v", e)
	}
	if e := entries[len(entries)-2]; !strings.Contains(e.Args, `names["GOOD","LD_PRELOAD"]`) {
		t.Errorf("%+v", e)
	}
}

// TestReadScopeStartsNothing: read-scope calls about a session start no
// shell, terminal or interpreter.
func TestReadScopeStartsNothing(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	mustCall(t, a, "create_session", CreateSessionInput{Name: "quiet"})
	reader := controller.Caller{Path: "test", Scope: capability.ScopeRead}
	for _, name := range []string{"get_session_env", "get_session_status", "list_sessions"} {
		if _, err := callAs(t, a, reader, name, SessionRef{Session: "quiet"}); err != nil && name != "list_sessions" {
			t.Fatalf("%s: %v", name, err)
		}
	}
	reply, err := callAs(t, a, reader, "read_screen", SessionRef{Session: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	if scr := reply.Output.(*Screen); scr.Open {
		t.Errorf("read_screen as read shows an open terminal: %+v", scr)
	}
	if shells, ptys := a.Terminals.Live(); shells != 0 || ptys != 0 || a.Python.Sessions() != 0 {
		t.Fatalf("read scope started %d shells, %d terminals, %d interpreters", shells, ptys, a.Python.Sessions())
	}
}

// TestExecScopeDestroysItsOwnSessions: a tenant with exec scope destroys
// the sessions it made, and finds no other tenant's to destroy.
func TestExecScopeDestroysItsOwnSessions(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec, TokenID: "ta"}
	bob := controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeExec, TokenID: "tb"}
	for _, c := range []controller.Caller{alice, bob} {
		if _, err := callAs(t, a, c, "create_session", CreateSessionInput{Name: "box"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := callAs(t, a, bob, "destroy_session", SessionRef{Session: "nope"})
	wantCode(t, err, capability.NotFound)
	if _, err := callAs(t, a, alice, "destroy_session", SessionRef{Session: "box"}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, alice, "get_session_status", SessionRef{Session: "box"}); err == nil {
		t.Fatal("alice's session survived")
	}
	if _, err := callAs(t, a, bob, "get_session_status", SessionRef{Session: "box"}); err != nil {
		t.Fatalf("bob's session went with alice's: %v", err)
	}
	// Code in a session calling back may not destroy, not even itself.
	st, _ := callAs(t, a, bob, "get_session_status", SessionRef{Session: "box"})
	inside := bob
	inside.Session = st.Output.(*SessionInfo).ID
	_, err = callAs(t, a, inside, "destroy_session", SessionRef{Session: "box"})
	wantCode(t, err, capability.PermissionDenied)
}

// TestHugeTimeoutsAreRefusedClearly: a timeout_ms past what a duration
// holds is refused with the accepted range, by every capability that takes
// one, before anything starts.
func TestHugeTimeoutsAreRefusedClearly(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		name string
		args map[string]any
	}{
		{"run_code", map[string]any{"code": "print(1)"}},
		{"terminal_exec", map[string]any{"command": "true"}},
		{"send_input", map[string]any{"data": "x\n"}},
		{"run_js_file", map[string]any{"path": "a.js"}},
		{"python_run", map[string]any{"code": "print(1)"}},
		{"install_packages", map[string]any{"packages": []string{"jq"}}},
	} {
		for _, ms := range []int64{math.MaxInt64, 9223372036855, -1, -2} {
			if ms == -1 && tc.name == "run_code" {
				continue // run_code's -1 is "the longest allowed" (E2B's /execute asks for it)
			}
			tc.args["timeout_ms"] = ms
			_, err := call(t, a, tc.name, tc.args)
			ce := wantCode(t, err, capability.InvalidArgument)
			if !strings.Contains(ce.Message, "is outside") || strings.Contains(ce.Message, "negative") {
				t.Errorf("%s %d: %q", tc.name, ms, ce.Message)
			}
		}
	}
	if shells, ptys := a.Terminals.Live(); shells != 0 || ptys != 0 {
		t.Errorf("a refused call started %d shells, %d terminals", shells, ptys)
	}
}
