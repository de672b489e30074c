package shell_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/engine/shell"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

func newSandbox(t *testing.T) *sandbox.Sandbox {
	t.Helper()
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func newSession(t *testing.T, rootfs string) *session.Session {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	s := &session.Session{ID: "t" + hex.EncodeToString(b[:]), Dir: filepath.Join(t.TempDir(), "session"), Rootfs: rootfs}
	for _, d := range []string{s.Workspace(), s.TmpDir(), s.OutputsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func run(t *testing.T, r *runcode.Runner, s *session.Session, lang, code string) *runcode.Result {
	t.Helper()
	res, err := r.Run(context.Background(), runcode.Input{Code: code, Lang: lang, Session: s, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("%s %q: %v", lang, code, err)
	}
	return res
}

// bashOnly is code that only bash runs: [[ ]], arrays, process
// substitution, a function named ":" (the fork-bomb spelling) and
// BASH_VERSION.
const bashOnly = `:(){ echo colon-fn; }; :
a=(x y z); [[ ${#a[@]} == 3 && $BASH_VERSION ]] && echo arrays-ok
cat <(echo procsub-ok)`

// TestBashRunsBash: lang bash and lang shell run real bash in the box,
// lang sh runs sh, and each result's engine says which ran.
func TestBashRunsBash(t *testing.T) {
	r := runcode.New(shell.Languages(newSandbox(t), nil), nil)
	s := newSession(t, "")
	for _, lang := range []string{"bash", "shell", "BASH"} {
		res := run(t, r, s, lang, bashOnly)
		if res.Engine != "shell/bash" || res.ExitCode != 0 || res.Stdout != "colon-fn\narrays-ok\nprocsub-ok\n" {
			t.Errorf("lang %s: engine %s exit %d stdout %q stderr %q error %q", lang, res.Engine, res.ExitCode, res.Stdout, res.Stderr, res.Error)
		}
	}
	// /dev/tcp is bash's own: bash tries to connect, sh opens a path.
	res := run(t, r, s, "bash", "echo x >/dev/tcp/127.0.0.1/9")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "connect") {
		t.Errorf("bash /dev/tcp: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	res = run(t, r, s, "sh", bashOnly)
	if res.Engine != "shell/sh" || res.ExitCode == 0 || !strings.Contains(res.Stderr, "Bad function name") {
		t.Errorf("lang sh: engine %s exit %d stdout %q stderr %q", res.Engine, res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(t, r, s, "sh", "[[ 1 == 1 ]] && echo bash-ish; echo $0")
	if res.Engine != "shell/sh" || strings.Contains(res.Stdout, "bash") {
		t.Errorf("lang sh ran bash: engine %s stdout %q", res.Engine, res.Stdout)
	}
	// A script over the argument limit goes through a file, still bash.
	res = run(t, r, s, "bash", bashOnly+"\n#"+strings.Repeat("x", 120<<10))
	if res.Engine != "shell/bash" || res.Stdout != "colon-fn\narrays-ok\nprocsub-ok\n" {
		t.Errorf("long bash script: engine %s stdout %q stderr %q", res.Engine, res.Stdout, res.Stderr)
	}
	// Its file is named where the box shows the session's tmp directory,
	// never at its host path: $0, and any error bash reports.
	res = run(t, r, s, "bash", "echo \"$0\"; no-such-command\n#"+strings.Repeat("x", 120<<10))
	if sb := newSandbox(t); sb.Boxed() {
		if text := res.Stdout + res.Stderr; strings.Contains(text, s.Dir) || !strings.HasPrefix(res.Stdout, sandbox.BoxTmp+"/run-") ||
			!strings.Contains(res.Stderr, sandbox.BoxTmp+"/run-") {
			t.Errorf("a long script's file is not named at %s: stdout %q stderr %q", sandbox.BoxTmp, res.Stdout, res.Stderr)
		}
	}
}

// miniRootfs is a root filesystem with dash as sh and no bash: the libc
// and loader dash needs, the merged-/usr symlinks of Debian.
func miniRootfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range [][2]string{{"usr/bin", "bin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}, {"dash", "usr/bin/sh"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"/usr/bin/dash", "/usr/bin/cat", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"} {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			t.Skipf("no %s on this machine: %v", f, err)
		}
		dst := filepath.Join(dir, strings.TrimPrefix(f, "/"))
		if strings.HasPrefix(f, "/lib/") {
			dst = filepath.Join(dir, "usr", strings.TrimPrefix(f, "/"))
		} else if strings.HasPrefix(f, "/lib64/") {
			dst = filepath.Join(dir, "usr", strings.TrimPrefix(f, "/"))
		}
		copyFile(t, real, dst)
	}
	return dir
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
}

// TestRootfsWithoutBash: on a rootfs that has no bash, lang bash gets an
// error that says so (it does not quietly run sh), lang shell runs sh and
// notes why, and lang sh runs the rootfs's own sh.
func TestRootfsWithoutBash(t *testing.T) {
	dir := miniRootfs(t)
	r := runcode.New(shell.Languages(newSandbox(t), func(name string) (string, error) { return dir, nil }), nil)
	s := newSession(t, "mini")

	res := run(t, r, s, "bash", "echo should-not-run")
	if res.Engine != "none" || res.Stdout != "" ||
		!strings.Contains(res.Error, `the session's rootfs "mini" has no bash`) || !strings.Contains(res.Error, `lang "sh" runs POSIX sh instead`) {
		t.Errorf("lang bash: engine %s stdout %q error %q", res.Engine, res.Stdout, res.Error)
	}
	res = run(t, r, s, "shell", "echo ran-by-$0; [ -e /usr/bin/dash ] && echo in-rootfs")
	if res.Engine != "shell/sh" || res.Stdout != "ran-by-sh\nin-rootfs\n" || len(res.Notes) == 0 || !strings.Contains(res.Notes[0], "has no bash") {
		t.Errorf("lang shell: engine %s stdout %q stderr %q notes %q error %q", res.Engine, res.Stdout, res.Stderr, res.Notes, res.Error)
	}
	res = run(t, r, s, "sh", "echo sh-ok")
	if res.Engine != "shell/sh" || res.Stdout != "sh-ok\n" {
		t.Errorf("lang sh: engine %s stdout %q stderr %q error %q", res.Engine, res.Stdout, res.Stderr, res.Error)
	}
}

// TestNoBashOnTheHost: a server whose PATH has no bash refuses lang bash
// with the reason, instead of running sh.
func TestNoBashOnTheHost(t *testing.T) {
	sb, err := sandbox.New(&sandbox.Options{Path: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	r := runcode.New(shell.Languages(sb, nil), nil)
	res := run(t, r, newSession(t, ""), "bash", "echo should-not-run")
	if res.Engine != "none" || res.Stdout != "" || !strings.Contains(res.Error, "bash") || !strings.Contains(res.Error, `lang "sh" runs POSIX sh instead`) {
		t.Errorf("engine %s stdout %q error %q", res.Engine, res.Stdout, res.Error)
	}
}

// TestLongScriptErrorNamesNoHostPath: code over the argument bound goes
// through a script file in the session's tmp directory; when it cannot
// be written (a full disk: here, the directory gone) the error names the
// file at its box path, never the session's directory on the host.
func TestLongScriptErrorNamesNoHostPath(t *testing.T) {
	r := runcode.New(shell.Languages(newSandbox(t), nil), nil)
	s := newSession(t, "")
	if err := os.RemoveAll(s.TmpDir()); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(context.Background(), runcode.Input{Code: "true #" + strings.Repeat("x", 200<<10), Lang: "bash", Session: s, Timeout: time.Minute})
	msg := fmt.Sprint(err)
	if res != nil {
		msg += " " + res.Error + " " + res.Stderr
	}
	if !strings.Contains(msg, "write script") || strings.Contains(msg, s.Dir) {
		t.Fatalf("a script that cannot be written: %s", msg)
	}
}
