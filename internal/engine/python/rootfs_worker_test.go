//go:build !slim

package python

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// rootfsWorker is a rootfs worker engine over the shared test rootfs,
// closed at the end of the test, with its module under the package tests'
// data directory.
func rootfsWorker(t *testing.T, opts *EmbeddedOptions) *RootfsWorker {
	t.Helper()
	e := NewRootfsWorker(testData, testSB, sharedRootfs(t), opts)
	t.Cleanup(func() { e.Close() })
	return e
}

// rootfsSession is a new session on the test rootfs.
func rootfsSession(t *testing.T) *session.Session {
	t.Helper()
	s := newSession(t)
	s.Rootfs = rootfs.DefaultName
	return s
}

// runOn runs code in s through engine e (the context c, if not nil).
func runOn(t testing.TB, e runcode.Engine, s *session.Session, c *runcode.ContextRun, code string, timeout time.Duration) ran {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := e.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: timeout,
		Stdout: &out, Stderr: &errb, Context: c})
	if err != nil {
		t.Fatalf("Run(%q): engine error: %v", code, err)
	}
	return ran{res, out.String(), errb.String()}
}

// A rootfs session's Python is the rootfs's python3 (Debian 12's 3.11),
// resident: its variables persist between runs, a trailing expression is
// shown, and site ran as usual (Debian's dist-packages on sys.path), with
// the environment's PYTHON* variables ignored by the worker.
func TestRootfsWorkerKeepsState(t *testing.T) {
	t.Parallel()
	e := rootfsWorker(t, nil)
	s := rootfsSession(t)
	s.Env = map[string]string{"PYTHONPATH": "/nowhere", "QURO_PROBE": "seen"}
	r := runOn(t, e, s, nil, "import sys, os\nx = 41\nprint(sys.version_info[:2], sys.executable, sys.flags.no_site, sys.flags.no_user_site, os.environ['QURO_PROBE'])\n"+
		"print('/usr/lib/python3/dist-packages' in sys.path, '/nowhere' in sys.path, os.environ.get('PYTHONPATH'))", time.Minute)
	if r.ExitCode != 0 || r.out != "(3, 11) /usr/bin/python3 0 0 seen\nTrue False /nowhere\n" {
		t.Fatalf("first run: %+v out %q err %q", r.Result, r.out, r.err)
	}
	r = runOn(t, e, s, nil, "x + 1", time.Minute)
	if r.ExitCode != 0 || r.out != "42\n" {
		t.Fatalf("second run: %+v out %q err %q", r.Result, r.out, r.err)
	}
	// The userland is the rootfs's, and Debian's packages import.
	r = runOn(t, e, s, nil, "import setuptools\nprint(open('/etc/debian_version').read()[:3], setuptools.__file__)", time.Minute)
	if r.ExitCode != 0 || !strings.HasPrefix(r.out, "12.") || !strings.Contains(r.out, "/usr/lib/python3/dist-packages/setuptools/") {
		t.Errorf("rootfs userland: %+v out %q err %q", r.Result, r.out, r.err)
	}
	// Reset gives a fresh interpreter.
	if err := e.Reset(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "x", time.Minute); !strings.Contains(r.err, "NameError") || len(r.Notes) != 0 {
		t.Errorf("after Reset: %+v out %q err %q", r.Result, r.out, r.err)
	}
	if n := e.Sessions(); n != 1 {
		t.Errorf("Sessions = %d, want 1", n)
	}
	e.Stop(s.ID)
	if n := e.Sessions(); n != 0 {
		t.Errorf("after Stop: Sessions = %d", n)
	}
}

