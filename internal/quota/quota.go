// Package quota bounds the disk a session may fill, in the kernel.
//
// Where it can (root, btrfs in the kernel, mkfs.btrfs installed, and a
// data directory without sessions' files of before), every session
// directory is a subvolume of one shared btrfs filesystem with a quota
// group limit (btrfs.go): no loop device or mount per session. Otherwise
// each session directory ($QURO_DATA/sessions/<id>: workspace, tmp and the
// spilled outputs under workspace/.quro/outputs) is its own ext4
// filesystem: a sparse image file ($QURO_DATA/disks/<id>.img, a copy of
// one formatted once per size: see Disks.template) loop-mounted at the
// session directory. A write beyond the image's size fails with
// ENOSPC inside the box, whoever writes (the session's code, or the server
// spilling an output), and other sessions, on other images, keep writing.
//
// Why images: ext4 and xfs project quotas would be cheaper (no loop
// device, no mount), but they need the filesystem to be made or converted
// with the project quota feature (mkfs.ext4 -O quota,project, or
// tune2fs on an unmounted filesystem), which a data directory on the host's
// root filesystem rarely has. Images need only root, a loop device and
// mkfs.ext4, and their size can grow with the session's quota (resize2fs
// online). Without root (or without those tools), Probe says so and no
// quota is enforced by the kernel; callers then measure usage instead
// (Usage) and refuse by admission.
package quota

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/limitbuf"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Disks manages the images of the sessions of one data directory.
type Disks struct {
	dir    string   // $QURO_DATA/disks
	data   []string // $QURO_DATA as given and resolved, for tool errors (toolError)
	usable error    // nil when images can be used here

	// shared is the btrfs method's filesystem (btrfs.go), nil when the
	// images method is used (usable) or none; noShared says why not.
	shared   *btrfsFS
	noShared error

	mu   sync.Mutex
	mine map[string]bool // session directories this process mounted

	// root is $QURO_DATA/sessions, a private mount point of its own (see
	// privateRoot); boundRoot: this process made it one.
	root      string
	boundRoot bool

	waitDelay time.Duration // the tools' sandbox.Helper.WaitDelay (0: its default)

	tmplMu    sync.Mutex
	templates map[int64]template // by image size
	tmplUsed  []int64            // the templates' sizes, the one used least recently first
	swept     bool               // the templates of processes gone were removed
	noHoles   bool               // the images' filesystem shows no holes: mkfs each disk (errNoHoles)
}

// template is a formatted image (see Disks.template): its path, and an
// open file of it that holds a shared lock while this process keeps it.
type template struct {
	path string
	lock *os.File
}

// Open prepares the images directory of dataDir and probes whether images
// can be made and mounted. The tools run in / (sandbox.RunHelper's
// default): dataDir is made absolute here, and the session directories
// given to the methods must be absolute too (the App's are).
func Open(dataDir string) *Disks {
	return open(dataDir, true)
}

// OpenImages is Open with the images method alone, never the shared
// filesystem: the fallback, as a machine without btrfs or a data
// directory of before gets it (its tests).
func OpenImages(dataDir string) *Disks {
	return open(dataDir, false)
}

// Shared reports whether the sessions' disks are subvolumes of the data
// directory's one shared btrfs filesystem (no loop device or mount each).
func (d *Disks) Shared() bool { return d.shared != nil }

// open is Open; withShared false keeps to the images method.
func open(dataDir string, withShared bool) *Disks {
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	d := &Disks{dir: filepath.Join(dataDir, "disks"), data: dataPaths(dataDir), mine: map[string]bool{},
		root: filepath.Join(dataDir, "sessions"), templates: map[int64]template{}}
	d.noShared = errors.New("not tried")
	if withShared {
		d.noShared = d.tryShared()
		if d.noShared == nil {
			return d
		}
	}
	d.usable = d.probe()
	if d.usable == nil {
		d.boundRoot = privateRoot(d.root)
	}
	return d
}

// Root is the directory whose subdirectories are the sessions' mount
// points ("" when images are not used here). It is a private mount: a
// session's disk mounted below it is not copied into the mount namespaces
// made from the server's after that (boxes start from such a copy,
// without the disks, and get their own session's alone: see
// sandbox.Options.MountRoot).
func (d *Disks) Root() string {
	if d.shared != nil {
		return d.root
	}
	if d.usable != nil {
		return ""
	}
	return d.root
}

// privateRoot makes root a mount point of its own (a bind mount of
// itself) if it is not one, with private propagation, and reports whether
// it made the bind. A failure leaves root as it was: boxes then copy the
// disks' mounts, which is slower, not less isolated.
func privateRoot(root string) (bound bool) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return false
	}
	if !mountPoint(root) {
		// Recursive: a disk a killed server left mounted below stays
		// where it is seen.
		if unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, "") != nil {
			return false
		}
		bound = true
	}
	if unix.Mount("", root, "", unix.MS_PRIVATE, "") != nil && bound {
		_ = unix.Unmount(root, 0) // best effort: a bind that cannot be made private is no use
		return false
	}
	return bound
}

