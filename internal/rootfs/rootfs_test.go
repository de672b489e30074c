package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeUserland writes what an installer leaves: a few directories and a
// dpkg database that lists python3.
func fakeUserland(t *testing.T, target string) {
	t.Helper()
	for _, d := range []string{"usr/bin", "etc", "var/lib/dpkg"} {
		if err := os.MkdirAll(filepath.Join(target, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	status := "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n" +
		"Package: python3\nStatus: install ok installed\nPriority: optional\nVersion: 3.11.2-1+b1\n\n"
	if err := os.WriteFile(filepath.Join(target, "var/lib/dpkg/status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "usr/bin/python3"), []byte("#!fake\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestInstallStatusRemove(t *testing.T) {
	m := New(filepath.Join(t.TempDir(), "rootfs"))
	var lines []string
	var during *Status
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		if filepath.Base(target) != "box.partial" {
			t.Errorf("installer builds in %s, want box.partial", target)
		}
		if fi, err := os.Stat(cache); err != nil || !fi.IsDir() {
			t.Errorf("cache dir %s: %v", cache, err)
		}
		if o.Suite != DefaultSuite || o.Mirror != "http://mirror.example/debian" || strings.Join(o.Packages, ",") != "python3,python3-pip,ca-certificates" {
			t.Errorf("options %+v", o)
		}
		progress("I: fake step")
		fakeUserland(t, target)
		// Half-way through: not ready, partial, and the lock is held.
		if m.Ready("box") {
			t.Error("ready while installing")
		}
		var err error
		during, err = m.Status("box")
		if err != nil {
			t.Error(err)
		}
		if _, err := m.Install(ctx, "box", o, nil); !errors.Is(err, ErrBusy) {
			t.Errorf("second install while installing: %v, want ErrBusy", err)
		}
		if err := m.Remove("box"); !errors.Is(err, ErrBusy) {
			t.Errorf("remove while installing: %v, want ErrBusy", err)
		}
		return nil
	}
	if st, err := m.Status("box"); err != nil || st.State != Absent {
		t.Fatalf("before: %+v %v", st, err)
	}
	info, err := m.Install(context.Background(), "box", InstallOptions{Mirror: "http://mirror.example/debian"}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	if during == nil || during.State != Partial || !during.Installing {
		t.Errorf("status during the install: %+v", during)
	}
	if info.Python != "3.11.2-1+b1" || info.Suite != "bookworm" {
		t.Errorf("info %+v", info)
	}
	if !m.Ready("box") {
		t.Fatal("not ready after install")
	}
	if _, err := os.Stat(m.partial("box")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial dir left: %v", err)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "I: fake step") {
		t.Errorf("progress %q", lines)
	}
	st, err := m.Status("box")
	if err != nil || st.State != Ready || st.Bytes == 0 || st.Info.Python != info.Python || st.Dir != m.Path("box") {
		t.Fatalf("status %+v %v", st, err)
	}
	if !strings.Contains(st.Text(), "ready") || !strings.Contains(st.Text(), "python3 3.11.2") {
		t.Errorf("text %q", st.Text())
	}
	// Installing again is a no-op.
	calls := 0
	m.Installer = func(context.Context, string, string, InstallOptions, func(string)) error { calls++; return nil }
	if _, err := m.Install(context.Background(), "box", InstallOptions{}, nil); err != nil || calls != 0 {
		t.Errorf("reinstall: %v, %d installer calls", err, calls)
	}
	list, err := m.List()
	if err != nil || len(list) != 1 || list[0].Name != "box" {
		t.Errorf("list %+v %v", list, err)
	}
	if err := m.Remove("box"); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Status("box"); st.State != Absent || m.Ready("box") {
		t.Errorf("after remove: %+v", st)
	}
	if err := m.Remove("box"); err != nil {
		t.Errorf("removing an absent rootfs: %v", err)
	}
	if err := New(filepath.Join(t.TempDir(), "none")).Remove("x"); err != nil {
		t.Errorf("remove with no directory: %v", err)
	}
}

func TestInterruptedInstallIsNeverReadyAndResumes(t *testing.T) {
	m := New(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		fakeUserland(t, target)
		// Something downloaded before the interruption, kept for the resume.
		os.WriteFile(filepath.Join(cache, "python3_3.11.deb"), []byte("deb"), 0o644)
		cancel() // the user pressed ^C half-way
		return ctx.Err()
	}
	_, err := m.Install(ctx, "box", InstallOptions{}, nil)
	if err == nil || !strings.Contains(err.Error(), "again to resume") {
		t.Fatalf("interrupted install: %v", err)
	}
	if m.Ready("box") {
		t.Fatal("an interrupted install is ready")
	}
	st, err := m.Status("box")
	if err != nil || st.State != Partial || st.Installing || st.Bytes == 0 {
		t.Fatalf("status %+v %v", st, err)
	}
	if !strings.Contains(st.Text(), "resumes it") {
		t.Errorf("text %q", st.Text())
	}
	if _, err := os.Stat(m.Path("box")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("final directory exists after an interruption: %v", err)
	}

	// A failing installer (not interrupted) is not ready either.
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		os.WriteFile(filepath.Join(target, "half"), nil, 0o644)
		return errors.New("mirror unreachable")
	}
	if _, err := m.Install(context.Background(), "box", InstallOptions{}, nil); err == nil || !strings.Contains(err.Error(), "mirror unreachable") {
		t.Fatalf("failing install: %v", err)
	}
	if m.Ready("box") {
		t.Fatal("a failed install is ready")
	}

	// Resuming: starts from a clean directory, keeps the download cache.
	var lines []string
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		if _, err := os.Stat(filepath.Join(target, "half")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the resumed install sees the leftovers: %v", err)
		}
		if _, err := os.Stat(filepath.Join(cache, "python3_3.11.deb")); err != nil {
			t.Errorf("the download cache was lost: %v", err)
		}
		fakeUserland(t, target)
		return nil
	}
	if _, err := m.Install(context.Background(), "box", InstallOptions{}, func(l string) { lines = append(lines, l) }); err != nil {
		t.Fatal(err)
	}
	if !m.Ready("box") || !strings.Contains(strings.Join(lines, "\n"), "resuming") {
		t.Errorf("ready=%v progress=%q", m.Ready("box"), lines)
	}
}

func TestInstallWithoutPythonFails(t *testing.T) {
	m := New(t.TempDir())
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		return os.MkdirAll(filepath.Join(target, "usr/bin"), 0o755)
	}
	if _, err := m.Install(context.Background(), "box", InstallOptions{}, nil); err == nil || !strings.Contains(err.Error(), "python3 is not in it") {
		t.Fatalf("install without python3: %v", err)
	}
	if m.Ready("box") {
		t.Fatal("ready without python3")
	}
}

func TestRemovePartialAndUnmarked(t *testing.T) {
	m := New(t.TempDir())
	os.MkdirAll(filepath.Join(m.partial("a"), "usr"), 0o755)
	os.MkdirAll(filepath.Join(m.Path("b"), "usr"), 0o755) // no marker
	for _, n := range []string{"a", "b"} {
		if st, _ := m.Status(n); st.State != Partial {
			t.Errorf("%s: %+v", n, st)
		}
		if err := m.Remove(n); err != nil {
			t.Fatal(err)
		}
		if st, _ := m.Status(n); st.State != Absent {
			t.Errorf("%s after remove: %+v", n, st)
		}
	}
	entries, _ := os.ReadDir(m.Dir)
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func TestNames(t *testing.T) {
	m := New(t.TempDir())
	for _, bad := range []string{"", ".", "..", "a.partial", "../x", "a/b", ".hidden", strings.Repeat("x", 65)} {
		if _, err := m.Status(bad); !errors.Is(err, ErrBadName) {
			t.Errorf("%q: %v", bad, err)
		}
		if m.Ready(bad) {
			t.Errorf("%q ready", bad)
		}
		if err := m.Remove(bad); !errors.Is(err, ErrBadName) {
			t.Errorf("remove %q: %v", bad, err)
		}
	}
	if err := CheckName("default"); err != nil {
		t.Error(err)
	}
}

func TestHostMirror(t *testing.T) {
	dir := t.TempDir()
	if got := hostMirror(dir); got != DefaultMirror {
		t.Errorf("no sources: %s", got)
	}
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "sources.list.d", "debian.sources"), []byte(
		"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n"+
			"Types: deb\n# a comment\nURIs: http://ftp.example.org/debian/\nSuites: bookworm\n"), 0o644)
	if got := hostMirror(dir); got != "http://ftp.example.org/debian" {
		t.Errorf("deb822: %s", got)
	}
	os.WriteFile(filepath.Join(dir, "sources.list"), []byte(
		"# deb http://commented.example/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"), 0o644)
	if got := hostMirror(dir); got != "http://mirror.example/debian" {
		t.Errorf("one-line: %s", got)
	}
}

// A rootfs named code-interpreter is installed, when its install names no
// packages, with what data work expects; another name gets the defaults,
// and packages named by the caller win over both.
func TestInstallPresetPackages(t *testing.T) {
	m := New(filepath.Join(t.TempDir(), "rootfs"))
	var got []string
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		got = o.Packages
		fakeUserland(t, target)
		return nil
	}
	for _, c := range []struct {
		name  string
		asked []string
		want  []string
	}{
		{CodeInterpreter, nil, []string{"python3", "python3-pip", "ca-certificates", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-scipy", "python3-sklearn", "python3-pytest", "python3-requests", "python3-openpyxl", "python3-bs4", "python3-pil", "ipython3", "nodejs"}},
		{"box", nil, DefaultPackages},
		{"mine", []string{"python3", "python3-numpy"}, []string{"python3", "python3-numpy"}},
	} {
		if _, err := m.Install(context.Background(), c.name, InstallOptions{Mirror: "http://mirror.example/debian", Packages: c.asked}, nil); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s: installed %v, want %v", c.name, got, c.want)
		}
		info, err := m.Info(c.name)
		if err != nil || strings.Join(info.Packages, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s: the marker lists %v (%v)", c.name, info, err)
		}
	}
}
