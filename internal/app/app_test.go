package app

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/terminal"
)

var admin = controller.Caller{Path: "test", Scope: capability.ScopeAdmin}

// testPython shares one extracted interpreter between all test data
// directories (and test runs): extraction takes seconds, and is tested in
// the python package.
var testPython = pythontest.Options()

// serverCanary is a variable of this test process's environment from its
// start, as a server's own secret would be: the tests that check that no
// code in a session sees the server's environment look for it in every
// process of a box. It is set once for the process rather than with
// t.Setenv (which a parallel test may not call), so those tests run in
// parallel, and every other test's boxes start beside it too.
const serverCanaryVar, serverCanary = "QURO_SECRET_TOKEN", "s3cr3t-canary-77"

func init() {
	if err := os.Setenv(serverCanaryVar, serverCanary); err != nil {
		panic(err)
	}
}

func newApp(t testing.TB, run *runcode.Options) *App {
	t.Helper()
	return newAppWith(t, &Options{Run: run})
}

// newAppWith is an App of o in a data directory of the test's, with the
// shared test Python and the network settings under which tests reach
// stand-ins on the host's loopback from "host" sessions (o's Python and
// Network are set to them).
func newAppWith(t testing.TB, o *Options) *App {
	t.Helper()
	o.Python, o.Network = testPython, hostAllowed
	a, err := New(context.Background(), t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func call(t testing.TB, a *App, name string, args any) (*controller.Reply, error) {
	t.Helper()
	return callAs(t, a, admin, name, args)
}

// callAs calls capability name with args (marshalled to JSON) as c.
func callAs(t testing.TB, a *App, c controller.Caller, name string, args any) (*controller.Reply, error) {
	t.Helper()
	return callWithin(t, a, c, name, args, 2*time.Minute)
}

// callerOfToken is a caller of tenant with scopes as an access path makes
// it: a token created, then verified. The token is returned too, for the
// paths that send it.
func callerOfToken(t testing.TB, a *App, tenant string, scopes ...string) (controller.Caller, string) {
	t.Helper()
	iss, err := a.tokens.Create(t.Context(), tenant, scopes, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.VerifyToken(t.Context(), iss.Token)
	if err != nil {
		t.Fatal(err)
	}
	return c, iss.Token
}

// callWithin is callAs giving the call d rather than 2 minutes.
func callWithin(t testing.TB, a *App, c controller.Caller, name string, args any, d time.Duration) (*controller.Reply, error) {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return a.Controller.Call(ctx, c, name, b)
}

func runCode(t testing.TB, a *App, in RunCodeInput) *runcode.Result {
	t.Helper()
	return runCodeWithin(t, a, in, 2*time.Minute)
}

// runCodeWithin is runCode giving the call d rather than 2 minutes: for a
// run whose own time budget is longer (a cold compile on a loaded machine).
func runCodeWithin(t testing.TB, a *App, in RunCodeInput, d time.Duration) *runcode.Result {
	t.Helper()
	reply, err := callWithin(t, a, admin, "run_code", in, d)
	if err != nil {
		t.Fatalf("run_code %q: %v", in.Code, err)
	}
	return reply.Output.(*runcode.Result)
}

func TestRunCodeLanguages(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		name, lang, code string
		engine           string
		stdout, stderr   string // substrings
		exit             int
		artifact         string
		error            string
	}{
		{name: "python default", code: "print(6*7)", engine: wantPython, stdout: "42\n"},
		{name: "python alias", lang: "py3", code: "import sys; print(sys.version_info[0])", engine: wantPython, stdout: "3\n"},
		{name: "python traceback is a result", lang: "python", code: "x = 1\n1/0\n", engine: wantPython,
			stderr: "line 2", exit: 1},
		{name: "python input gets EOF, not a hang", code: "input('name? ')", stderr: "EOFError", exit: 1},
		{name: "python sys.exit", code: "import sys; sys.exit(3)", exit: 3},
		{name: "python NUL in source", code: "print(1)\x00", stderr: "null bytes", exit: 1},
		{name: "shell", lang: "sh", code: "echo out; echo err >&2; exit 4", engine: "shell/sh", stdout: "out\n", stderr: "err\n", exit: 4},
		{name: "bash", lang: "bash", code: "printf '%s' hi", engine: "shell/bash", stdout: "hi"},
		{name: "html", lang: "htm", code: "<b>x</b>", engine: "render/html", artifact: "html"},
		{name: "json", lang: "json", code: `{"a":1}`, stdout: "\"a\": 1", artifact: "html"},
		{name: "json invalid", lang: "json", code: `{"a":}`, stderr: "line 1, column 6", exit: 1},
		{name: "css", lang: "css", code: "p{color:red}", artifact: "html"},
		{name: "xml", lang: "xml", code: "<a><b/></a>", artifact: "html"},
		{name: "svg", lang: "svg", code: `<svg xmlns="http://www.w3.org/2000/svg"/>`, artifact: "svg"},
		{name: "zig (no toolchain here) is shown, not run", lang: "zig", code: "pub fn main() void {}", engine: "render/code", artifact: "html"},
		{name: "js", lang: "javascript", code: "console.log(6*7)", stdout: "42\n"},
		{name: "ts", lang: "ts", code: "const x: number = 2; console.log(x * 21)", stdout: "42\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runCode(t, a, RunCodeInput{Code: tc.code, Lang: tc.lang})
			if tc.engine != "" && res.Engine != tc.engine {
				t.Errorf("engine %q, want %q", res.Engine, tc.engine)
			}
			if !strings.Contains(res.Stdout, tc.stdout) || !strings.Contains(res.Stderr, tc.stderr) {
				t.Errorf("stdout %q stderr %q; want %q / %q", res.Stdout, res.Stderr, tc.stdout, tc.stderr)
			}
			if res.ExitCode != tc.exit {
				t.Errorf("exit %d, want %d (stderr %q)", res.ExitCode, tc.exit, res.Stderr)
			}
			if tc.error == "" && res.Error != "" || !strings.Contains(res.Error, tc.error) {
				t.Errorf("error %q, want %q", res.Error, tc.error)
			}
			if tc.artifact != "" && (len(res.Artifacts) == 0 || res.Artifacts[0].Kind != tc.artifact) {
				t.Errorf("artifacts %+v, want %s", res.Artifacts, tc.artifact)
			}
			if res.Session == "" || res.Artifacts == nil {
				t.Errorf("result shape: %+v", res)
			}
		})
	}
}

func TestRunCodeBadRequests(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		name string
		args string
		code capability.Code
		msg  string
	}{
		{"empty code", `{"code":""}`, capability.InvalidArgument, "code is empty"},
		{"no code", `{}`, capability.InvalidArgument, "code"},
		{"unknown lang", `{"code":"x","lang":"cobol"}`, capability.InvalidArgument, "supported: python, js, ts, node, shell, bash, sh, html"},
		{"missing session", `{"code":"print(1)","session":"nope"}`, capability.NotFound, `session not found: "nope"`},
		{"unknown field", `{"code":"x","langg":"py"}`, capability.InvalidArgument, "langg"},
		{"wrong type", `{"code":1}`, capability.InvalidArgument, "code"},
		{"negative timeout", `{"code":"x","timeout_ms":-5}`, capability.InvalidArgument, "timeout_ms -5 is outside 1..600000"},
		{"huge timeout", `{"code":"x","timeout_ms":99999999999}`, capability.InvalidArgument, "timeout_ms 99999999999 is outside 1..600000"},
		// Past what time.Duration holds in milliseconds: once overflowed
		// into "must not be negative".
		{"overflowing timeout", `{"code":"x","timeout_ms":9223372036854775807}`, capability.InvalidArgument, "is outside 1..600000"},
		{"timeout that wraps into range", `{"code":"x","timeout_ms":9223372036855}`, capability.InvalidArgument, "is outside 1..600000"},
		{"malformed", `{"code":`, capability.InvalidArgument, "bad arguments"},
		{"trailing data", `{"code":"x"} {}`, capability.InvalidArgument, "after the JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Controller.Call(context.Background(), admin, "run_code", json.RawMessage(tc.args))
			var ce *capability.Error
			if !errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(ce.Message, tc.msg) {
				t.Fatalf("got %v; want %s containing %q", err, tc.code, tc.msg)
			}
		})
	}
	// 10 MB of code is refused with a clear message, not run.
	big := strings.Repeat("x = 1\n", 10<<20/6)
	_, err := call(t, a, "run_code", RunCodeInput{Code: big})
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.InvalidArgument || !strings.Contains(ce.Message, "the limit is 4.0 MiB") {
		t.Fatalf("10 MB code: %v", err)
	}
}

