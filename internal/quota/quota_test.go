package quota

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
)

func newDisks(t testing.TB) (*Disks, string) {
	t.Helper()
	data := t.TempDir()
	d := openDisks(t, data)
	if err := d.Enforced(); err != nil {
		t.Skipf("no kernel-enforced quota here: %v", err)
	}
	return d, data
}

// openDisks opens the disks of data with the images method (the
// fallback, whose loop devices and mounts most tests here are about) and
// closes them when t ends (before data is removed: the sessions'
// directory is a mount point meanwhile).
func openDisks(t testing.TB, data string) *Disks {
	t.Helper()
	d := open(data, false)
	t.Cleanup(d.Close)
	return d
}

// eachMethod runs f on a new data directory with each method this
// machine has: the shared btrfs filesystem (btrfs.go) and the ext4 images.
func eachMethod(t *testing.T, f func(t *testing.T, d *Disks, data string)) {
	t.Helper()
	t.Run("btrfs", func(t *testing.T) {
		d, data := newShared(t)
		f(t, d, data)
	})
	t.Run("images", func(t *testing.T) {
		d, data := newDisks(t)
		f(t, d, data)
	})
}

// full is what a write past the quota answers with d's method.
func full(d *Disks) string {
	if d.shared != nil {
		return "Disk quota exceeded"
	}
	return "No space left on device"
}

