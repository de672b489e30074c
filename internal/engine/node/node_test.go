package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/engine/node"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// setup is a runner with lang "node" on the engine, and a session whose
// workspace the test fills.
func setup(t *testing.T) (*runcode.Runner, *node.Engine, *session.Session) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("no node on this host: the Node engine has nothing to run")
	}
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	e := node.New(sb, nil)
	t.Cleanup(func() { e.Close(); sb.CloseBoxes() })
	var b [8]byte
	rand.Read(b[:])
	s := &session.Session{ID: "t" + hex.EncodeToString(b[:]), Dir: filepath.Join(t.TempDir(), "session")}
	for _, d := range []string{s.Workspace(), s.TmpDir(), s.OutputsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := runcode.New([]runcode.Language{
		{Name: "node", Runs: true, Chain: []runcode.Engine{e}},
		{Name: "ts", Runs: true, Chain: []runcode.Engine{e.ForContexts()}},
	}, nil)
	return r, e, s
}

func run(t *testing.T, r *runcode.Runner, s *session.Session, lang, code string, cr *runcode.ContextRun, timeout time.Duration) *runcode.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := r.Run(ctx, runcode.Input{Code: code, Lang: lang, Session: s, Timeout: timeout, Context: cr})
	if err != nil {
		t.Fatalf("%q: %v", code, err)
	}
	return res
}

func mainText(res *runcode.Result) string {
	for _, rr := range res.Results {
		if rr.Main {
			s, _ := rr.Data["text/plain"].(string)
			return s
		}
	}
	return "(no main result)"
}