func TestLargeButAllowedCodeRuns(t *testing.T) {
	t.Parallel() // its own App; compiling 1 MB of Python takes a while
	a := newApp(t, nil)
	// 256 KiB: twice the kernel's 128 KiB limit on one argument (and past
	// the shell engine's 100 KiB of code in argv), so it must not go via
	// argv: an engine that passed it there would fail with E2BIG. The
	// size is the check, not its multiple: 1 MB of Python and 3 MB of
	// shell cost 4.3 CPU-s to compile and parse, for the same proof.
	// The run's time is not the property: compiling statements takes
	// CPython seconds at a load of 15 on 2 cores.
	const size = 256 << 10
	py := strings.Repeat("x = 1\n", size/6) + "print('done')"
	if res := runCode(t, a, RunCodeInput{Code: py, TimeoutMS: -1}); res.Stdout != "done\n" {
		t.Errorf("python: %+v", res)
	}
	sh := strings.Repeat(": filler\n", size/9) + "echo done"
	if res := runCode(t, a, RunCodeInput{Code: sh, Lang: "sh", TimeoutMS: -1}); res.Stdout != "done\n" {
		t.Errorf("shell: stdout %q stderr %q err %q", res.Stdout, res.Stderr, res.Error)
	}
}

func TestTimeoutKeepsPartialOutput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct{ lang, code string }{
		{"python", "import time\nprint('before', flush=True)\nwhile True: time.sleep(1)"},
		{"sh", "echo before; while :; do sleep 1; done"},
	} {
		// The budget also covers starting the interpreter (in the slim
		// build a python3 process per run) and, for sh, the run's process
		// in the box: on a loaded machine 500 ms, then 2 s, could run out
		// before the code printed. 8 s, spent asleep, not spinning. A
		// warm-up run starts what the session keeps.
		runCode(t, a, RunCodeInput{Code: "1", Lang: tc.lang})
		res := runCode(t, a, RunCodeInput{Code: tc.code, Lang: tc.lang, TimeoutMS: 8000})
		if !res.TimedOut || !res.Interrupted || !strings.Contains(res.Error, "timed out") || res.Stdout != "before\n" {
			t.Errorf("%s: %+v", tc.lang, res)
		}
		if !strings.HasPrefix(res.Text(), "⚠️ error: timed out") {
			t.Errorf("%s text: %s", tc.lang, res.Text())
		}
	}
}

