package app

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/toolchain"
	"github.com/quro-dev/quro/internal/engine/toolchain/toolchaintest"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// Tests of run_code's toolchain languages (internal/engine/toolchain):
// real compilers of the host userland, or of the test rootfs, in real
// session boxes.

const helloC = "#include <stdio.h>\n#include <stdlib.h>\nint main(int argc, char **argv) {\n" +
	"  char line[64] = \"\";\n  if (fgets(line, sizeof line, stdin)) printf(\"stdin: %s\", line);\n" +
	"  for (int i = 1; i < argc; i++) printf(\"arg %d: %s\\n\", i, argv[i]);\n" +
	"  printf(\"hello from c\\n\");\n  return argc > 1 ? atoi(argv[1]) : 0;\n}\n"

// needHost skips a test when the host userland has none of progs.
func needHost(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed on this host (make test installs it): %v", p, err)
		}
	}
}

// toolSession creates a session and returns it.
func toolSession(t *testing.T, a *App, opts session.CreateOptions) *session.Session {
	t.Helper()
	s, err := a.Sessions.CreateWith(context.Background(), "", opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// entries lists the build cache's entries (directories with .ok) of s.
func entries(t *testing.T, s *session.Session) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(s.TmpDir(), toolchain.CacheDir, "*", ".ok"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestToolchainCRunsAndCaches(t *testing.T) {
	t.Parallel()
	needHost(t, "gcc")
	a := newApp(t, nil)
	s := toolSession(t, a, session.CreateOptions{})
	in := RunCodeInput{Session: s.ID, Lang: "c", Code: helloC, Stdin: "line one\n", Args: []string{"7", "two words"}}
	res := runCode(t, a, in)
	if res.Engine != "toolchain/gcc" || res.Error != "" || res.Stage != "run" || res.Cached {
		t.Fatalf("first run: %+v", res)
	}
	want := "stdin: line one\narg 1: 7\narg 2: two words\nhello from c\n"
	if res.Stdout != want || res.ExitCode != 7 {
		t.Fatalf("stdout %q exit %d, want %q exit 7", res.Stdout, res.ExitCode, want)
	}
	if !strings.HasPrefix(res.Toolchain, "gcc ") || res.CompileMS <= 0 || !strings.Contains(res.Text(), "🔧 "+res.Toolchain) {
		t.Fatalf("toolchain %q compile_ms %v text:\n%s", res.Toolchain, res.CompileMS, res.Text())
	}
	ents := entries(t, s)
	if len(ents) != 1 {
		t.Fatalf("cache entries %v, want 1", ents)
	}
	before, err := os.Stat(ents[0])
	if err != nil {
		t.Fatal(err)
	}

	// The warm run: same source, other stdin and args; nothing compiles.
	in.Stdin, in.Args = "", []string{"0"}
	res = runCode(t, a, in)
	if !res.Cached || res.CompileMS != 0 || res.Stdout != "arg 1: 0\nhello from c\n" || res.ExitCode != 0 {
		t.Fatalf("warm run: %+v", res)
	}
	if !strings.Contains(res.Text(), "cached build of this same source") {
		t.Errorf("warm text does not say cached:\n%s", res.Text())
	}
	after, err := os.Stat(ents[0])
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) || after.Sys().(*syscall.Stat_t).Ino != before.Sys().(*syscall.Stat_t).Ino {
		t.Error("the warm run rebuilt the cache entry")
	}
	if n := len(entries(t, s)); n != 1 {
		t.Errorf("%d cache entries after the warm run, want 1", n)
	}
}

func TestToolchainCompileErrorMapsToCodeLine(t *testing.T) {
	t.Parallel()
	needHost(t, "gcc", "g++")
	a := newApp(t, nil)
	for _, tc := range []struct{ lang, code, want string }{
		{"c", "#include <stdio.h>\nint main(void) {\n  undeclared_thing = 1;\n  return 0;\n}\n", "main.c:3:3: error"},
		{"cpp", "#include <iostream>\n\nint main() {\n\n  std::cout << nope << std::endl;\n}\n", "main.cpp:5:"},
	} {
		res := runCode(t, a, RunCodeInput{Lang: tc.lang, Code: tc.code})
		if res.Stage != "compile" || res.ExitCode == 0 || res.Error != "" || res.Stdout != "" {
			t.Fatalf("%s: %+v", tc.lang, res)
		}
		if !strings.Contains(res.Stderr, tc.want) {
			t.Errorf("%s: stderr does not name %q:\n%s", tc.lang, tc.want, res.Stderr)
		}
		if !strings.Contains(res.Text(), "compile failed") {
			t.Errorf("%s: text:\n%s", tc.lang, res.Text())
		}
	}
	// A warning leaves the program to run, the warning on stderr at the
	// code's line, and a note saying so.
	res := runCode(t, a, RunCodeInput{Lang: "c", Code: "\nint main(void) {\n  printf(\"warned\\n\");\n  return 0;\n}\n"})
	if res.Stage != "run" || res.Stdout != "warned\n" || !strings.Contains(res.Stderr, "main.c:3:3: warning") ||
		!strings.Contains(strings.Join(res.Notes, "\n"), "the compiler's messages are on stderr; the code was compiled as main.c") {
		t.Errorf("warning: %+v", res)
	}
}

// An endless program hits the run timeout, not the compile's; a compile
// that never ends (it includes a FIFO nobody writes) hits the compile
// timeout, not the run's.
func TestToolchainCompileAndRunTimeouts(t *testing.T) {
	t.Parallel()
	needHost(t, "gcc")
	a := newApp(t, nil)
	s := toolSession(t, a, session.CreateOptions{})
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: "int main(void) { for (;;) ; }\n", TimeoutMS: 1500})
	if !res.TimedOut || res.Stage != "run" || !strings.Contains(res.Error, "timed out after 1.5s") {
		t.Fatalf("endless program: %+v", res)
	}

	built := len(entries(t, s)) // the endless program's
	fifo := "/home/user/never"  // where the box shows it
	if sh := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "sh", Code: "mkfifo never"}); sh.ExitCode != 0 {
		t.Fatalf("mkfifo: %+v", sh)
	}
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: "#include \"" + fifo + "\"\nint main(void) { return 0; }\n",
		CompileTimeoutMS: 1500, TimeoutMS: 600000})
	if !res.TimedOut || res.Stage != "compile" || !strings.Contains(res.Error, "compile timed out after 1.5s") {
		t.Fatalf("endless compile: %+v", res)
	}
	if n := len(entries(t, s)); n != built {
		t.Errorf("%d cache entries after a compile timeout, want %d", n, built)
	}
}

