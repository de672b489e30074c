package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// Attack: learn the server's data directory from inside a session box.
// The run is shaped as every run of a session is (session.Session.Spec):
// Dir and HOME the workspace, TmpDir the session's tmp, the workspace
// bound at HomeUser, and the server hands it host paths of both in its
// arguments and environment, as engines do (a script file, a cache
// directory). User code then reads every place a path shows: the mount
// table's mount points, its working directory, /proc/self/cwd and
// environ, /etc/passwd, its argv, its maps, a `cd` to the host path, and
// what `pwd -P` resolves. None may name the data directory; and what the
// server named by host path must be there, at the box's path.
//
// The quro binary (the box's init, its spawners, an engine the server
// re-executes such as gpython: a run of the binary by its host path, which
// it names read-only, or a variable naming it) is in the box at
// /run/quro/bin/quro only: no mount point, argv, environ or /proc/PID/exe
// names its install location.
//
// Only the mount table's fourth field (the bind's source within its
// filesystem) is left out: the kernel shows it, and only a filesystem of
// the session's own (the session disk) makes it name no host directory
// (docs/security.md, "No host path in a box").
func TestBoxShowsNoHostPathOfTheSession(t *testing.T) {
	sb := newSandbox(t)
	ctx := testCtx(t)
	data := filepath.Join(t.TempDir(), "server-data-dir")
	sess := filepath.Join(data, "sessions", "s1")
	ws, tmp := filepath.Join(sess, "workspace"), filepath.Join(sess, "tmp")
	for _, d := range []string{ws, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The host path as user code could learn it other than from the
	// server (a guess, a leak elsewhere): the box must not show it.
	if err := os.WriteFile(filepath.Join(ws, "host-path"), []byte(ws), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "script.sh"), []byte("echo from-tmp-script\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const script = `
echo "== arg $1"; cat "$1"; echo "$2" > "$2.out" && echo wrote
echo "== pwd $(pwd) $(pwd -P) $(readlink /proc/self/cwd) $PWD"
echo "== env"; tr '\0' '\n' < /proc/self/environ
echo "== cmdline"; tr '\0' ' ' < /proc/self/cmdline; echo
echo "== passwd"; cat /etc/passwd
echo "== maps"; cat /proc/self/maps
echo "== mountpoints"; cut -d' ' -f5 /proc/self/mountinfo
echo "== cd"; cd "$(cat "$HOME/host-path")" 2>/dev/null && echo "in-host-""path"
echo "== find"; find / -xdev -maxdepth 6 -name workspace 2>/dev/null
echo "== procs"; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo " exe=$(readlink $p/exe 2>/dev/null)"; done
echo "== self $(command -v quro)"
`
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	for i := range 2 { // the box's first run and a later one (the spawner's)
		out.Reset()
		errOut.Reset()
		spec := &Spec{Args: []string{"sh", "-c", script, "sh", filepath.Join(tmp, "script.sh"), filepath.Join(ws, "made")},
			Dir: ws, Home: ws, TmpDir: tmp, Env: map[string]string{"CACHE": filepath.Join(tmp, "cache")},
			Binds: []Bind{{Src: ws, Dst: HomeUser, Writable: true}}, ReadOnly: []string{self}, Session: "test-" + t.Name(), Stdout: &out, Stderr: &errOut}
		exit, err := sb.Run(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		got := out.String() + errOut.String()
		for _, leak := range []string{data, "server-data-dir", "sessions/s1", self, filepath.Dir(self)} {
			if strings.Contains(got, leak) {
				t.Fatalf("run %d: the box shows the host path %s:\n%s", i, leak, got)
			}
		}
		for _, want := range []string{
			"== arg " + BoxTmp + "/script.sh\necho from-tmp-script\nwrote\n",
			"== pwd /home/user /home/user /home/user /home/user\n",
			"HOME=/home/user\n", "CACHE=" + BoxTmp + "/cache\n",
			"user:x:1000:1000:quro sandbox:/home/user:/bin/sh\n",
			"\n" + initPath + " " + boxinit.BoxArg + " ", // the box init's argv
			"== self " + initPath + "\n",
		} {
			if !strings.Contains(got, want) {
				t.Fatalf("run %d (exit %d): no %q in:\n%s", i, exit.Code, want, got)
			}
		}
		if strings.Contains(got, "in-host-path") {
			t.Fatalf("run %d: the box entered the host path:\n%s", i, got)
		}
		if b, err := os.ReadFile(filepath.Join(ws, "made.out")); err != nil || string(b) != "/home/user/made\n" {
			t.Fatalf("run %d: the file written by the box path: %q %v", i, b, err)
		}
	}
	// The binary run by its host path, as gpython is: it starts, at its
	// box path, in the same session box.
	out.Reset()
	exit, err := sb.Run(ctx, &Spec{Args: []string{self, boxinit.ProbeArg}, Dir: ws, Home: ws, TmpDir: tmp, ReadOnly: []string{self},
		Binds: []Bind{{Src: ws, Dst: HomeUser, Writable: true}}, Session: "test-" + t.Name(), Stdout: &out, Stderr: &out})
	if err != nil || exit.Code != 0 {
		t.Fatalf("the quro binary by its host path: %v %+v %s", err, exit, out.String())
	}
	// A tenant's bytes that name the install location (an argument, a
	// variable, a unit file's ExecStart) reach the box as they were
	// given: only a run's program is started at the box path.
	out.Reset()
	said := "ExecStart=" + self + " serve"
	exit, err = sb.Run(ctx, &Spec{Args: []string{"sh", "-c", `printf '%s|%s|%s\n' "$1" "$2" "$SELF"`, "sh", self, said},
		Env: map[string]string{"SELF": self + "/../x"}, Dir: ws, Home: ws, TmpDir: tmp,
		Binds: []Bind{{Src: ws, Dst: HomeUser, Writable: true}}, Session: "test-" + t.Name(), Stdout: &out, Stderr: &out})
	if want := self + "|" + said + "|" + self + "/../x\n"; err != nil || exit.Code != 0 || out.String() != want {
		t.Fatalf("a tenant's text naming the binary's host path: %v %+v %q, want %q", err, exit, out.String(), want)
	}
}
