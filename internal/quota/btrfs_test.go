package quota

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// newShared opens the disks of a new data directory with the btrfs
// method, or skips when this machine cannot have it (not root, no btrfs
// in the kernel, no mkfs.btrfs); a machine that has all three and still
// gets no shared filesystem fails.
func newShared(t testing.TB) (*Disks, string) {
	t.Helper()
	data := t.TempDir()
	d := Open(data)
	t.Cleanup(d.Close)
	if d.shared == nil {
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil || os.Geteuid() != 0 || !btrfsBuiltIn() {
			t.Skipf("no shared btrfs filesystem here: %v", d.noShared)
		}
		t.Fatalf("no shared btrfs filesystem: %v", d.noShared)
	}
	return d, data
}

// subvolAttack is a program that makes a subvolume in the current
// directory by BTRFS_IOC_SUBVOL_CREATE, as any process with write
// permission on a directory of a btrfs filesystem may, then writes
// 48 MiB into it; it prints what each step answered.
const subvolAttack = `
import errno, fcntl, os, struct
fd = os.open('.', os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0x5000940e, bytearray(struct.pack('q4088s', 0, b'escape')))
    print('CREATED')
except OSError as e:
    print('create:', errno.errorcode[e.errno])
try:
    fcntl.ioctl(fd, 0x50009401, bytearray(struct.pack('q4088s', fd, b'snap')))
    print('SNAPSHOT')
except OSError as e:
    print('snapshot:', errno.errorcode[e.errno])
target = 'escape/big' if os.path.isdir('escape') else 'big'
try:
    with open(target, 'wb') as f:
        for _ in range(48):
            f.write(b'x' * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    print('WROTE', target)
except OSError as e:
    print('write:', errno.errorcode[e.errno])
`

