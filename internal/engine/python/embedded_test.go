//go:build !slim

package python

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/soak"
)

// The tests share one data directory, so the interpreter is extracted once
// per test binary, and one engine with its spare.
var (
	testData string
	testSB   *sandbox.Sandbox
	testEng  *Embedded
	// patientEng is testEng with a grace long enough for a loaded
	// machine, for the tests of an interrupt that keeps the state: at a
	// load of 40 and more a SIGINT handled past testEng's 2 s grace
	// killed the worker and lost the state they check. Not for a test of
	// the escalation itself (TestSwallowedInterruptEscalates).
	patientEng *Embedded
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "quro-python-test-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	testData = dir
	testSB, err = sandbox.New(nil)
	if err != nil {
		panic(err)
	}
	testEng = NewEmbedded(testData, testSB, nil)
	defer testEng.Close()
	patientEng = NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: 5 * time.Minute, NoSpare: true})
	defer patientEng.Close()
	return m.Run()
}

func newSession(t testing.TB) *session.Session {
	t.Helper()
	s := &session.Session{ID: "t" + randomHex(8), Dir: filepath.Join(t.TempDir(), "session")}
	for _, d := range []string{s.Workspace(), s.TmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

type ran struct {
	*runcode.Result
	out, err string
}

func run(t testing.TB, e *Embedded, s *session.Session, code string, timeouts ...time.Duration) ran {
	t.Helper()
	timeout := time.Minute
	if len(timeouts) > 0 && timeouts[0] > 0 {
		timeout = timeouts[0]
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := e.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: timeout, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Run(%q): engine error: %v", code, err)
	}
	return ran{res, out.String(), errb.String()}
}

func hasNote(r ran, sub string) bool {
	for _, n := range r.Notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}

func TestStatePersistsWithinSession(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "x = 41\ndef inc(v):\n    return v + 1", 0)
	r := run(t, testEng, s, "print(inc(x))", 0)
	if r.out != "42\n" || r.ExitCode != 0 {
		t.Fatalf("got %q (exit %d, stderr %q)", r.out, r.ExitCode, r.err)
	}
}

func TestSessionsHaveOwnGlobals(t *testing.T) {
	a, b := newSession(t), newSession(t)
	run(t, testEng, a, "secret = 'a'", 0)
	r := run(t, testEng, b, "print(secret)", 0)
	if r.ExitCode != 1 || !strings.Contains(r.err, "NameError: name 'secret' is not defined") {
		t.Fatalf("session b saw session a's globals: out %q err %q", r.out, r.err)
	}
}

func TestResetClearsNamespace(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "x = 1", 0)
	if err := testEng.Reset(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	r := run(t, testEng, s, "x", 0)
	if !strings.Contains(r.err, "NameError") {
		t.Fatalf("x survived the reset: out %q err %q", r.out, r.err)
	}
	if len(r.Notes) != 0 {
		t.Fatalf("a requested reset is not a loss to report: %q", r.Notes)
	}
}

func TestTrailingExpression(t *testing.T) {
	s := newSession(t)
	for _, tc := range []struct{ code, want string }{
		{"1 + 1", "2\n"},
		{"'text'", "'text'\n"},
		{"None", ""},
		{"y = 5", ""},
		{"print('a')\ny * 2", "a\n10\n"},
		{"[i for i in range(3)]", "[0, 1, 2]\n"},
		{"import asyncio\nasync def f():\n    return 7\nawait f()", "7\n"},
	} {
		r := run(t, testEng, s, tc.code, 0)
		if r.out != tc.want || r.ExitCode != 0 {
			t.Errorf("%q: got %q, want %q (stderr %q)", tc.code, r.out, tc.want, r.err)
		}
	}
}

// The same source run again takes the worker's compiled-code cache: its
// value, its traceback and the namespace must be as for a first run.
func TestRepeatedCodeRunsAlike(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "n = 0", 0)
	for i := 1; i <= 3; i++ {
		r := run(t, testEng, s, "n += 1\nn * 10", 0)
		if want := fmt.Sprintf("%d\n", i*10); r.out != want {
			t.Errorf("run %d: got %q, want %q (stderr %q)", i, r.out, want, r.err)
		}
		r = run(t, testEng, s, "x = 1\n1 / 0", 0)
		if !strings.Contains(r.err, "line 2, in <module>") || !strings.Contains(r.err, "1 / 0") || r.ExitCode != 1 {
			t.Errorf("run %d traceback:\n%s", i, r.err)
		}
	}
	r := run(t, testEng, s, "sorted(k for k in globals() if 'quro' in k)", 0)
	if r.out != "[]\n" {
		t.Errorf("worker names leak into the namespace: %q", r.out)
	}
}