func TestOutputFloodIsCutAndSavedWhole(t *testing.T) {
	t.Parallel()
	a := newApp(t, &runcode.Options{SpillLimit: 64 << 20})
	// The longest time budget: this test is about the flood's cut, and at
	// a load of 70 the default 30 s ended the stream before its 50 MB.
	res := runCode(t, a, RunCodeInput{Code: "yes 0123456789 | head -c 50000000", Lang: "sh", TimeoutMS: -1})
	if !res.Truncated || res.StdoutBytes != 50_000_000 || len(res.Stdout) > 13<<10 {
		t.Fatalf("truncated %v, %d bytes, text %d bytes (exit %d, timed out %v)", res.Truncated, res.StdoutBytes, len(res.Stdout), res.ExitCode, res.TimedOut)
	}
	sess, _ := a.Sessions.Get(context.Background(), res.Session)
	fi, err := os.Stat(filepath.Join(sess.Workspace(), res.StdoutFile))
	if err != nil || fi.Size() != 50_000_000 {
		t.Fatalf("full output file: %v %v", fi, err)
	}
	if !strings.Contains(res.Text(), res.StdoutFile) || !strings.Contains(res.Stdout, "cut from the middle") {
		t.Errorf("text does not say what was cut and where:\n%s", res.Text())
	}
	// The session's own code can read the full output where the result says.
	check := runCode(t, a, RunCodeInput{Code: "wc -c < " + res.StdoutFile, Lang: "sh"})
	if strings.TrimSpace(check.Stdout) != "50000000" {
		t.Errorf("session code cannot read the saved output: %+v", check)
	}
}

