// Package rootfs installs and manages the Debian userlands that sessions
// can run on (docs/architecture.md, Packages): `quro rootfs install` builds one with debootstrap
// into $QURO_DATA/rootfs/<name>/, and the sandbox shows its top-level
// directories read-only in place of the host userland (sandbox.Spec.Rootfs).
//
// The layout under the manager's directory:
//
//	<name>/                  a finished rootfs; ready when it holds the marker
//	<name>/.quro-rootfs.json the ready marker, written last (see Install)
//	<name>.partial/          an install in progress or interrupted
//	.cache/<suite>/          downloaded .debs, kept across attempts
//	.<name>.lock             taken (flock) while installing or removing
//
// An install builds in <name>.partial/, checks the result, writes the marker
// into it atomically and only then renames the directory into place, so a
// crash at any point leaves either no <name>/ or a complete one: a
// half-built rootfs is never ready. An interrupted install is resumed by
// running again: it restarts from a clean directory, and the packages
// already downloaded are reused from the cache (debootstrap --cache-dir)
// instead of being fetched again.
package rootfs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
)

// DefaultName is the rootfs python_run uses for sessions that name none.
const DefaultName = "default"

// DefaultSuite is the Debian suite installed unless told otherwise.
const DefaultSuite = "bookworm"

// DefaultMirror is used when the host's apt sources name no Debian mirror.
const DefaultMirror = "http://deb.debian.org/debian"

// DefaultPackages are installed into every rootfs besides the minimal base.
var DefaultPackages = []string{"python3", "python3-pip", "ca-certificates"}

// CodeInterpreter is the name of the userland for data work: E2B's
// code-interpreter templates run on it when it is installed.
const CodeInterpreter = "code-interpreter"

// presets are the packages a rootfs of a known name gets (besides the
// minimal base) when its install names none: what data work in a
// notebook expects, as Debian packages of the suite (no index needed).
var presets = map[string][]string{
	CodeInterpreter: append(slices.Clone(DefaultPackages),
		"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-scipy",
		"python3-sklearn", "python3-pytest", "python3-requests", "python3-openpyxl",
		"python3-bs4", "python3-pil", "ipython3",
		// E2B's JavaScript and TypeScript contexts run on Node (the
		// session's Node worker); without it they fall back to QuickJS.
		"nodejs"),
}

// PresetPackages are the packages a rootfs called name is installed with
// when its install names none: its preset's, else DefaultPackages.
func PresetPackages(name string) []string {
	if p, ok := presets[name]; ok {
		return slices.Clone(p)
	}
	return slices.Clone(DefaultPackages)
}

// Marker is the file, inside a rootfs directory, that makes it ready.
const Marker = ".quro-rootfs.json"

const partialSuffix = ".partial"

// States of a rootfs (Status.State).
const (
	Ready   = "ready"   // installed and complete
	Partial = "partial" // an install is in progress or was interrupted
	Absent  = "absent"  // nothing installed
)

// Names are letters, digits, '_' and '-' (no dots, so that no name can
// collide with a partial or hidden entry).
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`) })

// ErrBadOption reports a suite or mirror Install does not take: a suite
// is a Debian codename (debootstrap sources a script of that name, so
// nothing else may reach it), a mirror an http(s) URL.
var ErrBadOption = errors.New("rootfs: invalid suite or mirror")

var (
	suiteRe  = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	mirrorRe = regexp.MustCompile(`^https?://[A-Za-z0-9][A-Za-z0-9._:@%/~+-]*$`)
)

// checkOptions refuses a suite or mirror that is not plainly one.
func checkOptions(o InstallOptions) error {
	if !suiteRe.MatchString(o.Suite) {
		return fmt.Errorf("%w: suite %q is not a Debian codename (lower-case letters, digits and -, e.g. bookworm)", ErrBadOption, o.Suite)
	}
	if !mirrorRe.MatchString(o.Mirror) || strings.Contains(o.Mirror, "..") {
		return fmt.Errorf("%w: mirror %q is not an http(s) URL such as %s", ErrBadOption, o.Mirror, DefaultMirror)
	}
	return nil
}

// ErrBadName reports an invalid rootfs name.
var ErrBadName = errors.New("rootfs: invalid name (letters, digits, _ and -; at most 64)")

