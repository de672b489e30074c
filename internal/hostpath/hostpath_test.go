package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"cgroup memory.max: write /sys/fs/cgroup/memory/a/quro/tenant-1/run-2/memory.max: invalid argument",
			"cgroup memory.max: write memory.max: invalid argument"},
		{"/usr/bin/bwrap: new user, pid", "bwrap: new user, pid"},
		{"made under /sys/fs/cgroup/memory/x/quro", "made under quro"},
		{"debootstrap --cache-dir=/var/lib/quro/rootfs/.cache/bookworm bookworm /var/lib/quro/rootfs/.default.partial http://deb.debian.org/debian",
			"debootstrap --cache-dir=bookworm bookworm .default.partial http://deb.debian.org/debian"},
		{`chroot "/var/lib/quro/rootfs/.default.partial" dpkg`, `chroot ".default.partial" dpkg`},
		{"(mkdir /data/x/: permission denied)", "(mkdir x: permission denied)"},
		{"a / b, n/a, 1/2, tenant acme/x", "a / b, n/a, 1/2, tenant acme/x"},
		{"no path here", "no path here"},
		{"PATH=/usr/bin:/root/.cache/quro/python/bin", "PATH=bin:bin"},
		{"open file:/var/lib/quro/x {/var/lib/quro/y}", "open file:x {y}"},
		{"fetch https://example.org/a/b and scp host:/srv/a", "fetch https://example.org/a/b and scp host:a"},
		{"(x)/2 a.b/c ~/x $HOME/x http://h:80/p?q=/x", "(x)/2 a.b/c ~/x $HOME/x http://h:80/p?q=x"},
	} {
		if got := Names(tc.in); got != tc.want {
			t.Errorf("Names(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// Attack: a host path in the shapes real tools print it, after the
// characters a narrower notion of a path's start let through whole. Each
// must come out as its last element, the data directory gone.
func TestNamesCutsPathsAsToolsPrintThem(t *testing.T) {
	const d = "/srv/quro-data/python/3.12"
	for _, tc := range []struct{ name, in, want string }{
		{"pipe", "a|" + d + "/lib|b", "a|lib|b"},
		{"at (npm, pip's name @ path)", "foo@" + d + "/pkg", "foo@pkg"},
		{"pip direct reference", "foo @ file://" + d + "/foo-1.0.whl", "foo @ file://foo-1.0.whl"},
		{"file URL", "Processing file://" + d + "/x.whl (from -r req.txt)", "Processing file://x.whl (from -r req.txt)"},
		{"git+file URL", "git+file://" + d + "/repo.git@main", "git+file://repo.git@main"},
		{"FILE URL in capitals", "FILE://" + d + "/a", "FILE://a"},
		{"semicolon", "PYTHONPATH=x;" + d + "/site;" + d + "/lib", "PYTHONPATH=x;site;lib"},
		{"bang (npm ERR!)", "npm ERR!" + d + "/node_modules", "npm ERR!node_modules"},
		{"carriage return (pip's progress)", "\r" + d + "/a\r" + d + "/b\r", "\ra\rb\r"},
		{"single Unicode quotes (gcc)", "fatal error: ‘" + d + "/x.h’: No such file", "fatal error: ‘x.h’: No such file"},
		{"double Unicode quotes", "“" + d + "/x”", "“x”"},
		{"guillemets", "«" + d + "/x»", "«x»"},
		{"redirection", "2>" + d + "/log", "2>log"},
		{"compiler include option", "gcc -I" + d + "/include/python3.12 -L" + d + "/lib -c x.c", "gcc -Ipython3.12 -Llib -c x.c"},
		{"compiler long option", "-isystem" + d + "/inc", "-isysteminc"},
		{"rpath list", "-Wl,-rpath," + d + "/lib", "-Wl,-rpath,lib"},
		{"Python traceback", "  File \"" + d + "/lib/m.py\", line 3, in <module>", "  File \"m.py\", line 3, in <module>"},
		{"compiler diagnostic", d + "/x.c:3:5: error: y", "x.c:3:5: error: y"},
		{"npm path line", "npm ERR! path " + d + "/node_modules/.bin", "npm ERR! path .bin"},
		{"node error", "Error: ENOENT: no such file or directory, open '" + d + "/a.json'", "Error: ENOENT: no such file or directory, open 'a.json'"},
		{"pip OSError", "[Errno 13] Permission denied: '" + d + "/site'", "[Errno 13] Permission denied: 'site'"},
		{"tab and vertical space", "\t" + d + "/a\v" + d + "/b\f", "\ta\vb\f"},
		{"non-breaking space", "in\u00a0" + d + "/a", "in\u00a0a"},
		{"Unicode arrow", "→" + d + "/a", "→a"},
		{"less than", "<" + d + "/a>", "<a>"},
		{"NUL", "x\x00" + d + "/a\x00", "x\x00a\x00"},
	} {
		got := Names(tc.in)
		if got != tc.want {
			t.Errorf("%s: Names(%q)\n = %q\nwant %q", tc.name, tc.in, got, tc.want)
		}
		if strings.Contains(got, "quro-data") {
			t.Errorf("%s: the data directory is left in %q", tc.name, got)
		}
	}
}

// FuzzNames: a host path put in any text, after a character that does not
// continue a word and before one that ends a path, never comes out.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"", " ", "|", "@", ";", "!", "\r", "‘", "’", "“", "”", "«", "»", "file://", "x:", "-I", "=", "(", "é", "\xff"} {
		f.Add(s, "")
		f.Add("a"+s, s+"b")
	}
	const host = "/srv/quro-data/sessions/s1/name"
	f.Fuzz(func(t *testing.T, before, after string) {
		if strings.Contains(before+after, "quro-data") {
			return
		}
		r, _ := utf8.DecodeLastRuneInString(before)
		if inWord(r) && !option(before) && !fileURL(before) {
			return // continues a word: not the start of a path
		}
		if strings.HasSuffix(before, ":") && !fileURL(before) {
			before += " " // not "://"
		}
		if after != "" && pathLen("/"+after) > 1 {
			return // the path would go on into after
		}
		in := before + host + after
		out := Names(in)
		if strings.Contains(out, "quro-data") {
			t.Fatalf("Names(%q) = %q: the host path is left", in, out)
		}
		if again := Names(out); again != out {
			t.Fatalf("Names is not idempotent on %q: %q then %q", in, out, again)
		}
	})
}

func TestHome(t *testing.T) {
	const ws = "/var/lib/quro/sessions/ab/workspace"
	for _, tc := range []struct{ in, want string }{
		{ws, "/home/user"},
		{ws + "/stats", "/home/user/stats"},
		{ws + "x/y", ws + "x/y"},
		{"/tmp", "/tmp"},
	} {
		if got := InHome(ws, tc.in); got != tc.want {
			t.Errorf("InHome(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if tc.want != tc.in {
			if back := FromHome(ws, tc.want); back != tc.in {
				t.Errorf("FromHome(%q) = %q, want %q", tc.want, back, tc.in)
			}
		}
	}
	if got := FromHome(ws, "/home/username"); got != "/home/username" {
		t.Errorf("FromHome(/home/username) = %q", got)
	}
	for _, tc := range []struct{ in, want string }{
		{ws + "\n", "/home/user\n"},
		{"cd " + ws + "/a: no such file", "cd /home/user/a: no such file"},
		{`File "` + ws + `/m.py", line 1`, `File "/home/user/m.py", line 1`},
		{ws + "2/a " + ws, ws + "2/a /home/user"},
		{"nothing", "nothing"},
	} {
		if got := HomeText(ws, tc.in); got != tc.want {
			t.Errorf("HomeText(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// Error keeps the whole text for the server's log; Tenant, what a tenant
// reads, names no host path, however the marked error was wrapped;
// errors.Is still sees the error.
func TestError(t *testing.T) {
	_, err := os.Open("/root/.cache/quro/python/missing")
	h := Error(err)
	if got := h.Error(); got != "open /root/.cache/quro/python/missing: no such file or directory" {
		t.Errorf("Error: %q", got)
	}
	if got := Tenant(h); got != "open missing: no such file or directory" {
		t.Errorf("Tenant: %q", got)
	}
	if !errors.Is(h, fs.ErrNotExist) {
		t.Errorf("errors.Is lost the cause: %v", h)
	}
	wrapped := fmt.Errorf("pip needs the preparation at /home/user/x: %w", h)
	if got := Tenant(wrapped); got != "pip needs the preparation at /home/user/x: open missing: no such file or directory" {
		t.Errorf("Tenant of a wrapper: %q (the wrapper's own text stays whole)", got)
	}
	if got := Tenant(errors.Join(errors.New("first"), wrapped)); got != "first\npip needs the preparation at /home/user/x: open missing: no such file or directory" {
		t.Errorf("Tenant of a join: %q", got)
	}
	if got := Tenant(rewrote{h}); strings.Contains(got, "/root") {
		t.Errorf("Tenant of a wrapper that rewrote the text: %q", got)
	}
	if plain := errors.New("open /etc/x"); Tenant(plain) != plain.Error() {
		t.Errorf("Tenant changed an unmarked error: %q", Tenant(plain))
	}
	if Error(nil) != nil || Tenant(nil) != "" {
		t.Error("Error(nil) is not nil")
	}
}

// rewrote wraps an error and quotes its text rather than holding it.
type rewrote struct{ err error }

func (r rewrote) Error() string { return strconv.Quote(r.err.Error()) }
func (r rewrote) Unwrap() error { return r.err }