// mountPoint reports whether dir is a mount point, a bind mount of a
// directory of the same filesystem included (which Mounted, comparing
// devices, cannot tell).
func mountPoint(dir string) bool {
	var a, b unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_MNT_ID, &a) != nil ||
		unix.Statx(unix.AT_FDCWD, filepath.Dir(dir), 0, unix.STATX_MNT_ID, &b) != nil {
		return Mounted(dir)
	}
	return a.Mnt_id != b.Mnt_id
}

// Close removes the disk templates this process made and unmounts the
// bind Open made of the sessions' directory, unless a disk is still
// mounted below it (another process's, or a busy one).
func (d *Disks) Close() {
	if d.shared != nil {
		d.UnmountMine()
		d.mu.Lock()
		if u := d.shared.users; u != nil {
			u.Close()
			d.shared.users = nil
		}
		d.mu.Unlock()
		return
	}
	d.tmplMu.Lock()
	for size, t := range d.templates {
		os.Remove(t.path)
		t.lock.Close()
		delete(d.templates, size)
	}
	d.tmplUsed = nil
	os.Remove(filepath.Join(d.dir, "templates")) // when empty: another process's may be there
	d.tmplMu.Unlock()
	if d.boundRoot {
		if unix.Unmount(d.root, 0) == nil {
			d.boundRoot = false
		}
	}
}

func (d *Disks) probe() error {
	if os.Geteuid() != 0 {
		return errors.New("the server is not root: it cannot mount a per-session disk image")
	}
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "resize2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (apt-get install e2fsprogs)", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("no loop devices: %v", err)
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return err
	}
	return nil
}

// Enforced reports whether the kernel enforces quotas here; when not, the
// error says why.
func (d *Disks) Enforced() error { return d.usable }

// Method names the mechanism, for status and doctor.
func (d *Disks) Method() string {
	if d.shared != nil {
		return MethodShared
	}
	if d.usable != nil {
		return "none (" + d.usable.Error() + ")"
	}
	return MethodImages + " (no shared btrfs filesystem: " + hidePaths(d.noShared.Error(), d.data) + ")"
}

// The methods, as Method names them.
const (
	MethodShared = "btrfs subvolume per session on one shared filesystem"
	MethodImages = "ext4 image per session, loop-mounted"
)

func (d *Disks) image(sessionDir string) string {
	return filepath.Join(d.dir, filepath.Base(sessionDir)+".img")
}

// Create makes an image of size bytes for the session directory dir (which
// must not exist yet, or be empty) and mounts it there.
func (d *Disks) Create(dir string, size int64) error {
	if d.usable != nil {
		return d.usable
	}
	if size < 8<<20 {
		return fmt.Errorf("disk quota %d bytes: at least 8 MiB", size)
	}
	if d.shared != nil {
		if err := d.ensureShared(); err != nil {
			return err
		}
		if err := d.createSubvol(dir, size); err != nil {
			return &hiddenPaths{err: err, data: d.data} // a tenant may read it
		}
		return nil
	}
	img := d.image(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// On a failure the mount point goes too (when empty: a directory the
	// caller filled is its own), so that a refused create leaves nothing.
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		os.Remove(dir)
		return fmt.Errorf("disk image: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		os.Remove(img)
		os.Remove(dir)
		return fmt.Errorf("disk image: %w", err)
	}
	tmpl, err := d.template(size)
	switch {
	case err == nil:
		err = copySparse(f, tmpl, size)
		tmpl.Close()
	case errors.Is(err, errNoHoles):
		// A copy would write the whole image: mkfs it instead.
		if err = f.Truncate(size); err == nil {
			err = d.mkfs(img, size)
		}
	}
	if err == nil {
		err = d.mountNew(img, dir)
	}
	if err != nil {
		os.Remove(img)
		os.Remove(dir)
		return fmt.Errorf("session disk: %w", err)
	}
	return nil
}

// maxTemplates bounds the templates a process keeps (one per disk
// size: the tenants' quotas); the one used least recently goes first.
const maxTemplates = 4

// template opens an image of size bytes formatted as a session's disk
// is, made once per size and process and copied for each new disk: a
// burst of creates ran a mkfs.ext4 each, 100 processes at once on 2
// cores (p50 1.3 s each at load; bench/README.md), where a copy of the
// template's 1.2 MB of written blocks takes no process. The templates
// are a cache, no session's: they live in their own directory
// ($QURO_DATA/disks/templates, where no session reaches), at most
// maxTemplates of them, removed on Close. The copies share the
// template's filesystem UUID and directory hash seed; each is a
// filesystem of its own on a device of its own, and nothing mounts them
// by UUID (mountDev mounts the device).
func (d *Disks) template(size int64) (*os.File, error) {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	if d.noHoles {
		return nil, errNoHoles
	}
	if t, ok := d.templates[size]; ok {
		d.tmplUsed = append(slices.DeleteFunc(d.tmplUsed, func(s int64) bool { return s == size }), size)
		return os.Open(t.path)
	}
	dir := filepath.Join(d.dir, "templates")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk template: %w", err)
	}
	if !d.swept {
		d.swept = true
		sweepTemplates(dir)
	}
	// A new file each time the process starts (a template left by an
	// earlier server, or by a crash in the middle of a mkfs, is never
	// trusted): made under a temporary name and share-locked for as long
	// as this process keeps it, so that another process's sweep leaves
	// it; then renamed.
	t, err := os.CreateTemp(dir, ".new-*")
	if err != nil {
		return nil, fmt.Errorf("disk template: %w", err)
	}
	err = unix.Flock(int(t.Fd()), unix.LOCK_SH)
	if err == nil {
		err = t.Truncate(size)
	}
	if err == nil {
		err = d.mkfs(t.Name(), size)
	}
	if err == nil {
		// A filesystem that shows no holes (SEEK_HOLE at the end) would
		// have every copy write the whole image.
		var hole int64
		if hole, err = unix.Seek(int(t.Fd()), 0, unix.SEEK_HOLE); err == nil && hole >= size {
			d.noHoles = true
			err = errNoHoles
		}
	}
	p := filepath.Join(dir, strings.TrimPrefix(filepath.Base(t.Name()), ".new-")+"-"+strconv.FormatInt(size, 10)+".img")
	if err == nil {
		err = os.Rename(t.Name(), p)
	}
	var f *os.File
	if err == nil {
		f, err = os.Open(p)
	}
	if err != nil {
		os.Remove(t.Name())
		os.Remove(p)
		t.Close()
		if errors.Is(err, errNoHoles) {
			return nil, err
		}
		return nil, fmt.Errorf("disk template: %w", err)
	}
	// t keeps its lock across the rename (t.Name() is the old name).
	d.templates[size] = template{path: p, lock: t}
	d.tmplUsed = append(d.tmplUsed, size)
	for len(d.tmplUsed) > maxTemplates {
		// An open template stays readable for the copy under way.
		old := d.templates[d.tmplUsed[0]]
		os.Remove(old.path)
		old.lock.Close()
		delete(d.templates, d.tmplUsed[0])
		d.tmplUsed = d.tmplUsed[1:]
	}
	return f, nil
}