func TestToolchainInputChecks(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		in   RunCodeInput
		want string
	}{
		{RunCodeInput{Lang: "python", Code: "print(1)", Stdin: "x"}, "stdin and args are for the compiled"},
		{RunCodeInput{Lang: "c", Code: "int main(){}", Args: []string{"a\x00b"}}, "NUL"},
		{RunCodeInput{Lang: "c", Code: "int main(){}", CompileTimeoutMS: 10 * 60 * 1000 * 2}, "compile_timeout_ms"},
	} {
		_, err := call(t, a, "run_code", tc.in)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want invalid_argument with %q", tc.in, err, tc.want)
		}
	}
}

// Without a toolchain the code keeps today's highlighted page and a note
// says which Debian package adds it.
func TestToolchainMissingFallsThroughToPage(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct{ lang, code, prog, want string }{
		{"zig", "pub fn main() void {}\n", "zig", "not packaged in Debian 12"},
		{"haskell", "main = putStrLn \"hi\"\n", "ghc", "apt-get install ghc on the host, or a session on a rootfs with install_packages ghc"},
	} {
		if _, err := exec.LookPath(tc.prog); err == nil {
			t.Logf("%s is installed here: not a missing toolchain", tc.prog)
			continue
		}
		res := runCode(t, a, RunCodeInput{Lang: tc.lang, Code: tc.code})
		if res.Engine != "render/code" || len(res.Artifacts) != 1 || res.Artifacts[0].Kind != "html" {
			t.Fatalf("%s: %+v", tc.lang, res)
		}
		if !strings.Contains(res.Text(), "not run, shown by render/code because toolchain/"+tc.prog+": no "+tc.prog+" in this server's userland") ||
			!strings.Contains(res.Text(), tc.want) {
			t.Errorf("%s: the notes do not say how to get the toolchain:\n%s", tc.lang, res.Text())
		}
	}
	reply, err := call(t, a, "help", HelpInput{Topic: "languages"})
	if err != nil {
		t.Fatal(err)
	}
	h := reply.Output.(*Help).Guide
	if !strings.Contains(h, "run_code runs these on this server's own userland now: python, js, ts, node, shell, bash, sh") {
		t.Errorf("help does not list what runs:\n%s", h)
	}
	if _, err := exec.LookPath("zig"); err != nil && !strings.Contains(h, "- zig: no zig in this server's userland") {
		t.Errorf("help does not say zig is only shown:\n%s", h)
	}
	if _, err := exec.LookPath("gcc"); err == nil && !strings.Contains(h, ", c, cpp") {
		t.Errorf("help does not list c as running:\n%s", h)
	}
}