func TestTracebackPointsAtUserCode(t *testing.T) {
	s := newSession(t)
	r := run(t, testEng, s, "def f():\n    return 1 / 0\n\nf()", 0)
	if r.ExitCode != 1 || r.Error != "" {
		t.Fatalf("exit %d error %q", r.ExitCode, r.Error)
	}
	for _, want := range []string{"Traceback (most recent call last):", "line 4, in <module>", "line 2, in f", "return 1 / 0", "ZeroDivisionError: division by zero"} {
		if !strings.Contains(r.err, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.err)
		}
	}
	if strings.Contains(r.err, workerModule) {
		t.Errorf("stderr shows worker frames:\n%s", r.err)
	}
	// A function defined in an earlier run keeps pointing at its own source.
	r = run(t, testEng, s, "f()", 0)
	if !strings.Contains(r.err, "return 1 / 0") || strings.Contains(r.err, workerModule) {
		t.Errorf("second run's traceback:\n%s", r.err)
	}
	r = run(t, testEng, s, "x = (1,\n", 0)
	if !strings.Contains(r.err, "SyntaxError") || strings.Contains(r.err, workerModule) {
		t.Errorf("syntax error:\n%s", r.err)
	}
}

// The run's deadline passes once the code printed, not at a time: a
// 300 ms timeout passed at load before the code printed, and its SIGINT,
// handled past the 2 s grace, killed the worker (patientEng).
func TestTimeoutInterruptsAndKeepsState(t *testing.T) {
	s := newSession(t)
	run(t, patientEng, s, "kept = 'yes'", 0)
	ctx := sandboxtest.NewExpiring(context.Background())
	out := &notify{f: func(p []byte) {
		if bytes.Contains(p, []byte("started\n")) {
			ctx.Expire()
		}
	}}
	var errb bytes.Buffer
	res, err := patientEng.Run(ctx, &runcode.Request{Code: "import time\nprint('started', flush=True)\ntime.sleep(3600)", Lang: "python",
		Session: s, Timeout: time.Hour, Stdout: out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	r := ran{res, out.String(), errb.String()}
	if !r.TimedOut || !r.Interrupted {
		t.Fatalf("timed_out %v interrupted %v", r.TimedOut, r.Interrupted)
	}
	if !strings.Contains(r.err, "KeyboardInterrupt") || r.out != "started\n" {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	if !strings.Contains(r.Error, "keeps its variables") {
		t.Fatalf("error %q", r.Error)
	}
	r = run(t, patientEng, s, "kept", 0)
	if r.out != "'yes'\n" {
		t.Fatalf("state lost after the interrupt: out %q err %q notes %q", r.out, r.err, r.Notes)
	}
}

// An interrupt that lands while the worker is still reading or compiling
// the run (a timeout of a millisecond) must interrupt that run, not be lost
// and leave the code running until the worker is killed.
func TestEarlyInterruptIsNotLost(t *testing.T) {
	t.Parallel()
	// A long grace: on a loaded machine compiling the code below may take
	// more than the default 2 s, and only a lost interrupt may fail here.
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: 30 * time.Second, NoSpare: true})
	defer e.Close()
	s := newSession(t)
	run(t, e, s, "kept = 'yes'", 0)
	// 20,000 statements take CPython a good part of a second to compile:
	// the SIGINT of a 5 ms timeout lands before the code starts.
	code := strings.Repeat("y = 1\n", 20_000) + "while True:\n    pass"
	for i := 0; i < 3; i++ {
		r := run(t, e, s, code, 5*time.Millisecond)
		if !r.TimedOut || !strings.Contains(r.Error, "keeps its variables") {
			t.Fatalf("try %d: %+v err %q", i, r.Result, r.err)
		}
	}
	if r := run(t, e, s, "kept", 0); r.out != "'yes'\n" {
		t.Fatalf("state lost: out %q notes %q", r.out, r.Notes)
	}
}

func TestRaisedKeyboardInterruptIsNotATimeout(t *testing.T) {
	r := run(t, testEng, newSession(t), "raise KeyboardInterrupt", 0)
	if r.TimedOut || r.Interrupted || r.ExitCode != 1 || !strings.Contains(r.err, "KeyboardInterrupt") {
		t.Fatalf("%+v err %q", r.Result, r.err)
	}
}

func TestSwallowedInterruptEscalates(t *testing.T) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: 200 * time.Millisecond, NoSpare: true})
	defer e.Close()
	s := newSession(t)
	run(t, e, s, "x = 1", 0)
	r := run(t, e, s, "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n    except BaseException:\n        pass", 200*time.Millisecond)
	if !r.TimedOut || !r.Interrupted || !strings.Contains(r.Error, "was killed") || !strings.Contains(r.Error, "lost") {
		t.Fatalf("%+v", r.Result)
	}
	r = run(t, e, s, "print(2 + 2)\nx", 0)
	if r.out != "4\n" || !strings.Contains(r.err, "NameError") {
		t.Fatalf("the next run: out %q err %q", r.out, r.err)
	}
}