// errNoHoles: the images directory's filesystem shows no holes
// (SEEK_HOLE), so a copy of a template would write every byte of the
// image; each disk is made by mkfs.ext4 then.
var errNoHoles = errors.New("the images' filesystem shows no holes")

// mkfs formats the image file path of size bytes as a session's disk.
func (d *Disks) mkfs(path string, size int64) error {
	// No reserved blocks (the server writes spilled outputs as root),
	// lazy init and a small journal keep the image sparse and quick.
	return d.run("mkfs.ext4", "-q", "-F", "-m", "0", "-J", "size="+strconv.Itoa(journalMiB(size)),
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", path)
}

// sweepTemplates removes the templates in dir that no process holds
// (each process share-locks its own while it lives): those of a server
// that stopped without Close. A template is named .img only once it is
// locked; an unfinished one (.new-*, a crash during its mkfs) is left.
func sweepTemplates(dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	for _, p := range names {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.Remove(p)
		}
		f.Close()
	}
}

// copySparse copies src into dst, whose length becomes size: only src's
// written extents (SEEK_DATA, SEEK_HOLE), in the kernel
// (copy_file_range), so that dst is as sparse as src.
func copySparse(dst, src *os.File, size int64) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	var off int64
	for {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data past off
		}
		if err != nil {
			return fmt.Errorf("disk template: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("disk template: %w", err)
		}
		for in, out := data, data; in < hole; {
			n, err := unix.CopyFileRange(sfd, &in, dfd, &out, int(hole-in), 0)
			if err != nil {
				return fmt.Errorf("disk template: copy: %w", err)
			}
			if n == 0 {
				return errors.New("disk template: copy: the template ended early")
			}
		}
		off = hole
	}
	if err := dst.Truncate(size); err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	return nil
}

// ErrNoLoop is a disk that could not get a loop device: none was free
// (the kernel's max_loop reached), or other attaches, of this host's
// other processes, took every free one offered first. Nothing of the
// disk is left; trying again later may succeed.
var ErrNoLoop = errors.New("no loop device could be had for the session's disk")

// attachTries bounds the loop devices a disk tries to attach to, each
// one taken by another process between its choice and the attach; the
// attaches of this process never choose the same device (offers), so
// only other processes race it.
const attachTries = 16

// offers are the loop devices this process's attaches have chosen and
// not yet attached (or given up). LOOP_CTL_GET_FREE offers every
// concurrent caller the same device, of which one attach wins, so a
// burst of creates at once lost all but one attach per round and some
// ran out of tries (issue 29: `a loop device: device or resource busy`
// at load). The attaches then took turns under one lock; but an attach
// (LOOP_CONFIGURE) waits for the kernel — a queue freeze, an RCU grace
// period — for up to a second at load, and a burst of 100 creates spent
// most of its time in that line (bench/README.md). Now each attach
// takes a device no other attach of this process holds, under offersMu
// only while it chooses, and the attaches themselves run at once.
var (
	offersMu sync.Mutex
	offers   = map[int]bool{}
)

// testBeforeAttach, when set (by tests), runs between the choice of free
// loop device n and the attach to it.
var testBeforeAttach func(n int)

// journalMiB is the journal's size for an image of size bytes: 4 MiB, or
// a quarter of a smaller image (at least 1 MiB, mkfs's least). mkfs.ext4
// refuses a journal larger than half the free blocks ("Total journal
// size too big for filesystem"): a 4 MiB one made the smallest quota
// Create takes, 8 MiB, fail.
func journalMiB(size int64) int {
	return int(min(max(size>>20/4, 1), 4))
}