// Interpreted languages run from the source file; each where the host has
// it.
func TestToolchainInterpreted(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct{ lang, prog, code string }{
		{"perl", "perl", "my $l = <STDIN>; print \"perl got $l\"; print \"args @ARGV\\n\"; exit 3;\n"},
		{"ruby", "ruby", "l = $stdin.gets\nputs \"ruby got #{l}\"\nputs \"args #{ARGV.join(' ')}\"\nexit 3\n"},
		{"php", "php", "<?php\n$l = fgets(STDIN);\necho \"php got $l\";\necho \"args \" . implode(' ', array_slice($argv, 1)) . \"\\n\";\nexit(3);\n"},
		{"lua", "lua5.4", "local l = io.read('L')\nio.write('lua got ', l)\nprint('args ' .. table.concat(arg, ' '))\nos.exit(3)\n"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			needHost(t, tc.prog)
			res := runCode(t, a, RunCodeInput{Lang: tc.lang, Code: tc.code, Stdin: "in\n", Args: []string{"x", "y"}})
			want := tc.lang + " got in\nargs x y\n"
			if res.Stdout != want || res.ExitCode != 3 || res.Toolchain == "" || res.Engine != "toolchain/"+tc.prog {
				t.Fatalf("%+v, want stdout %q exit 3", res, want)
			}
			// A runtime error names the source file and the code's line.
			bad := map[string]string{"perl": "\n\ndie \"boom\";\n", "ruby": "\n\nraise 'boom'\n", "php": "<?php\n\nthrow new Exception('boom');\n", "lua": "\n\nerror('boom')\n"}[tc.lang]
			res = runCode(t, a, RunCodeInput{Lang: tc.lang, Code: bad})
			if res.ExitCode == 0 || !strings.Contains(res.Stderr+res.Stdout, "main.") || !strings.Contains(res.Stderr+res.Stdout, "3") {
				t.Errorf("runtime error: %+v", res)
			}
		})
	}
}

