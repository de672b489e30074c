//go:build !slim

package python

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/session"
)

// runIn runs code in code context c (nil ID: the default namespace), with
// an observer that sees the output as it comes.
func runCtx(t testing.TB, ctx context.Context, s *session.Session, c runcode.ContextRun, code string) ran {
	t.Helper()
	return runCtxOn(t, testEng, ctx, s, c, code)
}

func runCtxOn(t testing.TB, e *Embedded, ctx context.Context, s *session.Session, c runcode.ContextRun, code string) ran {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := e.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: time.Minute,
		Stdout: &out, Stderr: &errb, Context: &c})
	if err != nil {
		t.Fatalf("Run(%q): engine error: %v", code, err)
	}
	return ran{res, out.String(), errb.String()}
}

func TestContextsAreIsolated(t *testing.T) {
	t.Parallel()
	s := newSession(t)
	bg := context.Background()
	run(t, testEng, s, "x = 'default'")
	runCtx(t, bg, s, runcode.ContextRun{ID: "a"}, "x = 'a'")
	runCtx(t, bg, s, runcode.ContextRun{ID: "b"}, "y = 'b'")
	if r := run(t, testEng, s, "print(x, 'y' in globals())"); r.out != "default False\n" {
		t.Errorf("the default namespace: %q %q", r.out, r.err)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "a"}, "print(x, 'y' in globals())"); r.out != "a False\n" {
		t.Errorf("context a: %q %q", r.out, r.err)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "b"}, "print('x' in globals(), y)"); r.out != "False b\n" {
		t.Errorf("context b: %q %q", r.out, r.err)
	}
	// The execution count is the context's own.
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "a"}, "1"); r.ExecutionCount != 3 {
		t.Errorf("context a's count: %d, want 3", r.ExecutionCount)
	}
	// Dropped: a fresh namespace under the same id.
	if err := testEng.DropContext(bg, s.ID, "a"); err != nil {
		t.Fatal(err)
	}
	r := runCtx(t, bg, s, runcode.ContextRun{ID: "a"}, "print('x' in globals())")
	if r.out != "False\n" || r.ExecutionCount != 1 {
		t.Errorf("after the drop: %q count %d", r.out, r.ExecutionCount)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "b"}, "print(y)"); r.out != "b\n" {
		t.Errorf("context b after a's drop: %q %q", r.out, r.err)
	}
}

func TestContextDirectory(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	sub := filepath.Join(s.Workspace(), "sub")
	if err := os.Mkdir(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	// /home/user is the workspace (the box binds it there; without that
	// bind the worker maps it).
	r := runCtx(t, bg, s, runcode.ContextRun{ID: "c", Dir: "/home/user/sub"}, "import os\nprint(os.path.realpath(os.getcwd()))\nos.chdir('..')")
	if got := strings.TrimSpace(r.out); got != "/home/user/sub" && got != mustReal(t, sub) {
		t.Errorf("the context's directory: %q (stderr %q, notes %q)", r.out, r.err, r.Notes)
	}
	// The default namespace keeps its own directory; the context keeps the
	// one its code moved to.
	if r := run(t, testEng, s, "import os\nprint(os.path.realpath(os.getcwd()))"); strings.TrimSpace(r.out) != shownAt(s, s.Workspace()) && strings.TrimSpace(r.out) != mustReal(t, s.Workspace()) {
		t.Errorf("the default directory: %q", r.out)
	}
	r = runCtx(t, bg, s, runcode.ContextRun{ID: "c"}, "import os\nprint(os.path.realpath(os.getcwd()))")
	if got := strings.TrimSpace(r.out); got != "/home/user" && got != mustReal(t, s.Workspace()) {
		t.Errorf("the context's directory after its chdir: %q", r.out)
	}
}

func mustReal(t testing.TB, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRichResults(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	rich := runcode.ContextRun{ID: "r", Rich: true}
	code := `class H:
    def _repr_html_(self): return "<b>hi</b>"
    def _repr_png_(self): return b"\x89PNG"
    def __repr__(self): return "H()"
print("printed")
display(H())
x = 6 * 7
x`
	r := runCtx(t, bg, s, rich, code)
	if r.out != "printed\n" || r.err != "" {
		t.Errorf("stdout %q stderr %q: the last value must not be printed", r.out, r.err)
	}
	if len(r.Results) != 2 {
		t.Fatalf("results: %+v", r.Results)
	}
	d, m := r.Results[0], r.Results[1]
	if d.Main || d.Data["text/html"] != "<b>hi</b>" || d.Data["text/plain"] != "H()" ||
		d.Data["image/png"] != base64.StdEncoding.EncodeToString([]byte("\x89PNG")) {
		t.Errorf("display(): %+v", d)
	}
	if !m.Main || m.Data["text/plain"] != "42" || len(m.Data) != 1 {
		t.Errorf("the main result: %+v", m)
	}
	// A statement as the last line (or None) is no result.
	if r := runCtx(t, bg, s, rich, "y = 1\nNone"); len(r.Results) != 0 {
		t.Errorf("results of a run without a value: %+v", r.Results)
	}
	// The plain run_code form is as before: the value printed.
	if r := run(t, testEng, s, "6 * 7"); r.out != "42\n" || r.Results != nil || r.ExecutionCount != 0 {
		t.Errorf("plain run: %q %+v %d", r.out, r.Results, r.ExecutionCount)
	}
}

func TestRichException(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	r := runCtx(t, bg, s, runcode.ContextRun{ID: "e", Rich: true}, "print('before')\ndef f():\n    return 1 / 0\nf()")
	if r.Exception == nil {
		t.Fatalf("no exception: %+v", r.Result)
	}
	e := r.Exception
	if e.Name != "ZeroDivisionError" || e.Value != "division by zero" ||
		!strings.Contains(e.Traceback, "return 1 / 0") || !strings.Contains(e.Traceback, "ZeroDivisionError: division by zero") ||
		strings.Contains(e.Traceback, "quro_worker") {
		t.Errorf("exception: %+v", e)
	}
	if r.err != "" || r.out != "before\n" {
		t.Errorf("the traceback must not be on stderr too: stdout %q stderr %q", r.out, r.err)
	}
	// A syntax error is one too.
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "e", Rich: true}, "def ("); r.Exception == nil || r.Exception.Name != "SyntaxError" {
		t.Errorf("syntax error: %+v", r.Exception)
	}
}