// ErrBusy reports that another process is installing or removing the rootfs.
var ErrBusy = errors.New("rootfs: another process is installing or removing it")

// ErrNotInstalled reports a rootfs that is not ready.
var ErrNotInstalled = errors.New("rootfs: not installed")

// ErrInstallFailed wraps the failure of an install on first use
// (OnFirstUse): debootstrap's or the network's reason, for the caller.
var ErrInstallFailed = errors.New("rootfs: installing failed")

// CheckName validates a rootfs name.
func CheckName(name string) error {
	if !nameRE().MatchString(name) {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	return nil
}

// InstallOptions say what to install.
type InstallOptions struct {
	Suite    string   // default DefaultSuite
	Mirror   string   // default HostMirror()
	Packages []string // default PresetPackages(name)
}

// Info is the content of the ready marker.
type Info struct {
	Name        string    `json:"name"`
	Suite       string    `json:"suite"`
	Mirror      string    `json:"mirror"`
	Packages    []string  `json:"packages"`
	Python      string    `json:"python,omitempty"` // version of the python3 package, "" when absent
	InstalledAt time.Time `json:"installed_at"`
	Seconds     float64   `json:"seconds"` // how long the install took
	// Added are the packages installed later with apt (install_packages,
	// `quro rootfs install-packages`), in the order asked for.
	Added []string `json:"added_packages,omitempty"`
	// ListsUpdated is when `apt-get update` last succeeded through
	// AddPackages' caller; zero when it never ran after the build.
	ListsUpdated time.Time `json:"lists_updated,omitempty"`
}

// Installer builds a userland into target, an empty directory that exists,
// reporting progress one line at a time. cacheDir is a directory it may use
// to keep downloads across attempts. The default is Debootstrap.
type Installer func(ctx context.Context, target, cacheDir string, o InstallOptions, progress func(string)) error

// Manager manages the rootfs directories under Dir. Managers of the same
// Dir, in this process or others, coordinate through file locks; a Manager
// holds no other state.
type Manager struct {
	Dir       string
	Installer Installer // nil means Debootstrap
}

// New returns a Manager of dir (usually $QURO_DATA/rootfs).
func New(dir string) *Manager { return &Manager{Dir: dir} }

// Path is the directory of the rootfs name (whether or not it is ready).
func (m *Manager) Path(name string) string { return filepath.Join(m.Dir, name) }

func (m *Manager) partial(name string) string { return filepath.Join(m.Dir, name+partialSuffix) }

// Ready reports whether the rootfs name is installed and complete. It is
// cheap: one stat.
func (m *Manager) Ready(name string) bool {
	if CheckName(name) != nil {
		return false
	}
	fi, err := os.Stat(filepath.Join(m.Path(name), Marker))
	return err == nil && fi.Mode().IsRegular()
}

// Status describes one rootfs.
type Status struct {
	Name  string `json:"name"`
	State string `json:"state"` // Ready, Partial or Absent
	Dir   string `json:"dir"`
	// Bytes is the size of the files in the rootfs (or the partial one).
	Bytes int64 `json:"bytes"`
	Info  *Info `json:"info,omitempty"` // the marker's content when ready
	// Installing is set when a process holds the install lock right now.
	Installing bool `json:"installing,omitempty"`
}

// Text is one line about the rootfs.
func (s *Status) Text() string {
	switch s.State {
	case Ready:
		py := "no python3"
		if s.Info.Python != "" {
			py = "python3 " + s.Info.Python
		}
		return fmt.Sprintf("%s: ready, %s %s, %s, %s, installed %s (%s)", s.Name, "debian", s.Info.Suite, py,
			humanBytes(s.Bytes), s.Info.InstalledAt.Local().Format(time.DateTime), s.Dir)
	case Partial:
		what := "interrupted install; `quro rootfs install " + s.Name + "` resumes it"
		if s.Installing {
			what = "being installed"
		}
		return fmt.Sprintf("%s: partial (%s), %s so far", s.Name, what, humanBytes(s.Bytes))
	}
	return fmt.Sprintf("%s: absent (`quro rootfs install %s` builds it)", s.Name, s.Name)
}

// Status reports the state of the rootfs name, its size and, when ready,
// what the marker says.
func (m *Manager) Status(name string) (*Status, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	st := &Status{Name: name, State: Absent, Dir: m.Path(name)}
	if m.Ready(name) {
		info, err := m.Info(name)
		if err != nil {
			return nil, err
		}
		st.State, st.Info = Ready, info
		st.Bytes = dirBytes(st.Dir)
		return st, nil
	}
	// A directory without the marker cannot come from Install (it renames
	// only marked directories into place); count it as partial all the same.
	for _, d := range []string{m.partial(name), m.Path(name)} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			st.State, st.Dir = Partial, d
			st.Bytes = dirBytes(d)
			break
		}
	}
	if st.State == Partial {
		if unlock, err := m.tryLock(name); err == nil {
			unlock()
		} else if errors.Is(err, ErrBusy) {
			st.Installing = true
		}
	}
	return st, nil
}