func TestToolchainGoAndJava(t *testing.T) {
	if testing.Short() {
		t.Skip("a cold go build compiles the standard library into the session's cache (~30 s)")
	}
	t.Parallel() // its own App; minutes of compiling on a loaded machine
	// Go's first build compiles the standard library into the session's
	// cache: ~30 s idle, past 10 minutes at a load of 60 on 2 cores. The
	// server's longest budget (MaxTimeout) here is what the test binary
	// has left (go test -timeout) but a margin, at least 10 minutes.
	budget := 10 * time.Minute
	if d, ok := t.Deadline(); ok {
		budget = max(budget, time.Until(d)-3*time.Minute)
	}
	a := newApp(t, &runcode.Options{MaxTimeout: budget})
	t.Run("go", func(t *testing.T) {
		// The host's Go is /usr/local/go, under /usr, which every box shows.
		if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
			needHost(t, "go")
		}
		// The compile gets the longest budget the server allows (-1:
		// MaxTimeout, above) and the call a minute more: a budget is a
		// bound on a failure, not a wait. The session's Go build cache
		// ($TMPDIR/.cache/go-build, owned by the session's uid) is empty,
		// or in make test a copy of the one the toolchain engine's
		// contract suite filled if it built first (toolchaintest: one
		// cold build of the standard library per make test, here or
		// there).
		s := toolSession(t, a, session.CreateOptions{})
		cache := filepath.Join(s.TmpDir(), ".cache")
		if err := os.MkdirAll(cache, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(cache, s.UID, s.UID); err != nil {
			t.Fatal(err)
		}
		var res *runcode.Result
		warm := toolchaintest.SharedGoCache(t, filepath.Join(cache, "go-build"), s.UID, func() bool {
			res = runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "go", Code: "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"hello from go\", os.Args[1:])\n}\n",
				Args: []string{"a"}, CompileTimeoutMS: -1}, budget+time.Minute)
			return res.Stdout == "hello from go [a]\n"
		})
		if res.Stdout != "hello from go [a]\n" || !strings.HasPrefix(res.Toolchain, "go version go") {
			t.Fatalf("warm cache %v: %+v", warm, res)
		}
		res = runCodeWithin(t, a, RunCodeInput{Session: s.ID, Lang: "go", Code: "package main\n\nfunc main() {\n\tundefinedCall()\n}\n", CompileTimeoutMS: -1}, budget+time.Minute)
		if res.Stage != "compile" || !strings.Contains(res.Stderr, "main.go:4:2: undefined: undefinedCall") {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("java", func(t *testing.T) {
		needHost(t, "javac", "java")
		res := runCode(t, a, RunCodeInput{Lang: "java", Code: "import java.util.Scanner;\n\npublic class Greeter {\n  public static void main(String[] args) {\n" +
			"    String l = new Scanner(System.in).nextLine();\n    System.out.println(\"java got \" + l + \" \" + args[0]);\n    System.exit(5);\n  }\n}\n",
			Stdin: "in\n", Args: []string{"z"}})
		if res.Stdout != "java got in z\n" || res.ExitCode != 5 || !strings.HasPrefix(res.Toolchain, "javac ") {
			t.Fatalf("%+v", res)
		}
		res = runCode(t, a, RunCodeInput{Lang: "java", Code: "public class Bad {\n  public static void main(String[] a) {\n    int x = \"s\";\n  }\n}\n"})
		if res.Stage != "compile" || !strings.Contains(res.Stderr, "Bad.java:3: error") {
			t.Fatalf("%+v", res)
		}
	})
}

// Concurrent cold runs of the same source each build in a directory of
// their own and one of them is renamed into place: every run prints the
// right output and the cache has one entry.
func TestToolchainConcurrentBuilds(t *testing.T) {
	t.Parallel()
	needHost(t, "gcc")
	a := newApp(t, nil)
	s := toolSession(t, a, session.CreateOptions{})
	var wg sync.WaitGroup
	results := make([]*runcode.Result, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply, err := call(t, a, "run_code", RunCodeInput{Session: s.ID, Lang: "c", Code: helloC})
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = reply.Output.(*runcode.Result)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r == nil || r.Stdout != "hello from c\n" || r.ExitCode != 0 {
			t.Errorf("run %d: %+v", i, r)
		}
	}
	if n := len(entries(t, s)); n != 1 {
		t.Errorf("%d cache entries, want 1", n)
	}
	m, _ := filepath.Glob(filepath.Join(s.TmpDir(), toolchain.CacheDir, ".*.tmp*"))
	if len(m) != 0 {
		t.Errorf("build directories left over: %v", m)
	}
}

// The build cache is the session's: code that tampers with it (a program
// swapped in, the entry's marker made a FIFO, the cache made a symlink out
// of the session) only affects that session. The server never opens what
// is there (a FIFO marker would block it), another session with the same
// source builds its own, and nothing is written outside the box.
func TestToolchainHostileCache(t *testing.T) {
	t.Parallel()
	needHost(t, "gcc")
	a := newApp(t, nil)
	evil := toolSession(t, a, session.CreateOptions{})
	other := toolSession(t, a, session.CreateOptions{})
	hello := "#include <stdio.h>\nint main(void) { puts(\"honest\"); return 0; }\n"
	if res := runCode(t, a, RunCodeInput{Session: evil.ID, Lang: "c", Code: hello}); res.Stdout != "honest\n" {
		t.Fatalf("%+v", res)
	}
	// The session swaps its cached program for a script and makes the
	// entry's marker a FIFO.
	tamper := `cd "$TMPDIR/.quro-build"/* && rm main && printf '#!/bin/sh\necho pwned\n' > main && chmod +x main && rm .ok && mkfifo .ok`
	if res := runCode(t, a, RunCodeInput{Session: evil.ID, Lang: "sh", Code: tamper}); res.ExitCode != 0 {
		t.Fatalf("tamper: %+v", res)
	}
	// The server looks at the marker without opening it: not a regular
	// file, so not a cached build; the build runs again, cannot replace
	// the session's own entry, and the session runs what it planted.
	res := runCode(t, a, RunCodeInput{Session: evil.ID, Lang: "c", Code: hello})
	if res.Cached || res.Stdout != "pwned\n" {
		t.Fatalf("tampered session: %+v", res)
	}
	// Another session with the same source never sees it.
	res = runCode(t, a, RunCodeInput{Session: other.ID, Lang: "c", Code: hello})
	if res.Cached || res.Stdout != "honest\n" {
		t.Fatalf("other session: %+v", res)
	}

	// The cache made a symlink to / (the host's root as the server
	// would see it; the box's own root inside): the server's check goes
	// through os.Root and refuses it, the build in the box fails to
	// prepare it, and the host's / gets nothing.
	if res := runCode(t, a, RunCodeInput{Session: evil.ID, Lang: "sh", Code: `rm -rf "$TMPDIR/.quro-build" && ln -s / "$TMPDIR/.quro-build"`}); res.ExitCode != 0 {
		t.Fatalf("symlink: %+v", res)
	}
	before, _ := os.ReadDir("/")
	res = runCode(t, a, RunCodeInput{Session: evil.ID, Lang: "c", Code: hello})
	if res.Stage != "compile" || res.Cached || !strings.Contains(res.Error, "could not be prepared") {
		t.Fatalf("symlinked cache: %+v", res)
	}
	after, _ := os.ReadDir("/")
	if len(after) != len(before) {
		t.Errorf("the host's / changed: %d entries, then %d", len(before), len(after))
	}
}

// A session on a rootfs uses the rootfs's toolchains, not the host's: the
// shared test rootfs has perl but no gcc.
func TestToolchainInRootfs(t *testing.T) {
	t.Parallel()
	a := appOnRootfs(t, testRootfs(t))
	s := toolSession(t, a, session.CreateOptions{Rootfs: "default"})
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "perl", Code: "print \"perl in rootfs $^V\\n\";\n"})
	if res.Engine != "toolchain/perl" || !strings.HasPrefix(res.Stdout, "perl in rootfs v5.") || res.Toolchain == "" {
		t.Fatalf("perl: %+v", res)
	}
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: "int main(void) { return 0; }\n"})
	if res.Engine != "render/code" || !strings.Contains(res.Text(), `no gcc in the session's rootfs "default": install_packages gcc libc6-dev adds it`) {
		t.Fatalf("c in a rootfs without gcc: %+v\n%s", res, res.Text())
	}
}