func TestContextEnvIsRestored(t *testing.T) {
	s := newSession(t)
	s.Env = map[string]string{"KEEP": "session"}
	bg := context.Background()
	c := runcode.ContextRun{ID: "v", Env: map[string]string{"ONLY_NOW": "1", "KEEP": "run"}}
	if r := runCtx(t, bg, s, c, "import os\nprint(os.environ.get('ONLY_NOW'), os.environ['KEEP'])"); r.out != "1 run\n" {
		t.Errorf("during the run: %q %q", r.out, r.err)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "v"}, "import os\nprint(os.environ.get('ONLY_NOW'), os.environ['KEEP'])"); r.out != "None session\n" {
		t.Errorf("after the run: %q %q", r.out, r.err)
	}
}

// An interrupt (the client of /execute went away) stops the run and keeps
// the context's state. patientEng: the code's stop itself can take a
// while at load (the worker's finishing is timed apart:
// TestInterruptGraceEndsWhenTheCodeStops).
func TestContextInterruptKeepsState(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	c := runcode.ContextRun{ID: "i", Rich: true}
	runCtxOn(t, patientEng, bg, s, c, "n = 0")
	r := waitRan(t, interruptedLoop(t, patientEng, s, c))
	if !r.Interrupted || r.Exception == nil || r.Exception.Name != "KeyboardInterrupt" {
		t.Fatalf("interrupted %v exception %+v error %q notes %q stderr %q", r.Interrupted, r.Exception, r.Error, r.Notes, r.err)
	}
	a := runCtxOn(t, patientEng, bg, s, c, "n")
	b := runCtxOn(t, patientEng, bg, s, c, "n")
	if len(a.Results) != 1 || len(b.Results) != 1 || len(a.Results[0].Data["text/plain"].(string)) < 4 ||
		a.Results[0].Data["text/plain"] != b.Results[0].Data["text/plain"] {
		t.Errorf("the loop did not stop or the state was lost: %+v then %+v", a.Results, b.Results)
	}
}

// interruptedLoop starts a busy loop in context c of s that counts n up
// (n must exist) and cancels it once it printed that it loops.
func interruptedLoop(t *testing.T, e *Embedded, s *session.Session, c runcode.ContextRun) *enginetest.Background {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	bgRun := enginetest.StartPrinting(t, "looping", func(stdout, stderr io.Writer) (*runcode.Result, error) {
		return e.Run(ctx, &runcode.Request{Code: "while True:\n    n += 1\n    if n == 1000:\n        print('looping', flush=True)", Lang: "python",
			Session: s, Timeout: time.Minute, Stdout: stdout, Stderr: stderr, Context: &c})
	})
	cancel()
	return bgRun
}

