package app

import (
	"bytes"
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
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// newAppInstalling is newApp whose python_run installs a rootfs with inst
// instead of debootstrap.
func newAppInstalling(t *testing.T, inst rootfs.Installer) *App {
	t.Helper()
	return newAppWith(t, &Options{rootfsInstaller: inst})
}

// capCode is the code a client reads for err: the controller's
// classification (err from a method called directly is a domain error).
func capCode(err error) capability.Code {
	if err == nil {
		return ""
	}
	return controller.Classify(err).Code
}

func TestPythonRunBadInput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, in := range []PythonRunInput{
		{Code: "print(1)", TimeoutMS: 999},
		{Code: "print(1)", TimeoutMS: 60001},
		{Code: "print(1)", TimeoutMS: -5},
		{Code: "print('\x00')"},
		{Code: strings.Repeat("#", 130<<10)},
	} {
		if _, err := call(t, a, "python_run", in); capCode(err) != capability.InvalidArgument {
			t.Errorf("timeout %d, %d bytes: %v, want invalid_argument", in.TimeoutMS, len(in.Code), err)
		}
	}
}

// A missing rootfs is installed in the background on first use; a call
// whose timeout ends first says so instead of overrunning it, and the
// install goes on for the next call. Not parallel: it bounds the first
// call's wall time (5 s for its 1 s timeout), which the parallel tests'
// load would stretch.
func TestPythonRunInstallsOnFirstUse(t *testing.T) {
	release := make(chan struct{})
	calls := 0
	a := newAppInstalling(t, func(ctx context.Context, target, cache string, o rootfs.InstallOptions, progress func(string)) error {
		calls++
		progress("I: fake debootstrap waiting")
		<-release
		return os.MkdirAll(filepath.Join(target, "var/lib/dpkg"), 0o755) // no python3: the install fails its check
	})
	start := time.Now()
	_, err := call(t, a, "python_run", PythonRunInput{Code: "print(1)", TimeoutMS: 1000})
	if capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "installing it now") ||
		!strings.Contains(err.Error(), "quro rootfs install default") || !strings.Contains(err.Error(), "fake debootstrap waiting") {
		t.Fatalf("first call: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the first call took %s, beyond its 1 s timeout", d)
	}
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if st, _ := m.Status("default"); st.State != rootfs.Partial || !st.Installing {
		t.Errorf("status during the install: %+v", st)
	}
	// The next call joins the same install; it fails (no python3 in the
	// fake), and the failure is reported, never a half-built rootfs run.
	close(release)
	_, err = call(t, a, "python_run", PythonRunInput{Code: "print(1)", TimeoutMS: 30000})
	if capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "python3 is not in it") {
		t.Fatalf("second call: %v", err)
	}
	if calls != 1 {
		t.Errorf("installer ran %d times, want 1 (the second call joins)", calls)
	}
	if m.Ready("default") {
		t.Error("a failed install is ready")
	}
}

// An exec caller never makes the host download a rootfs: python_run
// refuses before the installer runs, says how to install it, and leaves
// no trace in the rootfs directory; a caller with install (beside exec)
// does start it.
func TestPythonRunNeverInstallsForExec(t *testing.T) {
	t.Parallel()
	calls := 0
	a := newAppInstalling(t, func(ctx context.Context, target, cache string, o rootfs.InstallOptions, progress func(string)) error {
		calls++
		return errors.New("fake debootstrap ran")
	})
	ctx := context.Background()
	s, err := a.Sessions.CreateWith(ctx, "offline", session.CreateOptions{}) // network none
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []controller.Caller{
		{Path: "test", Scope: capability.ScopeExec},
		{Path: "insession", Scope: capability.ScopeExec, Session: s.ID}, // code in a session calling back
	} {
		b, _ := json.Marshal(PythonRunInput{Code: "print(1)", Session: "offline"})
		_, err := a.Controller.Call(ctx, c, "python_run", b)
		if capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), "scope install or admin") ||
			!strings.Contains(err.Error(), "quro rootfs install default") || !strings.Contains(err.Error(), "nothing was downloaded") {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if calls != 0 {
		t.Fatalf("the installer ran %d times for callers without install", calls)
	}
	if ents, _ := os.ReadDir(rootfs.DirIn(a.DataDir)); len(ents) != 0 {
		t.Errorf("the rootfs directory holds %v", ents)
	}
	b, _ := json.Marshal(PythonRunInput{Code: "print(1)"})
	_, err = a.Controller.Call(ctx, controller.Caller{Path: "test", Scope: "exec,install"}, "python_run", b)
	if calls != 1 || capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "fake debootstrap ran") {
		t.Errorf("exec,install caller: %d installs, %v", calls, err)
	}
}

func TestPythonRunInstallFailureIsReported(t *testing.T) {
	t.Parallel()
	a := newAppInstalling(t, func(ctx context.Context, target, cache string, o rootfs.InstallOptions, progress func(string)) error {
		return errors.New("debootstrap needs root")
	})
	_, err := call(t, a, "python_run", PythonRunInput{Code: "print(1)"})
	if capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "debootstrap needs root") || !strings.Contains(err.Error(), "did not run") {
		t.Fatalf("python_run: %v", err)
	}
}