// session makes a session directory with a quota of size bytes.
func session(t testing.TB, d *Disks, data, id string, size int64) string {
	t.Helper()
	dir := filepath.Join(data, "sessions", id)
	if err := d.Create(dir, size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Remove(dir); err != nil {
			t.Error(err)
		}
	})
	for _, sub := range []string{"workspace/.quro/outputs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The smallest quota Create takes, 8 MiB, makes a disk (its journal
// scaled down: mkfs.ext4 refused the 4 MiB one of larger disks), and
// most of it is the session's to write.
func TestSmallestDiskIsMade(t *testing.T) {
	t.Parallel()
	eachMethod(t, func(t *testing.T, d *Disks, data string) {
		s := session(t, d, data, "small", 8<<20)
		u, ok := d.Usage(s)
		if !ok || u.Quota != 8<<20 || u.Free < 5<<20 {
			t.Fatalf("usage %+v (%v), want an 8 MiB disk with at least 5 MiB free", u, ok)
		}
		if err := os.WriteFile(filepath.Join(s, "workspace", "f"), make([]byte, 4<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	for _, size := range []int64{8 << 20, 9 << 20, 16 << 20, 2 << 30} {
		if j := journalMiB(size); j < 1 || j > 4 || int64(j)<<20 > size/4 {
			t.Errorf("journal of a %d MiB disk: %d MiB", size>>20, j)
		}
	}
}

// Writes from a real box beyond the session's quota fail (ENOSPC on an
// image, EDQUOT on the shared filesystem), the run's output says which
// quota is full and what fills it, outputs the server spilled count, and
// another session keeps writing.
func TestQuotaStopsWritesInTheBox(t *testing.T) {
	eachMethod(t, quotaStopsWritesInTheBox)
}

func quotaStopsWritesInTheBox(t *testing.T, d *Disks, data string) {
	s1 := session(t, d, data, "s1", 64<<20)
	s2 := session(t, d, data, "s2", 64<<20)
	// The server spilled 20 MiB of a run's output into s1.
	if err := os.WriteFile(filepath.Join(s1, "workspace/.quro/outputs/r1.stdout"), bytes.Repeat([]byte("x"), 20<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.New(&sandbox.Options{Note: func(dir string) string { return d.Note(filepath.Dir(dir)) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(dir, script string) string {
		var out bytes.Buffer
		_, err := sb.Run(ctx, &sandbox.Spec{Args: []string{"sh", "-c", script}, Dir: filepath.Join(dir, "workspace"),
			TmpDir: filepath.Join(dir, "tmp"), Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := run(s1, `mkdir -p data; head -c 30M /dev/zero > "$TMPDIR/t"; head -c 100M /dev/zero > data/big; echo rc=$?; du -sm data/big`)
	for _, want := range []string{full(d), "disk quota of 64 MiB is full", "workspace/data", "workspace/.quro/outputs", "tmp ", "--disk-quota"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output of the run that filled its quota does not say %q:\n%s", want, out)
		}
	}
	var mb int
	if i := strings.Index(out, "rc="); i >= 0 {
		fmt.Sscanf(out[strings.Index(out[i:], "\n")+i+1:], "%d", &mb)
	}
	if mb == 0 || mb > 64-20-30 {
		t.Errorf("data/big is %d MiB: the spilled outputs and tmp should have left at most 14 MiB of 64:\n%s", mb, out)
	}
	if out := run(s2, `head -c 40M /dev/zero > f && echo WROTE`); !strings.Contains(out, "WROTE") || strings.Contains(out, "quota") {
		t.Errorf("another session could not write 40 MiB of its own 64: %q", out)
	}
	// Once the session deletes, it writes again and the note is gone.
	if out := run(s1, `rm -f data/big "$TMPDIR/t" && head -c 5M /dev/zero > small && echo WROTE`); !strings.Contains(out, "WROTE") || strings.Contains(out, "quota") {
		t.Errorf("after rm the session could not write: %q", out)
	}
}

// The image is remounted after an unmount (a restart), and grows. (The
// shared filesystem's: TestRestartFindsTheSubvolumesAndTheirLimits.)
func TestQuotaRemountAndGrow(t *testing.T) {
	d, data := newDisks(t)
	s := session(t, d, data, "s", 32<<20)
	os.WriteFile(filepath.Join(s, "workspace", "keep"), []byte("kept"), 0o644)
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	if Mounted(s) {
		t.Fatal("still mounted")
	}
	if err := d.Remount(s); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(s, "workspace", "keep")); string(b) != "kept" {
		t.Fatalf("after remount: %q %v", b, err)
	}
	if err := d.Grow(s, 96<<20); err != nil {
		t.Fatal(err)
	}
	u, ok := d.Usage(s)
	if !ok || u.Quota != 96<<20 || u.Free < 64<<20 {
		t.Fatalf("after growing to 96 MiB: %+v %v", u, ok)
	}
}

// A box made while a session's disk was mounted holds a copy of that mount
// in its own mount namespace. Growing the disk offline then must not check
// or resize the image under the filesystem that still lives there (that
// corrupts it): the disk stays mounted, its files intact, and it grows when
// it is mounted next, once the other namespace is gone.
func TestGrowLeavesAFilesystemInUseElsewhereAlone(t *testing.T) {
	d, data := newDisks(t)
	s := session(t, d, data, "s", 32<<20)
	if err := os.WriteFile(filepath.Join(s, "workspace", "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", "echo ready; exec cat")
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	t.Cleanup(func() { stdin.Close(); holder.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the namespace holder said %q, %v", line, err)
	}

	err = d.Grow(s, 96<<20)
	u, ok := d.Usage(s)
	if err == nil {
		if !ok || u.Quota != 96<<20 || u.Free < 64<<20 {
			t.Fatalf("Grow said it grew the disk, but it reads %+v %v", u, ok)
		}
		t.Skip("the disk grew online here (CAP_SYS_RESOURCE): the offline path was not taken")
	}
	if !errors.Is(err, ErrNotGrown) {
		t.Fatalf("Grow with the filesystem alive in another namespace: %v, want ErrNotGrown", err)
	}
	if !Mounted(s) {
		t.Fatal("the disk is no longer mounted")
	}
	if b, err := os.ReadFile(filepath.Join(s, "workspace", "keep")); string(b) != "kept" {
		t.Fatalf("after the refused grow: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(s, "workspace", "more"), []byte("more"), 0o644); err != nil {
		t.Fatalf("the disk cannot be written after the refused grow: %v", err)
	}

	// The other namespace ends; the session's disk is unmounted (the
	// server stopped) and mounted again: it grows then, its files kept.
	stdin.Close()
	if err := holder.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	if err := d.Remount(s); err != nil {
		t.Fatal(err)
	}
	if u, ok := d.Usage(s); !ok || u.Quota != 96<<20 || u.Free < 64<<20 {
		t.Fatalf("after growing to 96 MiB: %+v %v", u, ok)
	}
	for name, want := range map[string]string{"keep": "kept", "more": "more"} {
		if b, err := os.ReadFile(filepath.Join(s, "workspace", name)); string(b) != want {
			t.Errorf("after growing, %s: %q %v", name, b, err)
		}
	}
}

// Any process may hold a session's loop device open for a moment (udev
// probing it, losetup scanning for a free one, another session's attach):
// an autoclear device then stays bound to its image after the disk's
// unmount until that process closes it. Such an open is not a mount: an
// idle disk still grows, offline in Grow and at its next mount in Remount
// ("still in use in another mount namespace" was the flake of
// TestQuotaRemountAndGrow beside a loop of losetup -f / -d). Here a
// process of the test holds the device open across both, every time.
func TestGrowWhileAnotherProcessHoldsTheLoopDeviceOpen(t *testing.T) {
	d, data := newDisks(t)
	s := session(t, d, data, "s", 32<<20)
	if err := os.WriteFile(filepath.Join(s, "workspace", "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(s, &st); err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	dev := "/dev/" + filepath.Base(link)
	// A process of its own, as udev's or losetup's would be: it opens
	// the device (not exclusively) and keeps it open until its stdin
	// closes.
	hold := func() (release func()) {
		t.Helper()
		holder := exec.Command("sh", "-c", "exec 3<"+dev+" && echo open && exec cat")
		stdin, err := holder.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := holder.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "open\n" {
			stdin.Close()
			holder.Wait()
			t.Fatalf("the holder of %s said %q, %v", dev, line, err)
		}
		return func() { stdin.Close(); holder.Wait() }
	}

	release := hold()
	err = d.Grow(s, 64<<20)
	release()
	if err != nil {
		t.Fatalf("Grow of an idle disk whose loop device another process had open: %v", err)
	}
	if u, ok := d.Usage(s); !ok || u.Quota != 64<<20 || u.Free < 48<<20 {
		t.Fatalf("after growing to 64 MiB: %+v %v", u, ok)
	}

	// Unmounted with the device held open, and the image larger than
	// its filesystem (a grow that waited for the session to be idle):
	// the next mount grows it, on that device.
	release = hold()
	defer release()
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(d.image(s), 96<<20); err != nil {
		t.Fatal(err)
	}
	if err := d.Remount(s); err != nil {
		t.Fatal(err)
	}
	if u, ok := d.Usage(s); !ok || u.Quota != 96<<20 || u.Free < 64<<20 {
		t.Fatalf("after the remount with the image grown to 96 MiB: %+v %v", u, ok)
	}
	if b, err := os.ReadFile(filepath.Join(s, "workspace", "keep")); string(b) != "kept" {
		t.Fatalf("after growing: %q %v", b, err)
	}
	if out, err := exec.Command("losetup", "-j", d.image(s)).Output(); err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Fatalf("the image is on more than one loop device: %s %v", out, err)
	}
}

// Runs of a session mount its disk again when they find it unmounted, and
// several may at once, with a grow besides: the image's lock makes one of
// them mount it, through one loop device (two would be two independent
// filesystems on one image), and the grow waits instead of checking the
// image while it is being mounted. The filesystem is intact afterwards.
func TestConcurrentRemountsAndGrowMountOnce(t *testing.T) {
	d, data := newDisks(t)
	s := session(t, d, data, "s", 32<<20)
	if err := os.WriteFile(filepath.Join(s, "workspace", "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := d.image(s)
	for round := range 4 {
		if err := syscallUnmount(s); err != nil {
			t.Fatal(err)
		}
		// A grow that could not run: the image is larger than its
		// filesystem, so the next mount grows it first.
		if err := os.Truncate(img, int64(40+8*round)<<20); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make(chan error, 9)
		for range 8 {
			go func() { <-start; errs <- d.Remount(s) }()
		}
		go func() { <-start; errs <- d.Grow(s, int64(40+8*round)<<20) }()
		close(start)
		for range 9 {
			if err := <-errs; err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		out, err := exec.Command("losetup", "-j", img).Output()
		if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; err != nil || n != 1 {
			t.Fatalf("round %d: the image is on %d loop devices: %s %v", round, n, out, err)
		}
		if b, err := os.ReadFile(filepath.Join(s, "workspace", "keep")); string(b) != "kept" {
			t.Fatalf("round %d: %q %v", round, b, err)
		}
	}
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-f", "-n", img).CombinedOutput(); err != nil {
		t.Fatalf("the filesystem is damaged: %v\n%s", err, out)
	}
	if u := mustFsSize(t, img); u < 64<<20 {
		t.Errorf("the filesystem is %d bytes, not grown to the image's 64 MiB", u)
	}
	if err := d.Remount(s); err != nil {
		t.Fatal(err)
	}
}

func mustFsSize(t *testing.T, img string) int64 {
	t.Helper()
	n, err := fsSize(img)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkCreate measures making and mounting one session image (2 GiB,
// sparse) and removing it.
// BenchmarkCreate makes (and removes) a 2 GiB session disk, with each
// method: remove-ns/op is the removal's time.
func BenchmarkCreate(b *testing.B) {
	for _, m := range []struct {
		name string
		open func(testing.TB) (*Disks, string)
	}{{"btrfs", newShared}, {"images", newDisks}} {
		b.Run(m.name, func(b *testing.B) {
			d, data := m.open(b)
			var removing time.Duration
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(data, "sessions", fmt.Sprint(i))
				if err := d.Create(dir, 2<<30); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				t0 := time.Now()
				if err := d.Remove(dir); err != nil {
					b.Fatal(err)
				}
				removing += time.Since(t0)
				b.StartTimer()
			}
			b.ReportMetric(float64(removing.Nanoseconds())/float64(b.N), "remove-ns/op")
		})
	}
}

func syscallUnmount(dir string) error { return syscall.Unmount(dir, 0) }

// BenchmarkManySessions keeps b.N session images (2 GiB, sparse) mounted at
// once, to see how loop devices scale (-benchtime 1000x: 1,000 sessions).
func BenchmarkManySessions(b *testing.B) {
	d, data := newDisks(b)
	var dirs []string
	b.Cleanup(func() {
		for _, dir := range dirs {
			d.Remove(dir)
		}
	})
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(data, "sessions", fmt.Sprint(i))
		if err := d.Create(dir, 2<<30); err != nil {
			b.Fatalf("session %d: %v", i, err)
		}
		dirs = append(dirs, dir)
	}
	b.StopTimer()
	var st syscall.Statfs_t
	syscall.Statfs(d.dir, &st)
	out, _ := d.output("du", "-sk", d.dir)
	b.Logf("%d images mounted; disk used by the images: %s KiB", b.N, strings.Fields(out)[0])
}

// A disk tool's failure says what the tool printed, but with the data
// directory written $QURO_DATA and a loop device unnamed: the text can
// reach a tenant (Grow's ErrNotGrown carries resize2fs's, and the
// controller shows that class's text to the caller), which must never
// read a path of the host. It still wraps how the tool ended
// (resizeOffline reads e2fsck's exit code through it).
func TestToolErrorsKeepWhatTheToolSaidButNoHostPath(t *testing.T) {
	if _, err := exec.LookPath("e2fsck"); err != nil {
		t.Skip("no e2fsck here (apt-get install e2fsprogs)")
	}
	data := t.TempDir()
	d := openDisks(t, data) // without root too: only run is used
	err := d.run("e2fsck", "-f", "-p", filepath.Join(data, "disks", "absent.img"))
	if err == nil {
		t.Fatal("e2fsck of an absent image succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, data) {
		t.Errorf("the error names the host's data directory: %q", msg)
	}
	if !strings.HasPrefix(msg, "e2fsck: exit status ") || !strings.Contains(msg, "No such file or directory while trying to open $QURO_DATA/disks/absent.img") {
		t.Errorf("the error does not say what e2fsck said (its stderr, paths relative to $QURO_DATA): %q", msg)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 8 {
		t.Errorf("the error does not wrap e2fsck's exit (8, operational error): %#v", err)
	}

	// What mount and resize2fs print: the loop device, and the mount
	// point by the kernel's spelling of the data directory (its links
	// resolved).
	link := filepath.Join(t.TempDir(), "data")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	te := &toolError{tool: "resize2fs", err: errors.New("exit status 1"), data: dataPaths(link),
		out: "Filesystem at /dev/loop12 is mounted on " + filepath.Join(data, "sessions", "s1") + "; on-line resizing required"}
	want := "resize2fs: exit status 1: Filesystem at a loop device is mounted on $QURO_DATA/sessions/s1; on-line resizing required"
	if got := te.Error(); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// Grow's errors reach the caller of set_tenant_limits when one of them is
// ErrNotGrown (joined with the others): none names a host path. Here the
// image is missing, an os.PathError that named it.
func TestGrowErrorsNameNoHostPath(t *testing.T) {
	data := t.TempDir()
	d := openDisks(t, data)
	err := d.Grow(filepath.Join(data, "sessions", "gone"), 64<<20)
	if err == nil {
		t.Fatal("Grow of a session without an image succeeded")
	}
	if msg := err.Error(); strings.Contains(msg, data) || !strings.Contains(msg, "$QURO_DATA/disks/gone.img") {
		t.Errorf("Grow's error %q: want the image named under $QURO_DATA, not by its host path", msg)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Grow's error no longer wraps its cause: %#v", err)
	}
}

// A second Open of one data directory (a CLI beside the server, a server
// after a killed one) finds the sessions' directory a mount point already
// and binds nothing more on it: a second bind would hide the disks the
// first process mounted below it.
func TestOpenTwiceBindsTheSessionsDirectoryOnce(t *testing.T) {
	d, data := newDisks(t)
	root := filepath.Join(data, "sessions")
	if !d.boundRoot || !mountPoint(root) {
		t.Fatalf("the first Open did not make %s a mount point of its own", root)
	}
	dir := session(t, d, data, "s1", 16<<20)
	again := openDisks(t, data)
	if again.boundRoot {
		t.Error("the second Open bound the sessions' directory again")
	}
	if !Mounted(dir) {
		t.Error("the first Open's disk is hidden after the second Open")
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(mi), " "+root+" "); n != 1 {
		t.Errorf("%d mounts at the sessions' directory, want 1", n)
	}
}

// In a container (a Kubernetes pod), /dev is a tmpfs filled as the
// container started: loop devices the kernel made since have no node
// there. A session's disk is still made (an attach of its own) and
// mounted again (mount(8)): the node of the device is made from sysfs.
// The test runs in the package's own mount namespace (TestMain), where a
// tmpfs over /dev holding only loop-control and the character devices
// the tools open stands for the container's.
func TestDiskInADevWithoutLoopNodes(t *testing.T) {
	if os.Getenv("QURO_QUOTA_TEST_NS") == "" {
		t.Skip("needs the package's own mount namespace (as root): it mounts over /dev")
	}
	d, data := newDisks(t)
	nodes := map[string]os.FileInfo{}
	for _, n := range []string{"loop-control", "null", "zero", "random", "urandom", "full"} {
		fi, err := os.Stat("/dev/" + n)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n] = fi
	}
	if err := syscall.Mount("tmpfs", "/dev", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount("/dev", syscall.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	for n, fi := range nodes {
		st := fi.Sys().(*syscall.Stat_t)
		if err := syscall.Mknod("/dev/"+n, st.Mode, int(st.Rdev)); err != nil {
			t.Fatal(err)
		}
	}
	loops := func() []string {
		m, _ := filepath.Glob("/dev/loop[0-9]*")
		return m
	}
	s := session(t, d, data, "s", 32<<20)
	made := loops()
	if len(made) == 0 { // more than one when another process took a free device first
		t.Fatal("after making the disk, /dev holds no loop node")
	}
	if err := os.WriteFile(filepath.Join(s, "workspace", "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	for _, n := range made {
		if err := os.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Remount(s); err != nil {
		t.Fatalf("remounting with no loop node in /dev: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(s, "workspace", "keep")); string(b) != "kept" {
		t.Fatalf("after the remount: %q %v", b, err)
	}
	if len(loops()) == 0 {
		t.Fatal("remounted without a loop node in /dev: mount(8) attached none?")
	}
}

// TestRemountMountsTheSessionsOwnImage: a loop device that another mount
// namespace (another server's pod on the same machine, a leftover) bound
// to a file of the same path — its own data volume — shows that path as
// its backing_file in sysfs, which is all a remount used to look at: the
// session's disk was mounted from the other file, another filesystem
// (here one whose marker says "intruder"). The device is taken only when
// its backing file is the image itself (device and inode).
func TestRemountMountsTheSessionsOwnImage(t *testing.T) {
	d, data := newDisks(t)
	dir := filepath.Join(data, "sessions", "s")
	img := d.image(dir)
	script := `set -e; mount -t tmpfs none "$1"; truncate -s 16M "$2"; mkfs.ext4 -q -F "$2"; m=$(mktemp -d)
mount -o loop "$2" "$m"; echo intruder > "$m/marker"; umount "$m"; losetup -f --show "$2"; exec cat`
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", filepath.Dir(img), img)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	other := strings.TrimSpace(line)
	t.Cleanup(func() {
		stdin.Close()
		holder.Wait()
		if strings.HasPrefix(other, "/dev/loop") {
			exec.Command("losetup", "-d", other).Run() // the other namespace's device: nothing else clears it
		}
	})
	if !strings.HasPrefix(other, "/dev/loop") {
		t.Fatalf("the other namespace's loop device: %q %v", line, err)
	}

	s := session(t, d, data, "s", 16<<20)
	if err := os.WriteFile(filepath.Join(s, "workspace", "marker"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mine, err := mountSource(s)
	if err != nil {
		t.Fatal(err)
	}
	// While its own device backs it, that device is the one found.
	if lo, err := boundLoop(img); err != nil || lo == nil || lo.Name() != mine {
		t.Fatalf("the device bound to the session's image: %v %v, want %s", lo, err, mine)
	} else {
		lo.Close()
	}
	if err := syscallUnmount(s); err != nil {
		t.Fatal(err)
	}
	// The session's own device clears itself with its last mount: wait
	// for that state, so that the only device naming the path is the
	// other namespace's.
	// sysfs has no event for it: its state is read until it says so.
	for deadline := time.Now().Add(2 * time.Minute); !cleared(mine); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still bound 2 minutes after its last unmount", mine)
		}
	}
	if err := d.Remount(s); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(s, "workspace", "marker")); string(b) != "mine\n" {
		t.Fatalf("the session's disk after a remount holds %q (%v): the other namespace's image was mounted", b, err)
	}
}

// mountSource is the device mounted at dir.
func mountSource(dir string) (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 9 && f[4] == dir {
			return f[len(f)-2], nil
		}
	}
	return "", fmt.Errorf("nothing is mounted at %s", dir)
}

// cleared reports whether loop device dev is bound to no file.
func cleared(dev string) bool {
	_, err := os.Stat("/sys/block/" + filepath.Base(dev) + "/loop/backing_file")
	return errors.Is(err, fs.ErrNotExist)
}

// A disk tool that exited 0 succeeded even when a process it left behind
// held its output open past the drain's bound (issue 29: at load, mkfs.ext4
// failed creates with "WaitDelay expired before I/O complete"); a tool
// that failed still fails. The child here holds the pipe for a minute, the
// bound is 100 ms: the outcome cannot depend on timing.
func TestToolThatExitedZeroSucceedsWhileItsOutputIsHeld(t *testing.T) {
	t.Parallel()
	d := openDisks(t, t.TempDir()) // without root too: only run is used
	d.waitDelay = 100 * time.Millisecond
	if err := d.run("sh", "-c", "sleep 60 & exit 0"); err != nil {
		t.Errorf("a tool that exited 0 with its output held: %v", err)
	}
	err := d.run("sh", "-c", "sleep 60 & exit 3")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("a tool that exited 3 with its output held: got %v, want its exit status 3", err)
	}
}

// A new disk whose loop device another process takes between the
// kernel's offer and the attach tries the next one; when others take
// every one offered, Create fails with ErrNoLoop (which the controller
// classifies as unavailable, not internal) and leaves neither the image
// nor the mount point. The hook attaches a scratch file to the offered
// device first, as another process would (if a real one did first, the
// device is just as taken).
func TestCreateWhenOthersTakeTheOfferedLoopDevices(t *testing.T) {
	d, data := newDisks(t)
	scratch := filepath.Join(t.TempDir(), "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(scratch, 1<<20); err != nil {
		t.Fatal(err)
	}
	var held []*os.File // each holds its device; closing clears it (autoclear)
	t.Cleanup(func() {
		for _, f := range held {
			f.Close()
		}
	})
	steal := 0 // offers to take before the attach
	tries := 0
	testBeforeAttach = func(n int) {
		tries++
		if tries > steal {
			return
		}
		lo, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
		if err != nil {
			t.Errorf("opening the offered loop device: %v", err)
			return
		}
		f, err := os.OpenFile(scratch, os.O_RDWR, 0)
		if err != nil {
			lo.Close()
			t.Error(err)
			return
		}
		defer f.Close()
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if err := unix.IoctlLoopConfigure(int(lo.Fd()), &cfg); err != nil && !errors.Is(err, unix.EBUSY) {
			lo.Close()
			t.Errorf("taking the offered loop device: %v", err)
			return
		}
		held = append(held, lo)
	}
	t.Cleanup(func() { testBeforeAttach = nil })

	// Three offers taken by others: a later one is attached (the fourth,
	// unless a real process took that one too).
	steal = 3
	dir := session(t, d, data, "s1", 16<<20)
	if tries < 4 || !Mounted(dir) {
		t.Errorf("after 3 offers taken: %d tries, mounted %v; want at least 4 tries and the disk mounted", tries, Mounted(dir))
	}

	// Every offer taken: refused, classified, nothing left.
	tries, steal = 0, attachTries
	dir = filepath.Join(data, "sessions", "s2")
	err := d.Create(dir, 16<<20)
	if !errors.Is(err, ErrNoLoop) {
		t.Fatalf("every offered device taken: got %v, want ErrNoLoop", err)
	}
	if tries != attachTries {
		t.Errorf("%d tries, want %d", tries, attachTries)
	}
	for _, p := range []string{dir, d.image(dir)} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused create left %s behind (%v)", p, err)
		}
	}
}

// TestAttachesRunAtOnce: an attach that the kernel holds up (here the
// hook holds the first one between its device's choice and the attach,
// as LOOP_CONFIGURE's wait for a queue freeze does at load) holds up no
// other create of the process: a second create is attached to another
// device and mounted meanwhile. Before, the attaches took turns under
// one lock, and a burst of 100 creates spent most of its time in that
// line (bench/README.md).
func TestAttachesRunAtOnce(t *testing.T) {
	d, data := newDisks(t)
	var mu sync.Mutex
	var devs []int
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	testBeforeAttach = func(n int) {
		mu.Lock()
		devs = append(devs, n)
		first := len(devs) == 1
		mu.Unlock()
		if first {
			close(held)
			<-release
		}
	}
	t.Cleanup(func() { testBeforeAttach = nil })
	t.Cleanup(letGo)
	create := func(name string, done chan<- error) {
		dir := filepath.Join(data, "sessions", name)
		err := d.Create(dir, 16<<20)
		if err == nil {
			t.Cleanup(func() {
				if err := d.Remove(dir); err != nil {
					t.Error(err)
				}
			})
		}
		done <- err
	}
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go create("a", doneA)
	select {
	case <-held:
	case err := <-doneA:
		t.Fatalf("the first create ended before its attach: %v", err)
	}
	go create("b", doneB)
	select {
	case err := <-doneB:
		if err != nil {
			t.Fatalf("the second create, beside the held attach: %v", err)
		}
	case <-time.After(2 * time.Minute):
		letGo()
		t.Fatal("the second create waited for the first one's attach")
	}
	letGo()
	if err := <-doneA; err != nil {
		t.Fatalf("the held create: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(devs) < 2 || devs[1] == devs[0] {
		t.Errorf("devices chosen: %v; the second create was offered the held one", devs)
	}
	for _, name := range []string{"a", "b"} {
		if dir := filepath.Join(data, "sessions", name); !Mounted(dir) {
			t.Errorf("%s is not mounted", dir)
		}
	}
}

// TestDisksAreCopiesOfATemplate: the disks of one size are copies of one
// image formatted once (no mkfs.ext4 per create: the same filesystem
// UUID), each as sparse as a new one, mounted on its own device and
// written apart from the others; Close removes the template.
func TestDisksAreCopiesOfATemplate(t *testing.T) {
	data := t.TempDir()
	d := open(data, false) // the images method
	closed := false
	t.Cleanup(func() {
		if !closed {
			d.Close()
		}
	})
	if err := d.Enforced(); err != nil {
		t.Skipf("no kernel-enforced quota here: %v", err)
	}
	var dirs []string
	for _, id := range []string{"s1", "s2", "s3"} {
		dir := filepath.Join(data, "sessions", id)
		if err := d.Create(dir, 32<<20); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	uuids := map[string]bool{}
	for i, dir := range dirs {
		// The ext4 superblock is 1024 bytes in; its s_uuid 0x68 into it.
		f, err := os.Open(d.image(dir))
		if err != nil {
			t.Fatal(err)
		}
		uuid := make([]byte, 16)
		_, err = f.ReadAt(uuid, 1024+0x68)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		uuids[fmt.Sprintf("%x", uuid)] = true
		var st unix.Stat_t
		if err := unix.Stat(d.image(dir), &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != 32<<20 || st.Blocks*512 > 8<<20 {
			t.Errorf("image %d: %d bytes long, %d allocated; want 32 MiB long and sparse", i, st.Size, st.Blocks*512)
		}
		if !Mounted(dir) {
			t.Errorf("%s is not mounted", dir)
		}
		if err := os.WriteFile(filepath.Join(dir, "mine"), []byte(dir), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(uuids) != 1 {
		t.Errorf("filesystem UUIDs %v: want the template's one (a copy each, not a mkfs each)", uuids)
	}
	for _, dir := range dirs {
		if b, err := os.ReadFile(filepath.Join(dir, "mine")); err != nil || string(b) != dir {
			t.Errorf("%s reads %q, %v: the disks are not apart", dir, b, err)
		}
	}
	d.tmplMu.Lock()
	tmpl := d.templates[32<<20].path
	d.tmplMu.Unlock()
	if tmpl == "" {
		t.Fatal("no template kept for 32 MiB")
	}
	for _, dir := range dirs {
		if err := d.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()
	closed = true
	for _, p := range []string{tmpl, filepath.Dir(tmpl)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Close left %s (%v)", p, err)
		}
	}
}

// TestTemplatesAreBounded: one template per disk size, at most
// maxTemplates of them; the one used least recently goes, and a disk of
// its size is made again (from a new template).
func TestTemplatesAreBounded(t *testing.T) {
	t.Parallel()
	d, data := newDisks(t)
	sizes := []int64{8 << 20, 9 << 20, 10 << 20, 11 << 20, 12 << 20, 8 << 20}
	for i, size := range sizes {
		dir := filepath.Join(data, "sessions", fmt.Sprintf("s%d", i))
		if err := d.Create(dir, size); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	names, _ := filepath.Glob(filepath.Join(data, "disks", "templates", "*"))
	if len(d.templates) != maxTemplates || len(names) != maxTemplates {
		t.Errorf("%d templates kept, %d files (%v); want %d", len(d.templates), len(names), names, maxTemplates)
	}
	if _, ok := d.templates[9<<20]; ok {
		t.Errorf("the template used least recently (9 MiB) was kept: %v", d.tmplUsed)
	}
	if _, ok := d.templates[8<<20]; !ok {
		t.Errorf("the 8 MiB template, made again, is not kept: %v", d.tmplUsed)
	}
}

// TestTemplatesOfProcessesGoneAreSwept: a template whose process ended
// without Close (its lock gone) is removed by the next process's first
// template; one a live process holds is left.
//
// Not parallel: a lock lives as long as any descriptor of its open file,
// and a process another test forks holds a copy of every descriptor
// until its exec, so a fork at the moment of the sweep kept the lock
// of "the process gone" (CI saw its template left once).
func TestTemplatesOfProcessesGoneAreSwept(t *testing.T) {
	d1, data := newDisks(t)
	d2 := openDisks(t, data)
	d3 := openDisks(t, data)
	for i, d := range []*Disks{d1, d2} {
		dir := filepath.Join(data, "sessions", fmt.Sprintf("s%d", i))
		if err := d.Create(dir, 16<<20); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	gone, live := d1.templates[16<<20], d2.templates[16<<20]
	// d1's process ends: the kernel drops its lock, the file stays.
	gone.lock.Close()
	delete(d1.templates, 16<<20)
	dir := filepath.Join(data, "sessions", "s3")
	if err := d3.Create(dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := d3.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gone.path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the template of a process gone is left: %v", err)
	}
	if _, err := os.Stat(live.path); err != nil {
		t.Errorf("a live process's template was removed: %v", err)
	}
}

// TestDiskWithoutHolesIsMadeByMkfs: where the images' filesystem shows
// no holes (a copy would write the whole image), each disk is made by
// mkfs.ext4, sparse, mounted and writable, and no template is kept. The
// fallback is forced here: this machine's filesystems show holes.
func TestDiskWithoutHolesIsMadeByMkfs(t *testing.T) {
	t.Parallel()
	d, data := newDisks(t)
	d.tmplMu.Lock()
	d.noHoles = true
	d.tmplMu.Unlock()
	dir := session(t, d, data, "s1", 16<<20)
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil || !Mounted(dir) {
		t.Fatalf("the disk made without a template: write %v, mounted %v", err, Mounted(dir))
	}
	var st unix.Stat_t
	if err := unix.Stat(d.image(dir), &st); err != nil || st.Blocks*512 > 8<<20 {
		t.Errorf("image: %d bytes allocated (%v); want sparse", st.Blocks*512, err)
	}
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	if len(d.templates) != 0 {
		t.Errorf("templates kept without holes: %v", d.templates)
	}
}
