// Package toolchaintest shares, between the test packages of one make
// test, what a Go build in a box makes once: the build cache a first
// build of the standard library fills.
//
// Two tests build Go cold: internal/app's TestToolchainGoAndJava (a
// session's first go build, through run_code) and the toolchain engine's
// contract suite (internal/engine/toolchain, whose warmGoSessions builds
// once and gives each check a copy). Each compiled the standard library
// into an empty cache: ~30 s idle, past 10 minutes at a load of 60 on 2
// cores. test/run.sh gives make test one directory, QURO_TEST_GOCACHE,
// made empty as make test starts and removed as it ends: the first of the
// two to take its lock builds cold and leaves its cache there; the other
// starts from a copy of it. Both builds are still real builds by the
// engine, in a box, and one of them a cold one in every make test.
// Without QURO_TEST_GOCACHE (a go test of one package) each builds cold.
package toolchaintest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/quro-dev/quro/internal/flock"
)

// Env names the directory the Go build cache is shared in.
const Env = "QURO_TEST_GOCACHE"

// SharedGoCache runs build, the first Go build of a test, whose cache is
// dst (made by it when missing). With Env set, it holds the directory's
// lock while it runs: when the directory holds a cache another test left,
// dst starts as a copy of it (owned by uid, for a session's own uid; -1:
// as copied); when it holds none, build builds cold and dst is left there
// for the next. build reports whether it succeeded: a failed build leaves
// nothing to share. It returns whether dst was warm.
func SharedGoCache(t testing.TB, dst string, uid int, build func() bool) (warm bool) {
	t.Helper()
	root := os.Getenv(Env)
	if root == "" {
		build()
		return false
	}
	unlock, err := flock.Lock(filepath.Join(root, ".lock"), func() {
		t.Logf("waiting for the shared Go build cache in %s (another test's cold build)", root)
	})
	if err != nil {
		t.Fatalf("the shared Go build cache: %v", err)
	}
	defer unlock()
	shared := filepath.Join(root, "go-build")
	switch _, err := os.Stat(shared); {
	case err == nil:
		if err := copyTree(shared, dst, uid); err != nil {
			t.Fatalf("copying the shared Go build cache into %s: %v", dst, err)
		}
		build()
		return true
	case !errors.Is(err, fs.ErrNotExist):
		t.Fatalf("the shared Go build cache: %v", err)
	}
	if !build() {
		return false
	}
	tmp := shared + ".tmp"
	os.RemoveAll(tmp)
	if err := copyTree(dst, tmp, -1); err != nil {
		t.Fatalf("leaving the Go build cache in %s: %v", root, err)
	}
	if err := os.Rename(tmp, shared); err != nil {
		t.Fatalf("leaving the Go build cache in %s: %v", root, err)
	}
	return false
}

// copyTree copies the regular files and directories under src to dst,
// owned by uid when uid >= 0.
func copyTree(src, dst string, uid int) error {
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return err
	}
	if uid < 0 {
		return nil
	}
	return filepath.WalkDir(dst, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}
