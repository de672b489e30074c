package app

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Code contexts through the capabilities: a Python context is its own
// namespace (not run_code's), restart clears it, remove forgets it, and a
// context id names nothing in another session.
func TestCodeContexts(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needEmbedded(t, a) // Python contexts are the resident worker's namespaces
	s1 := mustCall(t, a, "create_session", CreateSessionInput{Name: "c1"}).(*SessionInfo)
	s2 := mustCall(t, a, "create_session", CreateSessionInput{Name: "c2"}).(*SessionInfo)
	c := mustCall(t, a, "create_code_context", CodeContextInput{Session: s1.ID}).(*CodeContext)
	if c.Language != "python" || c.Cwd != "/home/user" || c.Session != s1.ID {
		t.Fatalf("context: %+v", c)
	}
	runCode(t, a, RunCodeInput{Session: s1.ID, Code: "x = 'plain'"})
	runCode(t, a, RunCodeInput{Session: s1.ID, Context: c.ID, Code: "x = 'ctx'"})
	if r := runCode(t, a, RunCodeInput{Session: s1.ID, Code: "print(x)"}); r.Stdout != "plain\n" {
		t.Errorf("run_code's namespace: %q %q", r.Stdout, r.Stderr)
	}
	r := runCode(t, a, RunCodeInput{Session: s1.ID, Context: c.ID, Rich: true, Code: "import os\n(x, os.getcwd())"})
	if len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "('ctx', '/home/user')" || r.Context != c.ID || r.ExecutionCount != 2 {
		t.Errorf("the context: %+v", r)
	}
	// Another session, even of the same tenant, has no such context.
	_, err := call(t, a, "run_code", RunCodeInput{Session: s2.ID, Context: c.ID, Code: "print(x)"})
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.NotFound {
		t.Errorf("context of s1 in s2: %v", err)
	}
	// A language the context does not run.
	if _, err := call(t, a, "run_code", RunCodeInput{Session: s1.ID, Context: c.ID, Lang: "js", Code: "1"}); !errors.As(err, &ce) || ce.Code != capability.InvalidArgument {
		t.Errorf("js in a python context: %v", err)
	}
	mustCall(t, a, "restart_code_context", CodeContextRef{Session: s1.ID, ID: c.ID})
	if r := runCode(t, a, RunCodeInput{Session: s1.ID, Context: c.ID, Rich: true, Code: "x"}); r.Exception == nil || r.Exception.Name != "NameError" {
		t.Errorf("after restart: %+v", r)
	}
	mustCall(t, a, "remove_code_context", CodeContextRef{Session: s1.ID, ID: c.ID})
	if _, err := call(t, a, "run_code", RunCodeInput{Session: s1.ID, Context: c.ID, Code: "1"}); !errors.As(err, &ce) || ce.Code != capability.NotFound {
		t.Errorf("removed context: %v", err)
	}
	list := mustCall(t, a, "list_code_contexts", SessionRef{Session: s1.ID}).(*CodeContextList)
	if len(list.Contexts) != 2 || !list.Contexts[0].Default || !list.Contexts[1].Default {
		t.Errorf("list: %+v", list.Contexts)
	}
	// The cap.
	for range MaxCodeContexts - 2 {
		mustCall(t, a, "create_code_context", CodeContextInput{Session: s1.ID, Language: "bash"})
	}
	if _, err := call(t, a, "create_code_context", CodeContextInput{Session: s1.ID}); !errors.As(err, &ce) || ce.Code != capability.ResourceExhausted {
		t.Errorf("past the cap: %v", err)
	}
	// Bad input names what to fix.
	if _, err := call(t, a, "create_code_context", CodeContextInput{Session: s2.ID, Language: "r"}); !errors.As(err, &ce) || !strings.Contains(ce.Message, "python, javascript") {
		t.Errorf("language r: %v", err)
	}
	if _, err := call(t, a, "run_code", RunCodeInput{Session: s2.ID, Code: "1", Env: map[string]string{"LD_PRELOAD": "/x.so"}}); !errors.As(err, &ce) || ce.Code != capability.InvalidArgument {
		t.Errorf("LD_PRELOAD: %v", err)
	}
}

// A session's JavaScript VMs end with it.
func TestJSContextsEndWithTheSession(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "jsc"}).(*SessionInfo)
	r := runCode(t, a, RunCodeInput{Session: s.ID, Context: "default", Lang: "js", Rich: true, Code: "let kept = 1; kept"})
	if len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "1" {
		t.Fatalf("js: %+v", r)
	}
	// Where the host's userland has node, the context is a REPL of the
	// session's Node worker; else a QuickJS VM.
	vms := a.js.Contexts
	if _, err := a.Sandbox.LookPath("node"); err == nil {
		vms = a.node.Sessions
	}
	if n := vms(); n != 1 {
		t.Fatalf("%d JS contexts or Node workers", n)
	}
	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	if n := vms(); n != 0 {
		t.Errorf("%d JS contexts or Node workers after the destroy", n)
	}
}

