package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// interp posts to the code interpreter of sandbox id.
func (e *env) interp(t testing.TB, ctx context.Context, id, method, path string, body any) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.sandboxClient(id, e2b.InterpPort).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// lineReader reads /execute's NDJSON, checking each line as the SDK's
// readLines + JSON.parse would.
type lineReader struct {
	t  testing.TB
	sc *bufio.Scanner
}

func newLineReader(t testing.TB, resp *http.Response) *lineReader {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/execute: %s %s", resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	return &lineReader{t: t, sc: sc}
}

// next is the next line, nil at the end of the stream.
func (l *lineReader) next() map[string]any {
	l.t.Helper()
	if !l.sc.Scan() {
		return nil
	}
	raw := l.sc.Bytes()
	if len(bytes.TrimSpace(raw)) == 0 {
		l.t.Fatal("a blank line: the SDK's JSON.parse fails on it")
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		l.t.Fatalf("line %q: %v", raw, err)
	}
	return m
}

// nextData is the next line that is not a keepalive.
func (l *lineReader) nextData() map[string]any {
	l.t.Helper()
	m := l.next()
	for m != nil && m["type"] == "keepalive" {
		m = l.next()
	}
	return m
}

// all reads the rest of the stream, keepalives left out.
func (l *lineReader) all() []map[string]any {
	var out []map[string]any
	for m := l.next(); m != nil; m = l.next() {
		if m["type"] != "keepalive" {
			out = append(out, m)
		}
	}
	return out
}

func (e *env) execute(t testing.TB, id string, body map[string]any) []map[string]any {
	t.Helper()
	resp := e.interp(t, context.Background(), id, "POST", "/execute", body)
	defer resp.Body.Close()
	return newLineReader(t, resp).all()
}

func ofType(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

func stdoutOf(lines []map[string]any) string {
	var b strings.Builder
	for _, l := range ofType(lines, "stdout") {
		b.WriteString(l["text"].(string))
	}
	return b.String()
}

func TestExecuteNDJSON(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	lines := e.execute(t, id, map[string]any{"code": "print('hi')\nx = 41\nx + 1"})
	if len(lines) != 4 {
		t.Fatalf("lines: %v", lines)
	}
	if l := lines[0]; l["type"] != "stdout" || l["text"] != "hi\n" {
		t.Errorf("stdout line: %v", l)
	} else if _, err := time.Parse(time.RFC3339Nano, l["timestamp"].(string)); err != nil {
		t.Errorf("timestamp: %v", err)
	}
	if l := lines[1]; l["type"] != "result" || l["text"] != "42" || l["is_main_result"] != true || len(l["extra"].(map[string]any)) != 0 {
		t.Errorf("result line: %v", l)
	}
	if l := lines[2]; l["type"] != "number_of_executions" || l["execution_count"] != 1.0 {
		t.Errorf("count line: %v", l)
	}
	if l := lines[3]; l["type"] != "end_of_execution" {
		t.Errorf("last line: %v", l)
	}
	// The default python context keeps its state; the count goes on; a
	// string's quotes are stripped as E2B's server does.
	lines = e.execute(t, id, map[string]any{"code": "str(x)", "language": "python"})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "41" {
		t.Errorf("second run: %v", lines)
	}
	if c := ofType(lines, "number_of_executions"); len(c) != 1 || c[0]["execution_count"] != 2.0 {
		t.Errorf("second run's count: %v", lines)
	}
	// The default context is not run_code's own namespace.
	if out, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "run_code", json.RawMessage(`{"session":"`+id+`","code":"print('x' in globals())"}`)); err != nil || !strings.Contains(out.Text, "False") {
		t.Errorf("run_code's namespace sees the E2B context's x: %v %v", out, err)
	}
}