// The worker runs with -S and sets up what site would: the builtins exit,
// quit, help, copyright, credits and license.
func TestSiteBuiltins(t *testing.T) {
	s := newSession(t)
	r := run(t, testEng, s, "print([n for n in ('exit', 'quit', 'help', 'copyright', 'credits', 'license') if not hasattr(__builtins__, n)])\nrepr(exit)", 0)
	if r.out != "[]\n'Use exit() or Ctrl-D (i.e. EOF) to exit'\n" {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	r = run(t, testEng, s, "exit(5)", 0)
	if r.ExitCode != 5 {
		t.Fatalf("exit(5): %+v err %q", r.Result, r.err)
	}
}

func TestSysExitKeepsWorker(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "v = 9", 0)
	r := run(t, testEng, s, "import sys\nprint('bye')\nsys.exit(3)", 0)
	if r.ExitCode != 3 || r.out != "bye\n" || !hasNote(r, "sys.exit(3)") {
		t.Fatalf("%+v out %q", r.Result, r.out)
	}
	r = run(t, testEng, s, "import sys; sys.exit('message')", 0)
	if r.ExitCode != 1 || r.err != "message\n" {
		t.Fatalf("exit %d err %q", r.ExitCode, r.err)
	}
	if r = run(t, testEng, s, "v", 0); r.out != "9\n" {
		t.Fatalf("state lost after sys.exit: %q", r.out)
	}
}

func TestProcessDeathIsReportedAndNextRunWorks(t *testing.T) {
	for _, tc := range []struct {
		name, code string
		exit       int
		note, err  string
	}{
		{"os._exit", "import os\nprint('going', flush=True)\nos._exit(4)", 4, "exited with status 4", ""},
		{"segfault", "import ctypes\nctypes.string_at(0)", 128 + int(syscall.SIGSEGV), "signal 11", "Segmentation fault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			run(t, testEng, s, "v = 1", 0)
			r := run(t, testEng, s, tc.code, 0)
			if r.ExitCode != tc.exit || !hasNote(r, tc.note) || !hasNote(r, "lost") {
				t.Fatalf("exit %d notes %q", r.ExitCode, r.Notes)
			}
			if !strings.Contains(r.err, tc.err) {
				t.Fatalf("stderr %q lacks %q", r.err, tc.err)
			}
			r = run(t, testEng, s, "print('alive')\n'v' in globals()", 0)
			if r.out != "alive\nFalse\n" {
				t.Fatalf("next run: out %q err %q", r.out, r.err)
			}
		})
	}
}

func TestMemoryErrorUnderLimit(t *testing.T) {
	s := newSession(t)
	// 32 GiB is above the sandbox's 16 GiB address-space limit.
	r := run(t, testEng, s, "keep = 1\nb = bytearray(32 << 30)", 0)
	if r.ExitCode != 1 || !strings.Contains(r.err, "MemoryError") {
		t.Fatalf("exit %d err %q", r.ExitCode, r.err)
	}
	if r = run(t, testEng, s, "keep"); r.out != "1\n" {
		t.Fatalf("next run: %q %q", r.out, r.err)
	}
}

