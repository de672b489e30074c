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