func TestExecuteDisplayAndErrors(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	code := `class Img:
    def _repr_png_(self): return b"\x89PNG\r\n"
    def _repr_html_(self): return "<i>img</i>"
class Pic:
    def _repr_svg_(self): return "<svg/>"
display(Img())
display(Pic())
None`
	lines := e.execute(t, id, map[string]any{"code": code})
	res := ofType(lines, "result")
	if len(res) != 2 {
		t.Fatalf("results: %v", lines)
	}
	if res[0]["png"] != base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n")) || res[0]["html"] != "<i>img</i>" || res[0]["is_main_result"] != false {
		t.Errorf("png/html result: %v", res[0])
	}
	if res[1]["svg"] != "<svg/>" || res[1]["is_main_result"] != false || res[1]["text"] == nil {
		t.Errorf("svg result: %v", res[1])
	}
	lines = e.execute(t, id, map[string]any{"code": "print('before')\ndef f():\n    return 1/0\nf()"})
	errs := ofType(lines, "error")
	if len(errs) != 1 {
		t.Fatalf("error lines: %v", lines)
	}
	if errs[0]["name"] != "ZeroDivisionError" || errs[0]["value"] != "division by zero" ||
		!strings.Contains(errs[0]["traceback"].(string), "return 1/0") {
		t.Errorf("error: %v", errs[0])
	}
	if s := ofType(lines, "stderr"); len(s) != 0 {
		t.Errorf("the traceback is also on stderr: %v", s)
	}
	if stdoutOf(lines) != "before\n" {
		t.Errorf("stdout: %v", lines)
	}
}

// A line printed before the code blocks reaches the client while the run
// goes on, and keepalives come during the silence.
func TestExecuteStreams(t *testing.T) {
	old := *e2b.ExecuteKeepalive
	*e2b.ExecuteKeepalive = 20 * time.Millisecond
	t.Cleanup(func() { *e2b.ExecuteKeepalive = old })
	e := newEnv(t, nil)
	id := e.newSession(t)
	s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(s.Workspace(), "release")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	resp := e.interp(t, context.Background(), id, "POST", "/execute", map[string]any{
		"code": "print('ready')\nprint(open('release').read())"})
	defer resp.Body.Close()
	lr := newLineReader(t, resp)
	l := lr.nextData() // keepalives come while the worker starts
	if l == nil || l["type"] != "stdout" || l["text"] != "ready\n" {
		t.Fatalf("first line: %v", l)
	}
	// The run is blocked on the FIFO: wait for a keepalive.
	for l := lr.next(); ; l = lr.next() {
		if l == nil {
			t.Fatal("the stream ended while the run was blocked")
		}
		if l["type"] == "keepalive" {
			break
		}
		t.Fatalf("while blocked: %v", l)
	}
	if err := os.WriteFile(fifo, []byte("go"), 0o666); err != nil {
		t.Fatal(err)
	}
	rest := lr.all()
	if stdoutOf(rest) != "go\n" || rest[len(rest)-1]["type"] != "end_of_execution" {
		t.Errorf("after the release: %v", rest)
	}
}

// A context whose interpreter was released after it idled says so on
// stderr in the next run (E2B shows no notes): its state is never lost
// silently.
func TestExecuteSaysTheInterpreterWasRestarted(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	e.execute(t, id, map[string]any{"code": "x = 41"})
	if !e.App.Python.ReleaseIdle(id) {
		t.Skip("no resident worker to release in this build")
	}
	lines := e.execute(t, id, map[string]any{"code": "print('x' in globals())"})
	if got := stdoutOf(lines); got != "False\n" {
		t.Fatalf("stdout %q after the release", got)
	}
	errs := ofType(lines, "stderr")
	if len(errs) != 1 || !strings.HasPrefix(errs[0]["text"].(string), "[quro] the Python interpreter was restarted") {
		t.Fatalf("stderr lines %v: want the restart said once", errs)
	}
	if errs := ofType(e.execute(t, id, map[string]any{"code": "1"}), "stderr"); len(errs) != 0 {
		t.Fatalf("the run after: stderr %v", errs)
	}
}

// A print to stderr is one stderr line of the stream (E2B's onStderr is
// called once for it, as with Jupyter): print writes its text and its end
// into the worker's line-buffered stderr, which sends them together
// (TestStderrLinesWhole in internal/engine/python checks whole lines).
func TestExecuteStderrPrintIsOneLine(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	for range 3 {
		lines := ofType(e.execute(t, id, map[string]any{"code": "import sys\nprint('This is an error message', file=sys.stderr)"}), "stderr")
		if len(lines) != 1 || lines[0]["text"] != "This is an error message\n" {
			t.Errorf("one print to stderr: %v, want one line", lines)
		}
	}
}

