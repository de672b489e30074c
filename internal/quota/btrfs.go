package quota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
)

// The btrfs method: one filesystem for every session's disk.
//
// The data directory gets one sparse image ($QURO_DATA/disks/shared.img),
// formatted btrfs once (mkfs.btrfs, the one tool this method runs) and
// loop-mounted once at $QURO_DATA/sessions, with btrfs's simple quotas
// enabled. Each session directory is a subvolume of it, made by an ioctl
// (no process, no loop device, no mount), whose quota group (qgroup) is
// limited to the session's quota: a write past it fails with EDQUOT
// inside the box, whoever writes (the session's code, or the server
// spilling an output). Grow changes the limit; Remove deletes the
// subvolume (the kernel's cleaner frees its blocks afterwards). So the
// host's mount table holds one mount for all sessions, not one each, and
// a create costs two ioctls whatever the number of sessions.
//
// A box could make a subvolume of its own in its workspace (the ioctl
// needs only write permission on the directory), whose qgroup the
// session's limit does not hold: the box's seccomp filter refuses every
// btrfs ioctl (internal/sandbox/seccomp.go, btrfsIoctlType), so where
// boxes get no filter the shared filesystem is not used (tryShared).
//
// Kernel interface (include/uapi/linux/btrfs.h); x/sys/unix names none of it.
const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocFsInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	btrfsIocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	btrfsQuotaCtlEnable       = 1
	btrfsQuotaCtlEnableSimple = 4 // simple quotas (kernel 6.7+): no back-reference walks

	btrfsQgroupLimitMaxRfer = 1 << 0
	btrfsQgroupLimitMaxExcl = 1 << 1

	btrfsFirstFreeObjectID = 256 // the inode of a subvolume's root directory
	btrfsPathNameMax       = 4087
)

// btrfsVolArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type btrfsVolArgs struct {
	fd   int64
	name [btrfsPathNameMax + 1]byte
}

// btrfsQuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type btrfsQuotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args: qgroupid
// 0 is the subvolume of the file the ioctl is made on.
type btrfsQgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// btrfsFsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes): only
// fsid is read.
type btrfsFsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	rest       [1024 - 32]byte
}

func btrfsIoctl(fd uintptr, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// sharedImage is the btrfs method's image in the disks directory.
const sharedImage = "shared.img"

// sharedMinSize is the least size of the shared image: mkfs.btrfs
// refuses a filesystem much smaller (about 114 MiB with its defaults).
const sharedMinSize = 1 << 30

// btrfsFS is the data directory's shared btrfs filesystem, mounted at
// Disks.root.
type btrfsFS struct {
	qgroups string // /sys/fs/btrfs/<fsid>/qgroups: each subvolume's usage and limit
	mounted bool   // this process mounted it (Close unmounts it)
	// users is this process's shared flock on disks/.shared.users, held
	// while it uses the filesystem: the last process of the data
	// directory to let go unmounts it, never one while another (a CLI
	// command beside the server, a server beside a CLI command that
	// mounted it first) still makes and removes sessions' subvolumes.
	users *os.File
}

// openBtrfs makes the shared filesystem usable at d.root: found mounted
// there already (another process of this data directory mounted it),
// mounted from the shared image, or made (when the data directory holds
// no sessions' disks of the images method yet). The caller holds the
// disks directory's lock.
func (d *Disks) openBtrfs() (*btrfsFS, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the server is not root")
	}
	if !btrfsBuiltIn() {
		return nil, errors.New("the kernel has no btrfs (/proc/filesystems)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return nil, fmt.Errorf("no loop devices: %v", err)
	}
	if err := os.MkdirAll(d.root, 0o700); err != nil {
		return nil, err
	}
	fs := &btrfsFS{}
	img := filepath.Join(d.dir, sharedImage)
	var moved []dirEntry // the empty directories the new filesystem takes over
	if !isBtrfsMount(d.root) {
		if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
			if why := d.imagesInUse(); why != "" {
				return nil, errors.New(why)
			}
			var err error
			if moved, err = emptyTree(d.root); err != nil {
				return nil, err
			}
			if err := d.mkfsShared(img); err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, err
		}
		// The filesystem is mounted on a private bind of the directory
		// (as the images are), so that its mount propagates to no other
		// mount namespace, not even at the moment it is made.
		d.boundRoot = privateRoot(d.root)
		if err := d.mountShared(img); err != nil {
			d.unbindRoot()
			return nil, err
		}
		fs.mounted = true
	}
	fail := func(err error) (*btrfsFS, error) {
		if fs.mounted {
			_ = unix.Unmount(d.root, unix.MNT_DETACH)
			d.unbindRoot()
		}
		return nil, err
	}
	if len(moved) > 0 {
		// The directories beneath stay where they were, hidden; their
		// copies (the session directories session.Open made, all empty)
		// are made on the new filesystem.
		for _, e := range moved {
			if err := e.make(d.root); err != nil {
				return fail(err)
			}
		}
	}
	// Private: the subvolumes' binds into boxes (sandbox.mountView) and
	// the boxes' copies of mounts never come back to the server's view.
	if err := unix.Mount("", d.root, "", unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("making the sessions' filesystem private: %w", err))
	}
	root, err := os.Open(d.root)
	if err != nil {
		return fail(err)
	}
	defer root.Close()
	var info btrfsFsInfoArgs
	if err := btrfsIoctl(root.Fd(), btrfsIocFsInfo, unsafe.Pointer(&info)); err != nil {
		return fail(fmt.Errorf("BTRFS_IOC_FS_INFO: %w", err))
	}
	u := info.fsid
	fs.qgroups = fmt.Sprintf("/sys/fs/btrfs/%x-%x-%x-%x-%x/qgroups", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	if _, err := os.Stat(fs.qgroups); err != nil {
		// Simple quotas first; a kernel older than 6.7 answers EINVAL,
		// and gets the full qgroups.
		args := btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnableSimple}
		err := btrfsIoctl(root.Fd(), btrfsIocQuotaCtl, unsafe.Pointer(&args))
		if err != nil {
			args = btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnable}
			err = btrfsIoctl(root.Fd(), btrfsIocQuotaCtl, unsafe.Pointer(&args))
		}
		if err != nil {
			return fail(fmt.Errorf("enabling btrfs quotas: %w", err))
		}
		if _, err := os.Stat(fs.qgroups); err != nil {
			return fail(fmt.Errorf("btrfs quotas enabled but not in sysfs: %w", err))
		}
	}
	return fs, nil
}

