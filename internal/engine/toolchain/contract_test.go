package toolchain_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/engine/toolchain"
	"github.com/quro-dev/quro/internal/engine/toolchain/toolchaintest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// contractCaps are the contract's snippets of each toolchain language
// that could be checked on a machine with its toolchain (see
// TestContract for the others). Each snippet is a whole program, built
// and run by the engine as a caller's code is.
//
// Every toolchain run is a fresh process (stateless). A compiled program
// has no variable a next run could see, so SetVar and GetVar use what a
// process does have that could leak between runs if the engine ran them
// in one process or reused a build: its environment (C, C++, Go, Rust)
// or a JVM system property (Java); the interpreted languages use a
// global variable, as the Python and shell engines do.
//
// Loop waits (sleep, pause) after its line instead of spinning, as the
// shell engine's does: the timeout and the cancel stop a program that
// waits as they stop one that computes (the run's process group is
// killed), and a spinning loop burned a core for the whole of the timeout
// check's budget (10 s, Java's 15 s), per language, in every make test.
// Lua has no sleep of its own: it waits on a sleep(1) in its process
// group.
var contractCaps = map[string]enginetest.Caps{
	"c": {
		Print:      "#include <stdio.h>\nint main(void) { puts(\"contract-out\"); fputs(\"contract-err\\n\", stderr); return 0; }\n",
		Exit:       "#include <stdio.h>\nint main(void) { puts(\"bye\"); return 3; }\n",
		ExitCode:   3,
		Loop:       "#include <stdio.h>\n#include <unistd.h>\nint main(void) { puts(\"before-loop\"); fflush(stdout); for (;;) pause(); }\n",
		Huge:       "#include <stdio.h>\nint main(void) { for (int i = 0; i < 100000; i++) printf(\"%d\\n\", i); return 0; }\n",
		BadUTF8:    "#include <stdio.h>\nint main(void) { fputs(\"a\\xff\\xfe\" \"b\\n\", stdout); return 0; }\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "#include <stdlib.h>\nint main(void) { return setenv(\"X\", \"42\", 1); }\n",
		GetVar:     "#include <stdio.h>\n#include <stdlib.h>\nint main(void) { const char *x = getenv(\"X\"); puts(x ? x : \"unset\"); return 0; }\n",
	},
	"cpp": {
		Print:      "#include <iostream>\nint main() { std::cout << \"contract-out\\n\"; std::cerr << \"contract-err\\n\"; }\n",
		Exit:       "#include <iostream>\nint main() { std::cout << \"bye\\n\"; return 3; }\n",
		ExitCode:   3,
		Loop:       "#include <iostream>\n#include <unistd.h>\nint main() { std::cout << \"before-loop\" << std::endl; for (;;) pause(); }\n",
		Huge:       "#include <iostream>\nint main() { for (int i = 0; i < 100000; i++) std::cout << i << '\\n'; }\n",
		BadUTF8:    "#include <iostream>\nint main() { std::cout << \"a\\xff\\xfe\" \"b\\n\"; }\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "#include <cstdlib>\nint main() { return setenv(\"X\", \"42\", 1); }\n",
		GetVar:     "#include <cstdlib>\n#include <iostream>\nint main() { const char *x = std::getenv(\"X\"); std::cout << (x ? x : \"unset\") << '\\n'; }\n",
	},
	"go": {
		Print:      "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"contract-out\")\n\tfmt.Fprintln(os.Stderr, \"contract-err\")\n}\n",
		Exit:       "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"bye\")\n\tos.Exit(3)\n}\n",
		ExitCode:   3,
		Loop:       "package main\n\nimport (\n\t\"fmt\"\n\t\"time\"\n)\n\nfunc main() {\n\tfmt.Println(\"before-loop\")\n\tfor {\n\t\ttime.Sleep(time.Hour)\n\t}\n}\n",
		Huge:       "package main\n\nimport (\n\t\"bufio\"\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tw := bufio.NewWriter(os.Stdout)\n\tdefer w.Flush()\n\tfor i := 0; i < 100000; i++ {\n\t\tfmt.Fprintln(w, i)\n\t}\n}\n",
		BadUTF8:    "package main\n\nimport \"os\"\n\nfunc main() {\n\tos.Stdout.WriteString(\"a\\xff\\xfeb\\n\")\n}\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "package main\n\nimport \"os\"\n\nfunc main() {\n\tos.Setenv(\"X\", \"42\")\n}\n",
		GetVar:     "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tx, ok := os.LookupEnv(\"X\")\n\tif !ok {\n\t\tx = \"unset\"\n\t}\n\tfmt.Println(x)\n}\n",
	},
	"rust": {
		Print:      "fn main() {\n    println!(\"contract-out\");\n    eprintln!(\"contract-err\");\n}\n",
		Exit:       "fn main() {\n    println!(\"bye\");\n    std::process::exit(3);\n}\n",
		ExitCode:   3,
		Loop:       "fn main() {\n    println!(\"before-loop\");\n    loop {\n        std::thread::sleep(std::time::Duration::from_secs(3600));\n    }\n}\n",
		Huge:       "use std::io::Write;\n\nfn main() {\n    let mut w = std::io::BufWriter::new(std::io::stdout().lock());\n    for i in 0..100000 {\n        writeln!(w, \"{}\", i).unwrap();\n    }\n}\n",
		BadUTF8:    "use std::io::Write;\n\nfn main() {\n    std::io::stdout().write_all(b\"a\\xff\\xfeb\\n\").unwrap();\n}\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "fn main() {\n    std::env::set_var(\"X\", \"42\");\n}\n",
		GetVar:     "fn main() {\n    println!(\"{}\", std::env::var(\"X\").unwrap_or_else(|_| \"unset\".to_string()));\n}\n",
	},
	"java": {
		Print:    "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"contract-out\");\n        System.err.println(\"contract-err\");\n    }\n}\n",
		Exit:     "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"bye\");\n        System.exit(3);\n    }\n}\n",
		ExitCode: 3,
		Loop:     "public class Main {\n    public static void main(String[] args) throws InterruptedException {\n        System.out.println(\"before-loop\");\n        System.out.flush();\n        while (true) {\n            Thread.sleep(3600000);\n        }\n    }\n}\n",
		// Each run is a JVM of its own, whose start alone can take the
		// default 3 s on a loaded machine.
		LoopTimeout: 15 * time.Second,
		Huge:        "public class Main {\n    public static void main(String[] args) {\n        StringBuilder b = new StringBuilder();\n        for (int i = 0; i < 100000; i++) {\n            b.append(i).append('\\n');\n        }\n        System.out.print(b);\n        System.out.flush();\n    }\n}\n",
		BadUTF8:     "public class Main {\n    public static void main(String[] args) {\n        System.out.write(new byte[] {'a', (byte) 0xff, (byte) 0xfe, 'b', '\\n'}, 0, 5);\n        System.out.flush();\n    }\n}\n",
		BadUTF8Raw:  []byte("a\xff\xfeb\n"),
		SetVar:      "public class Main {\n    public static void main(String[] args) {\n        System.setProperty(\"x\", \"42\");\n    }\n}\n",
		GetVar:      "public class Main {\n    public static void main(String[] args) {\n        System.out.println(System.getProperty(\"x\", \"unset\"));\n    }\n}\n",
	},
	"ruby": {
		Print:      "puts \"contract-out\"\n$stderr.puts \"contract-err\"\n",
		Exit:       "puts \"bye\"\nexit 3\n",
		ExitCode:   3,
		Loop:       "puts \"before-loop\"\n$stdout.flush\nloop { sleep }\n",
		Huge:       "100000.times { |i| puts i }\n",
		BadUTF8:    "$stdout.write(\"a\\xff\\xfeb\\n\".b)\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "$x = 42\n",
		GetVar:     "puts($x.nil? ? \"unset\" : $x)\n",
	},
	"perl": {
		Print:      "print \"contract-out\\n\";\nprint STDERR \"contract-err\\n\";\n",
		Exit:       "print \"bye\\n\";\nexit 3;\n",
		ExitCode:   3,
		Loop:       "$| = 1;\nprint \"before-loop\\n\";\nsleep 3600 while 1;\n",
		Huge:       "print \"$_\\n\" for 0 .. 99999;\n",
		BadUTF8:    "print \"a\\xff\\xfeb\\n\";\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "our $x = 42;\n",
		GetVar:     "print defined($main::x) ? \"$main::x\\n\" : \"unset\\n\";\n",
	},
	"php": {
		Print:      "<?php\necho \"contract-out\\n\";\nfwrite(STDERR, \"contract-err\\n\");\n",
		Exit:       "<?php\necho \"bye\\n\";\nexit(3);\n",
		ExitCode:   3,
		Loop:       "<?php\necho \"before-loop\\n\";\nflush();\nwhile (true) {\n    sleep(3600);\n}\n",
		Huge:       "<?php\nfor ($i = 0; $i < 100000; $i++) {\n    echo \"$i\\n\";\n}\n",
		BadUTF8:    "<?php\necho \"a\\xff\\xfeb\\n\";\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "<?php\n$x = 42;\n",
		GetVar:     "<?php\necho isset($x) ? \"$x\\n\" : \"unset\\n\";\n",
	},
	"lua": {
		Print:      "io.write(\"contract-out\\n\")\nio.stderr:write(\"contract-err\\n\")\n",
		Exit:       "io.write(\"bye\\n\")\nos.exit(3)\n",
		ExitCode:   3,
		Loop:       "io.write(\"before-loop\\n\")\nio.stdout:flush()\nwhile true do os.execute(\"sleep 3600\") end\n",
		Huge:       "for i = 0, 99999 do io.write(i, \"\\n\") end\n",
		BadUTF8:    "io.write(\"a\\xff\\xfeb\\n\")\n",
		BadUTF8Raw: []byte("a\xff\xfeb\n"),
		SetVar:     "x = 42\n",
		GetVar:     "print(x or \"unset\")\n",
	},
}

// inTestPkgs are the toolchains of the Makefile's TEST_PKGS: every
// machine make test runs on has them, so their absence fails the suite
// instead of skipping it (enginetest.Target.Required).
var inTestPkgs = map[string]bool{"c": true, "cpp": true, "ruby": true, "php": true, "lua": true}

// TestContract runs the run_code engine contract over every toolchain
// language whose toolchain this machine's userland has, in sessions on
// the host's userland. A language whose toolchain is absent is skipped
// with the engine's own word on what is missing and how to add it; one
// whose toolchain is here but has no snippets in contractCaps fails, so
// that a toolchain is never counted as checked when it was not.
func TestContract(t *testing.T) {
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range toolchain.Tools {
		tool := &toolchain.Tools[i]
		t.Run(tool.Lang, func(t *testing.T) {
			// The toolchains' suites are independent and mostly wait
			// on compilers and boxes: side by side (go test -parallel).
			t.Parallel()
			e := toolchain.New(sb, nil, tool)
			// The engine's Probe is always nil (whether it runs depends
			// on the session's userland); these sessions are on the
			// host's, which HostProbe looks at.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := e.HostProbe(ctx)
			cancel()
			if err != nil {
				if inTestPkgs[tool.Lang] {
					t.Fatalf("%s: the Makefile's TEST_PKGS has this toolchain, but: %v", e.Name(), err)
				}
				t.Skipf("%s: toolchain absent here: %v", e.Name(), err)
			}
			caps, ok := contractCaps[tool.Lang]
			if !ok {
				t.Fatalf("%s: this machine has the toolchain, but contractCaps has no snippets for %s: declare them", e.Name(), tool.Lang)
			}
			caps.Lang = tool.Lang
			// A build (the JVM compilers start slowly; Go's links with
			// a warm cache) gets more than run_code's default minute on
			// a loaded machine: the longest a server accepts. It bounds
			// a failure, it is not waited out. Each check's own run
			// budget is unchanged. Go's cold build has its own budget
			// (warmGoSessions).
			caps.CompileTimeout = 10 * time.Minute
			// Each run of a toolchain's program is a process (and for
			// the interpreters, an interpreter start) in a fresh box: at
			// a load of 30 on 2 cores Ruby's start passed the default
			// 3 s before its loop printed.
			caps.LoopTimeout = max(caps.LoopTimeout, 10*time.Second)
			newSess, built := newSession, []*session.Session(nil)
			if tool.Lang == "go" {
				var warm *session.Session
				newSess, warm = warmGoSessions(t, e, caps)
				built = append(built, warm)
			}
			enginetest.Run(t, enginetest.Target{Engine: e, NewSession: sharedBuilds(t, newSess, built...), Required: true}, caps)
		})
	}
}

// warmGoSessions returns the suite's NewSession for Go, and the session
// of the first build (whose build cache holds caps.Print): a session whose
// Go build cache ($TMPDIR/.cache/go-build, the Tool's GOCACHE) is a copy
// of one a first build of caps.Print filled. Each of the suite's sessions
// would otherwise compile the standard library anew (a minute each on a
// loaded 2-core machine, nine of them): the builds are still real builds
// by the engine, in the box, of the checks' own code. In make test the
// first build is cold here or in internal/app's TestToolchainGoAndJava,
// whichever takes the shared cache first (toolchaintest).
func warmGoSessions(t *testing.T, e *toolchain.Engine, caps enginetest.Caps) (func(*testing.T) *session.Session, *session.Session) {
	t.Helper()
	warm := newSession(t)
	// The cold build compiles some 50 packages of the standard library:
	// ~30 s idle, and past 10 minutes at a load of 60 on 2 cores. Its
	// budget is what the test binary has left (go test -timeout) but a
	// margin for the checks, at least 10 minutes: a bound on a failure.
	budget := 10 * time.Minute
	if d, ok := t.Deadline(); ok {
		budget = max(budget, time.Until(d)-5*time.Minute)
	}
	r := runcode.New([]runcode.Language{{Name: caps.Lang, Runs: true, Chain: []runcode.Engine{e}}}, &runcode.Options{MaxTimeout: budget})
	cache := filepath.Join(warm.TmpDir(), ".cache", "go-build")
	// In make test, the cold build is this one or internal/app's
	// TestToolchainGoAndJava's, whichever comes first (toolchaintest).
	toolchaintest.SharedGoCache(t, cache, -1, func() bool {
		res, err := r.Run(context.Background(), runcode.Input{Code: caps.Print, Lang: caps.Lang, Session: warm, CompileTimeout: budget})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "contract-out\n" || res.Stage != "run" {
			t.Fatalf("the build that warms the Go cache: engine %s stage %s exit %d error %q stdout %q stderr %q",
				res.Engine, res.Stage, res.ExitCode, res.Error, res.Stdout, res.Stderr)
		}
		return true
	})
	return func(t *testing.T) *session.Session {
		s := newSession(t)
		if err := os.CopyFS(filepath.Join(s.TmpDir(), ".cache", "go-build"), os.DirFS(cache)); err != nil {
			t.Fatalf("copying the warm Go cache: %v", err)
		}
		return s
	}, warm
}

// sharedBuilds returns a language's NewSession for the suite: newSess's
// session, whose build cache (toolchain.CacheDir) starts with a copy of
// the entries the language's earlier sessions built. The suite makes a
// fresh session for each check, and runs some snippets in several: Print
// in "output" and as the warm-up of "timeout" and "cancel", Loop in
// those two, GetVar in both sessions of "state". Each was compiled again
// in each session (a JVM's javac, a rustc, a go build: 11 builds of 7
// sources a language). Now each source is built once, by the engine in
// the box, and its later runs take the engine's cached path, as a
// session's second run of the same code does; every check still runs
// its program, in its own session, and checks the same result. The
// entries are copied before the session's first run, which hands its
// tmp directory, copies included, to the session's uid; an entry is one
// only with its .ok (a build the deadline killed left none). The
// entries of built, sessions of the language's own (Go's first build,
// warmGoSessions), are shared as well.
func sharedBuilds(t *testing.T, newSess func(*testing.T) *session.Session, built ...*session.Session) func(*testing.T) *session.Session {
	t.Helper()
	pool := t.TempDir()
	var mu sync.Mutex
	live := map[*session.Session]bool{}
	for _, s := range built {
		live[s] = true
	}
	return func(st *testing.T) *session.Session {
		s := newSess(st)
		mu.Lock()
		defer mu.Unlock()
		for l := range live {
			copyEntries(st, filepath.Join(l.TmpDir(), toolchain.CacheDir), pool)
		}
		copyEntries(st, pool, filepath.Join(s.TmpDir(), toolchain.CacheDir))
		live[s] = true
		// Before the session's directory goes (its t.TempDir's removal,
		// registered earlier, runs later).
		st.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			copyEntries(st, filepath.Join(s.TmpDir(), toolchain.CacheDir), pool)
			delete(live, s)
		})
		return s
	}
}

// copyEntries copies to dst each complete build cache entry of src that
// dst does not have.
func copyEntries(t *testing.T, src, dst string) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatalf("the build cache %s: %v", src, err)
	}
	for _, ent := range ents {
		name := ent.Name()
		if strings.HasPrefix(name, ".") || !ent.IsDir() {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(src, name, ".ok")); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dst, name)); err == nil {
			continue
		}
		if err := os.CopyFS(filepath.Join(dst, name), os.DirFS(filepath.Join(src, name))); err != nil {
			t.Fatalf("copying the build of %s: %v", name, err)
		}
	}
}

func newSession(t *testing.T) *session.Session {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	s := &session.Session{ID: "t" + hex.EncodeToString(b[:]), Dir: filepath.Join(t.TempDir(), "session")}
	for _, d := range []string{s.Workspace(), s.TmpDir(), s.OutputsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}