// A timeout interrupts the code with KeyboardInterrupt and the worker, its
// variables, stay; code that ignores the interrupt is killed after the
// grace, and the next run says the state is lost. The interrupted code
// is a busy loop (the engine's one of a rootfs's Python: the contract's
// Loop sleeps); the code that swallows the interrupt waits in
// time.sleep, as the embedded engine's TestSwallowedInterruptEscalates
// does: its kill at the grace is the same for either, and a busy loop
// spent the timeout and the grace, 2.5 s, of CPU on nothing it checks.
func TestRootfsWorkerTimeoutKeepsState(t *testing.T) {
	e := rootfsWorker(t, &EmbeddedOptions{InterruptGrace: 500 * time.Millisecond})
	s := rootfsSession(t)
	runOn(t, e, s, nil, "x = 41", time.Minute)
	r := runOn(t, e, s, nil, "print('looping', flush=True)\nwhile True:\n    pass", 2*time.Second)
	if !r.TimedOut || !strings.Contains(r.Error, "the session keeps its variables") || r.out != "looping\n" || !strings.Contains(r.err, "KeyboardInterrupt") {
		t.Fatalf("timeout: %+v out %q err %q", r.Result, r.out, r.err)
	}
	if r := runOn(t, e, s, nil, "print(x + 1)", time.Minute); r.out != "42\n" {
		t.Fatalf("after the timeout: %+v out %q err %q", r.Result, r.out, r.err)
	}
	r = runOn(t, e, s, nil, "import time\nwhile True:\n    try:\n        while True:\n            time.sleep(60)\n    except KeyboardInterrupt:\n        pass", 2*time.Second)
	if !r.TimedOut || !strings.Contains(r.Error, "the Python worker was killed") {
		t.Fatalf("ignored interrupt: %+v out %q err %q", r.Result, r.out, r.err)
	}
	if r := runOn(t, e, s, nil, "print('x' in globals())", time.Minute); r.out != "False\n" {
		t.Errorf("after the kill: %+v out %q err %q", r.Result, r.out, r.err)
	}
}

// display() of an object with _repr_html_ becomes an artifact, and code
// contexts keep their own namespaces (E2B's code interpreter on a rootfs
// template), with rich results.
func TestRootfsWorkerArtifactsAndContexts(t *testing.T) {
	e := rootfsWorker(t, nil)
	s := rootfsSession(t)
	r := runOn(t, e, s, nil, "class T:\n    def _repr_html_(self):\n        return '<b>hi</b>'\ndisplay(T())", time.Minute)
	if r.ExitCode != 0 || len(r.Artifacts) != 1 || r.Artifacts[0].Kind != "html" || r.Artifacts[0].Data != "<b>hi</b>" {
		t.Fatalf("display: %+v out %q err %q", r.Result, r.out, r.err)
	}
	runOn(t, e, s, nil, "x = 'default'", time.Minute)
	c := &runcode.ContextRun{ID: "a", Dir: "/home/user", Rich: true}
	r = runOn(t, e, s, c, "x = 'a'\nx", time.Minute)
	if len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "'a'" || r.ExecutionCount != 1 {
		t.Fatalf("context a: %+v out %q err %q", r.Result, r.out, r.err)
	}
	r = runOn(t, e, s, c, "1/0", time.Minute)
	if r.Exception == nil || r.Exception.Name != "ZeroDivisionError" || r.ExecutionCount != 2 {
		t.Errorf("context a's error: %+v", r.Result)
	}
	if r := runOn(t, e, s, nil, "print(x)", time.Minute); r.out != "default\n" {
		t.Errorf("default namespace: %q %q", r.out, r.err)
	}
	if err := e.DropContext(context.Background(), s.ID, "a"); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, c, "'x' in globals()", time.Minute); r.ExecutionCount != 1 || len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "False" {
		t.Errorf("after the drop: %+v", r.Result)
	}
}

// A module written into the user site (where pip --user installs, under
// HOME: the workspace) between runs imports in the next run, without a
// restart, although the directory did not exist when the worker started.
func TestRootfsWorkerSeesUserSiteInstalls(t *testing.T) {
	e := rootfsWorker(t, nil)
	checkUserSiteInstalls(t, e, rootfsSession(t), "3.11")
}