// List reports every rootfs under Dir, ready or partial.
func (m *Manager) List() ([]*Status, error) {
	entries, err := os.ReadDir(m.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []*Status
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), partialSuffix)
		if !e.IsDir() || CheckName(name) != nil || seen[name] {
			continue
		}
		seen[name] = true
		st, err := m.Status(name)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Info reads the ready marker of name (an error when it is not ready).
func (m *Manager) Info(name string) (*Info, error) {
	b, err := os.ReadFile(filepath.Join(m.Path(name), Marker))
	if err != nil {
		return nil, err
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("rootfs %s: bad marker: %w", name, err)
	}
	return &info, nil
}

// Install builds the rootfs name unless it is ready already, reporting
// progress lines to progress (which may be nil). It resumes an interrupted
// install. It fails with ErrBusy when another process is installing or
// removing the same name.
func (m *Manager) Install(ctx context.Context, name string, o InstallOptions, progress func(string)) (*Info, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.Mirror == "" {
		o.Mirror = HostMirror()
	}
	if len(o.Packages) == 0 {
		o.Packages = PresetPackages(name)
	}
	if err := checkOptions(o); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := m.tryLock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if m.Ready(name) {
		progress("rootfs " + name + " is already installed")
		return m.Info(name)
	}
	final, part := m.Path(name), m.partial(name)
	if _, err := os.Stat(final); err == nil {
		// Not from Install (see Status); move it out of the way.
		progress("removing an unmarked directory " + final)
		if err := removeAll(final); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(part); err == nil {
		progress("resuming: an earlier attempt was interrupted; restarting it cleanly, downloaded packages are reused")
		if err := removeAll(part); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(part, 0o755); err != nil {
		return nil, err
	}
	cache := filepath.Join(m.Dir, ".cache", o.Suite)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	inst := m.Installer
	if inst == nil {
		inst = Debootstrap
	}
	start := time.Now()
	if err := inst(ctx, part, cache, o, progress); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rootfs %s: install interrupted (%w); run it again to resume", name, ctx.Err())
		}
		return nil, fmt.Errorf("rootfs %s: %w", name, err)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("rootfs %s: install interrupted (%w); run it again to resume", name, ctx.Err())
	}
	info := &Info{Name: name, Suite: o.Suite, Mirror: o.Mirror, Packages: o.Packages,
		Python: dpkgVersion(part, "python3"), InstalledAt: time.Now().UTC()}
	if slices.Contains(o.Packages, "python3") && info.Python == "" {
		return nil, fmt.Errorf("rootfs %s: the install finished but python3 is not in it", name)
	}
	info.Seconds = time.Since(start).Seconds()
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFileSync(filepath.Join(part, Marker), append(b, '\n')); err != nil {
		return nil, err
	}
	if err := os.Rename(part, final); err != nil {
		return nil, err
	}
	syncDir(m.Dir)
	progress(fmt.Sprintf("rootfs %s ready in %s", name, time.Since(start).Round(time.Second)))
	return info, nil
}