// A client that goes away interrupts its run (E2B's semantics); the
// context keeps its state.
func TestExecuteDisconnectInterrupts(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.createContext(t, id, map[string]any{"language": "python"})
	e.execute(t, id, map[string]any{"code": "n = 0", "context_id": c})
	ctx, cancel := context.WithCancel(context.Background())
	resp := e.interp(t, ctx, id, "POST", "/execute", map[string]any{"context_id": c,
		"code": "while True:\n    n += 1\n    if n == 1000:\n        print('looping', flush=True)"})
	lr := newLineReader(t, resp)
	if l := lr.nextData(); l == nil || l["text"] != "looping\n" {
		t.Fatalf("first line: %v", l)
	}
	cancel()
	resp.Body.Close()
	// The next run in the context waits for the interrupted one to end.
	la := e.execute(t, id, map[string]any{"code": "n", "context_id": c})
	lb := e.execute(t, id, map[string]any{"code": "n", "context_id": c})
	a, b := ofType(la, "result"), ofType(lb, "result")
	if len(a) != 1 || len(b) != 1 || len(a[0]["text"].(string)) < 4 || a[0]["text"] != b[0]["text"] {
		t.Errorf("the loop went on or the state was lost: %v then %v", la, lb)
	}
}

func (e *env) createContext(t testing.TB, id string, body map[string]any) string {
	t.Helper()
	resp := e.interp(t, context.Background(), id, "POST", "/contexts", body)
	defer resp.Body.Close()
	var c struct{ ID, Language, Cwd string }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 || c.ID == "" {
		t.Fatalf("POST /contexts: %s %+v %v", resp.Status, c, err)
	}
	return c.ID
}