// mountNew attaches the image img to a free loop device and mounts its
// filesystem at dir, as mount(8) would, with the same flags (see mountDev)
// but without reading the mount table and every loop device's backing
// file, which grow with the number of sessions. The caller holds the
// image's lock. The device clears itself once the filesystem's last
// mount is gone.
func (d *Disks) mountNew(img, dir string) error {
	// The loop device keeps the open file it is given for as long as it
	// is bound, and with it any flock on it: it gets an open file of its
	// own, never the one that holds the image's lock.
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	lo, err := attach(f)
	if err != nil {
		return err
	}
	// The device's open descriptor holds it until the mount does
	// (autoclear would clear it on its last close).
	err = d.mountDev(lo.Name(), dir)
	lo.Close()
	return err
}

// attach binds the open image f to a free loop device, with autoclear,
// and returns the device open.
func attach(f *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	for range attachTries {
		n, err := offer(ctl)
		if err != nil {
			return nil, err
		}
		lo, err := configure(n, f)
		if errors.Is(err, unix.EBUSY) {
			continue // another process's attach took it first
		}
		return lo, err
	}
	return nil, fmt.Errorf("%w: other attaches took the %d offered first", ErrNoLoop, attachTries)
}

// configure attaches f to loop device n, which offer chose, and gives
// n back to the other attaches once the kernel has it bound (or not).
func configure(n int, f *os.File) (*os.File, error) {
	defer func() {
		offersMu.Lock()
		delete(offers, n)
		offersMu.Unlock()
	}()
	if err := loopNode(n); err != nil {
		return nil, err
	}
	lo, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("a loop device: %w", err)
	}
	if testBeforeAttach != nil {
		testBeforeAttach(n)
	}
	cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	err = unix.IoctlLoopConfigure(int(lo.Fd()), &cfg)
	if err != nil {
		lo.Close()
		if errors.Is(err, unix.EBUSY) {
			return nil, err
		}
		return nil, fmt.Errorf("a loop device: %w", err)
	}
	return lo, nil
}

// offer chooses a free loop device that no other attach of this process
// holds, and marks it held (offers). The kernel's choice
// (LOOP_CTL_GET_FREE: the lowest unbound device, made when none is) is
// taken when it is not held; otherwise the devices above it are looked
// at in sysfs, where a bound device has a "loop" directory, and one past
// the last is made (LOOP_CTL_ADD). sysfs can be behind the kernel, and
// another process can bind a device between the choice and the attach:
// either is an EBUSY at the attach, and the next offer.
func offer(ctl *os.File) (int, error) {
	offersMu.Lock()
	defer offersMu.Unlock()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return 0, fmt.Errorf("%w: no free loop device: %w", ErrNoLoop, err)
	}
	if offers[n] {
		for {
			n++
			if offers[n] {
				continue
			}
			free, err := unbound(ctl, n)
			if err != nil {
				return 0, err
			}
			if free {
				break
			}
		}
	}
	offers[n] = true
	return n, nil
}

// unbound says whether loop device n looks free in sysfs, making it
// when it does not exist yet (as LOOP_CTL_GET_FREE does when no device
// is free).
func unbound(ctl *os.File, n int) (bool, error) {
	_, err := os.Stat(fmt.Sprintf("/sys/block/loop%d", n))
	if errors.Is(err, fs.ErrNotExist) {
		// Past the last device. Another process may have made it
		// meanwhile: then it is there, and taken or not, the attach says.
		if err := unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_ADD, n); err != nil && !errors.Is(err, unix.EEXIST) {
			return false, fmt.Errorf("%w: adding loop device %d: %w", ErrNoLoop, n, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("a loop device: %w", err)
	}
	_, err = os.Stat(fmt.Sprintf("/sys/block/loop%d/loop", n))
	return errors.Is(err, fs.ErrNotExist), nil
}

// mountDev mounts the ext4 filesystem on the loop device dev at dir.
// nodev, nosuid: a file the box made must never be a device or a set-uid
// program for the host.
func (d *Disks) mountDev(dev, dir string) error {
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mounting the session's disk: %w", err)
	}
	d.mu.Lock()
	d.mine[dir] = true
	d.mu.Unlock()
	return nil
}

// lock takes the image's lock (an flock on the image file, so it holds
// across quro processes and between goroutines): whoever mounts, checks,
// resizes or removes an image holds it, so that no two of these run at
// once on one image. unlock releases it.
func lock(img string) (unlock func(), err error) {
	f, err := os.Open(img)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// loopNode makes sure /dev/loopN, the node of loop device n, exists. In
// a container (a Kubernetes pod) /dev is a tmpfs the runtime filled as
// the container started: a loop device the kernel made since
// (LOOP_CTL_GET_FREE adds one when none is free, and other containers
// and the host take them too) has no node there, and neither an open nor
// mount(8) finds it ("failed to setup loop device"). sysfs has its
// numbers. n comes from the kernel, never from a session.
func loopNode(n int) error {
	dev := fmt.Sprintf("/dev/loop%d", n)
	if _, err := os.Stat(dev); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/dev", n))
	if err != nil {
		return fmt.Errorf("loop device %d has no node in /dev and no numbers in sysfs: %w", n, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return fmt.Errorf("loop device %d: sysfs says %q: %w", n, b, err)
	}
	err = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor)))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("making the node of loop device %d: %w", n, err)
	}
	return nil
}

