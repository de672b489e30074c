package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/pip/piptest"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/sandbox"
)

// The shims look for the stand-in and the socket where the box has them.
func TestPipStandInPaths(t *testing.T) {
	if python.PipStandIn != sandbox.BinDir+"/quro" || python.PipStandInSocket != insession.SocketInBox {
		t.Fatalf("shims ask %s over %s; the box has %s/quro and %s", python.PipStandIn, python.PipStandInSocket, sandbox.BinDir, insession.SocketInBox)
	}
}

func TestPipInstallRequest(t *testing.T) {
	for _, tc := range []struct {
		args []string
		reqs []string
	}{
		{[]string{"install", "requests"}, []string{"requests"}},
		{[]string{"install", "--user", "-U", "-q", "requests==2.32.3", "rich[jupyter]>=13"}, []string{"requests==2.32.3", "rich[jupyter]>=13"}},
		{[]string{"-q", "install", "--", "a", "b"}, []string{"a", "b"}},
		// The local pip's: other commands, options the server does not
		// take, paths, URLs, nothing to install.
		{[]string{"list"}, nil},
		{[]string{"install"}, nil},
		{[]string{"install", "-r", "requirements.txt"}, nil},
		{[]string{"install", "-e", "."}, nil},
		{[]string{"install", "--target", "/tmp/x", "a"}, nil},
		{[]string{"install", "--index-url=http://127.0.0.1:1/", "a"}, nil},
		{[]string{"install", "--index-url", "http://127.0.0.1:1/", "a"}, nil},
		{[]string{"install", "./a-1.0-py3-none-any.whl"}, nil},
		{[]string{"install", "pkg @ file:///etc/passwd"}, nil},
		{[]string{"install", "--", "--index-url=http://x/"}, nil},
		{[]string{"download", "a"}, nil},
	} {
		reqs, ok := pipInstallRequest(tc.args)
		if ok != (tc.reqs != nil) || !slices.Equal(reqs, tc.reqs) {
			t.Errorf("%q: %q %v, want %q", tc.args, reqs, ok, tc.reqs)
		}
	}
}

// Outside a session of quro serve (no socket), or with network, the
// stand-in leaves pip to the local pip.
func TestPipShimFallsBackWithoutAServer(t *testing.T) {
	if _, err := os.Stat(insession.SocketInBox); err == nil {
		t.Skip(insession.SocketInBox + " exists here")
	}
	for _, offline := range []string{"0", "1"} {
		t.Setenv("QURO_PIP_OFFLINE", offline)
		var out, errb bytes.Buffer
		if code := pipShim([]string{"install", "requests"}, &out, &errb); code != python.PipFallback || out.Len()+errb.Len() != 0 {
			t.Fatalf("offline=%s: exit %d %q %q", offline, code, out.String(), errb.String())
		}
	}
}

// TestPipInsideANetworkNoneSession: in a session of quro serve without
// network, `pip install` in the shell and `%pip install` in run_code
// have the server fetch the wheel from its index and install it into this
// session's user site; what the server cannot do whole falls back to the
// local pip (cache only, the hint); a hostile requirement sent straight
// to install_packages is refused before any fetch; apt stays refused.
func TestPipInsideANetworkNoneSession(t *testing.T) {
	t.Parallel()
	if python.PipVersion == "" {
		t.Skip("a slim build has no embedded Python and no pip")
	}
	if os.Geteuid() != 0 {
		t.Skip("in-session calls need the server to run as root (a uid per session); this test runs as uid", os.Geteuid())
	}
	ix := piptest.NewIndex(t, piptest.PureWheel(t, "purewheel", "1.0", "fetched"), piptest.PureWheel(t, "magicwheel", "1.0", "magic"),
		piptest.PureWheel(t, "optwheel", "1.0", "opt"))
	srv := startServer(t, "--pip-index-url", ix.URL())
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	for _, name := range []string{"offline", "other"} {
		if r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"`+name+`"}`, admin...); r.status != 201 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	run := func(sess, lang, code string) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"lang": lang, "session": sess, "code": code, "timeout_ms": 300000})
		r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return r.body
	}

	out := run("offline", "bash", `pip install purewheel; echo "exit=$?"
python3 -c 'import os, purewheel; print(purewheel.VALUE, purewheel.__file__.startswith(os.environ["HOME"] + "/.local/lib/python3.14/site-packages/"))'`)
	if !strings.Contains(out, "the server fetches purewheel") || !strings.Contains(out, "exit=0") || !strings.Contains(out, "fetched True") {
		t.Fatalf("pip install in the shell:\n%s", out)
	}
	if ix.Requests.Load() == 0 {
		t.Fatal("the index saw no request")
	}
	// It is this session's: another session of the tenant has not got it.
	if out := run("other", "bash", `python3 -c 'import purewheel' 2>&1; echo "exit=$?"`); !strings.Contains(out, "No module named 'purewheel'") {
		t.Fatalf("the other session:\n%s", out)
	}

	out = run("offline", "python", "%pip install magicwheel\nimport magicwheel\nprint(magicwheel.VALUE)")
	if !strings.Contains(out, "the server fetches magicwheel") || !strings.Contains(out, "magic") {
		t.Fatalf("%%pip install:\n%s", out)
	}

	// An option the server does not take: the local pip, cache only.
	before := ix.Requests.Load()
	out = run("offline", "bash", `pip install --index-url http://127.0.0.1:1/simple optwheel; echo "exit=$?"`)
	if strings.Contains(out, "the server fetches") || !strings.Contains(out, python.OfflineHint) || strings.Contains(out, "exit=0") {
		t.Fatalf("pip install with --index-url:\n%s", out)
	}
	// Hostile requirements straight to install_packages, as the session.
	for _, req := range []string{"pkg @ file:///etc/passwd", "--index-url=http://127.0.0.1:1/"} {
		in, _ := json.Marshal(map[string]any{"manager": "pip", "packages": []string{req}})
		out = run("offline", "bash", "quro call install_packages '"+string(in)+"'; echo \"exit=$?\"")
		if !strings.Contains(out, "invalid_argument") || !strings.Contains(out, "exit=1") {
			t.Fatalf("install_packages %q from the session:\n%s", req, out)
		}
	}
	if n := ix.Requests.Load(); n != before {
		t.Fatalf("%d requests reached the index after the fallback and the refused requirements", n-before)
	}
	// apt keeps needing scope install.
	out = run("offline", "bash", `quro call install_packages '{"packages":["jq"]}'; echo "exit=$?"`)
	if !strings.Contains(out, "permission_denied") || !strings.Contains(out, `needs scope "install"`) {
		t.Fatalf("apt from the session:\n%s", out)
	}
}