// btrfsBuiltIn reports whether the kernel knows btrfs.
func btrfsBuiltIn() bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(strings.TrimPrefix(l, "nodev")) == "btrfs" {
			return true
		}
	}
	return false
}

// isBtrfsMount reports whether dir is a mount point of a btrfs filesystem.
func isBtrfsMount(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BTRFS_SUPER_MAGIC && mountPoint(dir)
}

// imagesInUse says why the data directory keeps the images method: it
// has sessions' images already, or session directories the shared
// filesystem's mount would hide. "" when neither.
func (d *Disks) imagesInUse() string {
	imgs, _ := filepath.Glob(filepath.Join(d.dir, "*.img"))
	if len(imgs) > 0 {
		return "the data directory's sessions have ext4 images already"
	}
	if _, err := emptyTree(d.root); err != nil {
		return "the data directory has sessions' files made without the shared filesystem"
	}
	if mountPoint(d.root) {
		return "the sessions' directory is a mount point of another filesystem"
	}
	return ""
}

// mkfsShared makes the shared image: sparse, as large as the data
// directory's filesystem (at least sharedMinSize), formatted under a
// temporary name so that a crash never leaves a half-made one.
func (d *Disks) mkfsShared(img string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(d.dir, &st); err != nil {
		return err
	}
	size := max(int64(st.Blocks)*st.Bsize, sharedMinSize)
	t, err := os.CreateTemp(d.dir, ".shared-*")
	if err != nil {
		return err
	}
	defer os.Remove(t.Name())
	err = t.Truncate(size)
	t.Close()
	if err != nil {
		return err
	}
	// Single copies of data and metadata (the image is a file of the
	// host's, whose disk has its own redundancy), no discard of the
	// whole new image (it is all a hole).
	if err := d.run("mkfs.btrfs", "-q", "-f", "-K", "-m", "single", "-d", "single", t.Name()); err != nil {
		return err
	}
	return os.Rename(t.Name(), img)
}

// mountShared attaches the shared image to a loop device and mounts it at
// d.root. nodev, nosuid: a file a box made must never be a device or a
// set-uid program for the host.
func (d *Disks) mountShared(img string) error {
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	lo, err := boundLoop(img)
	if err != nil {
		return err
	}
	if lo == nil {
		if lo, err = attach(f); err != nil {
			return err
		}
	}
	defer lo.Close()
	if err := unix.Mount(lo.Name(), d.root, "btrfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mounting the sessions' filesystem: %w", err)
	}
	return nil
}

// subvolName is dir's name in the shared filesystem's root, which must be
// its parent.
func (d *Disks) subvolName(dir string) (string, error) {
	if filepath.Dir(filepath.Clean(dir)) != d.root {
		return "", fmt.Errorf("session directory %s is not in %s", filepath.Base(dir), "$QURO_DATA/sessions")
	}
	name := filepath.Base(dir)
	if name == "." || name == ".." || len(name) > btrfsPathNameMax {
		return "", fmt.Errorf("session directory %q: not a name", name)
	}
	return name, nil
}