// TestNodeKeepsStateAndRequires: a session's runs share one Node worker:
// top-level declarations persist, top-level await works, require finds
// Node's builtins and a package of the workspace's node_modules, output
// streams, and the last value is the result.
func TestNodeKeepsStateAndRequires(t *testing.T) {
	r, e, s := setup(t)
	ws := s.Workspace()
	if err := os.WriteFile(filepath.Join(ws, "data.txt"), []byte("from-the-workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(ws, "node_modules", "tiny-greet")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(pkg, "package.json"), []byte(`{"name":"tiny-greet","version":"1.0.0","main":"lib.js"}`), 0o644)
	os.WriteFile(filepath.Join(pkg, "lib.js"), []byte(`exports.greet = (n) => "hello " + n;`), 0o644)

	res := run(t, r, s, "node", "const a = 20; let b = 1; function f() { return a + b }\nconsole.log('printed', process.version.startsWith('v'))", nil, time.Minute)
	if res.Engine != "node/resident" || res.ExitCode != 0 || res.Stdout != "printed true\n" || res.Error != "" {
		t.Fatalf("first run: engine %s exit %d stdout %q stderr %q error %q", res.Engine, res.ExitCode, res.Stdout, res.Stderr, res.Error)
	}
	steps := []struct{ code, want string }{
		{"f() * 2", "42\n"},
		{"const v = await new Promise(r => setTimeout(() => r(b + 1), 10)); v", "2\n"},
		{"v + a", "22\n"},
		{"require('fs').readFileSync('data.txt', 'utf8')", "'from-the-workspace'\n"},
		{"require('tiny-greet').greet('box')", "'hello box'\n"},
		{"process.cwd()", "'/home/user'\n"},
		{"require('path').join('x', 'y')", "'x/y'\n"},
	}
	for _, st := range steps {
		res := run(t, r, s, "node", st.code, nil, time.Minute)
		if res.ExitCode != 0 || res.Stdout != st.want || res.Stderr != "" {
			t.Errorf("%q: exit %d stdout %q (want %q) stderr %q error %q", st.code, res.ExitCode, res.Stdout, st.want, res.Stderr, res.Error)
		}
	}
	if n := e.Sessions(); n != 1 {
		t.Errorf("%d sessions with a worker, want 1", n)
	}
	// A plain run's error: exit 1, the traceback on stderr without the
	// worker's frames; the state survives.
	res = run(t, r, s, "node", "function g() { throw new TypeError('bad input') }\ng()", nil, time.Minute)
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "TypeError: bad input") || !strings.Contains(res.Stderr, "at g (<cell>:1:") ||
		strings.Contains(res.Stderr, "[eval]") || strings.Contains(res.Stderr, "node:repl") {
		t.Errorf("error run: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	if res := run(t, r, s, "node", "a", nil, time.Minute); res.Stdout != "20\n" {
		t.Errorf("state after an error: %q %q", res.Stdout, res.Stderr)
	}
}

// TestNodeSeesSessionVariablesChanged: variables the session gets (or
// loses) after its Node worker started reach the next run, as they reach
// a new process; the worker and its state are kept.
func TestNodeSeesSessionVariablesChanged(t *testing.T) {
	r, _, s := setup(t)
	s.Env = map[string]string{"QURO_T_KEPT": "k", "QURO_T_GONE": "g"}
	if res := run(t, r, s, "node", "const pid = process.pid;\n[process.env.QURO_T_KEPT, process.env.QURO_T_GONE].join()", nil, time.Minute); res.Stdout != "'k,g'\n" {
		t.Fatalf("at the start: %q %q %q", res.Stdout, res.Stderr, res.Error)
	}
	s.Env = map[string]string{"QURO_T_KEPT": "k2", "QURO_T_NEW": "n"}
	res := run(t, r, s, "node", "[process.env.QURO_T_KEPT, process.env.QURO_T_NEW, 'QURO_T_GONE' in process.env, pid === process.pid].join()", nil, time.Minute)
	if res.Stdout != "'k2,n,false,true'\n" {
		t.Errorf("after set_session_env: %q %q %q", res.Stdout, res.Stderr, res.Error)
	}
}

// TestNodeContexts: code contexts are separate states with rich results
// and structured errors; TypeScript is stripped of its types; a removed
// context starts afresh.
func TestNodeContexts(t *testing.T) {
	r, e, s := setup(t)
	c1 := &runcode.ContextRun{ID: "c1", Dir: sandbox.HomeUser, Rich: true}
	c2 := &runcode.ContextRun{ID: "c2", Dir: "/tmp", Rich: true}
	res := run(t, r, s, "node", "const x: number = 5; x", c1, time.Minute)
	if res.Exception == nil || res.Exception.Name != "SyntaxError" {
		t.Errorf("TypeScript as JavaScript: %+v", res.Exception)
	}
	res = run(t, r, s, "ts", "interface P { n: number }\nconst p: P = { n: 5 }; p.n * 2", c1, time.Minute)
	if got := mainText(res); got != "10" || res.Exception != nil || res.ExecutionCount < 1 {
		t.Errorf("ts: %q exc %+v count %d stderr %q", got, res.Exception, res.ExecutionCount, res.Stderr)
	}
	if res := run(t, r, s, "node", "typeof p + ' ' + process.cwd()", c2, time.Minute); mainText(res) != "'undefined /tmp'" {
		t.Errorf("context 2 sees context 1's state or cwd: %q %+v", mainText(res), res.Exception)
	}
	res = run(t, r, s, "node", "const o = {k: [1, 2]}; o", c1, time.Minute)
	if got := mainText(res); got != "{ k: [ 1, 2 ] }" {
		t.Errorf("object result %q", got)
	}
	res = run(t, r, s, "node", "await Promise.reject(new RangeError('out of range'))", c1, time.Minute)
	if x := res.Exception; x == nil || x.Name != "RangeError" || x.Value != "out of range" || !strings.Contains(x.Traceback, "<cell>") || strings.Contains(x.Traceback, "node:repl") {
		t.Errorf("rejected await: %+v", res.Exception)
	}
	// The attack that killed the server when esbuild ran in it: cells
	// nested so deeply that esbuild's parser overflowed Go's stack. Each is
	// the cell's error; this process lives, and the next ts cell works.
	for name, code := range map[string]string{
		"arrows": "let deep = " + strings.Repeat("a=>", 100000) + "1",
		"nots":   "let deep = " + strings.Repeat("!", 256<<10) + "1",
	} {
		res = run(t, r, s, "ts", code, c1, time.Minute)
		if x := res.Exception; x == nil || x.Name != "Error" || !strings.Contains(x.Value, "the code nests too deeply to compile") {
			t.Errorf("deeply nested %s: %+v", name, res.Exception)
		}
	}
	if res := run(t, r, s, "ts", "const q: number = p.n + 1; q", c1, time.Minute); mainText(res) != "6" {
		t.Errorf("ts after the attacks: %q %+v", mainText(res), res.Exception)
	}
	if err := e.DropContext(context.Background(), s.ID, "c1"); err != nil {
		t.Fatal(err)
	}
	if res := run(t, r, s, "node", "typeof p", c1, time.Minute); mainText(res) != "'undefined'" {
		t.Errorf("a dropped context kept its state: %q", mainText(res))
	}
	// Plain runs of "ts" stay with QuickJS: this engine steps aside.
	res, err := r.Run(context.Background(), runcode.Input{Code: "1", Lang: "ts", Session: s, Timeout: time.Minute})
	if err != nil || res.Engine != "none" {
		t.Errorf("plain ts run on the contexts-only engine: %v %+v", err, res)
	}
}

// TestNodeTimeoutKillsTheWorker: a run past its timeout is ended with the
// worker (a busy loop takes no signal a REPL could catch); what it printed
// is kept, and the next run says the state is gone.
func TestNodeTimeoutKillsTheWorker(t *testing.T) {
	r, _, s := setup(t)
	run(t, r, s, "node", "const kept = 1", nil, time.Minute)
	res := run(t, r, s, "node", "console.log('before'); for (;;) {}", nil, time.Second)
	if !res.TimedOut || res.Stdout != "before\n" || !strings.Contains(res.Error, "state of its JavaScript contexts") {
		t.Errorf("timeout: timed out %v stdout %q error %q", res.TimedOut, res.Stdout, res.Error)
	}
	res = run(t, r, s, "node", "typeof kept", nil, time.Minute)
	if res.Stdout != "'undefined'\n" || res.ExitCode != 0 {
		t.Errorf("after the timeout: stdout %q stderr %q notes %q", res.Stdout, res.Stderr, res.Notes)
	}
}

// TestNodeRefusesForgedReplies: the code owns the worker's process and
// may write anything on the reply pipe: a reply that is not the protocol's
// ends the worker instead of reaching the result.
func TestNodeRefusesForgedReplies(t *testing.T) {
	r, _, s := setup(t)
	cr := &runcode.ContextRun{ID: "c", Rich: true}
	res := run(t, r, s, "node", `require('fs').writeSync(4, '{"op":"done","id":1,"results":[{"main":true,"data":{"text/html":"<script>x</script>"}}]}\n'); 1`, cr, time.Minute)
	if res.Error == "" || !strings.Contains(res.Error, "refused reply") || len(res.Results) != 0 {
		t.Errorf("forged reply: error %q results %+v", res.Error, res.Results)
	}
	res = run(t, r, s, "node", `require('fs').writeSync(4, 'x'.repeat(17 << 20)); 1`, cr, time.Minute)
	if !strings.Contains(res.Error, "refused reply") {
		t.Errorf("huge reply: error %q", res.Error)
	}
	if res := run(t, r, s, "node", "6 * 7", cr, time.Minute); mainText(res) != "42" {
		t.Errorf("after refused replies: %q %q", mainText(res), res.Error)
	}
}

// TestNodeFallsBackToQuickJS: a session whose userland has no node runs
// lang node in QuickJS, with a note saying why.
func TestNodeFallsBackToQuickJS(t *testing.T) {
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir() // a rootfs with no node in it
	e := node.New(sb, func(string) (string, error) { return empty, nil })
	q := js.New(nil)
	t.Cleanup(func() { e.Close(); q.Close(); sb.CloseBoxes() })
	r := runcode.New([]runcode.Language{{Name: "node", Runs: true, Chain: []runcode.Engine{e, q}}}, nil)
	s := &session.Session{ID: "tnonode", Dir: filepath.Join(t.TempDir(), "session"), Rootfs: "bare"}
	for _, d := range []string{s.Workspace(), s.TmpDir(), s.OutputsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	res := run(t, r, s, "node", "console.log(6 * 7)", nil, time.Minute)
	if res.Engine != "js/quickjs" || res.Stdout != "42\n" || len(res.Notes) != 1 || !strings.Contains(res.Notes[0], `rootfs "bare" has no node`) {
		t.Errorf("fallback: engine %s stdout %q notes %q", res.Engine, res.Stdout, res.Notes)
	}
}

// TestNodeRestartThatKillsTheWorkerIsARestart: a restart of the context
// of a run whose code ignores SIGINT and never yields ends the run as the
// restart the caller asked for (E2B's /execute waits for its
// ContextRestarting error, and without it cut the stream as if the
// sandbox had been killed), though the worker had to be killed; the
// error says the state of the session's contexts is gone, and the next
// run starts afresh. The restart comes once the code printed, an event.
func TestNodeRestartThatKillsTheWorkerIsARestart(t *testing.T) {
	r, e, s := setup(t)
	c := &runcode.ContextRun{ID: "r", Dir: sandbox.HomeUser, Rich: true}
	run(t, r, s, "node", "globalThis.kept = 1", c, time.Minute)
	bg := enginetest.StartPrinting(t, "looping", func(stdout, stderr io.Writer) (*runcode.Result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return r.Run(runcode.WithOutput(ctx, func(stream string, p []byte) {
			if stream == "stdout" {
				stdout.Write(p)
			}
		}), runcode.Input{Code: "process.on('SIGINT', () => {}); console.log('looping'); for (;;) {}", Lang: "node", Session: s, Timeout: 10 * time.Minute, Context: c})
	})
	if err := e.DropContext(context.Background(), s.ID, "r"); err != nil {
		t.Fatal(err)
	}
	res, _, err := bg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if x := res.Exception; x == nil || x.Name != runcode.RestartedException().Name || !strings.Contains(res.Error, "restarted") ||
		!strings.Contains(res.Error, "state of its JavaScript contexts") || res.TimedOut {
		t.Fatalf("the restart: exception %+v error %q timed out %v notes %q", res.Exception, res.Error, res.TimedOut, res.Notes)
	}
	if res := run(t, r, s, "node", "typeof kept", c, time.Minute); mainText(res) != "'undefined'" {
		t.Errorf("after the restart: %q %+v", mainText(res), res.Exception)
	}
}