func TestBinaryOutputIsEscapedAndKeptRaw(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	res := runCode(t, a, RunCodeInput{Code: `printf 'a\377b\000c'`, Lang: "sh"})
	if res.Stdout != `a\xffb\x00c` || res.StdoutFile == "" {
		t.Fatalf("%+v", res)
	}
	sess, _ := a.Sessions.Get(context.Background(), "")
	raw, err := os.ReadFile(filepath.Join(sess.Workspace(), res.StdoutFile))
	if err != nil || string(raw) != "a\xffb\x00c" {
		t.Fatalf("raw %q %v", raw, err)
	}
	b, _ := json.Marshal(res)
	if !json.Valid(b) {
		t.Fatal("result is not valid JSON")
	}
}

func TestSessionsAreSeparate(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	ctx := context.Background()
	if _, err := a.Sessions.Create(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	runCode(t, a, RunCodeInput{Code: "echo secret > note.txt", Lang: "sh"})
	if res := runCode(t, a, RunCodeInput{Code: "cat note.txt", Lang: "sh"}); res.Stdout != "secret\n" {
		t.Errorf("default session lost its file: %+v", res)
	}
	res := runCode(t, a, RunCodeInput{Code: "ls; pwd", Lang: "sh", Session: "other"})
	if strings.Contains(res.Stdout, "note.txt") {
		t.Error("a file of the default session is visible in another session")
	}
	// Its workspace, named /home/user as every session's is.
	if !strings.Contains(res.Stdout, "/home/user\n") {
		t.Errorf("other session did not run in its workspace: %q", res.Stdout)
	}
}

// TestServerEnvironmentDoesNotReachUserCode: a canary variable of the
// server's own environment is in no process a session can see (the
// environ of every process in /proc of the box, /proc/1 included), in the
// shell, run_code's shell or Python, while the session's own variables
// are there. The sandbox's TestHelpersGetAFixedEnvironment checks the
// processes a box cannot read (bubblewrap's) from the host.
func TestServerEnvironmentDoesNotReachUserCode(t *testing.T) {
	t.Parallel()
	if os.Getenv(serverCanaryVar) != serverCanary {
		t.Fatalf("the canary %s is not in the server's environment", serverCanaryVar)
	}
	a := newApp(t, nil)
	v := "session-value"
	if _, err := call(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{"MINE": &v}}); err != nil {
		t.Fatal(err)
	}
	all := `for f in /proc/[0-9]*/environ; do echo "== $f"; tr '\0' '\n' < $f; done 2>&1; cat /proc/1/environ 2>&1; env`
	texec := func(cmd string) string {
		reply, err := call(t, a, "terminal_exec", TerminalExecInput{Command: cmd})
		if err != nil {
			t.Fatal(err)
		}
		return reply.Output.(*terminal.Result).Output
	}
	for _, tc := range []struct{ name, out string }{
		{"shell", texec(all)},
		{"sh", runCode(t, a, RunCodeInput{Code: all, Lang: "sh"}).Stdout},
		{"python", runCode(t, a, RunCodeInput{Code: "import os\nfor p in os.listdir('/proc'):\n  try: print(p, open('/proc/'+p+'/environ','rb').read())\n  except (OSError, ValueError) as e: print(p, e)\nprint(dict(os.environ))"}).Stdout},
	} {
		if strings.Contains(tc.out, serverCanary) {
			t.Errorf("%s sees the server's environment:\n%s", tc.name, tc.out)
		}
		if !strings.Contains(tc.out, "MINE=session-value") && !strings.Contains(tc.out, "'MINE': 'session-value'") {
			t.Errorf("%s lacks the session variable:\n%s", tc.name, tc.out)
		}
	}
}

