package app

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/pip/piptest"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/terminal"
)

// The wheels and the index are piptest's (shared with cmd/quro's tests).
type (
	testWheel = piptest.Wheel
	testIndex = piptest.Index
)

var (
	buildWheel   = piptest.BuildWheel
	pureWheel    = piptest.PureWheel
	newTestIndex = piptest.NewIndex
)

// cextWheel is a wheel with a C extension module NAME (NAME.answer() ==
// 42), compiled with gcc against Debian's python3.11 headers for the
// stable ABI of 3.11 (cp311-abi3): the embedded 3.14 and a rootfs's 3.11
// both load it.
func cextWheel(t testing.TB, name string) *testWheel {
	t.Helper()
	if _, err := os.Stat("/usr/include/python3.11/Python.h"); err != nil {
		t.Skip("no python3.11 headers (make test installs python3-dev)")
	}
	cextMu.Lock()
	defer cextMu.Unlock()
	b, ok := cextBuilt[name]
	if !ok {
		b = compileCext(t, name)
		cextBuilt[name] = b
	}
	return buildWheel(t, name, "1.0", "cp311-abi3-linux_x86_64", map[string][]byte{name + ".abi3.so": b})
}

// cextBuilt are the extension modules cextWheel compiled in this test
// process, by module name: the two tests that install one (a session on
// the host's userland, one on a rootfs) each build a wheel of their own
// from the same bytes, compiled by one gcc run, not one each.
var (
	cextMu    sync.Mutex
	cextBuilt = map[string][]byte{}
)

// compileCext compiles the extension module name (its answer() is 42)
// for the stable ABI of Python 3.11.
func compileCext(t testing.TB, name string) []byte {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, name+".c")
	code := fmt.Sprintf(`#define Py_LIMITED_API 0x030B0000
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&mod); }
`, name, name)
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, name+".abi3.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-I/usr/include/python3.11", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pipApp is an App whose pip index is ix.
func pipApp(t *testing.T, ix *testIndex) *App {
	t.Helper()
	return pipAppWith(t, PipOptions{IndexURL: ix.URL()})
}

// pipAppWith is an App with pip options o, in session boxes with the
// embedded Python (the test skips where there are none). Its fetches do
// not retry (o.FetchRetries, unless o sets it): the tests' indexes are on
// loopback, and a fetch the test means to fail (an index that is down or
// answers 503, a destination the proxy refuses) spent some 7.5 s in
// pip's back-off before it failed.
func pipAppWith(t *testing.T, o PipOptions) *App {
	t.Helper()
	o.FetchRetries = cmp.Or(o.FetchRetries, -1)
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed, Pip: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needEmbedded(t, a)
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box")
	}
	return a
}

// runIn runs in as c. A run without a budget of its own gets slowRunMS:
// these runs start pip (or the worker that imports what pip installed)
// in the box, work that passed run_code's default 30 s at a load of 40.
func runIn(t *testing.T, a *App, c controller.Caller, in RunCodeInput) *runcode.Result {
	t.Helper()
	if in.TimeoutMS == 0 {
		in.TimeoutMS = slowRunMS
	}
	reply, err := callWithin(t, a, c, "run_code", in, slowRunCall)
	if err != nil {
		t.Fatalf("run_code %q: %v", in.Code, err)
	}
	return reply.Output.(*runcode.Result)
}

// installPip installs pkgs with install_packages' pip in session as c.
// The call's guard outlasts the install's own budget (its default, 10
// minutes): callAs's 2 minutes cut TestPipInstallOutputBoundedAgainstPth's
// install (512 MiB through pip's stdout, twice) at a load of 40, and the
// call answered deadline_exceeded instead of the install's result.
func installPip(t *testing.T, a *App, c controller.Caller, session string, pkgs ...string) (*InstallPackagesResult, error) {
	t.Helper()
	reply, err := callWithin(t, a, c, "install_packages", InstallPackagesInput{Session: session, Manager: "pip", Packages: pkgs}, packagesDefaultTimeout+time.Minute)
	if err != nil {
		return nil, err
	}
	return reply.Output.(*InstallPackagesResult), nil
}

