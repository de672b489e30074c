package pip

import (
	"archive/zip"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestCheckRequirement(t *testing.T) {
	for _, ok := range []string{"numpy", "requests[socks]>=2.31,<3", "zope.interface", "a_b-c", "pkg==1.0.post1+local", "x ~= 1.2", "Pkg[a, b]", "x===1"} {
		if err := CheckRequirement(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-r x", "--index-url=http://x", "pkg @ file:///etc/passwd", "../x", "/x", "x/y", "x.whl", "foo.tar.gz", "x.tlz", "x.tar.lz", "x.TAR.LZMA", "x.tar.lzma",
		"pkg; python_version<'4'", "pkg==1 x", "pkg\n-r /etc/shadow", "pkg[", "pkg==", ".x", "x.", strings.Repeat("a", 10<<10), "pkg\x00"} {
		if err := CheckRequirement(bad); !errors.Is(err, ErrBadRequirement) {
			t.Errorf("%.40q accepted (%v)", bad, err)
		}
	}
	if err := CheckRequirements(make([]string, MaxRequirements+1)); !errors.Is(err, ErrBadRequirement) {
		t.Error("too many requirements accepted")
	}
	if err := CheckRequirements(nil); !errors.Is(err, ErrBadRequirement) {
		t.Error("no requirement accepted")
	}
}

// TestCacheAdd: a wheel is stored once by hash and linked by name; a file
// that is not a regular file with a wheel's name, or a different wheel
// under a cached name, is refused; tenants' caches are apart.
func TestCacheAdd(t *testing.T) {
	c := &Cache{Root: filepath.Join(t.TempDir(), "pip")}
	src := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	w := write("demo-1.0-py3-none-any.whl", "wheel one")
	a, err := c.Add("alice", w)
	if err != nil || !a.New || a.Size != 9 {
		t.Fatalf("add: %+v %v", a, err)
	}
	again, err := c.Add("alice", w)
	if err != nil || again.New || again.SHA256 != a.SHA256 {
		t.Fatalf("add again: %+v %v", again, err)
	}
	link, _ := os.Stat(filepath.Join(c.Wheels("alice"), "demo-1.0-py3-none-any.whl"))
	blob, _ := os.Stat(filepath.Join(filepath.Dir(c.Wheels("alice")), "by-hash", a.SHA256))
	if link == nil || blob == nil || !os.SameFile(link, blob) || link.Mode().Perm() != 0o644 {
		t.Fatalf("not linked to its hash: %v %v", link, blob)
	}
	// The same content under another name: one blob, two names.
	if _, err := c.Add("alice", write("demo-1.0-py3-none-manylinux1_x86_64.whl", "wheel one")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(filepath.Dir(c.Wheels("alice")), "by-hash")); len(ents) != 1 {
		t.Fatalf("by-hash holds %d files", len(ents))
	}
	other := filepath.Join(t.TempDir(), "demo-1.0-py3-none-any.whl")
	os.WriteFile(other, []byte("other content"), 0o600)
	if _, err := c.Add("alice", other); !errors.Is(err, ErrCacheConflict) {
		t.Fatalf("a different wheel under a cached name: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(c.Wheels("alice"), "demo-1.0-py3-none-any.whl")); !bytes.Equal(got, []byte("wheel one")) {
		t.Fatal("the cached wheel changed")
	}
	// Bob's cache is his own.
	if _, err := os.Lstat(filepath.Join(c.Wheels("bob"), "demo-1.0-py3-none-any.whl")); err == nil || c.Wheels("bob") == c.Wheels("alice") || c.Wheels("") == c.Wheels("local") {
		t.Fatal("tenants share a cache")
	}
	if d := c.Wheels("../../etc"); !strings.HasPrefix(d, c.Root+"/h-") {
		t.Fatalf("a tenant name left the root: %s", d)
	}
	// Not a wheel, a symlink, a directory, a FIFO.
	if _, err := c.Add("alice", write("setup.py", "x")); err == nil {
		t.Error("a non-wheel name was added")
	}
	ln := filepath.Join(src, "evil-1.0-py3-none-any.whl")
	os.Symlink("/etc/shadow", ln)
	if _, err := c.Add("alice", ln); err == nil {
		t.Error("a symlink was followed")
	}
	dir := filepath.Join(t.TempDir(), "dir-1.0-py3-none-any.whl")
	os.Mkdir(dir, 0o755)
	if _, err := c.Add("alice", dir); err == nil {
		t.Error("a directory was added")
	}
}

// TestArchiveExtensionsArePips: every archive extension of the pip the
// sessions run (pip/_internal/utils/filetypes.py in the pinned wheel) is
// refused as a requirement, which pip would take as a file.
func TestArchiveExtensionsArePips(t *testing.T) {
	whls, _ := filepath.Glob("../engine/python/pipwheel/pip-*.whl")
	if len(whls) != 1 {
		t.Fatalf("pip wheels: %v", whls)
	}
	z, err := zip.OpenReader(whls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	f, err := z.Open("pip/_internal/utils/filetypes.py")
	if err != nil {
		t.Fatal(err)
	}
	src, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	exts := regexp.MustCompile(`"(\.[a-z0-9.]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(exts) < 12 {
		t.Fatalf("only %d extensions in filetypes.py:\n%s", len(exts), src)
	}
	for _, e := range exts {
		for _, name := range []string{"pkg" + e[1], "Pkg" + strings.ToUpper(e[1])} {
			if err := CheckRequirement(name); !errors.Is(err, ErrBadRequirement) || !strings.Contains(err.Error(), "names a file") {
				t.Errorf("%q accepted (%v)", name, err)
			}
		}
	}
}

func TestDiagnose(t *testing.T) {
	const none = "ERROR: Could not find a version that satisfies the requirement x (from versions: none)\nERROR: No matching distribution found for x\n"
	for _, tc := range []struct{ out, want string }{
		{none, NotOnIndex},
		{"WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(...: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/x/\n" + none, Unreachable},
		{"WARNING: Retrying ... after connection broken by 'ProxyError('Cannot connect to proxy.', ...)': /simple/x/\n" + none, Unreachable},
		{"ERROR: Invalid requirement: 'x=='\n", ""},
	} {
		if got := Diagnose(tc.out); got != tc.want {
			t.Errorf("Diagnose(%q) = %q, want %q", tc.out, got, tc.want)
		}
	}
}