// boundLoop opens the loop device whose backing file is img, if one is;
// nil if none. It reads sysfs, as losetup -j does: this is the rare path
// (a session's disk mounted again), not a create's. sysfs names a
// device's backing file by its path, which a file of another mount
// namespace (another pod's data volume on the same machine, mounted at
// the same place) shows too: a device is taken only when the kernel says
// its backing file is img itself (device and inode, LOOP_GET_STATUS64).
func boundLoop(img string) (*os.File, error) {
	abs, err := filepath.Abs(img)
	if err != nil {
		return nil, err
	}
	var ist unix.Stat_t
	if err := unix.Stat(abs, &ist); err != nil {
		return nil, err
	}
	// sysfs names the backing file by the kernel's path: the data
	// directory's links resolved.
	paths := []string{abs}
	if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
		paths = append(paths, real)
	}
	backs := func(n int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/backing_file", n))
		return err == nil && slices.Contains(paths, strings.TrimSuffix(string(b), "\n"))
	}
	names, _ := filepath.Glob("/sys/block/loop[0-9]*")
	for _, name := range names {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(name), "loop"))
		if err != nil || !backs(n) {
			continue
		}
		if err := loopNode(n); err != nil {
			return nil, err
		}
		lo, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("a loop device: %w", err)
		}
		if backsImage(lo, &ist) { // still: it did not clear itself before the open held it
			return lo, nil
		}
		lo.Close()
	}
	return nil, nil
}

// UnmountMine unmounts the images this process mounted and no process
// uses (a server or CLI that stops; whoever runs a session next mounts it
// again). A busy one stays mounted.
func (d *Disks) UnmountMine() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shared != nil {
		d.unmountShared()
		return
	}
	for dir := range d.mine {
		if syscall.Unmount(dir, 0) == nil || !Mounted(dir) {
			delete(d.mine, dir)
		}
	}
}

// Has reports whether dir has a disk of its own (a subvolume, or an image).
func (d *Disks) Has(dir string) bool {
	if d.shared != nil {
		return subvolID(dir) != 0
	}
	_, err := os.Stat(d.image(dir))
	return err == nil
}