// The grace is the code's time to stop after its interrupt, not the
// worker's to finish the run: a worker's first traceback imports 59
// modules (~50 ms of CPU, seconds in a box starved at load), and a worker
// whose code had stopped was killed in that import, its state lost
// (whatever the code or the worker imported: the test above failed at
// load until it moved to patientEng). Here the finishing is held past the
// grace (the worker's exception formatter waits on a FIFO): the worker
// has said the code stopped, and is not killed.
func TestInterruptGraceEndsWhenTheCodeStops(t *testing.T) {
	t.Parallel()
	const grace = 2 * time.Second
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: grace, NoSpare: true})
	defer e.Close()
	s := newSession(t)
	if err := syscall.Mkfifo(filepath.Join(s.Workspace(), "gate"), 0o600); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	c := runcode.ContextRun{ID: "g", Rich: true}
	hold := "import os, sys\nw = sys.modules['quro_worker']\nformat_exc = w._exception\n" +
		"def held(e):\n    with open(os.path.expanduser('~/gate')) as f:\n        f.read()\n    return format_exc(e)\n" +
		"w._exception = held\nn = 0"
	if r := runCtxOn(t, e, bg, s, c, hold); r.Exception != nil {
		t.Fatalf("set-up: %+v %q", r.Exception, r.err)
	}
	bgRun := interruptedLoop(t, e, s, c)
	ended := make(chan *runcode.Result, 1)
	go func() {
		r, _, _ := bgRun.Wait()
		ended <- r
	}()
	// Without the worker's word the run ends at the grace, killed; a run
	// that ends later than this wait passes here as it should.
	select {
	case r := <-ended:
		t.Fatalf("the run ended while its worker was still finishing it: error %q notes %q", r.Error, r.Notes)
	case <-time.After(grace + time.Second):
	}
	if err := os.WriteFile(filepath.Join(s.Workspace(), "gate"), []byte("go"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-ended
	if r == nil || !r.Interrupted || r.Exception == nil || r.Exception.Name != "KeyboardInterrupt" {
		t.Fatalf("%+v", r)
	}
	if a := runCtxOn(t, e, bg, s, c, "n"); len(a.Results) != 1 || len(a.Results[0].Data["text/plain"].(string)) < 4 {
		t.Errorf("the state was lost: %+v %q %q", a.Results, a.err, a.Notes)
	}
}

// The worker's "stopped" is the box's word: code that forges it (and
// blocks SIGINT) ends its SIGINTs and its grace, not its bound: the worker
// is killed once the finishing bound passes, as code that swallows
// KeyboardInterrupt is at the grace. The run is interrupted only once the
// code has forged its frames and blocked SIGINT (it says so on stdout):
// a deadline could land before, and the code would then stop as asked.
// The grace is long enough for the server to have read the forged frames
// (on the reply pipe, beside stdout) before it passes. The code then waits
// in time.sleep, SIGINT blocked: a busy loop spent the grace's 5 s of CPU
// on nothing the bound needs.
func TestForgedStoppedFrameIsStillBounded(t *testing.T) {
	old := finishGrace
	finishGrace = 300 * time.Millisecond
	t.Cleanup(func() { finishGrace = old })
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: 5 * time.Second, NoSpare: true})
	defer e.Close()
	s := newSession(t)
	run(t, e, s, "x = 1", 0)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	code := "import signal, sys\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n" +
		"w = sys.modules['quro_worker']\nfor i in range(w._counter + 50):\n    w._send({'op': 'stopped', 'id': i})\n" +
		"print('forged', flush=True)\nimport time\nwhile True:\n    time.sleep(60)"
	bgRun := enginetest.StartPrinting(t, "forged", func(stdout, stderr io.Writer) (*runcode.Result, error) {
		return e.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: time.Minute, Stdout: stdout, Stderr: stderr})
	})
	cancel()
	r := waitRan(t, bgRun)
	if !strings.Contains(r.Error, "did not finish the run within") || !strings.Contains(r.Error, "lost") {
		t.Fatalf("%+v", r.Result)
	}
	if r := run(t, e, s, "print(2 + 2)", 0); r.out != "4\n" {
		t.Fatalf("the next run: out %q err %q", r.out, r.err)
	}
}

// waitRan waits for a run StartPrinting started, which must not fail.
func waitRan(t *testing.T, b *enginetest.Background) ran {
	t.Helper()
	res, stderr, err := b.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return ran{Result: res, err: stderr}
}

type notify struct {
	bytes.Buffer
	f func([]byte)
}

func (n *notify) Write(p []byte) (int, error) {
	n.f(p)
	return n.Buffer.Write(p)
}