// volArgs is the ioctl argument naming name.
func volArgs(name string) *btrfsVolArgs {
	a := &btrfsVolArgs{}
	copy(a.name[:], name)
	return a
}

// createSubvol makes dir a subvolume whose qgroup is limited to size
// bytes. dir must not exist, or be an empty directory (removed first).
func (d *Disks) createSubvol(dir string, size int64) error {
	name, err := d.subvolName(dir)
	if err != nil {
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("session directory %s: %w", name, err)
	}
	parent, err := os.Open(d.root)
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := btrfsIoctl(parent.Fd(), btrfsIocSubvolCreate, unsafe.Pointer(volArgs(name))); err != nil {
		return fmt.Errorf("BTRFS_IOC_SUBVOL_CREATE: %w", err)
	}
	if err := setLimit(dir, size); err != nil {
		_ = btrfsIoctl(parent.Fd(), btrfsIocSnapDestroy, unsafe.Pointer(volArgs(name)))
		return err
	}
	return nil
}

// setLimit limits the qgroup of dir's subvolume to size bytes,
// referenced and exclusive (simple quotas count a subvolume's extents as
// both).
func setLimit(dir string, size int64) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	a := btrfsQgroupLimitArgs{flags: btrfsQgroupLimitMaxRfer | btrfsQgroupLimitMaxExcl, maxRfer: uint64(size), maxExcl: uint64(size)}
	if err := btrfsIoctl(f.Fd(), btrfsIocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("BTRFS_IOC_QGROUP_LIMIT: %w", err)
	}
	return nil
}

// removeSubvol deletes dir's subvolume, files and all; the kernel's
// cleaner frees its blocks afterwards.
func (d *Disks) removeSubvol(dir string) error {
	name, err := d.subvolName(dir)
	if err != nil {
		return err
	}
	parent, err := os.Open(d.root)
	if err != nil {
		return err
	}
	defer parent.Close()
	err = btrfsIoctl(parent.Fd(), btrfsIocSnapDestroy, unsafe.Pointer(volArgs(name)))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("BTRFS_IOC_SNAP_DESTROY: %w", err)
	}
	return nil
}

// subvolID is the id of the subvolume whose root dir is; 0 when dir is
// not the root of a subvolume of the shared filesystem (other than its
// top level, 5).
func subvolID(dir string) uint64 {
	var st unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_SUBVOL, &st) != nil ||
		st.Ino != btrfsFirstFreeObjectID || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0
	}
	id := st.Subvol
	if st.Mask&unix.STATX_SUBVOL == 0 {
		id = inoLookupTree(dir) // a kernel before 6.10
	}
	if id <= 5 {
		return 0
	}
	return id
}

// btrfsIocInoLookup is BTRFS_IOC_INO_LOOKUP, _IOWR(0x94, 18, struct
// btrfs_ioctl_ino_lookup_args): with treeid 0 and the objectid of a
// subvolume's root directory it answers the subvolume's id (no
// capability needed).
const btrfsIocInoLookup = 0xd0009412

// inoLookupTree is the id of the subvolume dir is in (0 when dir is not
// on btrfs).
func inoLookupTree(dir string) uint64 {
	var sfs unix.Statfs_t
	if unix.Statfs(dir, &sfs) != nil || sfs.Type != unix.BTRFS_SUPER_MAGIC {
		return 0
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0
	}
	defer f.Close()
	var a struct {
		treeid, objectid uint64
		name             [4080]byte
	}
	a.objectid = btrfsFirstFreeObjectID
	if btrfsIoctl(f.Fd(), btrfsIocInoLookup, unsafe.Pointer(&a)) != nil {
		return 0
	}
	return a.treeid
}

// qgroupUsage reads the usage and limit of dir's subvolume from sysfs.
func (fs *btrfsFS) qgroupUsage(dir string) (used, limit int64, ok bool) {
	id := subvolID(dir)
	if id == 0 {
		return 0, 0, false
	}
	q := filepath.Join(fs.qgroups, "0_"+strconv.FormatUint(id, 10))
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(filepath.Join(q, name))
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil
	}
	used, ok1 := read("referenced")
	limit, ok2 := read("max_referenced")
	rsv, _ := read("rsv_data") // written, not yet committed
	return used + rsv, limit, ok1 && ok2
}

// tryShared sets up the btrfs method, under the disks directory's lock
// (two processes of one data directory never make or mount the shared
// filesystem at once); its error says why the method is not used.
// seccompAvailable is sandbox.SeccompAvailable; a test stands in a
// machine without seccomp.
var seccompAvailable = sandbox.SeccompAvailable

