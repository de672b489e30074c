package toolchain

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// A rootfs is searched through os.Root: its symlinks resolve as the box
// sees them (an absolute target is taken inside the rootfs, as Debian's
// /etc/alternatives links are), and never to a file of the host.
func TestFindInRootfs(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string, mode os.FileMode) {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/lib/jvm/jdk/bin/javac", 0o755)
	ln("/etc/alternatives/javac", "usr/bin/javac")
	ln("/usr/lib/jvm/jdk/bin/javac", "etc/alternatives/javac")
	mk("usr/bin/gcc-12", 0o755)
	ln("gcc-12", "usr/bin/gcc")
	mk("usr/bin/ruby", 0o644) // not executable
	// Links that would reach the host's programs if followed on the host.
	ln("/usr/bin/perl", "usr/local/bin/perl")                      // the host has /usr/bin/perl; the rootfs has none
	ln("../../../../../../../../../usr/bin/perl", "usr/bin/perlx") // escapes upwards
	ln(filepath.Join(dir, "usr/bin/gcc-12"), "usr/bin/gccabs")     // the rootfs's own file by its host path
	if _, err := os.Stat("/usr/bin/perl"); err != nil {
		t.Skip("the host has no /usr/bin/perl to be reached")
	}

	e := New(&sandbox.Sandbox{}, nil, &Tool{Lang: "x", Prog: "x", Package: "x"})
	u := userland{name: "t", dir: dir}
	for prog, want := range map[string]string{
		"javac": "/usr/bin/javac", "gcc": "/usr/bin/gcc",
		"ruby": "", "perl": "", "perlx": "", "gccabs": "", "missing": "",
	} {
		got, err := e.find(u, prog, nil)
		if want == "" {
			if err == nil {
				t.Errorf("%s: found %s, want not found", prog, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", prog, got, err, want)
		}
	}
	// Absolute alternatives are looked up inside the rootfs as well.
	if got, err := e.find(u, "nothing", []string{"/usr/lib/jvm/jdk/bin/javac"}); err != nil || got != "/usr/lib/jvm/jdk/bin/javac" {
		t.Errorf("alt: %q %v", got, err)
	}
	if !e.has(u, "/usr/lib/jvm/*/bin/javac") || e.has(u, "/usr/lib/gcc/*/*/cc1obj") {
		t.Error("has: globs in the rootfs are wrong")
	}
}

// On the host, an absolute alternative counts only under /usr (what every
// box shows).
func TestFindOnHostOnlyUnderUsr(t *testing.T) {
	sh, err := os.Readlink("/proc/self/exe")
	if err != nil || strings.HasPrefix(sh, "/usr/") {
		t.Skip("the test binary is under /usr")
	}
	e := New(&sandbox.Sandbox{}, nil, &Tool{Lang: "x", Prog: "x", Package: "x"})
	if got, err := e.find(userland{}, "no-such-program-here", []string{sh}); err == nil {
		t.Errorf("found %s outside /usr", got)
	}
}

func TestMissingNamesThePackage(t *testing.T) {
	var c *Tool
	for i := range Tools {
		if Tools[i].Lang == "c" {
			c = &Tools[i]
		}
	}
	e := New(nil, nil, c)
	if got := e.missing(userland{}, "gcc").Error(); got != "no gcc in this server's userland: apt-get install gcc libc6-dev on the host, or a session on a rootfs with install_packages gcc libc6-dev" {
		t.Error(got)
	}
	if got := e.missing(userland{name: "deb", dir: "/x"}, "gcc").Error(); got != `no gcc in the session's rootfs "deb": install_packages gcc libc6-dev adds it` {
		t.Error(got)
	}
	for _, tl := range Tools {
		if (tl.Package == "") == (tl.Missing == "") {
			t.Errorf("%s: exactly one of Package and Missing must say how to get the toolchain", tl.Lang)
		}
	}
}

func TestJavaNames(t *testing.T) {
	for src, want := range map[string][2]string{
		"public class Hello { }":                                {"Hello.java", "Hello"},
		"import x;\npublic final class A {}\nclass B {}":        {"A.java", "A"},
		"class Solo { public static void main(String[] a) {} }": {"Main.java", "Solo"},
		"interface I {}":                                        {"Main.java", "Main"},
	} {
		f, c := javaNames(src)
		if f != want[0] || c != want[1] {
			t.Errorf("%q: %s %s, want %v", src, f, c, want)
		}
	}
}