func TestClosedStdoutIsRepaired(t *testing.T) {
	s := newSession(t)
	r := run(t, testEng, s, "import sys\nsys.stdout.close()\nprint('x')", 0)
	if !strings.Contains(r.err, "ValueError") || !hasNote(r, "closed sys.stdout") {
		t.Fatalf("err %q notes %q", r.err, r.Notes)
	}
	r = run(t, testEng, s, "import os\nos.close(1)\nos.system('echo lost')", 0)
	if !hasNote(r, "file descriptor 1") {
		t.Fatalf("notes %q", r.Notes)
	}
	r = run(t, testEng, s, "import os\nprint('py')\nos.system('echo sh')", 0)
	if r.out != "py\nsh\n0\n" {
		t.Fatalf("after repair: out %q err %q", r.out, r.err)
	}
}

func TestInputWithoutStdin(t *testing.T) {
	r := run(t, testEng, newSession(t), "name = input('name? ')", 0)
	if r.ExitCode != 1 || !strings.Contains(r.err, "EOFError: input() has no standard input") || r.out != "name? " {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	r = run(t, testEng, newSession(t), "import sys, io\nsys.stdin = io.StringIO('ann\\n')\ninput()", 0)
	if r.out != "'ann'\n" {
		t.Fatalf("a replaced stdin is read: out %q err %q", r.out, r.err)
	}
}

func TestProcessesLeftRunningAreKilled(t *testing.T) {
	for _, tc := range []struct{ name, code string }{
		{"popen", "import subprocess\np = subprocess.Popen(['sleep', '3600'])\nprint(p.pid)"},
		{"fork", "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(3600)\nprint(pid)"},
		{"daemon", "import subprocess\n_ = subprocess.run('sleep 3600 & echo $!', shell=True)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			r := run(t, testEng, s, tc.code, 0)
			pid, err := strconv.Atoi(strings.TrimSpace(r.out))
			if err != nil {
				t.Fatalf("out %q err %q", r.out, r.err)
			}
			if !hasNote(r, fmt.Sprintf("process %d", pid)) || !hasNote(r, "killed") {
				t.Fatalf("notes %q", r.Notes)
			}
			if hostPid, ok := findProcess(pid, s.Workspace()); ok {
				t.Fatalf("process %d (host pid %d) still exists", pid, hostPid)
			}
			if r = run(t, testEng, s, "print('next')"); r.out != "next\n" {
				t.Fatalf("next run: %q %q", r.out, r.err)
			}
		})
	}
}

func TestOutputOrderPerStream(t *testing.T) {
	code := `import os, sys, ctypes, subprocess
print("1 print")
os.system("echo 2 system")
sys.stdout.write("3 write\n")
os.write(1, b"4 fd\n")
ctypes.CDLL(None).printf(b"5 printf\n")
subprocess.run(["echo", "6 subprocess"])
print("7 print")
print("e1", file=sys.stderr)
os.system("echo e2 >&2")
_ = os.write(2, b"e3\n")`
	r := run(t, testEng, newSession(t), code, 0)
	if want := "1 print\n2 system\n3 write\n4 fd\n5 printf\n6 subprocess\n7 print\n"; r.out != want {
		t.Errorf("stdout %q, want %q", r.out, want)
	}
	if want := "e1\ne2\ne3\n"; r.err != want {
		t.Errorf("stderr %q, want %q", r.err, want)
	}
}

func TestOutputCannotFakeTheProtocol(t *testing.T) {
	s := newSession(t)
	// Frames and tokens printed by user code are just output.
	code := `import os, json
msg = json.dumps({"op": "done", "id": 1, "status": "ok"}).encode()
os.write(1, len(msg).to_bytes(4, "big") + msg)
print("\x1equro-sync-0000\x1e")`
	r := run(t, testEng, s, code, 0)
	if !strings.Contains(r.out, `"op": "done"`) || !strings.Contains(r.out, "quro-sync-0000") {
		t.Fatalf("out %q", r.out)
	}
	if r = run(t, testEng, s, "print('ok')"); r.out != "ok\n" {
		t.Fatalf("next run %q", r.out)
	}
}