func (d *Disks) tryShared() error {
	// A box can make a subvolume of its own in its workspace, which
	// needs only write permission, and a new subvolume's quota group has
	// no limit: only the boxes' seccomp filter, which refuses btrfs's
	// ioctls, keeps the session's quota whole.
	if err := seccompAvailable(); err != nil {
		return fmt.Errorf("boxes get no seccomp filter here (%v), which the shared filesystem needs to hold each session to its quota", err)
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return err
	}
	unlock, err := d.lockShared()
	if err != nil {
		return err
	}
	defer unlock()
	fs, err := d.openBtrfs()
	if err != nil {
		return err
	}
	fs.users = holdUsers(d.dir)
	d.shared = fs
	return nil
}

// holdUsers opens disks/.shared.users with a shared flock (nil if it
// cannot: then this process unmounts only what it mounted, as before).
func holdUsers(dir string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, ".shared.users"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_SH) != nil {
		f.Close()
		return nil
	}
	return f
}

// lockShared takes the lock of the shared filesystem's setup.
func (d *Disks) lockShared() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(d.dir, ".shared.lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// ensureShared mounts the shared filesystem again if it is not mounted at
// d.root (UnmountMine unmounted it, or another process that had mounted
// it stopped).
func (d *Disks) ensureShared() error {
	if isBtrfsMount(d.root) {
		return nil
	}
	unlock, err := d.lockShared()
	if err != nil {
		return err
	}
	defer unlock()
	if isBtrfsMount(d.root) {
		return nil
	}
	d.mu.Lock()
	if !d.boundRoot {
		d.boundRoot = privateRoot(d.root)
	}
	d.mu.Unlock()
	if err := d.mountShared(filepath.Join(d.dir, sharedImage)); err != nil {
		return &hiddenPaths{err: err, data: d.data}
	}
	if err := unix.Mount("", d.root, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the sessions' filesystem private: %w", err)
	}
	d.mu.Lock()
	d.shared.mounted = true
	d.mu.Unlock()
	return nil
}

// unmountShared unmounts the shared filesystem if this process mounted
// it; a busy one (a process of a session still running) is detached, and
// its loop device freed once its last user is gone. The caller holds d.mu.
func (d *Disks) unmountShared() {
	if u := d.shared.users; u != nil {
		// Under the setup lock, so no other process mounts or takes
		// the filesystem meanwhile: the last user unmounts it, whoever
		// mounted it; none while another process still holds it.
		unlock, err := d.lockShared()
		if err != nil {
			return
		}
		defer unlock()
		if unix.Flock(int(u.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			d.shared.mounted = false // another process's now
			return
		}
		defer func() { _ = unix.Flock(int(u.Fd()), unix.LOCK_SH) }() // this process may mount it again (ensureShared)
		if isBtrfsMount(d.root) {
			d.shared.mounted = true
		}
	}
	if !d.shared.mounted {
		return
	}
	if unix.Unmount(d.root, 0) != nil {
		_ = unix.Unmount(d.root, unix.MNT_DETACH)
	}
	d.shared.mounted = false
	if d.boundRoot {
		d.unbindRoot()
	} else if d.shared.users != nil && mountPoint(d.root) {
		_ = unix.Unmount(d.root, 0) // the private bind of the process that mounted it
	}
}

// unbindRoot unmounts the private bind of the sessions' directory this
// process made beneath the shared filesystem.
func (d *Disks) unbindRoot() {
	if d.boundRoot && unix.Unmount(d.root, 0) == nil {
		d.boundRoot = false
	}
}

// dirEntry is a directory of a tree, relative to its root, with its
// mode and owner.
type dirEntry struct {
	rel      string
	mode     os.FileMode
	uid, gid int
}

// make makes e below root as it was.
func (e dirEntry) make(root string) error {
	p := filepath.Join(root, e.rel)
	if err := os.Mkdir(p, e.mode.Perm()); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.Chown(p, e.uid, e.gid); err != nil {
		return err
	}
	return os.Chmod(p, e.mode.Perm())
}

// emptyTree lists root and the directories beneath it, parents first,
// when it holds nothing else (no file, link or device): the session
// directories session.Open made before the disks were set up. An error
// when it holds anything else.
func emptyTree(root string) ([]dirEntry, error) {
	var out []dirEntry
	err := filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.IsDir() {
			return fmt.Errorf("%s is not empty", filepath.Base(root))
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		e := dirEntry{rel: rel, mode: fi.Mode()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			e.uid, e.gid = int(st.Uid), int(st.Gid)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}