// checkUserSiteInstalls: what lands in the session's user site between
// runs (as pip --user puts it) imports in the next run of e's resident
// worker, without a restart: the user site once it appears, a module
// added to it, and a .pth file added after that (an editable install's,
// pointing at a directory outside site-packages).
func checkUserSiteInstalls(t *testing.T, e runcode.Engine, s *session.Session, version string) {
	t.Helper()
	r := runOn(t, e, s, nil, "import site, sys\nprint(site.getusersitepackages())", time.Minute)
	want := filepath.Join(s.Workspace(), ".local/lib/python"+version+"/site-packages")
	if strings.TrimSpace(r.out) != shownAt(s, want) {
		t.Fatalf("user site: %q (err %q), want %q", r.out, r.err, shownAt(s, want))
	}
	if r := runOn(t, e, s, nil, "import quro_user_mod", time.Minute); !strings.Contains(r.err, "ModuleNotFoundError") {
		t.Fatalf("before the install: %q %q", r.out, r.err)
	}
	if err := os.MkdirAll(want, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(want, "quro_user_mod.py"), []byte("VALUE = 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "import quro_user_mod\nprint(quro_user_mod.VALUE, quro_user_mod.__file__)", time.Minute); r.out != "7 "+shownAt(s, filepath.Join(want, "quro_user_mod.py"))+"\n" {
		t.Fatalf("after the install: %+v out %q err %q", r.Result, r.out, r.err)
	}
	// A second package in the same, now known, directory.
	if err := os.WriteFile(filepath.Join(want, "quro_user_mod2.py"), []byte("VALUE = 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "import quro_user_mod2\nprint(quro_user_mod2.VALUE)", time.Minute); r.out != "8\n" {
		t.Fatalf("second install: %+v out %q err %q", r.Result, r.out, r.err)
	}
	// An editable install: a .pth naming a directory of the workspace.
	src := filepath.Join(s.Workspace(), "editable")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "quro_editable_mod.py"), []byte("VALUE = 9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(want, "__editable__.quro_editable.pth"), []byte(shownAt(s, src)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "import quro_editable_mod\nprint(quro_editable_mod.VALUE)", time.Minute); r.out != "9\n" {
		t.Fatalf("a .pth added later: %+v out %q err %q", r.Result, r.out, r.err)
	}
}

// What the engine leaves to the next tier, without starting anything: a
// session without a rootfs, a rootfs not installed, a rootfs without
// python3 (named, with what adds it); and NUL bytes in the code are
// refused as Python 3.12+ says.
func TestRootfsWorkerFallsThrough(t *testing.T) {
	m := rootfs.New(t.TempDir())
	e := NewRootfsWorker(testData, testSB, m, nil)
	defer e.Close()
	s := newSession(t)
	var out, errb bytes.Buffer
	req := &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: &errb}
	if _, err := e.Run(context.Background(), req); !errors.Is(err, ErrNoRootfs) {
		t.Errorf("host session: %v, want ErrNoRootfs", err)
	}
	s.Rootfs = "missing"
	if _, err := e.Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), `rootfs "missing" is not installed`) {
		t.Errorf("missing rootfs: %v", err)
	}
	// A ready rootfs without python3 (a userland that never had it, or
	// whose python3 is a link to nothing).
	if err := os.MkdirAll(filepath.Join(m.Path("bare"), "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Path("bare"), rootfs.Marker), []byte("ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/bin/python3.99", filepath.Join(m.Path("bare"), "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	s.Rootfs = "bare"
	if _, err := e.Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), `rootfs "bare" has no /usr/bin/python3 (install_packages python3 adds it)`) {
		t.Errorf("rootfs without python3: %v", err)
	}
	// A link in the rootfs leads to the rootfs's /, never the host's
	// (whose /usr/bin/python3 exists: the test runs it).
	if err := os.MkdirAll(m.Path("escape"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Path("escape"), rootfs.Marker), []byte("ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/../../../../", filepath.Join(m.Path("escape"), "usr")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.Path("escape"), "usr/bin/python3")); err != nil {
		t.Fatalf("the host's view through the link: %v", err)
	}
	s.Rootfs = "escape"
	if _, err := e.Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), `rootfs "escape" has no /usr/bin/python3`) {
		t.Errorf("rootfs whose usr leads out: %v", err)
	}
	req.Code = "print(1)\nx = '\x00'"
	r, err := e.Run(context.Background(), req)
	if err != nil || r.ExitCode != 1 || !strings.HasPrefix(errb.String(), "SyntaxError: source code cannot contain null bytes (first at line 2)") || out.String() != "" {
		t.Errorf("NUL: %v %+v %q", err, r, errb.String())
	}
}

// Prestart starts a rootfs session's worker ahead of its first run, and
// nothing for a session on the host userland.
func TestRootfsWorkerPrestart(t *testing.T) {
	e := rootfsWorker(t, nil)
	host := newSession(t)
	e.Prestart(host)
	e.wg.Wait() // the prestart's goroutine, if any
	if n := e.Sessions(); n != 0 {
		t.Fatalf("a host session got a rootfs worker: %d", n)
	}
	s := rootfsSession(t)
	e.Prestart(s)
	e.wg.Wait()
	if n := e.Sessions(); n != 1 {
		t.Fatalf("prestarted workers: %d, want 1", n)
	}
	if r := runOn(t, e, s, nil, "import sys\nprint(sys.executable)", time.Minute); r.out != "/usr/bin/python3\n" || len(r.Notes) != 0 {
		t.Errorf("first run on the prestarted worker: %+v out %q err %q", r.Result, r.out, r.err)
	}
}