func TestDisplayArtifacts(t *testing.T) {
	code := `class H:
    def _repr_html_(self): return "<b>hi</b>"
class S:
    def _repr_svg_(self): return "<svg xmlns='http://www.w3.org/2000/svg'/>"
class P:
    def _repr_png_(self): return b"\x89PNG\r\n\x1a\n"
class Plain: 
    def __repr__(self): return "Plain()"
display(H(), S(), P(), Plain())
H()`
	s := newSession(t)
	r := run(t, testEng, s, code, 0)
	if r.ExitCode != 0 {
		t.Fatalf("err %q", r.err)
	}
	want := []runcode.Artifact{
		{Kind: "html", MIME: "text/html", Data: "<b>hi</b>"},
		{Kind: "svg", MIME: "image/svg+xml", Data: "<svg xmlns='http://www.w3.org/2000/svg'/>"},
		{Kind: "png", MIME: "image/png", Data: "iVBORw0KGgo="},
		{Kind: "html", MIME: "text/html", Data: "<b>hi</b>"},
	}
	if len(r.Artifacts) != len(want) {
		t.Fatalf("artifacts %+v", r.Artifacts)
	}
	for i, w := range want {
		a := r.Artifacts[i]
		if a.Kind != w.Kind || a.MIME != w.MIME || a.Data != w.Data || a.Name == "" {
			t.Errorf("artifact %d: %+v, want %+v", i, a, w)
		}
	}
	// The trailing H() is shown once, as its artifact: no text repr too.
	if r.out != "Plain()\n" {
		t.Errorf("plain objects are printed, rich ones not: %q", r.out)
	}
	// It is still _ for the next run, as a REPL's value.
	if r = run(t, testEng, s, "type(_).__name__", 0); r.out != "'H'\n" || len(r.Artifacts) != 0 {
		t.Errorf("_ after a rich value: %q %+v", r.out, r.Artifacts)
	}
}

