package app

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/terminal"
)

// TestPythonShowsNoHostPath: what a session's code reads of its Python
// names box paths only (python.BoxTree, BoxPip, BoxWorker), never the
// data directory or the install root the interpreter was extracted to:
// sys.prefix, sys.base_prefix, sys.executable, every sys.path entry, the
// worker module's __file__, a traceback into the standard library, the
// shell's (run_code's bash and terminal_exec) `pip --version`, `pip show pip`, `python3 -m site`, the
// tenant's wheels pip looks in (PIP_FIND_LINKS), and the session's
// temporary directory (TMPDIR, tempfile.gettempdir(), `pip cache dir`,
// pip's verbose lines: sandbox.BoxTmp, shared by the session's runs and
// not another session's); and the box's mount points and processes,
// read from its shell. Each is
// also checked to name the box path it should, so the test cannot pass
// by reading nothing.
func TestPythonShowsNoHostPath(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real boxes")
	}
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needEmbedded(t, a)
	if !a.Sandbox.Boxed() {
		t.Skip("minimal isolation: no box, the interpreter keeps its host paths")
	}
	hostDirs := []string{a.DataDir, testPython.InstallRoot}
	noHost := func(what, text string) {
		t.Helper()
		for _, d := range hostDirs {
			if strings.Contains(text, d) {
				t.Errorf("%s names the host path %s:\n%s", what, d, text)
			}
		}
	}
	mustCall(t, a, "create_session", CreateSessionInput{Name: "hostpath"})

	res := runCode(t, a, RunCodeInput{Session: "hostpath", Lang: "python", Code: `import json, sys
w = sys.modules["quro_worker"]
import os, tempfile
open(os.path.join(tempfile.gettempdir(), "from-python"), "w").write("kept")
print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
                  "path": sys.path, "worker": w.__file__, "tmpdir": os.environ["TMPDIR"], "tempdir": tempfile.gettempdir()}))`})
	var got struct {
		Prefix, BasePrefix, Executable, Worker, TmpDir, TempDir string
		Path                                                    []string
	}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("%v: stdout %q stderr %q", err, res.Stdout, res.Stderr)
	}
	noHost("sys of run_code's Python", res.Stdout)
	if got.Prefix != python.BoxTree || !strings.HasPrefix(got.Executable, python.BoxTree+"/bin/") {
		t.Errorf("sys.prefix %q, sys.executable %q: want them in %s", got.Prefix, got.Executable, python.BoxTree)
	}
	if got.TmpDir != sandbox.BoxTmp || got.TempDir != sandbox.BoxTmp {
		t.Errorf("TMPDIR %q, tempfile.gettempdir() %q: want %s", got.TmpDir, got.TempDir, sandbox.BoxTmp)
	}
	if !strings.HasPrefix(got.Worker, python.BoxWorker+"/") {
		t.Errorf("the worker module's __file__ is %q, want it in %s", got.Worker, python.BoxWorker)
	}
	if !strings.Contains(strings.Join(got.Path, "\n"), python.BoxTree+"/lib/python3.14") {
		t.Errorf("sys.path %q has not the standard library at its box path", got.Path)
	}

	res = runCode(t, a, RunCodeInput{Session: "hostpath", Lang: "python", Code: "import json\njson.loads('x')"})
	tb := res.Stdout + res.Stderr + res.Text()
	noHost("a traceback into the standard library", tb)
	if !strings.Contains(tb, python.BoxTree+"/lib/python3.14/json/") {
		t.Errorf("the traceback does not name json's box path:\n%s", tb)
	}

	// The same lines through run_code's bash and through terminal_exec:
	// each path to the session's shell must see the box's Python.
	shell := "pip --version; pip show pip | grep ^Location; python3 -m site; python -c 'import sys; print(sys.prefix)'; " +
		"python3 -c 'import json; json.loads(\"x\")'; " +
		"echo \"links=$PIP_FIND_LINKS\"; test -d \"$PIP_FIND_LINKS\" && echo links-there; " +
		// The session's temporary directory: named at its box path, and
		// what the Python run wrote there is read by the shell.
		"echo \"tmp=$TMPDIR\"; echo \"pipcache=$(pip cache dir)\"; python3 -c 'import tempfile; print(\"pytmp=\" + tempfile.gettempdir())'; " +
		"echo \"read=$(cat \"$TMPDIR/from-python\")\"; pip -v download --no-index --no-deps -d \"$TMPDIR/dl\" nothing-here 2>&1 | head -n 20"
	res = runCode(t, a, RunCodeInput{Session: "hostpath", Lang: "bash", Code: shell, TimeoutMS: 300_000})
	reply, err := call(t, a, "terminal_exec", TerminalExecInput{Session: "hostpath", Command: shell, TimeoutMS: 300_000}) // five pips under load: past the default 30 s
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range []struct{ name, out string }{
		{"run_code's bash", res.Stdout + res.Stderr},
		{"terminal_exec", reply.Output.(*terminal.Result).Output},
	} {
		out := sh.out
		noHost(sh.name+"'s pip and python", out)
		if !strings.Contains(out, "from "+python.BoxPip+"/pip") || !strings.Contains(out, "Location: "+python.BoxPip) {
			t.Errorf("%s: pip is not named at %s:\n%s", sh.name, python.BoxPip, out)
		}
		if !strings.Contains(out, python.BoxTree+"/lib/python3.14/json/") {
			t.Errorf("%s: python3's traceback does not name json's box path:\n%s", sh.name, out)
		}
		if !strings.Contains(out, "links="+WheelsInBox+"/") || !strings.Contains(out, "links-there") {
			t.Errorf("%s: the tenant's wheels (PIP_FIND_LINKS) are not shown at %s:\n%s", sh.name, WheelsInBox, out)
		}
		for _, want := range []string{"tmp=" + sandbox.BoxTmp + "\n", "pipcache=" + sandbox.BoxTmp + "/pip-cache\n", "pytmp=" + sandbox.BoxTmp + "\n", "read=kept\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in:\n%s", sh.name, want, out)
			}
		}
	}

	// The box itself, read from the session's shell: its mount points,
	// every process's argv and (where readable) executable, the shell's
	// own among them (the sealed copy of bash, at terminal.SealedInBox),
	// name neither the data directory nor the quro binary's install
	// location nor the host's sealed directory.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := terminal.SealedDir()
	if err != nil {
		t.Fatal(err)
	}
	reply, err = call(t, a, "terminal_exec", TerminalExecInput{Session: "hostpath", Command: `cut -d' ' -f5 /proc/self/mountinfo; ` +
		`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo " exe=$(readlink $p/exe 2>/dev/null)"; done`})
	if err != nil {
		t.Fatal(err)
	}
	box := reply.Output.(*terminal.Result).Output
	noHost("the box's mount points and processes", box)
	for _, d := range []string{self, filepath.Dir(self), sealed} {
		if strings.Contains(box, d) {
			t.Errorf("the box names the host path %s:\n%s", d, box)
		}
	}
	for _, want := range []string{"\n" + terminal.SealedInBox + "/bash-", "\n" + terminal.SealedInBox + "\n", "\n" + sandbox.BinDir + "/quro\n"} {
		if !strings.Contains(box, want) {
			t.Errorf("no %q in:\n%s", want, box)
		}
	}

	// Another session's TMPDIR is its own.
	mustCall(t, a, "create_session", CreateSessionInput{Name: "hostpath-other"})
	res = runCode(t, a, RunCodeInput{Session: "hostpath-other", Lang: "bash", Code: `echo "$TMPDIR"; cat "$TMPDIR/from-python" 2>&1`})
	noHost("another session's TMPDIR", res.Stdout+res.Stderr)
	if !strings.HasPrefix(res.Stdout, sandbox.BoxTmp+"\n") || strings.Contains(res.Stdout, "kept") {
		t.Errorf("another session reads the first one's $TMPDIR/from-python, or another TMPDIR: %q", res.Stdout)
	}
}