// Remove deletes the rootfs name, ready or partial. Removing an absent one
// is not an error. Sessions running on it keep what they have open.
func (m *Manager) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	unlock, err := m.tryLock(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no directory at all
	}
	if err != nil {
		return err
	}
	defer unlock()
	// Unmark first: from here on the rootfs is not ready, whatever happens.
	if err := os.Remove(filepath.Join(m.Path(name), Marker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, d := range []string{m.Path(name), m.partial(name)} {
		if err := removeAll(d); err != nil {
			return err
		}
	}
	return nil
}

// Lock takes the lock of name that Install and Remove take, waiting for
// it until ctx ends (then the error wraps ErrBusy). Whoever changes a
// ready rootfs (package installs) holds it, so that changes of one rootfs
// run one at a time and never during an install or a removal.
func (m *Manager) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	for {
		unlock, err := m.tryLock(name)
		if !errors.Is(err, ErrBusy) {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waited until %v)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// AddPackages records pkgs in the marker of the ready rootfs name, as
// packages installed after it was built, and listsUpdated (unless zero) as
// when its apt lists were last updated. The caller holds Lock.
func (m *Manager) AddPackages(name string, pkgs []string, listsUpdated time.Time) error {
	info, err := m.Info(name)
	if err != nil {
		return err
	}
	if !listsUpdated.IsZero() {
		info.ListsUpdated = listsUpdated.UTC()
	}
	for _, p := range pkgs {
		if !slices.Contains(info.Added, p) {
			info.Added = append(info.Added, p)
		}
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return writeFileSync(filepath.Join(m.Path(name), Marker), append(b, '\n'))
}

// Installed lists the packages dpkg says are installed in the rootfs
// directory root, with their versions.
func Installed(root string) map[string]string {
	out := map[string]string{}
	// Beneath root, never through a symlink out of it (see AptLists).
	r, err := os.OpenRoot(root)
	if err != nil {
		return out
	}
	defer r.Close()
	f, err := openRegular(r, "var/lib/dpkg/status")
	if err != nil {
		return out
	}
	defer f.Close()
	var cur, ver, status string
	flush := func() {
		if cur != "" && strings.HasSuffix(status, " installed") {
			out[cur] = ver
		}
		cur, ver, status = "", "", ""
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "Package: "):
			cur = strings.TrimPrefix(line, "Package: ")
		case strings.HasPrefix(line, "Version: "):
			ver = strings.TrimPrefix(line, "Version: ")
		case strings.HasPrefix(line, "Status: "):
			status = strings.TrimPrefix(line, "Status:")
		}
	}
	flush()
	return out
}

// packageRE is a Debian package name (Debian Policy §5.6.1: lower case
// letters, digits, + - and ., at least two characters, starting with a
// letter or digit), optionally with an architecture (:amd64) and a version
// (=1.6-2.1, Policy §5.6.12: digits, letters, . + ~ - and : for the
// epoch, starting with a digit). Nothing that starts with '-' or holds a
// space, so a name can never be read as an option.
var packageRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{1,127}(:[a-z0-9][a-z0-9-]{0,31})?(=[0-9][A-Za-z0-9.+~:-]{0,127})?$`)
})

// ErrBadPackage reports a package name that is not a Debian one.
var ErrBadPackage = errors.New("not a Debian package name (lower-case letters, digits, + - .; optionally NAME=VERSION)")

// CheckPackage validates one package argument for apt-get install.
func CheckPackage(p string) error {
	if !packageRE().MatchString(p) {
		return fmt.Errorf("%q: %w", p, ErrBadPackage)
	}
	return nil
}

// tryLock takes the install lock of name without waiting.
func (m *Manager) tryLock(name string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(m.Dir, "."+name+".lock"), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrBusy, name)
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}

// removeAll renames dir aside first, so that a crash half-way leaves no
// directory under the name, then deletes it.
func removeAll(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// An interrupted debootstrap can leave /proc, /sys or even the host's
	// /dev mounted inside its target: never delete through a mount.
	if err := unmountUnder(dir); err != nil {
		return err
	}
	trash := filepath.Join(filepath.Dir(dir), fmt.Sprintf(".trash-%s-%d", filepath.Base(dir), time.Now().UnixNano()))
	if err := os.Rename(dir, trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // best effort: a crash before it may lose the rename, and a missing file reads as not there
		d.Close()
	}
}

// dirBytes sums the sizes of the regular files under dir (no symlinks
// followed), as an approximation of its disk use.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error { // it returns only nil: an approximation
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// dpkgVersion reads the installed version of pkg from the rootfs's dpkg
// database; "" when it is not installed.
func dpkgVersion(root, pkg string) string {
	f, err := os.Open(filepath.Join(root, "var/lib/dpkg/status"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var cur, ver, status string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	flush := func() string {
		if cur == pkg && strings.Contains(status, " installed") {
			return ver
		}
		return ""
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if v := flush(); v != "" {
				return v
			}
			cur, ver, status = "", "", ""
		case strings.HasPrefix(line, "Package: "):
			cur = strings.TrimPrefix(line, "Package: ")
		case strings.HasPrefix(line, "Version: "):
			ver = strings.TrimPrefix(line, "Version: ")
		case strings.HasPrefix(line, "Status: "):
			status = strings.TrimPrefix(line, "Status:")
		}
	}
	return flush()
}

// HostMirror is the first Debian mirror named in the host's apt sources
// (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources),
// else DefaultMirror. Security and update archives are skipped.
func HostMirror() string { return hostMirror("/etc/apt") }

func hostMirror(etcApt string) string {
	files := []string{filepath.Join(etcApt, "sources.list")}
	for _, pat := range []string{"*.sources", "*.list"} {
		more, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		files = append(files, more...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			var uris []string
			switch {
			case strings.HasPrefix(line, "URIs:"):
				uris = strings.Fields(strings.TrimPrefix(line, "URIs:"))
			case strings.HasPrefix(line, "deb "):
				for _, w := range strings.Fields(line)[1:] {
					if strings.HasPrefix(w, "[") || strings.HasSuffix(w, "]") || strings.Contains(w, "=") {
						continue
					}
					uris = []string{w}
					break
				}
			}
			for _, u := range uris {
				if (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) &&
					strings.Contains(u, "debian") && !strings.Contains(u, "security") {
					return strings.TrimRight(u, "/")
				}
			}
		}
	}
	return DefaultMirror
}

// Debootstrap is the default Installer: `debootstrap --variant=minbase
// --include=PACKAGES SUITE TARGET MIRROR` with downloads kept in cacheDir.
// It needs root (debootstrap chroots and creates device nodes) and the
// network.
func Debootstrap(ctx context.Context, target, cacheDir string, o InstallOptions, progress func(string)) error {
	path, err := exec.LookPath("debootstrap")
	if err != nil {
		return fmt.Errorf("debootstrap not found (Debian: apt-get install debootstrap): %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("debootstrap needs root: run `sudo quro rootfs install`")
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(o.Packages, ","),
		"--cache-dir=" + cacheDir, o.Suite, target, o.Mirror}
	progress("debootstrap " + strings.Join(args, " "))
	r, w := io.Pipe()
	// On cancel, debootstrap's whole group goes: whatever it started (dpkg
	// in the chroot) too.
	h := &sandbox.Helper{Path: path, Args: args, Stdout: w, Stderr: w,
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive"}}
	lines := make(chan struct{})
	var last []string
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			progress(line)
			last = append(last, line)
			if len(last) > 10 {
				last = last[1:]
			}
		}
		_, _ = io.Copy(io.Discard, r) // drain past an over-long line so debootstrap never blocks on the pipe
	}()
	err = sandbox.RunHelper(ctx, h)
	w.Close()
	<-lines
	if err != nil {
		// Killed half-way, debootstrap leaves its chroot's mounts behind.
		if uerr := unmountUnder(target); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	if err != nil {
		return fmt.Errorf("debootstrap: %w; last output:\n%s", err, strings.Join(last, "\n"))
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, …).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir and fails when one
// remains.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil || len(mps) == 0 {
		return nil //nolint:nilerr // no mountinfo: nothing we could have mounted either
	}
	for _, mp := range mps {
		_ = syscall.Unmount(mp, syscall.MNT_DETACH) // what stays mounted is checked below
	}
	if left, _ := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("rootfs: %s is still mounted; unmount it before removing %s", left[0], dir)
	}
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// DirIn is where the rootfs directories of a data directory live.
func DirIn(dataDir string) string { return filepath.Join(dataDir, "rootfs") }