// testRootfs returns a manager of the shared test rootfs directory in
// which "default" is ready (see rootfstest.Default).
func testRootfs(t testing.TB) *rootfs.Manager {
	t.Helper()
	return rootfstest.Default(t)
}

// appOnRootfs is an App whose data directory sees the rootfs of m (linked,
// never copied: tests must not change it).
func appOnRootfs(t testing.TB, m *rootfs.Manager) *App {
	t.Helper()
	return appOnRootfsInstalling(t, m, nil)
}

// appOnRootfsInstalling is appOnRootfs whose python_run installs a rootfs
// with inst (nil: debootstrap).
func appOnRootfsInstalling(t testing.TB, m *rootfs.Manager, inst rootfs.Installer) *App {
	t.Helper()
	data := t.TempDir()
	if err := os.Symlink(m.Dir, rootfs.DirIn(data)); err != nil {
		t.Fatal(err)
	}
	a, err := New(context.Background(), data, &Options{Python: testPython, Network: hostAllowed, rootfsInstaller: inst})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	return a
}

// The one end-to-end test of the rootfs tier: a real debootstrapped Debian,
// python_run and run_code's python/rootfs engine in it.
func TestPythonRunInRealRootfs(t *testing.T) {
	t.Parallel()
	m := testRootfs(t)
	st, err := m.Status(rootfs.DefaultName)
	if err != nil || st.State != rootfs.Ready || !strings.HasPrefix(st.Info.Python, "3.") {
		t.Fatalf("status %+v %v", st, err)
	}
	a := appOnRootfsInstalling(t, m, func(context.Context, string, string, rootfs.InstallOptions, func(string)) error {
		t.Error("python_run installed a rootfs that is ready")
		return errors.New("unexpected")
	})

	pyRun := func(in PythonRunInput) *PythonRunResult {
		t.Helper()
		reply, err := call(t, a, "python_run", in)
		if err != nil {
			t.Fatalf("python_run %q: %v", in.Code, err)
		}
		return reply.Output.(*PythonRunResult)
	}
	res := pyRun(PythonRunInput{Code: "import os, sys\nprint(sys.version_info[:2], sys.flags.isolated)\n" +
		"print(open('/etc/debian_version').read().strip())\nprint(sorted(os.environ))\nprint(os.getcwd())\nprint(os.getuid())"})
	if res.ExitCode != 0 || res.Rootfs != "default" || res.Python == "" {
		t.Fatalf("%+v", res)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 5 || !strings.HasSuffix(lines[0], " 1") || !strings.HasPrefix(lines[1], "12") {
		t.Fatalf("stdout %q", res.Stdout)
	}
	if strings.Contains(res.Stdout, serverCanaryVar) || strings.Contains(lines[2], "QURO_DATA") {
		t.Errorf("server environment leaked: %s", lines[2])
	}
	if lines[4] == "0" {
		t.Error("python_run runs as root")
	}
	text := res.Text()
	if !strings.HasPrefix(text, "exit_code=0\n--- stdout ---\n") || !strings.Contains(text, "\n--- stderr ---") {
		t.Errorf("text %q", text)
	}

	res = pyRun(PythonRunInput{Code: "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"})
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.Text() != "exit_code=3\n--- stdout ---\nout\n--- stderr ---\nerr" {
		t.Errorf("%+v\n%s", res, res.Text())
	}

	// The host userland is not there: the rootfs's python, not the host's.
	res = pyRun(PythonRunInput{Code: "import sys, os; print(sys.executable, os.path.exists('/usr/share/debootstrap'))"})
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "False") {
		t.Errorf("%+v", res)
	}

	// Timeout: the whole tree is killed, the output so far is kept.
	start := time.Now()
	// (15 s: the rootfs's python must start in its box and print first
	// on a loaded machine, which took more than 5 s at a load of 60; the
	// run is killed long before its 1,000 s sleep ends.)
	res = pyRun(PythonRunInput{TimeoutMS: 15000, Code: "import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\nprint('before', flush=True)\ntime.sleep(1000)"})
	if !res.TimedOut || res.Stdout != "before\n" || !strings.Contains(res.Text(), "timed out after 15s") {
		t.Errorf("timeout: %+v\n%s", res, res.Text())
	}
	if d := time.Since(start); d > 5*time.Minute {
		t.Errorf("a 15 s timeout took %s: the run waited for its sleep", d)
	}

	// run_code's tier 2: a session on the rootfs.
	s, err := a.Sessions.CreateWith(context.Background(), "onroot", sessionCreateOpts("default"))
	if err != nil {
		t.Fatal(err)
	}
	eng := python.NewRootfs(a.Sandbox, rootfs.New(rootfs.DirIn(a.DataDir)))
	if err := eng.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	// Bounds on a failure: a box's start and python3's in it took some
	// seconds each at a load of 60, so 20 s was thin.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := eng.Run(ctx, &runcode.Request{Code: "print(open('/etc/debian_version').read().strip())", Session: s, Timeout: 2 * time.Minute, Stdout: &out, Stderr: &errb})
	if err != nil || r.ExitCode != 0 || !strings.HasPrefix(out.String(), "12") {
		t.Fatalf("python/rootfs: %v %+v %q %q", err, r, out.String(), errb.String())
	}
	// Through run_code the embedded interpreter steps aside for the session
	// on the rootfs, and the chain reaches this tier.
	if res := runCode(t, a, RunCodeInput{Code: "print(open('/etc/debian_version').read().strip())", Session: "onroot"}); res.Engine != "python/rootfs" || !strings.HasPrefix(res.Stdout, "12") {
		t.Fatalf("run_code in a rootfs session: %+v", res)
	}
	// A session on the host userland is not this tier's: the chain goes on.
	def, err := a.Sessions.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Run(ctx, &runcode.Request{Code: "print(1)", Session: def, Stdout: &out, Stderr: &errb}); !errors.Is(err, python.ErrNoRootfs) {
		t.Errorf("host session: %v", err)
	}
}