// TestPipShellIsTheSessionsPython: in a session on the host userland,
// python3, python, pip and pip3 are the embedded interpreter and pip
// 25.1.1, whatever process asks (run_code bash here).
func TestPipShellIsTheSessionsPython(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t)
	a := pipApp(t, ix)
	s := newSession(t, a, "shell", "")
	runIn(t, a, admin, RunCodeInput{Session: s.ID, Code: "print(1)"}) // prepares the interpreter
	res := runIn(t, a, admin, RunCodeInput{Session: s.ID, Lang: "bash", Code: `python3 -c 'import sys; print(sys.version_info[:2])'
python -c 'import sys; print(sys.executable)'
pip --version
pip3 --version
python3 -m pip --version
echo "user=$PIP_USER noindex=$PIP_NO_INDEX"`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 6 || lines[0] != "(3, 14)" || !strings.HasPrefix(lines[1], python.BoxTree+"/bin/python3.14") {
		t.Fatalf("python3 is not the embedded 3.14:\n%s", res.Stdout)
	}
	for _, l := range lines[2:5] {
		if !strings.HasPrefix(l, "pip "+python.PipVersion+" from ") || !strings.Contains(l, "(python 3.14)") {
			t.Fatalf("pip is not pip %s of 3.14: %q", python.PipVersion, l)
		}
	}
	if lines[5] != "user=1 noindex=1" {
		t.Fatalf("pip's environment: %q", lines[5])
	}
	// The session's shell and its processes too.
	reply := mustCall(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "python3 -c 'import sys; print(sys.version_info[:2])'; pip --version"})
	if out := reply.(*terminal.Result).Output; !strings.Contains(out, "(3, 14)") || !strings.Contains(out, "pip "+python.PipVersion+" ") {
		t.Fatalf("terminal_exec: %q", out)
	}
	pr := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "python", Args: []string{"-c", "import sys; print(sys.version_info[:2])"}}).(*ProcessResult)
	if pr.Stdout != "(3, 14)\n" {
		t.Fatalf("start_process python: %+v", pr)
	}
}

// TestLoginShellIsTheSessionsPython: a login shell of the session (E2B's
// commands run `bash -l -c`, its PTY `bash -i -l`), which sources
// Debian's /etc/profile and its fixed PATH, still finds run_code's
// interpreter as python and python3, on every path: start_process (a
// program, a shell line, on a terminal) and terminal_exec; and what its
// pip installs, run_code's worker imports.
func TestLoginShellIsTheSessionsPython(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "loginpure", "1.0", "login"))
	a := pipApp(t, ix)
	s := newSession(t, a, "login", "host") // its pip reaches the index
	want := loginShellsAgree(t, a, s.ID, "/quro-bin/")
	// A box path: no host path (the install root's) in sys.executable.
	if !strings.HasPrefix(want, python.BoxTree+"/bin/python3.14 3.14.") {
		t.Fatalf("run_code's Python is not the embedded 3.14 at its box path %s: %q", python.BoxTree, want)
	}
	// pip's start and install, slow under load: the call gets runIn's budget.
	reply, err := callWithin(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Cmd: "/bin/bash", Args: []string{"-l", "-c", "pip install loginpure"}}, slowRunCall)
	if err != nil {
		t.Fatal(err)
	}
	if pr := reply.Output.(*ProcessResult); !pr.Exited || pr.ExitCode != 0 {
		t.Fatalf("pip install in a login shell: %+v", pr)
	}
	if r := runIn(t, a, admin, RunCodeInput{Session: s.ID, Code: "import loginpure; print(loginpure.VALUE)"}); r.Stdout != "login\n" {
		t.Fatalf("run_code after the login shell's pip install: %+v", r)
	}
}

