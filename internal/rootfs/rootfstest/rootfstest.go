// Package rootfstest gives tests the shared Debian test rootfs and rootfs
// derived from it, built once per machine and reused after. Tests must
// not change them: a test that needs to change a rootfs copies it.
//
// The directory is $QURO_TEST_ROOTFS (default /var/cache/quro-test-rootfs).
// "default" is debootstrapped there (minutes, the first time); a derived
// rootfs NAME is "default" plus Debian packages, built in NAME.partial/ (a
// cp -a copy of "default", the packages installed by the product's own
// apt path, rootfs.Apt) and renamed into place only when complete, so an
// interrupted build is redone. Builders of the same rootfs in several test
// processes (packages tested in parallel) take turns on a lock file beside
// it.
package rootfstest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/sandbox"
)

// Sci is what the "sci" rootfs adds to "default": the Debian builds of
// the libraries the rich outputs are tested with.
var Sci = []string{"python3-matplotlib", "python3-pandas", "python3-pil"}

// Dir is the shared test rootfs directory.
func Dir() string {
	if dir := os.Getenv("QURO_TEST_ROOTFS"); dir != "" {
		return dir
	}
	return "/var/cache/quro-test-rootfs"
}

// Default returns a manager of Dir in which "default" is ready, building
// it first if needed (skipping the test where it cannot be: not root, no
// debootstrap).
func Default(t testing.TB) *rootfs.Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("debootstrap needs root")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skip("debootstrap not installed (make test installs it)")
	}
	dir := Dir()
	m := rootfs.New(dir)
	if m.Ready(rootfs.DefaultName) {
		return m
	}
	// Parallel tests of one package, and packages tested side by side,
	// take turns, as Derived's builders do: Install refuses (ErrBusy)
	// while another caller installs, and on a fresh machine the first
	// two callers met there (cmd/quro's TestAptInsideARootfsSession
	// failed beside TestPipInsideARootfsSession).
	unlock := buildLock(t, m, rootfs.DefaultName)
	defer unlock()
	if m.Ready(rootfs.DefaultName) { // built meanwhile by whoever held the lock
		return m
	}
	t.Logf("building the shared test rootfs %q in %s (once per machine; minutes)", rootfs.DefaultName, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	info, err := m.Install(ctx, rootfs.DefaultName, rootfs.InstallOptions{}, func(line string) {
		if strings.HasPrefix(line, "I: Retrieving") || strings.HasPrefix(line, "I: Base system") || strings.HasPrefix(line, "rootfs") || strings.HasPrefix(line, "debootstrap") {
			t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), line)
		}
	})
	if err != nil {
		t.Fatalf("installing the test rootfs into %s: %v", dir, err)
	}
	t.Logf("test rootfs installed in %s: %+v", time.Since(start).Round(time.Second), info)
	return m
}

// Derived returns a manager of Dir in which the rootfs name is ready:
// "default" plus the Debian packages pkgs (and their dependencies),
// building it first if needed. "default" is never changed.
func Derived(t testing.TB, name string, pkgs []string) *rootfs.Manager {
	t.Helper()
	m := Default(t)
	if m.Ready(name) {
		return m
	}
	if err := rootfs.CheckName(name); err != nil {
		t.Fatal(err)
	}
	unlock := buildLock(t, m, name)
	defer unlock()
	if m.Ready(name) { // another test process built it meanwhile
		return m
	}
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("no bubblewrap box: apt cannot run in a rootfs")
	}
	t.Logf("building the test rootfs %q (default + %s) in %s (once per machine; a few minutes)", name, strings.Join(pkgs, " "), m.Dir)
	start := time.Now()
	staging := filepath.Join(m.Dir, name+".partial")
	if err := os.RemoveAll(staging); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	// apt works on a copy, renamed to name, in the staging directory.
	copied := filepath.Join(staging, ".copy")
	Copy(t, copied)
	if err := os.Rename(filepath.Join(copied, rootfs.DefaultName), filepath.Join(staging, name)); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	apt := &rootfs.Apt{M: rootfs.New(staging), SB: sb}
	res, err := apt.Install(context.Background(), name, pkgs, 20*time.Minute, &log)
	if err != nil {
		t.Fatalf("installing %v into the %s rootfs: %v\n%s", pkgs, name, err, tail(log.String(), 4000))
	}
	if res.Exit.Code != 0 || len(res.Unsettled) > 0 {
		t.Fatalf("installing %v into the %s rootfs: exit %+v, unsettled %v\n%s", pkgs, name, res.Exit, res.Unsettled, tail(log.String(), 4000))
	}
	if err := os.Rename(filepath.Join(staging, name), m.Path(name)); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(staging)
	t.Logf("%s rootfs built in %s (%d packages installed)", name, time.Since(start).Round(time.Second), len(res.Installed))
	return m
}

// Copy copies the shared test rootfs "default" (built first if needed)
// into the rootfs directory dir (rootfs.DirIn of a data directory, made
// if absent), for a test that changes it, and returns a manager of dir.
//
// The copy's marker records when its apt lists were fetched: debootstrap
// fetched them while it built "default", so the copy's lists date from
// the build's start. Without it the marker said the lists were never
// updated, and each copy's first install ran `apt-get update` against
// the mirror; with it a copy less than rootfs.ListsMaxAge after the
// build installs from the lists it has, and an older one updates first,
// as any rootfs does. The shared rootfs itself is not changed (other
// test processes copy it without a lock).
func Copy(t testing.TB, dir string) *rootfs.Manager {
	t.Helper()
	m := Default(t)
	info, err := m.Info(rootfs.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--reflink=auto", m.Path(rootfs.DefaultName), dir+"/").CombinedOutput(); err != nil {
		t.Fatalf("copying the test rootfs: %v\n%s", err, out)
	}
	c := rootfs.New(dir)
	if info.ListsUpdated.IsZero() {
		fetched := info.InstalledAt.Add(-time.Duration(info.Seconds * float64(time.Second)))
		SetListsUpdated(t, c, rootfs.DefaultName, fetched)
	}
	return c
}

// SetListsUpdated records in the marker of the rootfs name, a copy of
// the test's own, when its apt lists were last updated: a time older
// than rootfs.ListsMaxAge makes its next install run `apt-get update`.
func SetListsUpdated(t testing.TB, m *rootfs.Manager, name string, when time.Time) {
	t.Helper()
	unlock, err := m.Lock(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if err := m.AddPackages(name, nil, when); err != nil {
		t.Fatal(err)
	}
}

// buildLock waits for the build lock of the rootfs name in m's directory
// (a lock file beside it, shared by every test process on the machine)
// and returns its release. An flock is per open file description, so
// two tests of one process wait for each other too.
func buildLock(t testing.TB, m *rootfs.Manager, name string) (unlock func()) {
	t.Helper()
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(filepath.Join(m.Dir, "."+name+"-build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		lf.Close()
		t.Fatal(err)
	}
	return func() { lf.Close() }
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