func TestEnvironmentFollowsSession(t *testing.T) {
	s := newSession(t)
	s.Env = map[string]string{"GREETING": "hi"}
	r := run(t, testEng, s, "import os\nos.environ['GREETING'], os.getcwd() == os.environ['HOME']", 0)
	if r.out != "('hi', True)\n" {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	s.Env = map[string]string{"OTHER": "x"}
	r = run(t, testEng, s, "import os, subprocess\nprint(os.environ.get('GREETING'), subprocess.run(['sh', '-c', 'echo $OTHER'], capture_output=True, text=True).stdout.strip())", 0)
	if r.out != "None x\n" {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	r = run(t, testEng, s, "import os\nos.getcwd()", 0)
	if ws := shownAt(s, s.Workspace()); r.out != fmt.Sprintf("%q\n", ws) && r.out != "'"+ws+"'\n" {
		t.Fatalf("cwd %q, want %q", r.out, ws)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newSession(t)
	t.Run("nul bytes", func(t *testing.T) {
		r := run(t, testEng, s, "print(1)\x00", 0)
		if r.ExitCode != 1 || !strings.Contains(r.err, "SyntaxError") || !strings.Contains(r.err, "null bytes") {
			t.Fatalf("err %q", r.err)
		}
	})
	t.Run("non-UTF-8 source", func(t *testing.T) {
		r := run(t, testEng, s, "print('caf\xe9')", 0)
		if r.ExitCode != 1 || !strings.Contains(r.err, "SyntaxError") || !strings.Contains(r.err, "UTF-8") {
			t.Fatalf("err %q", r.err)
		}
		r = run(t, testEng, s, "# -*- coding: latin-1 -*-\nprint('caf\xe9')", 0)
		if r.out != "café\n" {
			t.Fatalf("a coding cookie is honoured: out %q err %q", r.out, r.err)
		}
	})
	t.Run("invalid UTF-8 output", func(t *testing.T) {
		r := run(t, testEng, s, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\x00 end\\n')\nprint('\\udcff')", 0)
		if want := "ok \xff\xfe\x00 end\n\xff\n"; r.out != want {
			t.Fatalf("out %q, want the raw bytes %q (err %q)", r.out, want, r.err)
		}
	})
	t.Run("large code", func(t *testing.T) {
		// 1.5 MiB: far beyond a pipe's buffer (64 KiB), and past the
		// largest an unprivileged process can make one (pipe-max-size,
		// 1 MiB). Not 3 MiB: compiling it was the cost (3.4 CPU-s of
		// CPython's compile alone, against 1.8), and the size past the
		// pipe is the check, not its multiple. (10 MiB of statements take
		// CPython some 1.3 GB to compile, more than the run's memory cgroup.)
		var b strings.Builder
		for i := 0; b.Len() < 3<<19; i++ {
			fmt.Fprintf(&b, "v%d = %d\n", i%1000, i)
		}
		b.WriteString("print(v7)")
		// Compiling 1.5 MiB is seconds of CPU on a loaded machine: the
		// budget is generous, the check is that it runs.
		r := run(t, testEng, s, b.String(), 5*time.Minute)
		if r.ExitCode != 0 || !strings.HasSuffix(r.out, "7\n") {
			t.Fatalf("exit %d out %q err %q", r.ExitCode, r.out, lastLines(r.err, 5))
		}
	})
}

// A run's output is streamed, never held: 256 MiB through the pipe (four
// times the 64 MiB the Go side may grow by, and past the 64 MiB file cap)
// leaves the Go side's memory within that bound and the capture's view
// exact. The soak run (make test-soak) writes 1 GiB.
func TestHugeOutputBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 256 MiB through a pipe")
	}
	hugeOutputBoundedMemory(t, 256)
}

func TestSoakHugeOutputBoundedMemory(t *testing.T) {
	soak.Skip(t)
	hugeOutputBoundedMemory(t, 1024)
}

// hugeOutputBoundedMemory has a run write mib MiB and then END.
func hugeOutputBoundedMemory(t *testing.T, mib int) {
	s := newSession(t)
	out := runcode.NewCapture(12<<10, filepath.Join(t.TempDir(), "stdout"), 64<<20)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx := context.Background()
	res, err := testEng.Run(ctx, &runcode.Request{Code: fmt.Sprintf("import sys\nfor _ in range(%d):\n    sys.stdout.write('x' * (1 << 20))\nprint('END')", mib),
		Session: s, Timeout: 5 * time.Minute, Stdout: out, Stderr: io.Discard})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	v := out.Finish()
	if v.Bytes != int64(mib)<<20+4 || !v.Cut || !strings.HasSuffix(v.Text, "xxxxEND\n") || v.FileBytes != 64<<20 {
		t.Fatalf("view: bytes %d cut %v file %d tail %q", v.Bytes, v.Cut, v.FileBytes, v.Text[len(v.Text)-20:])
	}
	if grew := int64(after.Sys) - int64(before.Sys); grew > 64<<20 {
		t.Fatalf("the Go side grew by %d MiB for a %d MiB output", grew>>20, mib)
	}
}

func TestSpareWorkerServesNewSession(t *testing.T) {
	if testSB.Boxed() {
		t.Skip("the sandbox boxes its runs: a boxed spare cannot be bound to a session's workspace, so there is none (see TestNoSpareWhenBoxed)")
	}
	e := NewEmbedded(testData, testSB, nil)
	defer e.Close()
	if err := e.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	spare := e.spare
	e.mu.Unlock()
	if spare == nil {
		t.Fatal("no spare after Warm")
	}
	s := newSession(t)
	r := run(t, e, s, "import os\nos.getpid(), os.getcwd()", 0)
	if want := fmt.Sprintf("(%d, '%s')\n", spare.pid, s.Workspace()); r.out != want {
		t.Fatalf("out %q, want %q (the spare, bound to the session)", r.out, want)
	}
	<-e.fillSpare()
	e.mu.Lock()
	next := e.spare
	e.mu.Unlock()
	if next == nil || next == spare {
		t.Fatalf("no new spare after the old one was taken")
	}
}

func TestIdleWorkerStopsAndRestarts(t *testing.T) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{NoSpare: true, IdleTimeout: time.Hour})
	defer e.Close()
	s := newSession(t)
	run(t, e, s, "x = 1", 0)
	sl, _ := e.slot(s.ID)
	w := sl.worker()
	if !e.ReleaseIdle(s.ID) { // what the idle timer does
		t.Fatal("ReleaseIdle released nothing")
	}
	if w.alive() {
		t.Fatal("the worker is still running")
	}
	r := run(t, e, s, "print('back')\n'x' in globals()", 0)
	if r.out != "back\nFalse\n" || !hasNote(r, "the Python interpreter was restarted: it had been idle for 1 h") {
		t.Fatalf("out %q notes %q", r.out, r.Notes)
	}
	// Said once: the run after it lost nothing.
	if r := run(t, e, s, "1", 0); len(r.Notes) != 0 {
		t.Fatalf("notes of the next run: %q", r.Notes)
	}
}