// TestLoginShellOnRootfsIsTheSessionsPython: on a rootfs, run_code's
// Python is the rootfs's python3, and every path's python and python3 is
// that one too (Debian has no `python`: the session's shims give it).
func TestLoginShellOnRootfsIsTheSessionsPython(t *testing.T) {
	t.Parallel()
	m := testRootfs(t)
	data := t.TempDir()
	if err := os.Symlink(m.Dir, rootfs.DirIn(data)); err != nil {
		t.Fatal(err)
	}
	a, err := New(context.Background(), data, &Options{Python: testPython, Network: hostAllowed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needEmbedded(t, a)
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "r", Rootfs: rootfs.DefaultName}).(*SessionInfo)
	if want := loginShellsAgree(t, a, s.ID, "/bin/"); !strings.HasPrefix(want, "/usr/bin/python3 3.") {
		t.Fatalf("run_code's Python on the rootfs: %q", want)
	}
}

// loginShellsAgree checks that every path's python, python3 (login
// shells or not) is run_code's in session id, and that pip and pip3 are
// the session's shims (in a directory ending in shimDir); it returns
// run_code's sys.executable and version.
func loginShellsAgree(t *testing.T, a *App, id, shimDir string) string {
	t.Helper()
	const probe = `import sys; print(sys.executable, sys.version.split()[0])`
	want := strings.TrimSpace(runIn(t, a, admin, RunCodeInput{Session: id, Code: probe}).Stdout)
	line := fmt.Sprintf(`python -c '%s'; python3 -c '%s'; command -v pip; command -v pip3`, probe, probe)
	check := func(how, out string) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r", "")), "\n")
		if len(lines) < 4 || lines[len(lines)-4] != want || lines[len(lines)-3] != want ||
			!strings.HasSuffix(lines[len(lines)-2], shimDir+"pip") || !strings.HasSuffix(lines[len(lines)-1], shimDir+"pip3") {
			t.Errorf("%s: python, python3, pip, pip3 are not run_code's (%s):\n%s", how, want, out)
		}
	}
	for _, c := range []struct {
		how string
		in  StartProcessInput
	}{
		{"start_process bash -l -c (E2B's commands)", StartProcessInput{Cmd: "/bin/bash", Args: []string{"-l", "-c", line}}},
		{"start_process sh -l -c", StartProcessInput{Cmd: "/bin/sh", Args: []string{"-l", "-c", line}}},
		{"start_process command", StartProcessInput{Command: line}},
		{"start_process bash -i -l on a terminal (E2B's PTY)", StartProcessInput{Cmd: "/bin/bash", Args: []string{"-i", "-l", "-c", line}, PTY: &proc.Size{Cols: 200, Rows: 24}}},
	} {
		c.in.Session = id
		pr := mustCall(t, a, "start_process", c.in).(*ProcessResult)
		check(c.how, pr.Stdout+pr.PTY)
	}
	out := mustCall(t, a, "terminal_exec", TerminalExecInput{Session: id, Command: "bash -l -c " + shellQuoteTest(line)}).(*terminal.Result).Output
	check("terminal_exec bash -l", out)
	return want
}

// shellQuoteTest quotes s for a POSIX shell.
func shellQuoteTest(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

var (
	pipAlice = controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeAdmin, TokenID: "ta"}
	pipBob   = controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeAdmin, TokenID: "tb"}
)