// TestPipInsideARootfsSession: on a rootfs session without network (the
// shared test rootfs), `pip install` in the shell (the rootfs's pip
// shim, run by its python3 3.11) has the server fetch and install too,
// into the session's 3.11 user site; the rootfs is not changed.
func TestPipInsideARootfsSession(t *testing.T) {
	t.Parallel()
	if python.PipVersion == "" {
		t.Skip("a slim build has no embedded Python and no pip")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (a uid per session)")
	}
	// The shared test rootfs itself, not a copy: nothing here may change
	// it (checked below), as internal/app's TestPipOnRootfs; a copy was
	// 296 MB written for a check that it stays unchanged.
	data := t.TempDir()
	if err := os.Symlink(rootfstest.Default(t).Dir, rootfs.DirIn(data)); err != nil {
		t.Fatal(err)
	}
	// The seeded pip directory's rootfs shims name the shared Python's
	// place: the server writes them again for this data directory (the
	// python package's TestPipFollowsAMovedDataDir), without
	// extracting pip again.
	seedPython(t, data)
	ix := piptest.NewIndex(t, piptest.PureWheel(t, "rootwheel", "1.0", "on the rootfs"))
	srv := startServerIn(t, data, "--pip-index-url", ix.URL())
	admin := []string{"Authorization", "Bearer " + srv.token}
	const js = "application/json"
	// The server prepares the interpreter and pip in the background; a
	// box shows the pip directory once that is done (BoxDirs). A Python
	// run waits for it, so the rootfs session made after it finds its pip.
	if r := do(t, "POST", srv.url+"/v1/run_code", js, `{"lang":"python","code":"print(1)","timeout_ms":300000}`, admin...); r.status != 200 || !strings.Contains(r.body, `"exit_code":0`) {
		t.Fatalf("the run that waits for the preparation: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", srv.url+"/v1/sessions", js, `{"name":"deb","rootfs":"default"}`, admin...); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	body, _ := json.Marshal(map[string]any{"lang": "bash", "session": "deb", "timeout_ms": 300000, "code": `pip install rootwheel; echo "exit=$?"
python3 -c 'import os, rootwheel; print(rootwheel.VALUE, rootwheel.__file__.startswith(os.environ["HOME"] + "/.local/lib/python3.11/site-packages/"))'`})
	r := do(t, "POST", srv.url+"/v1/run_code", js, string(body), append([]string{"Accept", "text/plain"}, admin...)...)
	if r.status != 200 || !strings.Contains(r.body, "the server fetches rootwheel") || !strings.Contains(r.body, "exit=0") || !strings.Contains(r.body, "on the rootfs True") {
		t.Fatalf("pip install on a rootfs: %d\n%s", r.status, r.body)
	}
	if _, err := os.Stat(filepath.Join(rootfs.New(rootfs.DirIn(data)).Path(rootfs.DefaultName), "usr/lib/python3/dist-packages/rootwheel")); err == nil {
		t.Fatal("the install went into the rootfs")
	}
}