// A worker that has run nothing (a prestarted one) holds no state: its
// release loses nothing and the next run says nothing.
func TestUnusedWorkerReleasedSilently(t *testing.T) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{NoSpare: true, IdleTimeout: time.Hour, UnusedTimeout: time.Hour})
	defer e.Close()
	s := newSession(t)
	sl, _ := e.slot(s.ID)
	sl.sem <- struct{}{}
	if err := e.ensureWorker(t.Context(), sl, s); err != nil {
		t.Fatal(err)
	}
	<-sl.sem
	w := sl.worker()
	if !e.ReleaseIdle(s.ID) {
		t.Fatal("ReleaseIdle released nothing")
	}
	if w.alive() {
		t.Fatal("the unused worker is still running")
	}
	if r := run(t, e, s, "print('first')", 0); r.out != "first\n" || len(r.Notes) != 0 {
		t.Fatalf("out %q notes %q", r.out, r.Notes)
	}
}

// A timer that fired while a run held the slot, and takes it only after
// the run re-armed another, stands down: the worker just used stays.
func TestLateIdleTimerStandsDown(t *testing.T) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{NoSpare: true, IdleTimeout: time.Hour})
	defer e.Close()
	s := newSession(t)
	run(t, e, s, "x = 1", 0)
	sl, _ := e.slot(s.ID)
	sl.sem <- struct{}{}
	stale := sl.gen // the generation of the timer armed after that run
	<-sl.sem
	run(t, e, s, "x += 1", 0) // a run came: its own timer replaces it
	w := sl.worker()
	e.idleStop(sl, stale) // the first timer, late
	if !w.alive() {
		t.Fatal("a stale idle timer released the worker of a run that had just ended")
	}
	if r := run(t, e, s, "x", 0); r.out != "2\n" || len(r.Notes) != 0 {
		t.Fatalf("out %q notes %q", r.out, r.Notes)
	}
}

func TestStopDuringRun(t *testing.T) {
	s := newSession(t)
	started := make(chan struct{})
	var once sync.Once
	out := writerFunc(func(p []byte) (int, error) {
		once.Do(func() { close(started) })
		return len(p), nil
	})
	done := make(chan *runcode.Result)
	go func() {
		res, err := testEng.Run(context.Background(), &runcode.Request{Code: "import time\nprint('go', flush=True)\ntime.sleep(3600)",
			Session: s, Timeout: time.Hour, Stdout: out, Stderr: io.Discard})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-started
	testEng.Stop(s.ID)
	res := <-done
	if res.ExitCode != 128+int(syscall.SIGKILL) || len(res.Notes) == 0 {
		t.Fatalf("%+v", res)
	}
}

func TestConcurrentSessions(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := newSession(t)
			for j := range 5 {
				r := run(t, testEng, s, fmt.Sprintf("n = %d * 100 + %d\nn", i, j), 0)
				if want := fmt.Sprintf("%d\n", i*100+j); r.out != want {
					t.Errorf("got %q want %q", r.out, want)
				}
			}
		}()
	}
	wg.Wait()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestNoSpareWhenBoxed(t *testing.T) {
	if !testSB.Boxed() {
		t.Skip("the sandbox does not box its runs here")
	}
	e := NewEmbedded(testData, testSB, nil)
	defer e.Close()
	if err := e.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	spare := e.spare
	e.mu.Unlock()
	if spare != nil {
		t.Fatal("a spare worker was started in a box")
	}
	s := newSession(t)
	r := run(t, e, s, "import os; print(os.getcwd())", 0)
	if want := "/home/user\n"; r.out != want { // where the box shows the workspace
		t.Fatalf("out %q, want %q", r.out, want)
	}
}

// findProcess looks for the process that the code saw as pid: the same
// host pid without a box; in a box, a process whose innermost pid is pid and
// whose working directory is the session's workspace. It returns its host
// pid.
func findProcess(pid int, workspace string) (int, bool) {
	if !testSB.Boxed() {
		return pid, !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
	return sandboxtest.HostPID(pid, workspace)
}

// The embedded worker sees what pip --user installs between runs, as the
// rootfs worker does.
func TestEmbeddedWorkerSeesUserSiteInstalls(t *testing.T) {
	checkUserSiteInstalls(t, testEng, newSession(t), "3.14")
}