// run_code's lang node runs on the session's Node worker in its box:
// state across runs, require of a builtin and of a package in
// /home/user/node_modules, top-level await; js stays on QuickJS, and a JS
// code context runs on Node (E2B's JS contexts).
func TestRunCodeNode(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if _, err := a.Sandbox.LookPath("node"); err != nil {
		t.Skip("the host's userland has no node: lang node falls back to QuickJS (internal/engine/node's tests)")
	}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "nodes"}).(*SessionInfo)
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "node_modules/leftpad-lite/index.js", Content: "module.exports = (s, n) => String(s).padStart(n, '.')"})
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "notes.txt", Content: "a note"})
	r := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "node", Code: "const pad = require('leftpad-lite'); let n = await Promise.resolve(5)"})
	if r.Engine != "node/resident" || r.ExitCode != 0 || r.Error != "" {
		t.Fatalf("node: %+v", r)
	}
	r = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "node", Code: "console.log(pad('x', n), require('fs').readFileSync('notes.txt', 'utf8'))"})
	if r.Stdout != "....x a note\n" || r.Stderr != "" {
		t.Errorf("node state and require: %+v", r)
	}
	r = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "node", Code: "require('os').homedir() + ' ' + __quro_missing"})
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "ReferenceError: __quro_missing is not defined") || strings.Contains(r.Stderr, a.DataDir) {
		t.Errorf("node error: %+v", r)
	}
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "js", Code: "console.log(typeof require('fs').readFileSync)"}); r.Engine != "js/quickjs" {
		t.Errorf("lang js left QuickJS: %+v", r)
	}
	r = runCode(t, a, RunCodeInput{Session: s.ID, Context: "default", Lang: "js", Rich: true, Code: "require('fs').readdirSync('.').sort().join(',')"})
	if r.Engine != "node/resident" || len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "'node_modules,notes.txt'" {
		t.Errorf("a JS context on Node: %+v", r)
	}
}

// Concurrent first runs of a session make one default context per
// language: two defaults would split the session's state between two
// namespaces, and later runs would land in either.
func TestDefaultContextOnce(t *testing.T) {
	t.Parallel()
	var r codeContexts
	const rounds, racers = 3000, 4
	for i := 0; i < rounds; i++ {
		sid := fmt.Sprint("s", i)
		start := make(chan struct{})
		ids := make(chan string, racers)
		var wg sync.WaitGroup
		for j := 0; j < racers; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, err := r.defaultOf(sid, ctxPython)
				if err != nil {
					t.Error(err)
					return
				}
				ids <- c.ID
			}()
		}
		close(start)
		wg.Wait()
		close(ids)
		seen := map[string]bool{}
		for id := range ids {
			seen[id] = true
		}
		if len(seen) != 1 || len(r.list(sid)) != 1 {
			t.Fatalf("round %d: the first runs got %d default contexts (%d listed)", i, len(seen), len(r.list(sid)))
		}
	}
}

// create_code_context with default answers the session's default context
// of the language, the one run_code's context "default" runs in.
func TestCreateDefaultContext(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needEmbedded(t, a) // Python contexts are the resident worker's namespaces
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "d"}).(*SessionInfo)
	c := mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "py", Default: true}).(*CodeContext)
	if !c.Default || c.Language != "python" || c.Cwd != sandbox.HomeUser {
		t.Fatalf("the default context: %+v", c)
	}
	runCode(t, a, RunCodeInput{Session: s.ID, Context: "default", Code: "x = 'default'"})
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Context: c.ID, Code: "print(x)"}); r.Stdout != "default\n" {
		t.Errorf("run_code's default context is not the one answered: %q %q", r.Stdout, r.Stderr)
	}
	if again := mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "python3", Default: true}).(*CodeContext); again.ID != c.ID {
		t.Errorf("a second default: %s, then %s", c.ID, again.ID)
	}
	var ce *capability.Error
	if _, err := call(t, a, "create_code_context", CodeContextInput{Session: s.ID, Default: true, Cwd: "/tmp"}); !errors.As(err, &ce) || ce.Code != capability.InvalidArgument {
		t.Errorf("default with a cwd: %v", err)
	}
}

// JavaScript/TypeScript contexts are refused at create past the engine's
// per-session cap (each keeps a VM in the server's memory), not at their
// first run; a run the engine still refuses (a default context past it)
// is resource_exhausted with the engine's reason, not an internal error.
func TestJSContextCap(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "jscap"}).(*SessionInfo)
	var ids []string
	for i := range js.MaxContextsPerSession {
		lang := "js"
		if i%2 == 1 {
			lang = "ts"
		}
		ids = append(ids, mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: lang}).(*CodeContext).ID)
	}
	var ce *capability.Error
	if _, err := call(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "javascript"}); !errors.As(err, &ce) ||
		ce.Code != capability.ResourceExhausted || !strings.Contains(ce.Message, "remove_code_context") {
		t.Fatalf("a JS context past the cap: %v", err)
	}
	mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "python"})
	for _, id := range ids {
		runCode(t, a, RunCodeInput{Session: s.ID, Context: id, Code: "1"})
	}
	// The default JS context is not refused at create (run_code's
	// "default" and list_code_contexts make it), but its QuickJS VM is;
	// where the host has node, the contexts are REPLs of the session's
	// Node worker, in its box, and none holds a VM of the server's.
	_, err := call(t, a, "run_code", RunCodeInput{Session: s.ID, Context: "default", Lang: "js", Code: "1"})
	if _, noNode := a.Sandbox.LookPath("node"); noNode != nil {
		if !errors.As(err, &ce) || ce.Code != capability.ResourceExhausted || !strings.Contains(ce.Message, "JavaScript") {
			t.Fatalf("the default context's run past the engine's cap: %v", err)
		}
	} else if err != nil {
		t.Fatalf("the default context's run on Node: %v", err)
	}
	// The default one, now in the registry, counts: two removed make room
	// for one.
	mustCall(t, a, "remove_code_context", CodeContextRef{Session: s.ID, ID: ids[0]})
	if _, err := call(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "js"}); !errors.As(err, &ce) || ce.Code != capability.ResourceExhausted {
		t.Errorf("the default context is not counted: %v", err)
	}
	mustCall(t, a, "remove_code_context", CodeContextRef{Session: s.ID, ID: ids[1]})
	c := mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID, Language: "js"}).(*CodeContext)
	runCode(t, a, RunCodeInput{Session: s.ID, Context: c.ID, Code: "1"})
}