func sessionCreateOpts(rootfsName string) session.CreateOptions {
	return session.CreateOptions{Rootfs: rootfsName}
}

// A session on a rootfs runs its shell, its terminal and run_code's shell
// in that rootfs, and with its own network policy; a session whose rootfs
// is missing gets a clear error.
func TestRootfsSessionTerminalsAndNetwork(t *testing.T) {
	t.Parallel()
	a := appOnRootfs(t, testRootfs(t))
	for _, in := range []CreateSessionInput{{Name: "onrootfs", Rootfs: "default"}, {Name: "host"}, {Name: "net", Network: "host"}} {
		if _, err := call(t, a, "create_session", in); err != nil {
			t.Fatal(err)
		}
	}
	// A session naming a rootfs that is not installed is refused at
	// create, with the installed ones and how to install it.
	_, err := call(t, a, "create_session", CreateSessionInput{Name: "gone", Rootfs: "missing"})
	if capCode(err) != capability.NotFound || !strings.Contains(err.Error(), "installed: default") || !strings.Contains(err.Error(), "quro rootfs install missing") {
		t.Fatalf("create_session on a missing rootfs: %v", err)
	}
	// One whose rootfs went away later (created beneath the capability
	// here) gets a clear error when it runs.
	if _, err := a.Sessions.CreateWith(context.Background(), "gone", session.CreateOptions{Rootfs: "missing"}); err != nil {
		t.Fatal(err)
	}
	// bubblewrap is on the host, never in the debootstrapped rootfs.
	const where = "test -e /usr/bin/bwrap && echo on-host || echo on-rootfs"
	exec := func(sess, cmd string) string {
		t.Helper()
		reply, err := call(t, a, "terminal_exec", TerminalExecInput{Session: sess, Command: cmd})
		if err != nil {
			t.Fatalf("%s: %v", sess, err)
		}
		return reply.Output.(*terminal.Result).Output
	}
	if got := exec("onrootfs", where); got != "on-rootfs\n" {
		t.Errorf("terminal_exec on a rootfs session: %q", got)
	}
	if got := exec("host", where); got != "on-host\n" {
		t.Errorf("terminal_exec on a host session: %q", got)
	}
	if r := runCode(t, a, RunCodeInput{Session: "onrootfs", Lang: "sh", Code: where}); r.Stdout != "on-rootfs\n" {
		t.Errorf("run_code sh on a rootfs session: %+v", r)
	}
	// Network: only lo without it; the host's interfaces with it.
	ifaces := "tail -n +3 /proc/net/dev | wc -l"
	if got := exec("host", ifaces); got != "1\n" {
		t.Errorf("network none sees %s interfaces", got)
	}
	if got := exec("net", ifaces); got == "1\n" {
		t.Errorf("network full sees only lo")
	}
	_, err = call(t, a, "terminal_exec", TerminalExecInput{Session: "gone", Command: "true"})
	if err == nil || !strings.Contains(err.Error(), `rootfs "missing", which is not installed`) {
		t.Fatalf("missing rootfs: %v", err)
	}
}

// create_session refuses a rootfs that is not installed, listing the
// installed ones and how to install it, and creates nothing.
func TestCreateSessionRefusesAMissingRootfs(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if err := os.MkdirAll(m.Path("other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Path("other"), rootfs.Marker), []byte(`{"name":"other"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := call(t, a, "create_session", CreateSessionInput{Name: "s", Rootfs: "missing"})
	if capCode(err) != capability.NotFound || !strings.Contains(err.Error(), "installed: other") || !strings.Contains(err.Error(), "quro rootfs install missing") {
		t.Fatalf("missing rootfs: %v", err)
	}
	if _, err := a.Sessions.Get(context.Background(), "s"); err == nil {
		t.Fatal("the refused session exists")
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "bad", Rootfs: "../x"}); capCode(err) != capability.InvalidArgument {
		t.Fatalf("bad rootfs name: %v", err)
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "s", Rootfs: "other"}); err != nil {
		t.Fatalf("installed rootfs: %v", err)
	}
}