func TestRegistryCapabilities(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	reply, err := call(t, a, "list_capabilities", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	list := reply.Output.(*CapabilityList)
	names := map[string]bool{}
	for _, c := range list.Capabilities {
		names[c.Name] = true
		if c.Description == "" || c.InputSchema == nil || c.OutputSchema == nil {
			t.Errorf("%s: incomplete declaration", c.Name)
		}
	}
	for _, n := range []string{"run_code", "list_capabilities", "get_service_status", "help"} {
		if !names[n] {
			t.Errorf("%s not registered", n)
		}
	}
	// help languages names every language the runner accepts (run_code's
	// description names the main ones and points there).
	rc, _ := a.Controller.Registry().Get("run_code")
	langs, err := call(t, a, "help", HelpInput{Topic: "languages"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range a.Runner.Languages() {
		if !strings.Contains(langs.Text, l) {
			t.Errorf("help languages does not mention %s", l)
		}
	}
	if !strings.Contains(rc.Description, "help languages") {
		t.Errorf("run_code's description does not point to help languages: %q", rc.Description)
	}
	if short, err := call(t, a, "help", nil); err != nil || !strings.Contains(short.Text, "run_code") {
		t.Errorf("help: %v %q", err, short.Text)
	}
	help, err := call(t, a, "help", HelpInput{Topic: "python"})
	if err != nil {
		t.Fatal(err)
	}
	// Which Python each capability uses, and why (issue 18): help, run_code
	// and python_run say the same.
	pr, _ := a.Controller.Registry().Get("python_run")
	for what, text := range map[string]string{"help": help.Text, "run_code": rc.Description, "python_run": pr.Description} {
		for _, want := range []string{"embedded CPython 3.14", "rootfs's python3"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s does not say which Python (%q missing)", what, want)
			}
		}
	}
	if !strings.Contains(help.Text, "python_run is a fresh python3 -I") {
		t.Errorf("help does not say what python_run runs: %q", help.Text)
	}
	st, err := call(t, a, "get_service_status", nil)
	if err != nil {
		t.Fatal(err)
	}
	status := st.Output.(*Status)
	if status.PID != os.Getpid() || status.Sessions != 1 || len(status.Engines) == 0 || len(status.Isolation) == 0 {
		t.Errorf("%+v", status)
	}
	_, err = call(t, a, "no_such_capability", nil)
	wantCode(t, err, capability.NotFound)
}

func TestScopesAreChecked(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	reader := controller.Caller{Path: "test", Scope: capability.ScopeRead}
	_, err := a.Controller.Call(context.Background(), reader, "run_code", json.RawMessage(`{"code":"print(1)"}`))
	wantCode(t, err, capability.PermissionDenied) // the read scope runs no code
	if _, err := a.Controller.Call(context.Background(), reader, "get_service_status", nil); err != nil {
		t.Fatalf("read scope cannot read status: %v", err)
	}
}

// hostAllowed lets tests' sessions ask for the host's network, to reach
// stand-ins on the host's loopback.
var hostAllowed = NetworkOptions{Max: "host"}
