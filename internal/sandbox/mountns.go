package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Boxes are born in a mount namespace without the sessions' disks.
//
// Each session's disk is an ext4 image mounted at its directory under a
// root (Options.MountRoot, $QURO_DATA/sessions). Bubblewrap copies the
// mount namespace it starts in, and unmounts the copy of the old root
// after its pivot: both cost one step per mount, so with the disks of
// 1,000 sessions mounted in the server's namespace every box paid for
// all 1,000 (bubblewrap alone went from ~5 ms to 40–70 ms).
//
// So a box starts from the base namespace instead: a copy of the server's
// made once, in which nothing is mounted below the root, a slave of the
// server's (the host's later mounts and unmounts reach it; the root is a
// private mount in the server's namespace, see quota.Open, so the
// sessions' disks do not). The thread that starts a box enters a fresh
// copy of the base and moves a clone of its own session's disk (open_tree,
// move_mount) to the session's directory there, then goes back to the
// server's namespace. A box holds the host's mounts and its own disk,
// whatever the number of sessions; no session's disk is ever in another
// session's box, not even hidden under a bind.
type mountView struct {
	root   string   // Options.MountRoot
	base   *os.File // the base namespace
	server *os.File // the server's namespace, to go back to
}

// newMountView makes the base namespace of root. It needs root (as the
// server is when sessions have disks).
func newMountView(root string) (*mountView, error) {
	root = filepath.Clean(root)
	if serverMountNS == nil {
		return nil, errors.New("mount namespace: the server's could not be opened at start")
	}
	v := &mountView{root: root, server: serverMountNS}
	done := make(chan error, 1)
	goLocked(func() {
		cwd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("mount namespace: %w", err)
			return
		}
		defer unix.Close(cwd)
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("mount namespace: %w", err)
			return
		}
		err = v.makeBase()
		if unix.Setns(int(v.server.Fd()), unix.CLONE_NEWNS) != nil || unix.Fchdir(cwd) != nil {
			done <- errors.Join(err, errNamespaceStuck)
			parkThread()
		}
		runtime.UnlockOSThread()
		done <- err
	})
	if err := <-done; err != nil {
		return nil, err
	}
	return v, nil
}

// makeBase makes the calling thread's mount namespace, a copy of the
// server's of its own, the base: a slave of the server's, with nothing
// mounted at or below the root.
func (v *mountView) makeBase() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("mount namespace: making it a slave: %w", err)
	}
	if err := unmountBelow(v.root); err != nil {
		return err
	}
	// Another server's sessions' root is private in the host's namespace
	// too: its unmounts never reach this copy, which would hold its disks
	// (and their loop devices, and a deleted image's space) until this
	// server exits. None of it is any box's business.
	points, err := mountPoints()
	if err != nil {
		return err
	}
	for _, p := range otherSessionRoots(points, v.root) {
		_ = unmountBelow(p) // best effort: what stays costs space, not isolation
	}
	f, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/mnt", unix.Gettid()))
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	v.base = f
	return nil
}

// otherSessionRoots are the mount points among points that are another
// Quro server's sessions' root (own is this one's): a directory named
// sessions beside a disks directory, as every data directory has them
// (quota.Open).
func otherSessionRoots(points []string, own string) []string {
	var out []string
	for _, p := range points {
		if p == own || filepath.Base(p) != "sessions" || slices.Contains(out, p) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(filepath.Dir(p), "disks")); err == nil && fi.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// parkThread blocks the calling goroutine, locked to a thread that could
// not go back to the server's namespace, for good. The thread must not
// end either: every process it ever started (a box's bubblewrap, with
// its parent-death signal) would be killed with it.
func parkThread() {
	select {}
}

// unmountBelow detaches, in the calling thread's mount namespace, every
// mount at root or below it. Detaching root's own mount takes everything
// mounted on it; a mount hidden beneath it (made on the directory before
// root was bound onto itself) shows up then and goes next.
func unmountBelow(root string) error {
	for {
		points, err := mountPoints()
		if err != nil {
			return err
		}
		var below []string
		for _, p := range points {
			if p == root || strings.HasPrefix(p, root+"/") {
				below = append(below, p)
			}
		}
		if len(below) == 0 {
			return nil
		}
		// Shortest first: a mount's detach takes the ones on top of it. A
		// path whose top mount went with its parent answers EINVAL: try
		// the next, and give up only when a whole pass detached nothing.
		sort.Slice(below, func(i, j int) bool { return len(below[i]) < len(below[j]) })
		var first error
		detached := false
		for _, p := range below {
			err := unix.Unmount(p, unix.MNT_DETACH)
			if err == nil {
				detached = true
				break
			}
			if first == nil {
				first = fmt.Errorf("mount namespace: dropping %s: %w", p, err)
			}
		}
		if !detached {
			return first
		}
	}
}

// mountPoints lists the mount points of the calling thread's namespace.
func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			out = append(out, UnescapeMountPath(fields[4]))
		}
	}
	return out, sc.Err()
}

