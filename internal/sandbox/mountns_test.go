package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// TestBoxesAreBornWithoutOtherSessionsDisks mounts three sessions'
// "disks" (tmpfs, each with a marker) below a private root, as quota.Open
// and Create do, and opens a session box of one of them: the box reads its
// own disk, and no mount namespace of the box (bubblewrap's, the box's)
// holds another session's disk. The same box made by a sandbox without
// MountRoot holds them all: the check sees what it looks for.
func TestBoxesAreBornWithoutOtherSessionsDisks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts")
	}
	root := sessionDisks(t, "a", "b", "c")
	run := func(sb *Sandbox, key string) (seen string, own, others int) {
		t.Helper()
		var out bytes.Buffer
		exit, err := sb.Run(testCtx(t), boxSpec(key, filepath.Join(root, "a"), &out, "cat marker"))
		if err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
		sandboxtest.DescendantMounts(t, os.Getpid(), func(f []string) {
			switch f[4] {
			case filepath.Join(root, "a"):
				own++
			case filepath.Join(root, "b"), filepath.Join(root, "c"):
				others++
			}
		})
		return out.String(), own, others
	}

	sb, err := New(&Options{SessionBoxes: true, MountRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("no bubblewrap box here")
	}
	if sb.mounts == nil {
		t.Fatal("no base mount namespace with MountRoot as root")
	}
	t.Cleanup(sb.CloseBoxes)
	seen, own, others := run(sb, "mv-a")
	if seen != "a" {
		t.Errorf("the box read %q in its session's directory, want its own disk's marker %q", seen, "a")
	}
	if own == 0 || others != 0 {
		t.Errorf("the box's namespaces hold %d mounts of its own disk and %d of other sessions' disks, want some and none", own, others)
	}

	plain, err := New(&Options{SessionBoxes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.CloseBoxes)
	if _, _, others := run(plain, "plain-a"); others == 0 {
		t.Error("a box made from the server's namespace holds no other session's disk: the check cannot see them")
	}
}

// TestAnotherServersDisksLeaveTheBase: a server started while another
// server's sessions have their disks mounted (its root private, as
// quota.Open makes it) makes its base without them: that server's
// unmounts never reach a copy, which held its disks, their loop devices
// and a deleted image's space until this server exited.
func TestAnotherServersDisksLeaveTheBase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts")
	}
	other := sessionDisks(t, "x")
	if err := os.Mkdir(filepath.Join(filepath.Dir(other), "disks"), 0o700); err != nil {
		t.Fatal(err)
	}
	own := sessionDisks(t, "a")
	sb, err := New(&Options{SessionBoxes: true, MountRoot: own})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("no bubblewrap box here")
	}
	t.Cleanup(sb.CloseBoxes)
	var out bytes.Buffer
	exit, err := sb.Run(testCtx(t), boxSpec("base-a", filepath.Join(own, "a"), &out, "cat marker"))
	if err != nil || exit.Code != 0 || out.String() != "a" {
		t.Fatalf("run: %v %+v %q", err, exit, out.String())
	}
	held, mounts := 0, 0
	sandboxtest.DescendantMounts(t, os.Getpid(), func(f []string) {
		mounts++
		if f[4] == other || strings.HasPrefix(f[4], other+"/") {
			held++
		}
	})
	if mounts == 0 {
		t.Fatal("no box's mount namespace was read")
	}
	if held != 0 {
		t.Errorf("a box's namespaces hold %d mounts of another server's sessions' disks", held)
	}
}

// TestBoxStartsLeaveEveryThreadInTheServersNamespace starts boxes of two
// sandboxes with a MountRoot (two servers in one process, one after the
// other, as tests make them) while other goroutines read a disk mounted
// in the server's namespace: every read finds it (no thread the runtime
// gives another goroutine stayed in a box's or the base namespace), and
// the main thread, whose view /proc/self shows, is still in the server's.
func TestBoxStartsLeaveEveryThreadInTheServersNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts")
	}
	const disks = 4
	root := sessionDisks(t, "0", "1", "2", "3")
	var misses atomic.Int64
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := os.Stat(filepath.Join(root, "0", "marker")); err != nil {
					misses.Add(1)
				}
				runtime.Gosched()
			}
		})
	}
	// A session box that must outlive what follows: a thread that made a
	// base namespace, or started a box, never ends (each process a thread
	// started gets a parent-death signal when it ends).
	first, err := New(&Options{SessionBoxes: true, MountRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.CloseBoxes)
	keep := func() {
		t.Helper()
		var out bytes.Buffer
		exit, err := first.Run(testCtx(t), boxSpec("keep", filepath.Join(root, "1"), &out, "cat marker"))
		if err != nil || exit.Code != 0 || out.String() != "1" {
			t.Fatalf("run in the kept box: %v %+v %q", err, exit, out.String())
		}
	}
	keep()
	bx := first.Box("keep")
	for range 2 {
		sb, err := New(&Options{SessionBoxes: true, MountRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		if !sb.Boxed() {
			t.Skip("no bubblewrap box here")
		}
		var runs sync.WaitGroup
		for i := range disks {
			runs.Go(func() {
				for range 3 {
					var out bytes.Buffer
					exit, err := sb.Run(testCtx(t), &Spec{Args: []string{"cat", "marker"}, Dir: filepath.Join(root, strconv.Itoa(i)), Stdout: &out, Stderr: &out})
					if err != nil || exit.Code != 0 || out.String() != strconv.Itoa(i) {
						t.Errorf("run in disk %d: %v %+v %q", i, err, exit, out.String())
					}
				}
			})
		}
		runs.Wait()
		sb.CloseBoxes()
	}
	for range 8 { // more base namespaces, on whatever threads run them
		if _, err := New(&Options{MountRoot: root}); err != nil {
			t.Fatal(err)
		}
	}
	keep()
	if first.Box("keep") != bx {
		t.Error("the kept session box ended while other boxes and base namespaces were made")
	}
	close(stop)
	readers.Wait()
	if n := misses.Load(); n > 0 {
		t.Errorf("%d reads of a disk mounted in the server's namespace did not find it", n)
	}
	var main, server unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &main); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(serverMountNS.Fd()), &server); err != nil {
		t.Fatal(err)
	}
	if main.Ino != server.Ino {
		t.Error("the main thread is no longer in the server's mount namespace")
	}
}

// sessionDisks makes a sessions' directory as quota.Open makes it (a
// private bind mount of itself) with a "disk" (a tmpfs) mounted at each
// of ids, holding a file marker whose content is its id.
func sessionDisks(t *testing.T, ids ...string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "sessions")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	if err := unix.Mount("", root, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		d := filepath.Join(root, id)
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "marker"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
