package rootfstest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/rootfs"
)

// TestBuildLockExcludesWithinAProcess: while one caller holds a rootfs's
// build lock, another open of the lock file in the same process cannot
// take it (parallel tests of one package take turns, not only test
// processes), and it can once the holder releases it.
func TestBuildLockExcludesWithinAProcess(t *testing.T) {
	t.Parallel()
	m := rootfs.New(filepath.Join(t.TempDir(), "rootfs"))
	unlock := buildLock(t, m, rootfs.DefaultName)
	other, err := os.OpenFile(filepath.Join(m.Dir, "."+rootfs.DefaultName+"-build.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("a second lock while the first is held: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
}
