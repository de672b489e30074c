package app

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/engine/python"
)

// TestDataDirIsPrivate starts an App on a data directory and sessions
// directory made 0755 beforehand, runs Python, bash and JS in a session,
// and then finds both 0700, no file of the server's own world-readable,
// and another local user (nobody) unable to list either.
func TestDataDirIsPrivate(t *testing.T) {
	if testing.Short() {
		t.Skip("real boxes")
	}
	if os.Geteuid() != 0 {
		t.Skip("the modes that keep other users out are a root server's")
	}
	// The data directory's parent is open to everyone, as /var/lib is:
	// only the data directory's own mode keeps nobody out.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(dir, "sessions"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // made beforehand, as by a service manager
		t.Fatal(err)
	}
	a, err := New(context.Background(), dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.Sandbox.SessionBoxes() {
		t.Skip("no session boxes on this machine")
	}
	mustCall(t, a, "create_session", CreateSessionInput{Name: "modes"})
	for _, r := range []RunCodeInput{
		{Lang: "python", Code: "open('p.txt', 'w').write('x'); print('ok')"},
		{Lang: "bash", Code: "echo x > b.txt; echo ok"},
		{Lang: "js", Code: "console.log('ok')"},
	} {
		r.Session = "modes"
		if res := runCode(t, a, r); !strings.Contains(res.Stdout, "ok") {
			t.Fatalf("%s: %+v", r.Lang, res)
		}
	}

	for _, d := range []string{dir, filepath.Join(dir, "sessions")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s is %v, want 0700", d, fi.Mode().Perm())
		}
	}
	// The server's own files: the session directories' contents are the
	// sessions' (their code's files, 0644 as it made them, behind the
	// 0700 above); the interpreters' directory, the wheels, the rootfs
	// trees and the egress's CA bundle (public roots and the CA's
	// certificate, bound read-only into boxes at /run/quro/ca-bundle.pem)
	// are what boxes read, through their binds.
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if e.IsDir() && (rel == "python" || rel == "pip" || rel == "rootfs" || filepath.Dir(rel) == "sessions") {
			return filepath.SkipDir
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o044 != 0 && rel != filepath.Join("egress", "ca-bundle.pem") {
			t.Errorf("%s is %v: readable by others than the server", rel, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Another local user lists the parent, but not the data directory nor
	// its sessions.
	asNobody := func(args ...string) (string, error) {
		out, err := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := asNobody("ls", base); err != nil {
		t.Fatalf("nobody cannot list the data directory's parent, so the test proves nothing: %v: %s", err, out)
	}
	for _, d := range []string{dir, filepath.Join(dir, "sessions")} {
		out, err := asNobody("ls", d)
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("nobody lists %s: %v: %s", d, err, out)
		}
	}
}

// TestBoxShowsOnlyTheInterpretersOwnDirectories: of the interpreters'
// directory <root>/python a session box shows the embedded interpreter's
// tree, pip's directory and the worker module's (python.Embedded.BoxDirs),
// each at its box path (python.BoxTree, BoxPip, BoxWorker), and nothing
// else of it: neither <root>/python nor an entry planted beside them is
// there, to the session's shell or its Python, while the shell's python3
// and pip (the shims in the tree) still run.
func TestBoxShowsOnlyTheInterpretersOwnDirectories(t *testing.T) {
	if testing.Short() {
		t.Skip("real boxes")
	}
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.Sandbox.SessionBoxes() {
		t.Skip("no session boxes on this machine")
	}
	py := filepath.Join(testPython.InstallRoot, "python")
	other, err := os.MkdirTemp(py, "other-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	if err := os.Chmod(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("planted"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCall(t, a, "create_session", CreateSessionInput{Name: "binds"})
	// Python first: the interpreter is prepared before the box is made.
	// The longest timeouts: what is checked is what the box shows, and
	// at a load of 100 the default 30 s passed first (pip --version
	// imports much of pip).
	res := runCode(t, a, RunCodeInput{Session: "binds", Lang: "python", TimeoutMS: -1,
		Code: "import json, os\nprint(json.dumps([os.path.exists(" + strconvQuote(py) + "), os.path.exists(" + strconvQuote(other) + "), " +
			"[sorted(os.listdir(d)) for d in (" + strconvQuote(python.BoxTree) + ", " + strconvQuote(python.BoxPip) + ", " + strconvQuote(python.BoxWorker) + ")]], separators=(',', ':')))"})
	dirs := a.Python.BoxDirs()
	if len(dirs) != 3 {
		t.Fatalf("BoxDirs after a Python run: %q, want the tree, pip's and the worker's directories", dirs)
	}
	// Each box path shows its directory: the same entries as on the host.
	var want [3][]string
	for i, d := range dirs {
		es, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			want[i] = append(want[i], e.Name())
		}
		sort.Strings(want[i])
	}
	wantJSON, _ := json.Marshal([]any{false, false, want})
	if got := strings.TrimSpace(res.Stdout); got != string(wantJSON) {
		t.Fatalf("the session's Python sees %s, want %s (%s absent, the tree, pip's and the worker's directories at their box paths); stderr %q", got, wantJSON, py, res.Stderr)
	}
	res = runCode(t, a, RunCodeInput{Session: "binds", Lang: "bash", TimeoutMS: -1,
		Code: "cat " + other + "/secret 2>/dev/null || echo hidden; python3 -c 'print(6*7)'; pip --version | cut -d' ' -f1,2"})
	if w := "hidden\n42\npip " + python.PipVersion + "\n"; res.Stdout != w {
		t.Fatalf("the session's shell: %q (stderr %q), want %q", res.Stdout, res.Stderr, w)
	}
}

// strconvQuote is s as a Python string literal (a path: no quotes in it).
func strconvQuote(s string) string { return "'" + s + "'" }