func sessionAs(t *testing.T, a *App, c controller.Caller, name, network string, env map[string]string) *SessionInfo {
	t.Helper()
	reply, err := callAs(t, a, c, "create_session", CreateSessionInput{Name: name, Network: network, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	return reply.Output.(*SessionInfo)
}

// TestPipInstallPackagesThroughTheCache: install_packages {manager: pip}
// in a session without network has the server fetch the wheels (a pure
// one and a C extension) into the tenant's cache and installs them into
// the session's user site, importable by its running worker at once; a
// second session of the tenant installs them from the cache with the
// index down (no request reaches it), by install_packages and by the
// shell's pip; another tenant sees none of it; a box cannot write the
// cache; an uncached package fails with the hint, in the shell and in a
// %pip line.
func TestPipInstallPackagesThroughTheCache(t *testing.T) {
	t.Parallel() // its own App, index and data directory (its tenants' cgroups are scoped by it)
	pure := pureWheel(t, "quropure", "1.0", "hello")
	cext := cextWheel(t, "qurocext")
	ix := newTestIndex(t, pure, cext)
	a := pipApp(t, ix)

	s1 := sessionAs(t, a, pipAlice, "p1", "", nil)
	if r := runIn(t, a, pipAlice, RunCodeInput{Session: s1.ID, Code: "import sys; print(sys.version_info[:2])"}); r.Stdout != "(3, 14)\n" {
		t.Fatalf("worker: %+v", r)
	}
	res, err := installPip(t, a, pipAlice, s1.ID, "quropure", "qurocext==1.0")
	if err != nil {
		t.Fatal(err)
	}
	if res.FromCache || len(res.Wheels) != 2 || res.ExitCode != 0 {
		t.Fatalf("first install: %+v", res)
	}
	fetched := ix.Requests.Load()
	if fetched == 0 {
		t.Fatal("the index saw no request")
	}
	// The worker that ran before the install imports both (no restart),
	// and the files are in the user site of 3.14.
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s1.ID, Code: "import quropure, qurocext\nprint(quropure.VALUE, qurocext.answer())\nprint(quropure.__file__)"})
	if !strings.HasPrefix(r.Stdout, "hello 42\n") || !strings.Contains(r.Stdout, "/.local/lib/python3.14/site-packages/quropure/__init__.py") {
		t.Fatalf("import after install_packages: %+v", r)
	}

	// The cache: by hash, linked by name, read-only to the box.
	wheels := a.pip.cache.Wheels("alice")
	for _, w := range []*testWheel{pure, cext} {
		got, err := os.ReadFile(filepath.Join(wheels, w.Name))
		if err != nil || !bytes.Equal(got, w.Data) {
			t.Fatalf("cache has %s: %v", w.Name, err)
		}
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s1.ID, Code: fmt.Sprintf(`import os
w = %q
for what, f in [("create", lambda: open(os.path.join(w, "evil-1.0-py3-none-any.whl"), "wb")),
                ("overwrite", lambda: open(os.path.join(w, %q), "r+b")),
                ("unlink", lambda: os.unlink(os.path.join(w, %q))),
                ("by-hash", lambda: os.listdir(os.path.join(os.path.dirname(w), "by-hash")))]:
    try:
        f()
        print(what, "ALLOWED")
    except OSError as e:
        print(what, "refused", type(e).__name__)
`, wheels, pure.Name, pure.Name)})
	if strings.Contains(r.Stdout, "ALLOWED") || strings.Count(r.Stdout, "refused") != 4 {
		t.Fatalf("the box could change the tenant's cache:\n%s%s", r.Stdout, r.Stderr)
	}

	// A second session of the tenant: from the cache, the index down.
	ix.Down.Store(true)
	before := ix.Requests.Load()
	s2 := sessionAs(t, a, pipAlice, "p2", "", nil)
	res, err = installPip(t, a, pipAlice, s2.ID, "quropure")
	if err != nil {
		t.Fatal(err)
	}
	if !res.FromCache || len(res.Wheels) != 0 {
		t.Fatalf("second install was not from the cache: %+v", res)
	}
	s3 := sessionAs(t, a, pipAlice, "p3", "", nil)
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s3.ID, Lang: "bash", Code: "pip install qurocext && python3 -c 'import qurocext; print(qurocext.answer())'"})
	if r.ExitCode != 0 || !strings.HasSuffix(r.Stdout, "42\n") {
		t.Fatalf("the shell's pip from the cache: %+v", r)
	}
	if n := ix.Requests.Load(); n != before {
		t.Fatalf("installs from the cache reached the index: %d requests", n-before)
	}

	// Uncached, without network: pip fails at once, naming the package,
	// with the hint; the same from a %pip line.
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s3.ID, Lang: "bash", Code: "pip install nosuchpkg"})
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "nosuchpkg") || !strings.Contains(r.Stderr, "quro: this session has no network") {
		t.Fatalf("uncached offline install: %+v", r)
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s3.ID, Code: "%pip install nosuchpkg\nprint('after')"})
	if !strings.Contains(r.Stderr, "nosuchpkg") || !strings.Contains(r.Stderr, "quro: this session has no network") || !strings.HasSuffix(r.Stdout, "after\n") {
		t.Fatalf("uncached offline %%pip: %+v", r)
	}

	// Another tenant sees neither the cache nor the wheels.
	b1 := sessionAs(t, a, pipBob, "b1", "", nil)
	r = runIn(t, a, pipBob, RunCodeInput{Session: b1.ID, Lang: "bash", Code: fmt.Sprintf("ls %q; pip install quropure", wheels)})
	if r.ExitCode == 0 || strings.Contains(r.Stdout, pure.Name) || !strings.Contains(r.Stderr, "quropure") {
		t.Fatalf("bob reached alice's cache: %+v", r)
	}
	if _, err := installPip(t, a, pipBob, b1.ID, "quropure"); err == nil || !strings.Contains(err.Error(), "quropure") {
		t.Fatalf("bob's install_packages with the index down: %v", err)
	}
}