func textOf(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestContextsCRUD(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	bg := context.Background()
	c := e.createContext(t, id, map[string]any{"language": "python", "cwd": "/home/user"})

	resp := e.interp(t, bg, id, "GET", "/contexts", nil)
	var list []struct{ ID, Language, Cwd string }
	if err := json.Unmarshal([]byte(textOf(t, resp)), &list); err != nil {
		t.Fatal(err)
	}
	langs := map[string]int{}
	seen := false
	for _, x := range list {
		langs[x.Language]++
		seen = seen || x.ID == c && x.Cwd == "/home/user"
	}
	if !seen || langs["python"] != 2 || langs["javascript"] != 1 {
		t.Errorf("GET /contexts: %+v", list)
	}

	e.execute(t, id, map[string]any{"code": "v = 'kept'", "context_id": c})
	if r := ofType(e.execute(t, id, map[string]any{"code": "v", "context_id": c}), "result"); len(r) != 1 || r[0]["text"] != "kept" {
		t.Errorf("state in the context: %v", r)
	}
	// Isolated from the default context.
	if errs := ofType(e.execute(t, id, map[string]any{"code": "v"}), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Errorf("the default context sees v: %v", errs)
	}
	// Restart: a fresh namespace under the same id.
	if resp := e.interp(t, bg, id, "POST", "/contexts/"+c+"/restart", nil); resp.StatusCode != 200 {
		t.Errorf("restart: %s %s", resp.Status, textOf(t, resp))
	}
	if errs := ofType(e.execute(t, id, map[string]any{"code": "v", "context_id": c}), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Errorf("after the restart: %v", errs)
	}
	// Both a context and a language: 400, as E2B's server.
	if resp := e.interp(t, bg, id, "POST", "/execute", map[string]any{"code": "1", "context_id": c, "language": "python"}); resp.StatusCode != 400 ||
		textOf(t, resp) != "Only one of context_id or language can be provided" {
		t.Errorf("context and language: %s", resp.Status)
	}
	if resp := e.interp(t, bg, id, "POST", "/execute", map[string]any{"code": "1", "language": "r"}); resp.StatusCode != 400 ||
		!strings.Contains(textOf(t, resp), `Quro test's code interpreter: language "r" has no code contexts`) {
		t.Errorf("language r: %s", resp.Status)
	}
	// Removed: 404 with E2B's text.
	if resp := e.interp(t, bg, id, "DELETE", "/contexts/"+c, nil); resp.StatusCode != 200 {
		t.Errorf("delete: %s %s", resp.Status, textOf(t, resp))
	}
	resp = e.interp(t, bg, id, "POST", "/execute", map[string]any{"code": "1", "context_id": c})
	if got := textOf(t, resp); resp.StatusCode != 404 || got != "Context "+c+" not found" {
		t.Errorf("execute in a removed context: %s %q", resp.Status, got)
	}
	for _, p := range []string{"/contexts/" + c + "/restart"} {
		if resp := e.interp(t, bg, id, "POST", p, nil); resp.StatusCode != 404 {
			t.Errorf("POST %s: %s", p, resp.Status)
		}
	}
	if resp := e.interp(t, bg, id, "DELETE", "/contexts/"+c, nil); resp.StatusCode != 404 {
		t.Errorf("second delete: %s", resp.Status)
	}
}

// A context id is its sandbox's: another sandbox (even of the same
// tenant, with its own valid token) cannot run in it.
func TestContextsAreTheSandboxes(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.newSession(t), e.newSession(t)
	c := e.createContext(t, a, map[string]any{})
	e.execute(t, a, map[string]any{"code": "secret = 1", "context_id": c})
	resp := e.interp(t, context.Background(), b, "POST", "/execute", map[string]any{"code": "secret", "context_id": c})
	if got := textOf(t, resp); resp.StatusCode != 404 {
		t.Errorf("sandbox b ran in a's context: %s %q", resp.Status, got)
	}
	// And without the access token nothing runs.
	req, _ := http.NewRequest("POST", e.URL+"/execute", strings.NewReader(`{"code":"1"}`))
	req.Header.Set(e2b.HeaderSandboxID, a)
	req.Header.Set(e2b.HeaderSandboxPort, "49999")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r2.StatusCode != 401 {
		t.Errorf("without a token: %s", r2.Status)
	}
	r2.Body.Close()
}

func TestExecuteEnvVars(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	lines := e.execute(t, id, map[string]any{"code": "import os\nos.environ.get('E2B_T')", "env_vars": map[string]string{"E2B_T": "only now"}})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "only now" {
		t.Errorf("during: %v", lines)
	}
	lines = e.execute(t, id, map[string]any{"code": "import os\nstr(os.environ.get('E2B_T'))"})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "None" {
		t.Errorf("after: %v", lines)
	}
	// A variable the sandbox refuses is an error naming it; nothing runs.
	lines = e.execute(t, id, map[string]any{"code": "print('ran')", "env_vars": map[string]string{"LD_PRELOAD": "/tmp/x.so"}})
	if errs := ofType(lines, "error"); len(errs) != 1 || !strings.Contains(errs[0]["value"].(string), "LD_PRELOAD") || stdoutOf(lines) != "" {
		t.Errorf("LD_PRELOAD: %v", lines)
	}
}

func TestInterpHealth(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	req, _ := http.NewRequest("GET", e.URL+"/health", nil)
	req.Header.Set(e2b.HeaderSandboxID, id)
	req.Header.Set(e2b.HeaderSandboxPort, "49999")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(t, resp); resp.StatusCode != 200 || strings.TrimSpace(got) != `"OK"` {
		t.Errorf("/health: %s %q", resp.Status, got)
	}
}

// JavaScript keeps its state across runs of a context, TypeScript runs in
// the same kind of VM, and bash runs in the session's resident shell.
func TestExecuteJSAndBash(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	e.execute(t, id, map[string]any{"code": "let x = 41; function inc(v) { return v + 1 }", "language": "js"})
	lines := e.execute(t, id, map[string]any{"code": "console.log('hi'); inc(x)", "language": "javascript"})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "42" || r[0]["is_main_result"] != true || stdoutOf(lines) != "hi\n" {
		t.Errorf("js: %v", lines)
	}
	if c := ofType(lines, "number_of_executions"); len(c) != 1 || c[0]["execution_count"] != 2.0 {
		t.Errorf("js count: %v", lines)
	}
	lines = e.execute(t, id, map[string]any{"code": "throw new RangeError('nope')", "language": "js"})
	if errs := ofType(lines, "error"); len(errs) != 1 || errs[0]["name"] != "RangeError" || errs[0]["value"] != "nope" {
		t.Errorf("js error: %v", lines)
	}
	c := e.createContext(t, id, map[string]any{"language": "ts"})
	lines = e.execute(t, id, map[string]any{"code": "const s: string = 'typed'; s", "context_id": c})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "typed" {
		t.Errorf("ts: %v", lines)
	}
	e.execute(t, id, map[string]any{"code": "export GREETING=hello", "language": "bash"})
	lines = e.execute(t, id, map[string]any{"code": "echo $GREETING", "language": "bash"})
	if stdoutOf(lines) != "hello\n" {
		t.Errorf("bash: %v", lines)
	}
}

// Contexts start in /home/user, the workspace as every session box shows
// it (E2B's cwd and bash tests).
func TestExecuteCwd(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	lines := e.execute(t, id, map[string]any{"code": "import os\nos.getcwd()"})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "/home/user" {
		t.Errorf("python's cwd: %v", lines)
	}
	if out := stdoutOf(e.execute(t, id, map[string]any{"code": "!pwd"})); out != "/home/user\n" {
		t.Errorf("!pwd: %q", out)
	}
	if out := stdoutOf(e.execute(t, id, map[string]any{"code": "pwd", "language": "bash"})); out != "/home/user\n" {
		t.Errorf("bash's pwd: %q", out)
	}
	c := e.createContext(t, id, map[string]any{"cwd": "/home/user/sub"})
	s, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	e.execute(t, id, map[string]any{"code": "import os\nos.mkdir('sub')"})
	lines = e.execute(t, id, map[string]any{"code": "import os\nopen('f.txt', 'w').write('x')\nos.getcwd()", "context_id": c})
	if r := ofType(lines, "result"); len(r) != 1 || r[0]["text"] != "/home/user/sub" {
		t.Errorf("a context's cwd: %v", lines)
	}
	if _, err := os.Stat(filepath.Join(s.Workspace(), "sub", "f.txt")); err != nil {
		t.Errorf("the file written in /home/user/sub: %v", err)
	}
}

// A run stopped because its sandbox was killed ends with the connection
// reset, not with a normal end, and only once the sandbox is gone: the
// SDK probes /health right after the reset, and only a 502 there makes it
// say the sandbox was killed (E2B's killedSandbox test). The kill comes
// from elsewhere while the run streams, as a user's Sandbox.kill() does.
func TestExecuteSandboxKilled(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	resp := e.interp(t, context.Background(), id, "POST", "/execute", map[string]any{
		"code": "print('ready', flush=True)\nimport time\ntime.sleep(300)"})
	defer resp.Body.Close()
	lr := newLineReader(t, resp)
	if l := lr.nextData(); l == nil || l["text"] != "ready\n" {
		t.Fatalf("first line: %v", l)
	}
	killed := make(chan error, 1)
	go func() {
		_, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec},
			"destroy_session", json.RawMessage(`{"session":"`+id+`"}`))
		killed <- err
	}()
	for l := lr.next(); l != nil; l = lr.next() {
		if l["type"] == "end_of_execution" {
			t.Fatalf("the stream ended normally: %v", l)
		}
	}
	if lr.sc.Err() == nil {
		t.Error("the stream ended without an error: the SDK would take the run as finished")
	}
	// At once, as the SDK does.
	req, _ := http.NewRequest("GET", e.URL+"/health", nil)
	req.Header.Set(e2b.HeaderSandboxID, id)
	req.Header.Set(e2b.HeaderSandboxPort, "49983")
	h, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	h.Body.Close()
	if h.StatusCode != http.StatusBadGateway {
		t.Errorf("/health right after the reset: %s (the sandbox was not gone yet: the SDK would not say it was killed)", h.Status)
	}
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
}