// The worker's behaviours that depend on the interpreter, on the rootfs's
// 3.11 (the embedded 3.14 has its own tests of each): tracebacks show
// user code only, sys.exit keeps the worker, os._exit is reported and the
// next run starts afresh, a closed stdout is repaired, input() meets EOF,
// processes left running are killed, C stdio and a shell's output keep
// their order, top-level await, and the "!" shell lines of rich mode.
func TestRootfsWorkerBehaviours(t *testing.T) {
	t.Parallel()
	e := rootfsWorker(t, nil)
	s := rootfsSession(t)
	try := func(code string) ran { t.Helper(); return runOn(t, e, s, nil, code, time.Minute) }
	runOn(t, e, s, nil, "v = 9", time.Minute)

	r := try("def f():\n    return 1 / 0\n\nf()")
	for _, want := range []string{"Traceback (most recent call last):", "line 4, in <module>", "line 2, in f", "return 1 / 0", "ZeroDivisionError: division by zero"} {
		if !strings.Contains(r.err, want) {
			t.Errorf("traceback lacks %q:\n%s", want, r.err)
		}
	}
	if strings.Contains(r.err, workerModule) {
		t.Errorf("traceback shows worker frames:\n%s", r.err)
	}
	if r := try("x = (1,\n"); !strings.Contains(r.err, "SyntaxError") || strings.Contains(r.err, workerModule) {
		t.Errorf("syntax error:\n%s", r.err)
	}
	if r := try("import sys\nprint('bye')\nsys.exit(3)"); r.ExitCode != 3 || r.out != "bye\n" || !hasNote(r, "sys.exit(3)") {
		t.Errorf("sys.exit: %+v out %q", r.Result, r.out)
	}
	if r := try("import sys\nsys.stdout.close()\nprint('x')"); !strings.Contains(r.err, "ValueError") || !hasNote(r, "closed sys.stdout") {
		t.Errorf("closed stdout: err %q notes %q", r.err, r.Notes)
	}
	if r := try("import os, ctypes\nprint('py')\nctypes.CDLL(None).printf(b'c\\n')\nos.system('echo sh')\nprint('end')"); r.out != "py\nc\nsh\nend\n" {
		t.Errorf("order of Python, C and shell output: %q err %q", r.out, r.err)
	}
	if r := try("name = input('name? ')"); r.ExitCode != 1 || !strings.Contains(r.err, "EOFError: input() has no standard input") || r.out != "name? " {
		t.Errorf("input: out %q err %q", r.out, r.err)
	}
	if r := try("import asyncio\nasync def g():\n    await asyncio.sleep(0)\n    return 7\nawait g()"); r.out != "7\n" {
		t.Errorf("top-level await: out %q err %q", r.out, r.err)
	}
	if r := try("import subprocess\np = subprocess.Popen(['sleep', '3600'])\nprint(p.pid)"); !hasNote(r, "was still running when the run ended; it was killed") {
		t.Errorf("process left running: %+v out %q", r.Result, r.out)
	}
	if r := try("import os\npid = os.fork()\nif pid == 0:\n    print('child', flush=True)\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('parent')"); r.out != "child\nparent\n" {
		t.Errorf("fork: out %q err %q", r.out, r.err)
	}
	if r := try("v"); r.out != "9\n" {
		t.Errorf("state after all that: %q %q", r.out, r.err)
	}
	c := &runcode.ContextRun{ID: "sh", Rich: true}
	if r := runOn(t, e, s, c, "!echo from-shell", time.Minute); r.out != "from-shell\n" {
		t.Errorf("! line: %+v out %q err %q", r.Result, r.out, r.err)
	}
	r = try("import os\nprint('going', flush=True)\nos._exit(4)")
	if r.ExitCode != 4 || !hasNote(r, "exited with status 4") || r.out != "going\n" {
		t.Errorf("os._exit: %+v out %q", r.Result, r.out)
	}
	if r := try("print('alive')\n'v' in globals()"); r.out != "alive\nFalse\n" {
		t.Errorf("after os._exit: out %q err %q", r.out, r.err)
	}
}