// TestPipMagicsWithNetwork: in a session with network, %pip and !pip lines
// (plain and rich runs) and subprocess `-m pip` install from the server's
// index into the user site; what a line installed imports on the next
// line of the same run and in the next run, without a restart.
func TestPipMagicsWithNetwork(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "magic_a", "1.0", "a"), pureWheel(t, "magic_b", "1.0", "b"),
		pureWheel(t, "magic_c", "1.0", "c"), pureWheel(t, "magic_d", "1.0", "d"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "net", "host", nil)
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "%pip install magic_a\nimport magic_a\nprint('value', magic_a.VALUE)"})
	if !strings.HasSuffix(r.Stdout, "value a\n") || !strings.Contains(r.Stdout, "Successfully installed magic_a-1.0") {
		t.Fatalf("%%pip then import: %+v", r)
	}
	if r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "import magic_a; print(magic_a.__file__)"}); !strings.Contains(r.Stdout, "/.local/lib/python3.14/site-packages/magic_a/") {
		t.Fatalf("next run: %+v", r)
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "!pip install magic_b\nimport magic_b\nprint('value', magic_b.VALUE)"})
	if !strings.HasSuffix(r.Stdout, "value b\n") {
		t.Fatalf("!pip then import: %+v", r)
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Rich: true, Code: "%pip install -q magic_c\nimport magic_c\nmagic_c.VALUE"})
	if len(r.Results) != 1 || !strings.Contains(fmt.Sprint(r.Results[0]), "'c'") {
		t.Fatalf("rich %%pip: %+v", r)
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: `import subprocess, sys
p = subprocess.run([sys.executable, "-m", "pip", "install", "magic_d"])
import magic_d
print(p.returncode, magic_d.VALUE)`})
	if !strings.HasSuffix(r.Stdout, "0 d\n") {
		t.Fatalf("subprocess -m pip: %+v", r)
	}
	// A %pip line inside a string of valid code stays what it is.
	if r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "s = '''\n%pip install nothing\n'''\nprint(len(s))"}); r.Stdout != "22\n" {
		t.Fatalf("a %%pip line in a string ran: %+v", r)
	}
}

// TestPipHostileRequirements: install_packages {manager: pip} refuses
// anything but NAME[extras] with version specifiers before any process
// starts: options, URLs, paths, a 10 KB name.
func TestPipHostileRequirements(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t)
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "hostile", "", nil)
	for _, req := range []string{
		"--index-url=http://127.0.0.1:1/simple", "-r /etc/shadow", "-r/etc/shadow", "pkg @ file:///etc/passwd",
		"pkg@http://127.0.0.1/x.whl", "../x", "/etc/passwd", "./x.whl", "x.whl", "http://evil/x", "pkg; os_name=='posix'",
		"pkg --global-option=x", "pkg\n-r /etc/shadow", strings.Repeat("a", 10<<10), "", " ", "pkg[", "pkg==1 pkg2",
	} {
		_, err := installPip(t, a, pipAlice, s.ID, req)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.InvalidArgument {
			t.Errorf("requirement %.40q: %v, want invalid_argument", req, err)
		}
	}
	if _, err := installPip(t, a, pipAlice, s.ID, "ok", "--index-url=http://127.0.0.1:1/"); err == nil {
		t.Error("a hostile requirement after a good one was taken")
	}
	if n := ix.Requests.Load(); n != 0 {
		t.Fatalf("a refused requirement reached the index: %d requests", n)
	}
}