// Restarting a context stops the run in it (E2B's restart restarts the
// kernel): the run's stream ends with a ContextRestarting error, and the
// context starts afresh.
func TestRestartStopsTheRun(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	for _, lang := range []string{"python", "javascript"} {
		c := e.createContext(t, id, map[string]any{"language": lang})
		code := "kept = 1\nwhile True:\n    kept += 1\n    if kept == 1000:\n        print('looping', flush=True)"
		if lang == "javascript" {
			code = "var kept = 1; while (true) { kept++; if (kept === 1000) console.log('looping') }"
		}
		resp := e.interp(t, context.Background(), id, "POST", "/execute", map[string]any{"context_id": c, "code": code})
		lr := newLineReader(t, resp)
		if l := lr.nextData(); l == nil || l["text"] != "looping\n" {
			t.Fatalf("%s: first line: %v", lang, l)
		}
		if r := e.interp(t, context.Background(), id, "POST", "/contexts/"+c+"/restart", nil); r.StatusCode != 200 {
			t.Fatalf("%s: restart: %s %s", lang, r.Status, textOf(t, r))
		}
		rest := lr.all()
		resp.Body.Close()
		if errs := ofType(rest, "error"); len(errs) != 1 || errs[0]["name"] != "ContextRestarting" || rest[len(rest)-1]["type"] != "end_of_execution" {
			t.Errorf("%s: the stopped run's end: %v (%v)", lang, rest, lr.sc.Err())
		}
		probe := "'kept' in globals()"
		if lang == "javascript" {
			probe = "typeof kept !== 'undefined'"
		}
		if r := ofType(e.execute(t, id, map[string]any{"context_id": c, "code": probe}), "result"); len(r) != 1 || (r[0]["text"] != "False" && r[0]["text"] != "false") {
			t.Errorf("%s: after the restart: %v", lang, r)
		}
	}
}

