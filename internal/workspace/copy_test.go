package workspace

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Where the filesystem clones (XFS with reflink, in a loop image here),
// copyTree clones each file instead of copying its bytes; the clone is
// its own (a write to it leaves the source as it was) and the byte budget
// still holds.
func TestCopyTreeClonesWhereItCan(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an XFS image needs root")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("no mkfs.xfs (apt-get install xfsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "x.img"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o700)
	for _, c := range [][]string{{"truncate", "-s", "320M", img}, {"mkfs.xfs", "-q", "-m", "reflink=1", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Skipf("%v: %v %s", c, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	src, dst := filepath.Join(mnt, "src"), filepath.Join(mnt, "dst")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.Mkdir(dst, 0o700)
	os.WriteFile(filepath.Join(src, "a"), []byte(strings.Repeat("a", 1<<20)), 0o644)
	os.WriteFile(filepath.Join(src, "sub", "b"), []byte("bbb"), 0o600)
	st, err := CopyTree(context.Background(), src, dst, CopyOptions{UID: -1, Budget: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.Reflinked != 2 || st.Bytes != 1<<20+3 {
		t.Fatalf("%+v", st)
	}
	os.WriteFile(filepath.Join(dst, "a"), []byte("changed"), 0o644)
	if b, _ := os.ReadFile(filepath.Join(src, "a")); len(b) != 1<<20 {
		t.Fatal("a write to the clone changed the source")
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "b")); string(b) != "bbb" {
		t.Fatalf("sub/b: %q", b)
	}
	dst2 := filepath.Join(mnt, "dst2")
	os.Mkdir(dst2, 0o700)
	if _, err := CopyTree(context.Background(), src, dst2, CopyOptions{UID: -1, Budget: 1 << 19}); !errors.Is(err, ErrBudget) {
		t.Fatalf("a clone past the budget: %v", err)
	}
}

// A program the server starts while a copy is under way (any goroutine's:
// another session's box, a helper) inherits no descriptor of the copy.
// One it did inherit kept the tree's filesystem busy for as long as the
// program ran: a session's disk could then not be unmounted when the
// server stopped (its directory stayed a mount point, EBUSY).
func TestCopyTreeLeavesNoDescriptorToAChild(t *testing.T) {
	t.Parallel()
	src, dst := filepath.Join(t.TempDir(), "src"), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "sub", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a", "sub/b", "sub/deeper/c"} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seen := 0
	_, err := CopyTree(context.Background(), src, dst, CopyOptions{UID: -1, BeforeOpen: func(rel string) {
		// The child lists the descriptors it was started with (exec'd:
		// what it holds is what it inherited, plus ls's own).
		out, err := exec.Command("ls", "-l", "/proc/self/fd/").CombinedOutput()
		if err != nil {
			t.Errorf("ls: %v %s", err, out)
			return
		}
		seen++
		if strings.Contains(string(out), src) {
			t.Errorf("before %s, a child started during the copy holds a descriptor of the tree:\n%s", rel, out)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if seen != 5 {
		t.Fatalf("the hook ran %d times, want one per entry (5)", seen)
	}
}
