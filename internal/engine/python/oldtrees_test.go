package python

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// oldRoot makes an install root holding, beside this build's directories
// (keep), those of other builds: each with a lock file, as a build with
// the locks leaves them.
func oldRoot(t *testing.T) (root string, keep, old []string) {
	t.Helper()
	root = t.TempDir()
	py := filepath.Join(root, "python")
	keep = []string{filepath.Join(py, "3.14.6-c30123efab3fa4e4-nolibpython"), filepath.Join(py, "pip-25.1.1-20568e5d7503"), filepath.Join(py, "worker", "0123456789ab")}
	old = []string{filepath.Join(py, "3.13.1-0123456789abcdef"), filepath.Join(py, "3.14.6-c30123efab3fa4e4"), filepath.Join(py, "pip-25.0-aaaaaaaaaaaa"), filepath.Join(py, "worker", "bbbbbbbbbbbb")}
	for _, d := range append(slices.Clone(keep), old...) {
		if err := os.MkdirAll(filepath.Join(d, "lib"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "lib", "x.py"), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(treeLock(d), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root, keep, old
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestRemoveOldTrees: the directories of other builds go, with their lock
// files; this build's stay, and so does everything else of the install
// root. No symbolic link is followed: a link in the root named like a
// tree, and a link inside an old tree, leave their targets whole; a tree
// without a lock file (a build before the locks) changed within the
// grace stays.
func TestRemoveOldTrees(t *testing.T) {
	root, keep, old := oldRoot(t)
	py := filepath.Join(root, "python")
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(old[0], "lib", "escape")); err != nil {
		t.Fatal(err)
	}
	linkTree := filepath.Join(py, "3.12.0-fedcba9876543210")
	if err := os.Symlink(outside, linkTree); err != nil {
		t.Fatal(err)
	}
	lockless := filepath.Join(py, "3.11.2-1111111111111111")
	other := filepath.Join(py, "spare")
	for _, d := range []string{lockless, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	removed, err := removeOldTrees(root, keep)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := slices.Sorted(slices.Values(old))
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v; want %v", removed, want)
	}
	for _, d := range old {
		if exists(d) || exists(treeLock(d)) {
			t.Errorf("%s or its lock file is still there", d)
		}
	}
	for _, d := range append(slices.Clone(keep), linkTree, lockless, other, filepath.Join(py, "worker")) {
		if !exists(d) {
			t.Errorf("%s was removed", d)
		}
	}
	if exists(treeLock(lockless)) {
		t.Errorf("the lock file made to look at a lockless tree is left")
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep me\n" {
		t.Errorf("a link's target: %q %v", b, err)
	}
	if m, _ := filepath.Glob(filepath.Join(py, ".gc-*")); len(m) > 0 {
		t.Errorf("left aside: %v", m)
	}
}

// holder runs a second process (util-linux flock(1)) that holds path's
// lock shared until the returned release: another server using or
// preparing that directory.
func holder(t *testing.T, args ...string) (release func()) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("%s: %v", args[0], err)
	}
	// It says "held" once it holds what it holds.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		in.Close()
		cmd.Wait()
		t.Fatalf("the holder said %q: %v", line, err)
	}
	return func() {
		in.Close()
		io.Copy(io.Discard, out)
		if err := cmd.Wait(); err != nil {
			t.Errorf("the holder: %v", err)
		}
	}
}

// TestOldTreeAnotherProcessHoldsStays: a directory whose lock another
// process holds shared (a server of that build using it, or preparing
// it) is not removed, nor its lock file; once that process is gone, it
// is.
func TestOldTreeAnotherProcessHoldsStays(t *testing.T) {
	root, keep, old := oldRoot(t)
	release := holder(t, "flock", "--shared", treeLock(old[0]), "sh", "-c", "echo held; read x || :")
	removed, err := removeOldTrees(root, keep)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(removed, old[0]) || !exists(old[0]) || !exists(treeLock(old[0])) {
		t.Fatalf("a held tree was removed (%v)", removed)
	}
	if len(removed) != len(old)-1 {
		t.Errorf("removed %v; want the other old trees", removed)
	}
	release()
	if removed, err := removeOldTrees(root, keep); err != nil || !slices.Equal(removed, old[:1]) {
		t.Fatalf("once released: removed %v, %v", removed, err)
	}
}

// TestOldTreeABoxShowsStays: a directory that a mount namespace of
// another process shows by a bind mount (a box, of any server) is not
// removed, though nobody holds its lock; once that namespace is gone, it
// is.
func TestOldTreeABoxShowsStays(t *testing.T) {
	t.Run("direct", func(t *testing.T) { testOldTreeABoxShowsStays(t, false) })
	t.Run("root-through-a-link", func(t *testing.T) { testOldTreeABoxShowsStays(t, true) })
}

// testOldTreeABoxShowsStays: with link, the server reaches its install
// root through a symbolic link (a data directory given so), while the
// box's mount names the directory where it is.
func testOldTreeABoxShowsStays(t *testing.T, link bool) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	root, keep, old := oldRoot(t)
	at := t.TempDir()
	if link {
		l := filepath.Join(t.TempDir(), "data")
		if err := os.Symlink(root, l); err != nil {
			t.Fatal(err)
		}
		for i := range keep {
			keep[i] = filepath.Join(l, strings.TrimPrefix(keep[i], root))
		}
		bound := filepath.Join(old[1], "lib")
		for i := range old {
			old[i] = filepath.Join(l, strings.TrimPrefix(old[i], root))
		}
		root = l
		release := holder(t, "unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" "$2" && echo held && { read x || :; }`, "sh", bound, at)
		defer release()
		removed, err := removeOldTrees(root, keep)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(removed, old[1]) || !exists(old[1]) {
			t.Fatalf("a tree a box shows was removed (%v)", removed)
		}
		return
	}
	release := holder(t, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$2" && echo held && { read x || :; }`, "sh", filepath.Join(old[1], "lib"), at)
	removed, err := removeOldTrees(root, keep)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(removed, old[1]) || !exists(old[1]) {
		t.Fatalf("a tree a box shows was removed (%v)", removed)
	}
	release()
	if removed, err := removeOldTrees(root, keep); err != nil || !slices.Equal(removed, old[1:2]) {
		t.Fatalf("once the box is gone: removed %v, %v", removed, err)
	}
}

// TestOldTreesAnotherServerCollects: while another server removes old
// trees (it holds the collection's lock), this one removes nothing; once
// it is done, this one does.
func TestOldTreesAnotherServerCollects(t *testing.T) {
	root, keep, old := oldRoot(t)
	release := holder(t, "flock", "--exclusive", filepath.Join(root, "python", ".gc.lock"), "sh", "-c", "echo held; read x || :")
	removed, err := removeOldTrees(root, keep)
	if err != nil || len(removed) != 0 {
		t.Fatalf("beside another collector: removed %v, %v", removed, err)
	}
	for _, d := range old {
		if !exists(d) {
			t.Fatalf("%s was removed", d)
		}
	}
	release()
	if removed, err := removeOldTrees(root, keep); err != nil || len(removed) != len(old) {
		t.Fatalf("alone: removed %v, %v", removed, err)
	}
}