// /execute's language is read by the app, which knows every spelling its
// contexts accept (E2B's and Quro's own: py, node, sh…); one it has no
// contexts for is refused before the stream starts, as E2B's server
// refuses a kernel it cannot start.
func TestExecuteLanguages(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	e.execute(t, id, map[string]any{"code": "kept = 'py'", "language": "py"})
	if r := ofType(e.execute(t, id, map[string]any{"code": "kept", "language": "Python"}), "result"); len(r) != 1 || r[0]["text"] != "py" {
		t.Errorf("py and Python are one default context: %v", r)
	}
	e.execute(t, id, map[string]any{"code": "var kept = 'node'", "language": "node"})
	if r := ofType(e.execute(t, id, map[string]any{"code": "kept", "language": "js"}), "result"); len(r) != 1 || r[0]["text"] != "node" {
		t.Errorf("node and js are one default context: %v", r)
	}
	if out := stdoutOf(e.execute(t, id, map[string]any{"code": "echo sh", "language": "sh"})); out != "sh\n" {
		t.Errorf("sh: %q", out)
	}
	resp := e.interp(t, context.Background(), id, "POST", "/execute", map[string]any{"code": "1", "language": "cobol"})
	if msg := textOf(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, `"cobol"`) || !strings.Contains(msg, "python, javascript") {
		t.Errorf("an unknown language: %s %q", resp.Status, msg)
	}
	resp = e.interp(t, context.Background(), id, "POST", "/contexts", map[string]any{"language": "cobol"})
	if msg := textOf(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, `"cobol"`) {
		t.Errorf("a context of an unknown language: %s %q", resp.Status, msg)
	}
	if c := e.createContext(t, id, map[string]any{"language": "node"}); c == "" {
		t.Error("a node context")
	}
}

// A JavaScript context past the engine's per-session cap is refused when
// made (each keeps a VM in the server's memory), with what frees one.
func TestContextsJSCap(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	for range 4 {
		e.createContext(t, id, map[string]any{"language": "js"})
	}
	resp := e.interp(t, context.Background(), id, "POST", "/contexts", map[string]any{"language": "ts"})
	if msg := textOf(t, resp); resp.StatusCode < 400 || resp.StatusCode == http.StatusInternalServerError || !strings.Contains(msg, "remove_code_context") {
		t.Errorf("past the cap: %s %q", resp.Status, msg)
	}
}

// Each of E2B's cwd tests (code-interpreter js/tests/cwd.test.ts,
// bash.test.ts) as the first run of a fresh sandbox: every language starts
// in /home/user and says so, never the workspace's host path; a "!pwd"
// line prints it and is no result of its own (IPython's shell lines).
func TestExecuteCwdFirstRun(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		body   map[string]any
		stdout string // else the main result's text
	}{
		{map[string]any{"code": "pwd", "language": "bash"}, "/home/user\n"},
		{map[string]any{"code": "!pwd"}, "/home/user\n"},
		{map[string]any{"code": "from pathlib import Path; print(Path.cwd())", "language": "python"}, "/home/user\n"},
		{map[string]any{"code": "process.cwd()", "language": "js"}, ""},
		{map[string]any{"code": "process.cwd()", "language": "ts"}, ""},
	} {
		id := e.newSession(t)
		lines := e.execute(t, id, tc.body)
		results := ofType(lines, "result")
		if tc.stdout != "" {
			if out := stdoutOf(lines); out != tc.stdout || len(results) != 0 {
				t.Errorf("%v: stdout %q, results %v", tc.body, out, results)
			}
			continue
		}
		if len(results) != 1 || results[0]["text"] != "/home/user" {
			t.Errorf("%v: %v", tc.body, lines)
		}
	}
	// A bash context made with its own directory reports it.
	id := e.newSession(t)
	e.execute(t, id, map[string]any{"code": "mkdir -p sub", "language": "bash"})
	c := e.createContext(t, id, map[string]any{"language": "bash", "cwd": "sub"})
	if out := stdoutOf(e.execute(t, id, map[string]any{"code": "pwd", "context_id": c})); out != "/home/user/sub\n" {
		t.Errorf("a bash context in sub: %q", out)
	}
}