// TestPipSessionIndexNotFetchedByServer: a session's own PIP_INDEX_URL
// steers pip in its box (network full), never the server's fetch, which
// uses the server's configured index only.
func TestPipSessionIndexNotFetchedByServer(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroidx", "1.0", "good"))
	evil := newTestIndex(t, pureWheel(t, "quroidx", "1.0", "evil"), pureWheel(t, "evilonly", "1.0", "evil"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "idx", "host", map[string]string{"PIP_INDEX_URL": evil.URL()})
	res, err := installPip(t, a, pipAlice, s.ID, "quroidx")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Wheels) != 1 || evil.Requests.Load() != 0 {
		t.Fatalf("server fetch: %+v, the session's index got %d requests", res, evil.Requests.Load())
	}
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "import quroidx; print(quroidx.VALUE)"})
	if r.Stdout != "good\n" {
		t.Fatalf("installed: %+v", r)
	}
	if _, err := installPip(t, a, pipAlice, s.ID, "evilonly"); err == nil || !strings.Contains(err.Error(), "evilonly") {
		t.Fatalf("a package only the session's index has: %v", err)
	}
	if evil.Requests.Load() != 0 {
		t.Fatal("the server fetched from the session's index")
	}
	// In the box, the session's index is pip's.
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: "pip install evilonly >/dev/null && python3 -c 'import evilonly; print(evilonly.VALUE)'"})
	if r.Stdout != "evil\n" || evil.Requests.Load() == 0 {
		t.Fatalf("the session's index in its box: %+v", r)
	}
}

// TestPipOnRootfs: on a rootfs session (the shared test rootfs, not
// changed) pip is pip 25.1.1 run by the rootfs's python3 (3.11): wheels
// go to ~/.local/lib/python3.11 (PEP 668 does not stop it: the user
// scheme), and the rootfs's python3 imports them, C extension included.
func TestPipOnRootfs(t *testing.T) {
	t.Parallel()
	m := testRootfs(t)
	pure := pureWheel(t, "quropure", "1.0", "rootfs")
	cext := cextWheel(t, "qurocext")
	ix := newTestIndex(t, pure, cext)
	data := t.TempDir()
	if err := os.Symlink(m.Dir, rootfs.DirIn(data)); err != nil {
		t.Fatal(err)
	}
	a, err := New(context.Background(), data, &Options{Python: testPython, Network: hostAllowed, Pip: PipOptions{IndexURL: ix.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needEmbedded(t, a)
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	reply, err := callAs(t, a, pipAlice, "create_session", CreateSessionInput{Name: "r", Rootfs: rootfs.DefaultName})
	if err != nil {
		t.Fatal(err)
	}
	s := reply.Output.(*SessionInfo)
	res, err := installPip(t, a, pipAlice, s.ID, "quropure", "qurocext")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Wheels) != 2 {
		t.Fatalf("fetched for the rootfs's python3: %+v", res)
	}
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: `pip --version
python3 -c 'import sys, quropure, qurocext; print(sys.version_info[:2], quropure.VALUE, qurocext.answer()); print(quropure.__file__)'`})
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if r.ExitCode != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "pip "+python.PipVersion+" ") || !strings.Contains(lines[0], "(python 3.11)") ||
		lines[1] != "(3, 11) rootfs 42" || !strings.Contains(lines[2], "/.local/lib/python3.11/site-packages/quropure/") {
		t.Fatalf("rootfs pip: %+v", r)
	}
	// One pip in the session: `python3 -m pip`, from the shell and from
	// run_code's worker, is Quro's, not the rootfs's Debian pip.
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: "python3 -m pip --version"})
	if !strings.HasPrefix(r.Stdout, "pip "+python.PipVersion+" ") {
		t.Fatalf("the rootfs's python3 -m pip: %+v", r)
	}
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "python", Code: "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', '--version'])"})
	if !strings.HasPrefix(r.Stdout, "pip "+python.PipVersion+" ") {
		t.Fatalf("sys.executable -m pip in the rootfs worker: %+v", r)
	}
	// The shell's pip installs from the cache too (offline, PEP 668 or not).
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: "pip install --force-reinstall quropure 2>&1 | tail -1"})
	if !strings.Contains(r.Stdout, "Successfully installed quropure-1.0") {
		t.Fatalf("the rootfs shell's pip: %+v", r)
	}
}