// toolchainPackages are what the "toolchains" test rootfs adds to
// "default": a C compiler (libc6-dev is only gcc's recommendation).
var toolchainPackages = []string{"gcc", "libc6-dev"}

// toolchainsRootfs returns a manager of the shared test rootfs directory
// in which the rootfs "toolchains" is ready: "default" plus
// toolchainPackages (see rootfstest.Derived).
func toolchainsRootfs(t testing.TB) *rootfs.Manager {
	t.Helper()
	return rootfstest.Derived(t, "toolchains", toolchainPackages)
}

// A rootfs whose gcc was installed with apt compiles and runs C: the
// rootfs's gcc, not the host's (the version line is the rootfs's own
// probe), with the build cache in the session's tmp directory.
func TestToolchainCompilesInRootfs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the toolchains test rootfs on first use (apt-get install gcc: network, minutes)")
	}
	t.Parallel() // its own App on the shared rootfs, built under its lock
	a := appOnRootfs(t, toolchainsRootfs(t))
	s := toolSession(t, a, session.CreateOptions{Rootfs: "toolchains"})
	code := "#include <stdio.h>\nint main(void) {\n  FILE *f = fopen(\"/etc/debian_version\", \"r\");\n  char v[32] = \"\";\n  if (f) fgets(v, sizeof v, f);\n  printf(\"debian %s\", v);\n  return 0;\n}\n"
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: code})
	if res.Engine != "toolchain/gcc" || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "debian 12") || !strings.Contains(res.Toolchain, "gcc") {
		t.Fatalf("%+v", res)
	}
	if res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: code}); !res.Cached || !strings.HasPrefix(res.Stdout, "debian 12") {
		t.Fatalf("warm: %+v", res)
	}
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "c", Code: "int main(void) {\n\n  return nope;\n}\n"})
	if res.Stage != "compile" || !strings.Contains(res.Stderr, "main.c:3:10: error") {
		t.Fatalf("compile error: %+v", res)
	}
}