// A notebook cell's "!command" line runs the command in a shell (E2B's
// kernel is IPython); valid Python with a "!" line in a string is left
// alone, and plain runs never read it so.
func TestRichShellLines(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	r := runCtx(t, bg, s, runcode.ContextRun{ID: "sh", Rich: true}, "print('py')\n!echo from-shell\nif True:\n    !echo indented")
	if r.out != "py\nfrom-shell\nindented\n" || r.Exception != nil {
		t.Errorf("shell lines: %q %q %+v", r.out, r.err, r.Exception)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "sh", Rich: true}, "x = '''\n!not a command\n'''\nprint(x.strip())"); r.out != "!not a command\n" {
		t.Errorf("a string: %q %q", r.out, r.err)
	}
	if r := run(t, testEng, s, "!echo no"); !strings.Contains(r.err, "SyntaxError") || r.out != "" {
		t.Errorf("plain run: %q %q", r.out, r.err)
	}
}

// A notebook cell indented as a whole runs, as in IPython (E2B's SDK
// tests send code indented inside template strings), with its "!" lines
// and its last value; a plain run still reads the indent as an error.
func TestRichCellIndentedAsAWhole(t *testing.T) {
	s := newSession(t)
	bg := context.Background()
	cell := "\n        x = 40\n        if x:\n            x += 1\n        !echo shell\n        x + 1\n"
	r := runCtx(t, bg, s, runcode.ContextRun{ID: "ind", Rich: true}, cell)
	if r.Exception != nil || r.out != "shell\n" || len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "42" {
		t.Fatalf("an indented cell: out %q err %q exception %+v results %+v", r.out, r.err, r.Exception, r.Results)
	}
	if r := runCtx(t, bg, s, runcode.ContextRun{ID: "ind", Rich: true}, "    x = 1\n  y = 2"); r.Exception == nil || r.Exception.Name != "IndentationError" {
		t.Errorf("a cell whose lines do not share the indent: %+v", r.Exception)
	}
	if r := run(t, testEng, s, "    print(1)"); !strings.Contains(r.err, "IndentationError") {
		t.Errorf("plain run: %q %q", r.out, r.err)
	}
}

// TestRichResultsInTheText: a rich run's values and exception are in the
// reply text a model reads, not only in the structured result.
func TestRichResultsInTheText(t *testing.T) {
	s := newSession(t)
	rich := runcode.ContextRun{ID: "rt", Rich: true}
	code := `class H:
    def _repr_html_(self): return "<b>hi</b>"
    def __repr__(self): return "H-text"
display(H())
6 * 7`
	r := runCtx(t, context.Background(), s, rich, code)
	txt := r.Text()
	for _, want := range []string{"H-text", "📎 also as text/html", "Out: 42"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text misses %q:\n%s", want, txt)
		}
	}
	r = runCtx(t, context.Background(), s, rich, "1 / 0")
	if txt := r.Text(); !strings.Contains(txt, "ZeroDivisionError") {
		t.Errorf("the exception is not in the text:\n%s", txt)
	}
}

// A restart whose run does not stop within the interrupt grace (it
// blocks SIGINT; at load a SIGINT can also be handled past the grace) kills the worker, and the run still ends as the restart:
// E2B's /execute waits for its ContextRestarting error, and without it
// cut the stream as if the sandbox had been killed.
func TestRestartThatKillsTheWorkerIsARestart(t *testing.T) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{InterruptGrace: 200 * time.Millisecond, NoSpare: true})
	defer e.Close()
	s := newSession(t)
	bg := context.Background()
	c := runcode.ContextRun{ID: "r", Rich: true}
	runCtxOn(t, e, bg, s, c, "n = 0")
	bgRun := enginetest.StartPrinting(t, "looping", func(stdout, stderr io.Writer) (*runcode.Result, error) {
		return e.Run(bg, &runcode.Request{Code: "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)",
			Lang: "python", Session: s, Timeout: 10 * time.Minute, Stdout: stdout, Stderr: stderr, Context: &c})
	})
	if err := e.DropContext(bg, s.ID, "r"); err != nil {
		t.Fatal(err)
	}
	r := waitRan(t, bgRun)
	if r.Exception == nil || r.Exception.Name != runcode.RestartedException().Name || !strings.Contains(r.Error, "was killed") {
		t.Fatalf("exception %+v error %q notes %q", r.Exception, r.Error, r.Notes)
	}
	if a := runCtxOn(t, e, bg, s, c, "'n' in globals()"); len(a.Results) != 1 || a.Results[0].Data["text/plain"] != "False" {
		t.Errorf("after the restart: %+v %q", a.Results, a.err)
	}
}