// A session's quota is its subvolume's quota group, and the kernel lets
// any process that may write a directory make a subvolume there (with a
// quota group of its own, which the session's limit does not hold). The
// control run proves it: an unprivileged process outside a box makes one
// and writes past the quota through it. In a box, the seccomp filter
// refuses btrfs's ioctls: the subvolume is never made and the write
// fails with EDQUOT at the session's quota.
func TestBoxCannotEscapeItsQuotaWithASubvolume(t *testing.T) {
	py, err := exec.LookPath("/usr/bin/python3") // the system's: one an unprivileged user may run
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	d, data := newShared(t)
	const quota = 16 << 20
	// The control: an unprivileged process, no box.
	ctl := session(t, d, data, "control", quota)
	work := filepath.Join(ctl, "workspace")
	// The unprivileged process reaches it: t.TempDir's are 0700.
	for _, dir := range []string{filepath.Dir(data), data, filepath.Join(data, "sessions")} {
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(work, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", subvolAttack)
	cmd.Dir = work
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("control: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "CREATED") || !strings.Contains(string(out), "WROTE escape/big") {
		t.Fatalf("outside a box, an unprivileged process could not escape the quota with a subvolume (the attack is not what this test thinks):\n%s", out)
	}
	// The subvolume the control made goes with its session's (Remove
	// deletes the session's subvolume, and the kernel refuses to delete
	// one that holds another).
	if err := d.removeSubvolIn(work, "escape"); err != nil {
		t.Fatal(err)
	}

	s := session(t, d, data, "s", quota)
	sb, err := sandbox.New(&sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var buf bytes.Buffer
	if _, err := sb.Run(ctx, &sandbox.Spec{Args: []string{"python3", "-c", subvolAttack}, Dir: filepath.Join(s, "workspace"),
		TmpDir: filepath.Join(s, "tmp"), Stdout: &buf, Stderr: &buf}); err != nil {
		t.Fatal(err)
	}
	got := buf.String()
	for _, want := range []string{"create: EPERM", "snapshot: EPERM", "write: EDQUOT"} {
		if !strings.Contains(got, want) {
			t.Errorf("in a box, the attack did not meet %q:\n%s", want, got)
		}
	}
	if _, err := os.Stat(filepath.Join(s, "workspace", "escape")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the box made a subvolume: %v", err)
	}
	if u, ok := d.Usage(s); !ok || u.Used > quota+1<<20 {
		t.Errorf("the session holds %+v (%v), past its quota of 16 MiB", u, ok)
	}
}

// removeSubvolIn deletes the subvolume name in dir (a test's cleanup of
// a subvolume a control process made).
func (d *Disks) removeSubvolIn(dir, name string) error {
	parent, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer parent.Close()
	return btrfsIoctl(parent.Fd(), btrfsIocSnapDestroy, unsafe.Pointer(volArgs(name)))
}

// Sessions are separate subvolumes: a hard link or a rename from one into
// another fails (EXDEV), so no file is ever shared or moved between two
// sessions' quotas; and each session's directory is a subvolume whose
// usage and limit the method reads back.
func TestSessionsAreSeparateSubvolumes(t *testing.T) {
	t.Parallel()
	d, data := newShared(t)
	a := session(t, d, data, "a", 32<<20)
	b := session(t, d, data, "b", 32<<20)
	f := filepath.Join(a, "workspace", "f")
	if err := os.WriteFile(f, []byte("a's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(f, filepath.Join(b, "workspace", "f")); !errors.Is(err, unix.EXDEV) {
		t.Errorf("hard link across sessions: %v, want EXDEV", err)
	}
	if err := os.Rename(f, filepath.Join(b, "workspace", "f")); !errors.Is(err, unix.EXDEV) {
		t.Errorf("rename across sessions: %v, want EXDEV", err)
	}
	if !d.Has(a) || !d.Has(b) || d.Has(filepath.Join(a, "workspace")) {
		t.Errorf("Has: a %v, b %v, a's workspace %v", d.Has(a), d.Has(b), d.Has(filepath.Join(a, "workspace")))
	}
	// The ioctl a kernel before statx's STATX_SUBVOL (6.10) is asked
	// answers what statx does.
	if ida, idb := subvolID(a), subvolID(b); ida == idb || inoLookupTree(a) != ida || inoLookupTree(b) != idb {
		t.Errorf("subvolume ids: statx %d %d, BTRFS_IOC_INO_LOOKUP %d %d", ida, idb, inoLookupTree(a), inoLookupTree(b))
	}
	if !strings.HasPrefix(d.Method(), MethodShared) {
		t.Errorf("Method %q", d.Method())
	}
	// Grow's errors reach a tenant: none names a host path.
	err := d.Grow(filepath.Join(data, "sessions", "gone"), 64<<20)
	if err == nil || strings.Contains(err.Error(), data) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Grow of a session without a subvolume: %v", err)
	}
}

// A server restarted (its Disks closed, the shared filesystem unmounted,
// and opened again) finds its sessions' subvolumes, their files and their
// limits; a limit grows, and the grown one holds.
func TestRestartFindsTheSubvolumesAndTheirLimits(t *testing.T) {
	t.Parallel()
	first, data := newShared(t)
	root := filepath.Join(data, "sessions")
	s := filepath.Join(root, "s")
	if err := first.Create(s, 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s, "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	first.Close()
	if isBtrfsMount(root) {
		t.Fatal("the shared filesystem is still mounted after Close")
	}
	d := Open(data)
	t.Cleanup(d.Close)
	if d.shared == nil {
		t.Fatalf("after a restart: %s", d.Method())
	}
	defer func() {
		if err := d.Remove(s); err != nil {
			t.Error(err)
		}
	}()
	if !d.Has(s) {
		t.Fatal("the session's subvolume is not found after a restart")
	}
	if b, err := os.ReadFile(filepath.Join(s, "keep")); string(b) != "kept" {
		t.Fatalf("after a restart: %q %v", b, err)
	}
	if u, ok := d.Usage(s); !ok || u.Quota != 32<<20 {
		t.Fatalf("after a restart: usage %+v (%v), want a 32 MiB quota", u, ok)
	}
	if err := os.WriteFile(filepath.Join(s, "big"), make([]byte, 48<<20), 0o644); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("48 MiB into a 32 MiB quota after a restart: %v, want EDQUOT", err)
	}
	if err := d.Grow(s, 96<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s, "big"), make([]byte, 48<<20), 0o644); err != nil {
		t.Fatalf("48 MiB into the quota grown to 96 MiB: %v", err)
	}
	if u, ok := d.Usage(s); !ok || u.Quota != 96<<20 || u.Used < 48<<20 {
		t.Fatalf("after growing to 96 MiB: %+v %v", u, ok)
	}
}

// Boxes are born without other sessions' disks (sandbox.mountView): with
// one shared filesystem, the base namespace boxes start from drops its
// mount, and a box gets a bind of its own session's subvolume alone. No
// mount namespace of a session box (bubblewrap's, the box's) holds the
// shared filesystem at another session's subvolume or at its root; a
// box made from the server's namespace does (the check sees what it looks
// for).
func TestBoxesHoldOnlyTheirOwnSubvolume(t *testing.T) {
	d, data := newShared(t)
	for _, id := range []string{"a", "b", "c"} {
		s := session(t, d, data, id, 16<<20)
		if err := os.WriteFile(filepath.Join(s, "marker"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := d.Root()
	dev := mountDev(t, "/proc/self/mountinfo", root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(sb *sandbox.Sandbox, key string) (seen string, own, others int) {
		t.Helper()
		var out bytes.Buffer
		exit, err := sb.Run(ctx, &sandbox.Spec{Args: []string{"cat", "marker"}, Dir: filepath.Join(root, "a"), Session: key,
			UID: 2_500_000 + len(key), Stdout: &out, Stderr: &out})
		if err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
		sandboxtest.DescendantMounts(t, os.Getpid(), func(f []string) {
			switch {
			case f[2] != dev:
			case f[3] == "/a" || strings.HasPrefix(f[3], "/a/"):
				own++
			default:
				others++
			}
		})
		return out.String(), own, others
	}
	sb, err := sandbox.New(&sandbox.Options{SessionBoxes: true, MountRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.CloseBoxes)
	if !sb.Boxed() {
		t.Skip("no bubblewrap box here")
	}
	seen, own, others := run(sb, "mv-a")
	if seen != "a" {
		t.Errorf("the box read %q in its session's directory, want its own marker %q", seen, "a")
	}
	if own == 0 || others != 0 {
		t.Errorf("the box's namespaces hold %d mounts of its own subvolume and %d of the shared filesystem elsewhere, want some and none", own, others)
	}
	plain, err := sandbox.New(&sandbox.Options{SessionBoxes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.CloseBoxes)
	if _, _, others := run(plain, "plain-a"); others == 0 {
		t.Error("a box made from the server's namespace holds the shared filesystem nowhere else: the check cannot see it")
	}
}

// mountDev is the device (major:minor) of the top mount at dir in the
// mountinfo file at path (the shared filesystem lies on a bind of the
// directory).
func mountDev(t *testing.T, path, dir string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dev := ""
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			dev = f[2]
		}
	}
	if dev == "" {
		t.Fatalf("nothing mounted at %s", dir)
	}
	return dev
}

// A data directory whose sessions' directory holds only empty directories
// (the default session session.Open made before the disks were set up)
// gets the shared filesystem, with those directories on it as they were
// (mode, owner); one that holds a file (sessions of before, without
// disks or with images) keeps the images method, its files untouched.
func TestOpenTakesOverEmptySessionDirectoriesOnly(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil || os.Geteuid() != 0 || !btrfsBuiltIn() {
		t.Skip("no btrfs here")
	}
	data := t.TempDir()
	ws := filepath.Join(data, "sessions", "default", "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, 2_500_001, 2_500_001); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(data, "sessions"), 0o700); err != nil {
		t.Fatal(err)
	}
	d := Open(data)
	t.Cleanup(d.Close)
	if d.shared == nil {
		t.Fatalf("empty session directories kept the shared filesystem away: %s", d.Method())
	}
	fi, err := os.Stat(ws)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 2_500_001 || fi.Mode().Perm() != 0o755 || !isBtrfsMount(filepath.Join(data, "sessions")) {
		t.Errorf("the workspace on the shared filesystem: uid %d, mode %v", st.Uid, fi.Mode())
	}
	if fi, err := os.Stat(filepath.Join(data, "sessions")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the sessions' directory: %v %v, want mode 0700 as before", fi.Mode(), err)
	}

	old := t.TempDir()
	f := filepath.Join(old, "sessions", "s", "workspace", "notes.txt")
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Open(old)
	t.Cleanup(o.Close)
	if o.shared != nil || !strings.HasPrefix(o.Method(), MethodImages) || strings.Contains(o.Method(), old) {
		t.Errorf("a data directory with sessions' files: %q, want the images method, its reason naming no host path", o.Method())
	}
	if b, err := os.ReadFile(f); string(b) != "mine" {
		t.Errorf("the session's file: %q %v", b, err)
	}
}

// Where boxes get no seccomp filter (an architecture without one, a
// kernel without seccomp), a box could make a subvolume outside its
// quota: the data directory keeps the images method, and says why.
// Not parallel: it stands in a machine without seccomp for the package.
func TestNoSharedFilesystemWithoutSeccomp(t *testing.T) {
	newShared(t) // skips where there is no shared filesystem to refuse
	seccompAvailable = func() error { return errors.New("kernel has no seccomp: EINVAL") }
	t.Cleanup(func() { seccompAvailable = sandbox.SeccompAvailable })
	d := Open(t.TempDir())
	t.Cleanup(d.Close)
	if d.Shared() || !strings.Contains(d.Method(), "seccomp") {
		t.Fatalf("without seccomp: shared %v, method %q", d.Shared(), d.Method())
	}
}

// Two processes of one data directory (here two Disks, each its own open
// file of the users' lock, as two processes have): the one that mounted
// the shared filesystem lets go first, and it stays mounted for the
// other, which still makes and removes subvolumes; the last to let go
// unmounts it, and the private bind beneath.
func TestTheLastUserUnmountsTheSharedFilesystem(t *testing.T) {
	t.Parallel()
	first, data := newShared(t)
	root := filepath.Join(data, "sessions")
	second := Open(data)
	t.Cleanup(second.Close)
	if second.shared == nil {
		t.Fatalf("the second: %s", second.Method())
	}
	first.Close()
	if !isBtrfsMount(root) {
		t.Fatal("the first's Close unmounted the filesystem the second still uses")
	}
	s := filepath.Join(root, "s")
	if err := second.Create(s, 16<<20); err != nil {
		t.Fatal(err)
	}
	if !second.Has(s) {
		t.Fatal("the second's new subvolume is not there")
	}
	if err := second.Remove(s); err != nil {
		t.Fatal(err)
	}
	second.Close()
	if isBtrfsMount(root) || mountPoint(root) {
		t.Fatal("the last user's Close left the filesystem or its bind mounted")
	}
}