// UnescapeMountPath undoes mountinfo's octal escapes (\040 for a space)
// in a path field of /proc/PID/mountinfo.
func UnescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sessionDisk is the session directory dir lies in, when dir is below
// the root and that directory exists; "". It is the session's disk: its
// image's mount point, or its subvolume of the shared filesystem mounted
// at the root (see quota), or a plain directory (a session without a
// disk quota), which the base namespace may not show either (when the
// root is itself a mount, the base drops it).
func (v *mountView) sessionDisk(dir string) string {
	rel, err := filepath.Rel(v.root, filepath.Clean(dir))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return ""
	}
	sdir := filepath.Join(v.root, strings.SplitN(rel, "/", 2)[0])
	var a syscall.Stat_t
	if syscall.Lstat(sdir, &a) != nil || a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return ""
	}
	return sdir
}

// enter moves the calling thread, which must be locked, into a fresh copy
// of the base namespace with the disk of dir's session (if it has one)
// mounted at its directory. leave puts the thread back in the server's
// namespace and working directory. An error that wraps
// errNamespaceStuck, from enter or leave, leaves the thread elsewhere: it
// must not be unlocked (it ends with its goroutine).
func (v *mountView) enter(dir string) (leave func() error, err error) {
	tree := -1
	disk := v.sessionDisk(dir)
	if disk != "" {
		// The clone is taken here, in the server's namespace, where the
		// disk is mounted; it is attached in the new one below.
		tree, err = unix.OpenTree(unix.AT_FDCWD, disk, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("mount namespace: the session's disk: %w", err)
		}
		defer unix.Close(tree)
	}
	cwd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	leave = func() error {
		defer unix.Close(cwd)
		if err := unix.Setns(int(v.server.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("mount namespace: going back: %w (%w)", err, errNamespaceStuck)
		}
		if err := unix.Fchdir(cwd); err != nil {
			return fmt.Errorf("mount namespace: going back: %w (%w)", err, errNamespaceStuck)
		}
		return nil
	}
	// The thread gets file system attributes of its own (root, working
	// directory, umask), so that it may change mount namespace alone.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		unix.Close(cwd)
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	if err := unix.Setns(int(v.base.Fd()), unix.CLONE_NEWNS); err != nil {
		unix.Close(cwd)
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, errors.Join(fmt.Errorf("mount namespace: %w", err), leave())
	}
	if tree >= 0 {
		if err := mountPointFor(v.root, disk); err != nil {
			return nil, errors.Join(fmt.Errorf("mount namespace: the session's disk: %w", err), leave())
		}
		if err := unix.MoveMount(tree, "", unix.AT_FDCWD, disk, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return nil, errors.Join(fmt.Errorf("mount namespace: the session's disk: %w", err), leave())
		}
	}
	return leave, nil
}

// mountPointFor makes sure the session directory disk exists in the
// calling thread's fresh namespace, to move the session's disk onto. When
// the sessions' root was itself a mount (one shared filesystem for every
// session), the base dropped it and the directory beneath shows no
// session: a small tmpfs of this namespace alone is mounted at the root
// and the directory made in it, so that nothing is written to the host's
// directory and no other box sees the name.
func mountPointFor(root, disk string) error {
	if _, err := os.Lstat(disk); err == nil {
		return nil
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "size=16k,nr_inodes=4,mode=0755"); err != nil {
		return err
	}
	return os.Mkdir(disk, 0o755)
}

// errNamespaceStuck marks an error after which the thread is in a
// namespace not the server's: it must end, not go back to the pool.
var errNamespaceStuck = errors.New("the thread could not go back to the server's namespace")

// serverMountNS is the server's mount namespace, opened as the program
// starts, on its main thread, before any thread changed its own: a thread
// that made a box goes back to it. (/proc/self names the main thread's,
// which need not be the server's later on: see goLocked.)
var serverMountNS, _ = os.Open("/proc/self/ns/mnt")

// goLocked runs fn in a new goroutine locked to its OS thread, which is
// never the program's main thread: fn may move its thread into another
// namespace, and the runtime never ends the main thread (a goroutine that
// exits locked to it leaves it wedged where it was), while /proc/self
// reads what the main thread sees. fn unlocks the thread, or keeps it
// (parkThread).
func goLocked(fn func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			fn()
			return
		}
		// On the main thread: run fn on another. This goroutine holds the
		// main thread meanwhile, so the new one cannot be given it.
		done := make(chan struct{})
		goLocked(func() {
			defer close(done)
			fn()
		})
		<-done
		runtime.UnlockOSThread()
	}()
}