// TestPipIndexURLChecked: the server's index URLs must be http(s) URLs
// with a host (quro serve --pip-index-url refuses others at start).
func TestPipIndexURLChecked(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"file:///etc/passwd", "/simple", "ftp://x/simple", "http:///simple", "https://pypi.org/simple --trusted-host x"} {
		if _, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed, Pip: PipOptions{ExtraIndexURLs: []string{u}}}); err == nil {
			t.Errorf("index %q accepted", u)
		}
	}
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed, Pip: PipOptions{IndexURL: "https://pypi.org/simple"}})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
}

// TestPipFetchErrorSaysWhy: pip words a missing package and an index it
// could not reach alike ("from versions: none"); install_packages says
// which it was.
func TestPipFetchErrorSaysWhy(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroreal", "1.0", "x"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "p1", "", nil)
	_, err := installPip(t, a, pipAlice, s.ID, "quronosuch")
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.NotFound || !strings.Contains(err.Error(), "quronosuch: not found on the package index "+ix.URL()) {
		t.Fatalf("a package the index has not: %v", err)
	}
	ix.Down.Store(true) // it answers 503
	_, err = installPip(t, a, pipAlice, s.ID, "quroreal")
	if !errors.As(err, &ce) || ce.Code != capability.Unavailable || !strings.Contains(err.Error(), "could not be reached") {
		t.Fatalf("an index that fails: %v", err)
	}

	// Nothing listens there.
	b := pipAppWith(t, PipOptions{IndexURL: "http://127.0.0.1:9/simple/"})
	s = sessionAs(t, b, pipAlice, "p1", "", nil)
	_, err = installPip(t, b, pipAlice, s.ID, "quroreal")
	if !errors.As(err, &ce) || ce.Code != capability.Unavailable ||
		!strings.Contains(err.Error(), "the package index http://127.0.0.1:9/simple/ could not be reached") ||
		!strings.Contains(err.Error(), "--pip-index-url") {
		t.Fatalf("an index nobody serves: %v", err)
	}
	t.Logf("%v", err)
}

// TestPipInTheBoxSaysWhy: pip in a session with network ends a failure
// with whether its index could not be reached or has no such package.
func TestPipInTheBoxSaysWhy(t *testing.T) {
	t.Parallel()
	ix := newTestIndex(t, pureWheel(t, "quroreal", "1.0", "x"))
	a := pipApp(t, ix)
	s := sessionAs(t, a, pipAlice, "up", "host", nil)
	runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Code: "print(1)"}) // prepares the interpreter and pip
	r := runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: "pip install quronosuch"})
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, python.NotOnIndexHint) || strings.Contains(r.Stderr, python.UnreachableHint) {
		t.Fatalf("a package the index has not: %+v", r)
	}
	s = sessionAs(t, a, pipAlice, "down", "host", map[string]string{"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"})
	r = runIn(t, a, pipAlice, RunCodeInput{Session: s.ID, Lang: "bash", Code: "pip install --retries 0 quroreal"})
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, python.UnreachableHint) {
		t.Fatalf("an index nobody serves: %+v", r)
	}
}