// Code of the session that runs before the worker's hello (a .pth file in
// the user site, which site executes at start) cannot make the server
// believe or allocate what it says: a forged reply frame of 4 GiB fails
// the start with the worker's own words, and the run is an engine error
// (the chain goes on), not a hang.
func TestRootfsWorkerHostileUserSite(t *testing.T) {
	e := rootfsWorker(t, nil)
	s := rootfsSession(t)
	dir := filepath.Join(s.Workspace(), ".local/lib/python3.11/site-packages")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pth := "import os, sys; os.write(4, b'\\xff\\xff\\xff\\xff' + b'x' * 64); sys.stderr.write('forged\\n')\n"
	if err := os.WriteFile(filepath.Join(dir, "zz-forge.pth"), []byte(pth), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.Run(ctx, &runcode.Request{Code: "print(1)", Lang: "python", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: &errb})
	if err == nil || !strings.Contains(err.Error(), "the Python worker did not start: refused reply frame: reply frame of 4294967295 bytes") {
		t.Fatalf("forged frame at start: %v (out %q)", err, out.String())
	}
	// Without the file the session's Python works again.
	if err := os.Remove(filepath.Join(dir, "zz-forge.pth")); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "print(2)", time.Minute); r.out != "2\n" {
		t.Errorf("after removing the .pth: %+v out %q err %q", r.Result, r.out, r.err)
	}
}

// A session whose worker cannot start (here a .pth that forges a reply
// frame) pays the failed start once: later runs go straight to the next
// tier, saying why, without starting a worker, until reset_python or a
// change of the session's user site.
func TestRootfsWorkerRemembersFailedStart(t *testing.T) {
	e := rootfsWorker(t, nil)
	var starts atomic.Int32
	start := e.startFor
	e.startFor = func(ctx context.Context, sess *session.Session) (*worker, error) {
		starts.Add(1)
		return start(ctx, sess)
	}
	s := rootfsSession(t)
	dir := filepath.Join(s.Workspace(), ".local/lib/python3.11/site-packages")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pth := "import os; os.write(4, b'\\xff\\xff\\xff\\xff' + b'x' * 64)\n"
	if err := os.WriteFile(filepath.Join(dir, "zz-forge.pth"), []byte(pth), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := e.Run(ctx, &runcode.Request{Code: "print(1)", Lang: "python", Session: s, Timeout: time.Minute, Stdout: io.Discard, Stderr: io.Discard})
		return err
	}
	if err := run(); err == nil || !strings.Contains(err.Error(), "reply frame of 4294967295 bytes") || starts.Load() != 1 {
		t.Fatalf("first run: %v, %d starts", err, starts.Load())
	}
	// A FIFO where a user site would be is not opened (the server would
	// block on it): the key is read without it.
	if err := os.MkdirAll(filepath.Join(s.Workspace(), ".local/lib/python3.99"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(s.Workspace(), ".local/lib/python3.99/site-packages"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := run()
		if err == nil || !strings.Contains(err.Error(), "could not start the session's worker on an earlier run") ||
			!strings.Contains(err.Error(), "reply frame of 4294967295 bytes") || !strings.Contains(err.Error(), "reset_python") {
			t.Fatalf("later run: %v", err)
		}
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("%d starts, want 1: later runs must not try the start again", n)
	}
	// reset_python tries again (and fails again: the .pth is still there).
	if err := e.Reset(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if err := run(); err == nil || strings.Contains(err.Error(), "earlier run") || starts.Load() != 2 {
		t.Fatalf("after reset: %v, %d starts", err, starts.Load())
	}
	// A change of the user site tries again, and works.
	if err := os.Remove(filepath.Join(dir, "zz-forge.pth")); err != nil {
		t.Fatal(err)
	}
	if r := runOn(t, e, s, nil, "print(2)", time.Minute); r.out != "2\n" || starts.Load() != 3 {
		t.Errorf("after removing the .pth: %+v out %q err %q, %d starts", r.Result, r.out, r.err, starts.Load())
	}
}

// shownAt is where the session's runs see the host path p of its
// workspace: at /home/user in a box (which shows the workspace there
// only), at p itself without one.
func shownAt(s *session.Session, p string) string {
	if testSB.Boxed() {
		return hostpath.InHome(s.Workspace(), p)
	}
	return p
}
