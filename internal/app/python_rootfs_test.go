package app

import (
	"strings"
	"testing"
)

// A session on a rootfs runs run_code's Python in a resident worker of
// the rootfs's python3 (in every build: it needs no embedded Python): the
// state is kept between runs and across a timeout, reset_python clears
// it, code contexts work (E2B's code interpreter on a rootfs template),
// and a file put into the user site with files.write imports in the next
// run.
func TestRootfsSessionResidentPython(t *testing.T) {
	t.Parallel()
	a := appOnRootfs(t, testRootfs(t))
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "resident", Rootfs: "default"}).(*SessionInfo)
	r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "import sys\nx = 41\nprint(sys.executable, sys.version_info[:2])"})
	if r.Engine != "python/rootfs" || r.Stdout != "/usr/bin/python3 (3, 11)\n" {
		t.Fatalf("first run: %+v", r)
	}
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "x + 1"}); r.Stdout != "42\n" {
		t.Fatalf("state: %+v", r)
	}
	r = runCode(t, a, RunCodeInput{Session: s.ID, Code: "while True:\n    pass", TimeoutMS: 1000})
	if !r.TimedOut || !strings.Contains(r.Error, "the session keeps its variables") {
		t.Fatalf("timeout: %+v", r)
	}
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print(x)"}); r.Stdout != "41\n" {
		t.Fatalf("after the timeout: %+v", r)
	}

	// A module written into the user site between runs.
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: ".local/lib/python3.11/site-packages/quro_files_mod.py", Content: "WHERE = 'user site'\n"})
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "import quro_files_mod\nprint(quro_files_mod.WHERE)"}); r.Stdout != "user site\n" {
		t.Fatalf("user site module: %+v", r)
	}

	// A code context: its own namespace, rich results.
	c := mustCall(t, a, "create_code_context", CodeContextInput{Session: s.ID}).(*CodeContext)
	runCode(t, a, RunCodeInput{Session: s.ID, Context: c.ID, Code: "x = 'ctx'"})
	r = runCode(t, a, RunCodeInput{Session: s.ID, Context: c.ID, Rich: true, Code: "import os\n(x, os.getcwd())"})
	if len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "('ctx', '/home/user')" || r.ExecutionCount != 2 || r.Engine != "python/rootfs" {
		t.Errorf("the context: %+v", r)
	}
	mustCall(t, a, "restart_code_context", CodeContextRef{Session: s.ID, ID: c.ID})
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Context: c.ID, Rich: true, Code: "'x' in globals()"}); len(r.Results) != 1 || r.Results[0].Data["text/plain"] != "False" {
		t.Errorf("after restart: %+v", r)
	}
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print(x)"}); r.Stdout != "41\n" {
		t.Errorf("run_code's namespace after the context's restart: %+v", r)
	}

	// reset_python: a fresh interpreter of the rootfs.
	mustCall(t, a, "reset_python", SessionRef{Session: s.ID})
	if r := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print('x' in globals())"}); r.Stdout != "False\n" {
		t.Errorf("after reset_python: %+v", r)
	}
	if n := a.PythonRootfs.Sessions(); n != 1 {
		t.Errorf("rootfs workers: %d, want 1", n)
	}
	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	if n := a.PythonRootfs.Sessions(); n != 0 {
		t.Errorf("rootfs workers after destroy_session: %d", n)
	}

	// A session whose worker cannot start (here its user site forges a
	// reply before the worker's hello) still runs its code in the rootfs,
	// once per run, and is told why.
	s2 := mustCall(t, a, "create_session", CreateSessionInput{Name: "broken", Rootfs: "default"}).(*SessionInfo)
	mustCall(t, a, "write_file", WriteFileInput{Session: s2.ID, Path: ".local/lib/python3.11/site-packages/zz.pth",
		Content: "import os; os.write(4, b'\\xff\\xff\\xff\\xff')\n"})
	r = runCode(t, a, RunCodeInput{Session: s2.ID, Code: "print(open('/etc/debian_version').read()[:3])"})
	if r.Engine != "python/rootfs-oneshot" || r.Stdout != "12.\n" || !strings.Contains(strings.Join(r.Notes, "\n"), "python/rootfs: starting the Python worker: the Python worker did not start: refused reply frame: reply frame of 4294967295 bytes") {
		t.Errorf("worker that cannot start: %+v", r)
	}
	// The next run does not try the start again, and says so.
	r = runCode(t, a, RunCodeInput{Session: s2.ID, Code: "print(2)"})
	if r.Engine != "python/rootfs-oneshot" || r.Stdout != "2\n" || !strings.Contains(strings.Join(r.Notes, "\n"), "python/rootfs: the rootfs's python3 could not start the session's worker on an earlier run") {
		t.Errorf("second run of a worker that cannot start: %+v", r)
	}
}