// Mounted reports whether dir is a mount point (its image is mounted).
func Mounted(dir string) bool {
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// Remount mounts dir's image again if it has one and it is not mounted
// (after a restart of the machine or a server killed mid-way).
func (d *Disks) Remount(dir string) error {
	if d.shared != nil {
		return d.ensureShared()
	}
	if d.usable != nil || !d.Has(dir) || Mounted(dir) {
		return nil // no images on this server (d.usable says why), none to remount, or mounted already
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	img := d.image(dir)
	unlock, err := lock(img)
	if err != nil {
		return err
	}
	defer unlock()
	if Mounted(dir) {
		return nil // mounted by another call meanwhile
	}
	// When a loop device backs img already (its filesystem lives on in
	// another mount namespace, a box's, or a process has the device
	// open), that device is mounted again, so one filesystem is never
	// mounted from two devices; else img is attached to a free one
	// (mountNew). The device is chosen here, never by mount(8), which
	// asks loop-control for a free device of its own: another process
	// may take it first, or it may have no node in a container's /dev.
	// A disk Grow could not grow while it was in use grows now, unless
	// its filesystem still lives in another mount namespace.
	lo, err := boundLoop(img)
	if err != nil {
		return err
	}
	if lo == nil {
		// No loop device backs the image: nothing has its filesystem.
		if d.short(img) {
			if err := d.resizeOffline(img); err != nil {
				return fmt.Errorf("growing the session's disk: %w", err)
			}
		}
		return d.mountNew(img, dir)
	}
	defer lo.Close() // held open, the device cannot clear itself before the mount holds it
	if d.short(img) && unmountedEverywhere(lo) {
		if err := d.growDevice(lo); err != nil {
			return fmt.Errorf("growing the session's disk: %w", err)
		}
	}
	return d.mountDev(lo.Name(), dir)
}

// ErrNotGrown is Grow's error when the session's disk is in use and the
// server cannot resize it online: the image was made larger, and its
// filesystem grows when the session is idle.
var ErrNotGrown = errors.New("the session's disk grows when it is idle")

// Grow makes dir's filesystem size bytes, if that is larger (shrinking a
// mounted ext4 is not possible; a smaller quota applies to new sessions).
// It resizes online when the server may (CAP_SYS_RESOURCE), else it
// unmounts, resizes and mounts again, which needs the session idle: a busy
// one keeps its size and the error wraps ErrNotGrown.
//
// Its error never names a host path: set_tenant_limits joins the errors
// of a tenant's sessions, and when one is ErrNotGrown the caller reads
// them all (the image's own errors, os.PathErrors, would name it).
func (d *Disks) Grow(dir string, size int64) error {
	if err := d.grow(dir, size); err != nil {
		return &hiddenPaths{err: err, data: d.data}
	}
	return nil
}

func (d *Disks) grow(dir string, size int64) error {
	if d.shared != nil {
		if _, limit, ok := d.shared.qgroupUsage(dir); ok && limit >= size {
			return nil
		}
		return setLimit(dir, size)
	}
	img := d.image(dir)
	unlock, err := lock(img)
	if err != nil {
		return err
	}
	defer unlock()
	fi, err := os.Stat(img)
	if err != nil {
		return err
	}
	if fi.Size() < size {
		if err := os.Truncate(img, size); err != nil {
			return err
		}
	} else if !d.short(img) {
		return nil // the image and its filesystem are that large already
	}
	if !Mounted(dir) {
		lo, err := boundLoop(img)
		if err != nil {
			return err
		}
		if lo == nil {
			return d.resizeOffline(img) // no loop device backs it: nothing has its filesystem
		}
		defer lo.Close()
		if !unmountedEverywhere(lo) {
			return fmt.Errorf("%w (the filesystem is in use in another mount namespace)", ErrNotGrown)
		}
		return d.growDevice(lo)
	}
	// The loop device under dir is held open from here to the end: it
	// stays bound to the image across the unmount below (an autoclear
	// device is released on its last close, which may be any process's:
	// one that scans or probes the loop devices), so that the filesystem
	// is checked, grown and mounted again on the one device whose page
	// cache holds it.
	lo, err := mountedLoop(dir, img)
	if err != nil {
		return err
	}
	defer lo.Close()
	if err := unix.IoctlSetInt(int(lo.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("a loop device's new size: %w", err)
	}
	online := resizeOnline(dir, img)
	if online == nil {
		return nil
	}
	if err := syscall.Unmount(dir, 0); err != nil {
		return fmt.Errorf("%w (online resizing failed: %v; unmount: %v)", ErrNotGrown, online, err)
	}
	// The filesystem may still be mounted in another mount namespace (a
	// box made while it was mounted here holds a copy of the mount):
	// checking or resizing it under the live filesystem would corrupt
	// it. Mount it back (the same device, so the same filesystem) and
	// grow it when idle.
	if !unmountedEverywhere(lo) {
		if merr := d.mountDev(lo.Name(), dir); merr != nil {
			return merr
		}
		return fmt.Errorf("%w (online resizing failed: %v; the filesystem is still in use in another mount namespace)", ErrNotGrown, online)
	}
	err = d.resizeOffline(lo.Name())
	if merr := d.mountDev(lo.Name(), dir); merr != nil {
		return merr
	}
	return err
}

// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64)
// (linux/fs/ext4/ext4.h): grow a mounted ext4 filesystem to a number of
// blocks. x/sys/unix does not name it.
const ext4IocResizeFS = 0x40086610

// resizeOnline grows the ext4 filesystem mounted at dir to the size of
// its image img, by the ioctl resize2fs makes, on the mount point itself
// (resize2fs finds a mount point by the device's name in the mount
// table). The kernel needs CAP_SYS_RESOURCE (else EPERM) and trims a
// last block group too small for its metadata.
func resizeOnline(dir, img string) error {
	fi, err := os.Stat(img)
	if err != nil {
		return err
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Type != unix.EXT4_SUPER_MAGIC || st.Bsize <= 0 {
		return fmt.Errorf("the session's disk is not an ext4 filesystem (type %#x)", st.Type)
	}
	blocks := uint64(fi.Size()) / uint64(st.Bsize)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&blocks))); e != 0 {
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: %w", e)
	}
	return nil
}

// mountedLoop opens the loop device of the filesystem mounted at dir,
// found by the mount's device numbers (sysfs names the device), and
// checks that it is the one backing img.
func mountedLoop(dir, img string) (*os.File, error) {
	var st, ist unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, err
	}
	if err := unix.Stat(img, &ist); err != nil {
		return nil, err
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return nil, fmt.Errorf("the device of the session's disk: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(link), "loop"))
	if err != nil || !strings.HasPrefix(filepath.Base(link), "loop") {
		return nil, fmt.Errorf("the session's disk is not on a loop device (%s)", filepath.Base(link))
	}
	if err := loopNode(n); err != nil {
		return nil, err
	}
	lo, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("a loop device: %w", err)
	}
	var lst unix.Stat_t
	err = unix.Fstat(int(lo.Fd()), &lst)
	if err == nil && lst.Rdev != st.Dev {
		err = errors.New("its node is another device")
	}
	if err == nil && !backsImage(lo, &ist) {
		err = errors.New("the device mounted there is not the session's image")
	}
	if err != nil {
		lo.Close()
		return nil, fmt.Errorf("a loop device: %w", err)
	}
	return lo, nil
}

// backsImage reports whether the open loop device lo is bound to the file
// img (its device and inode numbers, as the kernel keeps them).
func backsImage(lo *os.File, img *unix.Stat_t) bool {
	info, err := unix.IoctlLoopGetStatus64(int(lo.Fd()))
	return err == nil && info.Device == img.Dev && info.Inode == img.Ino
}

// unmountedEverywhere reports whether no mount, in any mount namespace,
// holds the filesystem on the loop device lo: a mounted filesystem holds
// its block device exclusively, and an exclusive open (O_EXCL) then
// fails with EBUSY. Other opens of the device (a tool that probes it)
// do not count; whether the device is still bound to its file after an
// unmount does not tell (see grow).
func unmountedEverywhere(lo *os.File) bool {
	ex, err := os.OpenFile(lo.Name(), os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	ex.Close()
	return true
}

// growDevice grows the filesystem on the loop device lo, mounted
// nowhere, to its image's size: the device takes the image's new size,
// and the filesystem is checked and grown through the device, whose
// page cache a mount of it reads afterwards.
func (d *Disks) growDevice(lo *os.File) error {
	if err := unix.IoctlSetInt(int(lo.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("a loop device's new size: %w", err)
	}
	return d.resizeOffline(lo.Name())
}

// resizeOffline checks the filesystem on img (an image, or the loop
// device bound to it) and grows it to its size. Nothing may have it
// mounted, in any mount namespace.
func (d *Disks) resizeOffline(img string) error {
	// e2fsck exits 1 when it corrected something, which is fine here.
	err := d.run("e2fsck", "-f", "-p", img)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		err = nil
	}
	if err != nil {
		return err
	}
	return d.run("resize2fs", img)
}

// growSlack is how much smaller than its image a filesystem may be and
// count as grown: resize2fs leaves out a last block group too small for
// its own metadata.
const growSlack = 1 << 20

// short reports whether img's filesystem is smaller than the image (a
// Grow that could not resize it yet).
func (d *Disks) short(img string) bool {
	fi, err := os.Stat(img)
	if err != nil {
		return false
	}
	n, err := fsSize(img)
	return err == nil && n < fi.Size()-growSlack
}

// fsSize is the size of the ext4 filesystem in img, from its superblock.
func fsSize(img string) (int64, error) {
	f, err := os.Open(img)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var sb [1024]byte
	if _, err := f.ReadAt(sb[:], 1024); err != nil {
		return 0, err
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != 0xEF53 {
		return 0, fmt.Errorf("%s: no ext4 superblock", img)
	}
	blocks := uint64(le.Uint32(sb[0x4:]))
	if le.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT: the high half of the count
		blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	return int64(blocks) << (10 + le.Uint32(sb[0x18:])), nil
}

// Remove unmounts dir and deletes its image. Stop every process of the
// session first: a busy filesystem is detached (MNT_DETACH) and freed when
// its last user is gone.
func (d *Disks) Remove(dir string) error {
	if d.shared != nil {
		if subvolID(dir) == 0 {
			return nil // none made, or removed already
		}
		return d.removeSubvol(dir)
	}
	if unlock, err := lock(d.image(dir)); err == nil {
		defer unlock()
	}
	if Mounted(dir) {
		if err := syscall.Unmount(dir, 0); err != nil {
			if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
		}
	}
	d.mu.Lock()
	delete(d.mine, dir)
	d.mu.Unlock()
	if err := os.Remove(d.image(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Usage is how full a session's filesystem is.
type Usage struct {
	Quota int64 // the image's size
	Used  int64 // bytes in files and directories
	Free  int64 // bytes that can still be written
}

// Usage reads the quota and usage of dir's disk (its subvolume's quota
// group, or its image's filesystem); ok is false when dir has none.
func (d *Disks) Usage(dir string) (u Usage, ok bool) {
	if d.shared != nil {
		used, limit, ok := d.shared.qgroupUsage(dir)
		if !ok || limit <= 0 {
			return u, false
		}
		return Usage{Quota: limit, Used: used, Free: max(limit-used, 0)}, true
	}
	if !Mounted(dir) || !d.Has(dir) {
		return u, false
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return u, false
	}
	fi, err := os.Stat(d.image(dir))
	if err != nil {
		return u, false
	}
	u.Quota = fi.Size()
	u.Used = int64(st.Blocks-st.Bfree) * st.Bsize
	u.Free = int64(st.Bavail) * st.Bsize
	return u, true
}

// Full reports whether less than 1% (at least 1 MiB) of dir's image is free.
func (u Usage) Full() bool {
	return u.Free < max(u.Quota/100, 1<<20)
}

// Note is the message appended to the output of a run in session dir when
// its disk quota is full; "" when it is not. It names the quota and the
// biggest directories, so that the model knows what to delete.
func (d *Disks) Note(sessionDir string) string {
	u, ok := d.Usage(sessionDir)
	if !ok || !u.Full() {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nquro: this session's disk quota of %s is full (%s used by workspace, tmp and saved outputs together)",
		Human(u.Quota), Human(u.Used))
	if big := Biggest(sessionDir, 5); len(big) > 0 {
		b.WriteString("; the biggest directories:")
		for _, e := range big {
			fmt.Fprintf(&b, " %s %s,", e.Path, Human(e.Bytes))
		}
		s := strings.TrimSuffix(b.String(), ",")
		b.Reset()
		b.WriteString(s)
	}
	msg := "No space left on device"
	if d.shared != nil {
		msg = "Disk quota exceeded"
	}
	b.WriteString(". Writes fail with \"" + msg + "\" until you delete files you no longer need (rm), or an admin raises the quota (quro serve --disk-quota, or quro tenant limits set --disk).\n")
	return b.String()
}

// Entry is a directory and the bytes beneath it.
type Entry struct {
	Path  string // relative to the session directory, e.g. workspace/data
	Bytes int64
}

// Biggest returns the n directories (two levels deep: workspace/x, tmp/y,
// workspace/.quro/outputs) that hold the most bytes beneath sessionDir. It
// stops counting after 200,000 files.
func Biggest(sessionDir string, n int) []Entry {
	sizes := map[string]int64{}
	files := 0
	// The walk's callback skips what it cannot read: an approximation
	// with a gap, not an error.
	_ = filepath.WalkDir(sessionDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || files > 200000 {
			return fs.SkipDir
		}
		if e.Type().IsRegular() {
			files++
			rel, _ := filepath.Rel(sessionDir, p)
			parts := strings.Split(rel, string(filepath.Separator))
			key := parts[0]
			if len(parts) > 2 {
				key = filepath.Join(parts[0], parts[1])
				if parts[1] == ".quro" && len(parts) > 3 {
					key = filepath.Join(parts[0], parts[1], parts[2])
				}
			}
			if info, err := e.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					sizes[key] += st.Blocks * 512
				} else {
					sizes[key] += info.Size()
				}
			}
		}
		return nil
	})
	var out []Entry
	for k, v := range sizes {
		out = append(out, Entry{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bytes > out[j].Bytes })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// Human renders bytes as B, KiB, MiB or GiB.
func Human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// toolEnv is the whole environment of a disk tool: nothing of the
// server's, and the C locale, so that what the tools print is the same
// on every server.
var toolEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// maxToolOutput bounds what is kept of a disk tool's output (their
// errors are a few lines; the rest is dropped).
const maxToolOutput = 16 << 10

func (d *Disks) run(name string, args ...string) error {
	_, err := d.output(name, args...)
	if errors.Is(err, exec.ErrWaitDelay) {
		// The tool exited 0 and only the drain of its output (which
		// run drops) outlived the helper's WaitDelay: on a loaded
		// machine (issue 29: mkfs.ext4 failed 7 of a burst's creates
		// at load 400) the pipe's last copy, held by a child forked
		// elsewhere in the server until its exec, or the server's
		// starved reader, can take longer. The work is done.
		return nil
	}
	return err
}

// output runs a disk tool (mkfs.ext4, e2fsck, resize2fs) to its end and returns its output, stdout and stderr
// together. It runs through sandbox.RunHelper, the one way the server
// runs a program of its own: in a process group of its own, killed as a
// whole once the tool exited, with a parent-death signal. A failure is a
// *toolError, whose text has what the tool said.
func (d *Disks) output(name string, args ...string) (string, error) {
	out := &limitbuf.Buffer{Max: maxToolOutput}
	// No deadline, as before: no caller has a context, and a mount or
	// a check of a large image has no bound known beforehand.
	err := sandbox.RunHelper(context.Background(), &sandbox.Helper{Path: name, Args: args, Env: toolEnv, Stdout: out, Stderr: out, WaitDelay: d.waitDelay})
	if err != nil {
		return "", &toolError{tool: name, err: err, out: strings.TrimSpace(out.String()), data: d.data}
	}
	return strings.TrimSpace(out.String()), nil
}

// toolError is a disk tool's failure: which tool, how it ended, and what
// it printed. Its text may reach a tenant (Grow's ErrNotGrown carries
// resize2fs's, and that class is shown to the caller), so it never names
// a path of the host: the data directory is written $QURO_DATA (the
// image $QURO_DATA/disks/<session>.img, the mount point
// $QURO_DATA/sessions/<session>, both named by the session's id only),
// and a loop device is "a loop device". The operator reads the same text
// in the log, which is enough to find both.
type toolError struct {
	tool string
	err  error  // how it ended: an *exec.ExitError, or why it did not start
	out  string // what it printed, cut at maxToolOutput
	data []string
}

func (e *toolError) Error() string {
	msg := fmt.Sprintf("%s: %v", e.tool, e.err)
	if e.out != "" {
		msg += ": " + e.out
	}
	return hidePaths(msg, e.data)
}

func (e *toolError) Unwrap() error { return e.err }

// hiddenPaths is err with the data directory's paths and loop devices
// written as toolError writes them.
type hiddenPaths struct {
	err  error
	data []string
}

func (e *hiddenPaths) Error() string { return hidePaths(e.err.Error(), e.data) }
func (e *hiddenPaths) Unwrap() error { return e.err }

// loopDev is a loop device's path, as the tools print it.
var loopDev = regexp.MustCompile(`/dev/loop[0-9]+(p[0-9]+)?`)

// hidePaths writes each of the data directory's paths in s (data, as
// dataPaths gives them) as $QURO_DATA, and each loop device as "a loop
// device".
func hidePaths(s string, data []string) string {
	for _, p := range data {
		s = strings.ReplaceAll(s, p, "$QURO_DATA")
	}
	return loopDev.ReplaceAllString(s, "a loop device")
}

// dataPaths are the spellings of dataDir a tool may print: as given,
// absolute, and with its symbolic links resolved (mount and findmnt print
// the kernel's path), longest first so that none is left half-replaced.
func dataPaths(dataDir string) []string {
	var out []string
	add := func(p string) {
		p = filepath.Clean(p)
		if p != "/" && p != "." && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	add(dataDir)
	if abs, err := filepath.Abs(dataDir); err == nil {
		add(abs)
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			add(real)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// ParseSize reads a size such as 2G, 2GiB, 512M, 1.5G or 1048576 (bytes);
// K, M, G, T are powers of 1024. "none" or -1 is -1 (no limit).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	if t == "NONE" || t == "-1" {
		return -1, nil
	}
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*float64(mult) >= 1<<62 {
		return 0, fmt.Errorf("size %q: want bytes or a number with K, M, G or T (powers of 1024), e.g. 2G", s)
	}
	return int64(f * float64(mult)), nil
}
