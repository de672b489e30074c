package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLookPathInRoot builds a rootfs laid out as Debian's (usr/bin/bash
// → /etc/alternatives/bash → /usr/lib/x/bash-real, absolute links) with
// links that leave it, and checks that a program is found the way the box
// finds it and that no link leads out to the host.
func TestLookPathInRoot(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/lib/x/bash-real", 0o755)
	ln("/usr/lib/x/bash-real", "etc/alternatives/bash")
	ln("/etc/alternatives/bash", "usr/bin/bash")
	mk("usr/share/doc/readme", 0o644)
	ln("/usr/share/doc/readme", "usr/bin/notexec")
	// Escapes: "../../../../.." stops at the rootfs's top, an absolute
	// link to a host program names the rootfs's (missing) one.
	ln("../../../../../../bin/sh", "usr/bin/up")
	ln("/bin/sh", "usr/local/bin/hostsh")
	ln("/proc/self/exe", "usr/bin/magic")
	// usr -> / : the rootfs's own top, never the host's /usr.
	esc := filepath.Join(t.TempDir(), "esc")
	if err := os.MkdirAll(esc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(esc, "usr")); err != nil {
		t.Fatal(err)
	}

	if p, ok := LookPath(dir, "bash"); !ok || p != "/usr/bin/bash" {
		t.Errorf("bash: got %q %v, want /usr/bin/bash through the absolute /etc/alternatives links", p, ok)
	}
	if p, ok := LookPath(dir, "nope", "/usr/lib/x/bash-real"); !ok || p != "/usr/lib/x/bash-real" {
		t.Errorf("absolute alternative: got %q %v", p, ok)
	}
	for _, n := range []string{"notexec", "up", "hostsh", "magic", "../lib/x/bash-real", "sh"} {
		if p, ok := LookPath(dir, n); ok {
			t.Errorf("%s: found %q, want not found (the host's programs are not the rootfs's)", n, p)
		}
	}
	if _, err := os.Stat("/usr/bin/env"); err == nil {
		if p, ok := LookPath(esc, "env"); ok {
			t.Errorf("usr -> /: found %q, the host's /usr/bin/env", p)
		}
		if Executable(esc, "/usr/bin/env") {
			t.Error("usr -> /: /usr/bin/env is the host's")
		}
	}
	if fi, err := Stat(dir, "/usr/bin/bash"); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("Stat follows the links to the file: %v %v", fi, err)
	}
}
