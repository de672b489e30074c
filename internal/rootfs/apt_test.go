package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// apt's simulated plan is read strictly: a removal, a name apt read as a
// pattern or as another package, or a named package apt would not install
// refuses the install.
func TestAptPlanCheck(t *testing.T) {
	installed := map[string]string{"libc6": "2.36-9", "python3.11": "3.11.2-6"}
	for _, tc := range []struct {
		out  string
		pkgs []string
		want string // "" accepted
	}{
		{"Inst jq (1.6-2.1 Debian:12/stable [amd64])\nInst libjq1 (1.6)\nConf libjq1 (1.6)\nConf jq (1.6)\n", []string{"jq"}, ""},
		{"", []string{"python3.11"}, ""},
		{"", []string{"libc6=2.36-9"}, ""},
		{"", []string{"libc6=2.36-8"}, "would not install libc6=2.36-8"},
		{"Inst libc6:i386 (2.36)\nConf libc6:i386 (2.36)\n", []string{"libc6:i386"}, ""},
		{"Remv libsystemd0 [252]\nInst libelogind0 (252)\nConf libelogind0 (252)\n", []string{"libelogind0"}, "would remove libsystemd0"},
		{"Purg foo [1]\nInst bar (1)\nConf bar (1)\n", []string{"bar"}, "would remove foo"},
		{"Note, selecting 'cowsay' for regex 'cowsa.'\nInst cowsay (3)\nConf cowsay (3)\n", []string{"cowsay"}, "read a name as something else"},
		{"Inst cowsay (3)\nConf cowsay (3)\n", []string{"sl"}, "would not install sl"},
		{"Inst sl (5)\n", []string{"sl"}, "configures none"},
	} {
		p, err := parseAptPlan(tc.out, false)
		if err == nil {
			err = p.check(tc.pkgs, installed)
		}
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q %q: %v, want %q", tc.out, tc.pkgs, err, tc.want)
		}
	}
	if _, err := parseAptPlan("Inst x (1)\n", true); err == nil {
		t.Error("a cut plan was trusted")
	}
}

// Arguments apt-get would read as options, patterns or remove/install
// markers are not package arguments.
func TestCheckAptArg(t *testing.T) {
	for _, p := range []string{"-o", "-oAPT::Sandbox::User=root", "foo;rm", "foo bar", "--reinstall", "Jq", "j", "jq=-1", "jq=1.6 x",
		"../jq", "jq\n", "$(id)", "a*", "", "jq-", "coreutils-", "sl=5.02-1+", "sl:amd64+", "cowsa?", "a|b", "^jq$", "[jq]"} {
		if err := CheckAptArg(p); !errors.Is(err, ErrBadPackage) {
			t.Errorf("%q: %v, want ErrBadPackage", p, err)
		}
	}
	for _, p := range []string{"jq", "python3-numpy", "g++", "libc6:amd64", "jq=1.6-2.1+deb12u2", "libstdc++6=1:12.2.0-14", "cowsa."} {
		if err := CheckAptArg(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	if err := CheckAptArg("jq-"); err == nil || !strings.Contains(err.Error(), "remove this package") {
		t.Errorf("jq-: %v", err)
	}
}

// readyFake makes name a ready rootfs of m holding a fake userland whose
// dpkg status is status (fakeUserland's when empty).
func readyFake(t *testing.T, m *Manager, name, status string) string {
	t.Helper()
	root := m.Path(name)
	fakeUserland(t, root)
	if status != "" {
		if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, Marker), []byte(`{"name":"`+name+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// What Install and Repair refuse before any apt runs (the Apt has no
// sandbox: reaching apt would panic), each as an error a caller can tell
// apart: a bad name, a rootfs that is not installed, the lock held by
// another change past the timeout or a cancel, a half-configured rootfs,
// a dpkg status that cannot be read.
func TestAptRefusesBeforeRunningApt(t *testing.T) {
	m := New(filepath.Join(t.TempDir(), "rootfs"))
	a := &Apt{M: m}
	ctx := context.Background()
	if _, err := a.Install(ctx, "../x", []string{"jq"}, time.Minute, nil); !errors.Is(err, ErrBadName) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := a.Install(ctx, "default", []string{"jq-"}, time.Minute, nil); !errors.Is(err, ErrBadPackage) {
		t.Errorf("bad package: %v", err)
	}
	if _, err := a.Install(ctx, "default", nil, time.Minute, nil); !errors.Is(err, ErrBadPackage) {
		t.Errorf("no package: %v", err)
	}
	if _, err := a.Repair(ctx, "default", time.Minute, nil); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("not installed: %v", err)
	}

	readyFake(t, m, "default", "")
	unlock, err := m.Lock(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	var we *WaitError
	var out strings.Builder
	_, err = a.Install(ctx, "default", []string{"jq"}, 200*time.Millisecond, &out)
	if !errors.As(err, &we) || we.Canceled || !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "after 200ms, this call's timeout") {
		t.Errorf("lock held past the timeout: %v", err)
	}
	if want := `# waiting for another change of rootfs "default" to finish (at most 200ms)` + "\n"; out.String() != want {
		t.Errorf("the output of a call that waited: %q, want %q", out.String(), want)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err = a.Repair(canceled, "default", time.Minute, nil); !errors.As(err, &we) || !we.Canceled {
		t.Errorf("canceled while waiting: %v", err)
	}
	unlock()

	readyFake(t, m, "half", "Package: sl\nStatus: install ok unpacked\nVersion: 5\n\n")
	_, err = a.Install(ctx, "half", []string{"jq"}, time.Minute, nil)
	if !errors.Is(err, ErrUnsettled) || !strings.Contains(err.Error(), "sl (unpacked)") || !strings.Contains(err.Error(), "quro rootfs repair half") {
		t.Errorf("half-configured: %v", err)
	}
	root := readyFake(t, m, "odd", "")
	status := filepath.Join(root, "var/lib/dpkg/status")
	if err := os.Remove(status); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", status); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Install(ctx, "odd", []string{"jq"}, time.Minute, nil); !errors.Is(err, ErrUnreadable) {
		t.Errorf("install, unreadable status: %v", err)
	}
	if _, err := a.Repair(ctx, "odd", time.Minute, nil); !errors.Is(err, ErrUnreadable) {
		t.Errorf("repair, unreadable status: %v", err)
	}
}

// Names are matched literally against the lists, and against dpkg's
// status for what is installed; what is unknown is said to be unknown
// (fresher lists may have it), with the nearest names.
func TestCheckAvailable(t *testing.T) {
	root := t.TempDir()
	fakeUserland(t, root)
	lists := filepath.Join(root, AptListsDir)
	if err := os.MkdirAll(lists, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lists, "deb_dists_bookworm_main_binary-amd64_Packages"), []byte(samplePackages), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pkgs    []string
		want    string // "" accepted
		unknown bool
	}{
		{[]string{"jq", "cowsay", "g++", "python3", "libc6=2.36-9"}, "", false},
		{[]string{"cowsay:i386"}, "", false}, // Architecture: all
		{[]string{"cowsa."}, "did you mean cowsay", true},
		{[]string{"jq:i386"}, "not offered for architecture i386", true},
		{[]string{"jq=9"}, "no version 9", true},
	} {
		err, unknown := checkAvailable(root, "r", tc.pkgs, "")
		if (tc.want == "") != (err == nil) || (err != nil && (!strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrRefused))) || unknown != tc.unknown {
			t.Errorf("%q: %v (unknown %v), want %q", tc.pkgs, err, unknown, tc.want)
		}
	}
	// A note on the lists' freshness joins the refusal of an unknown name.
	if err, _ := checkAvailable(root, "r", []string{"cowsa."}, "the apt lists are fresh (updated 3s ago)"); err == nil ||
		!strings.HasSuffix(err.Error(), "use exact Debian package names; the apt lists are fresh (updated 3s ago); nothing was installed") {
		t.Errorf("fresh lists: %v", err)
	}
	if err := os.RemoveAll(lists); err != nil {
		t.Fatal(err)
	}
	if err, _ := checkAvailable(root, "r", []string{"jq"}, ""); err == nil || !strings.Contains(err.Error(), "no apt lists yet") {
		t.Errorf("no lists: %v", err)
	}
}

// An unknown name may update the lists once a call, only when they are
// older than ListsFreshFor (never updated counts as old; a time ahead of
// the clock does not count as fresh), and not once the call is over; a
// refusal notes fresh lists.
func TestMayUpdateOnlyPastTheWindow(t *testing.T) {
	now := time.Now()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		listsAt          time.Time
		updated          bool // by this call already
		ctx              context.Context
		mayUpdate, fresh bool
	}{
		{time.Time{}, false, context.Background(), true, false},
		{now.Add(-ListsFreshFor - time.Second), false, context.Background(), true, false},
		{now.Add(-time.Second), false, context.Background(), false, true},
		{now.Add(time.Hour), false, context.Background(), true, false},
		{now.Add(-time.Hour), true, context.Background(), false, false},
		{now.Add(-time.Hour), false, canceled, false, false},
	} {
		c := &aptInstall{ctx: tc.ctx, listsAt: tc.listsAt, res: &InstallResult{Updated: tc.updated}}
		if got := c.mayUpdate(); got != tc.mayUpdate {
			t.Errorf("lists at %v (now %v), updated %v, ctx err %v: mayUpdate %v, want %v", tc.listsAt, now, tc.updated, tc.ctx.Err(), got, tc.mayUpdate)
		}
		if note := c.listsNote(); (note != "") != tc.fresh || (tc.fresh && !strings.HasPrefix(note, "the apt lists are fresh (updated ")) {
			t.Errorf("lists at %v (now %v): note %q, want one: %v", tc.listsAt, now, note, tc.fresh)
		}
	}
}

// TestUpdateFetchFailureIsNotFresh: apt-get update exits 0 when it could
// not fetch a list (a warning); its output says so, and such an update
// must not make the lists count as fresh (fetchFailures), even when the
// line arrives split across writes.
func TestUpdateFetchFailureIsNotFresh(t *testing.T) {
	ok := "Hit:1 http://deb.debian.org/debian bookworm InRelease\nReading package lists...\n"
	bad := "Err:1 http://mirror.invalid/debian bookworm InRelease\n  Could not resolve 'mirror.invalid'\n" +
		"W: Failed to fetch http://mirror.invalid/debian/dists/bookworm/InRelease  Could not resolve 'mirror.invalid'\n" +
		"W: Some index files failed to download. They have been ignored, or old ones used instead.\n"
	for _, c := range []struct {
		out  string
		want bool
	}{{ok, false}, {ok + bad, true}} {
		for _, step := range []int{1, 3, 7, len(c.out)} {
			var f fetchFailures
			for i := 0; i < len(c.out); i += step {
				if _, err := f.Write([]byte(c.out[i:min(i+step, len(c.out))])); err != nil {
					t.Fatal(err)
				}
			}
			if f.seen() != c.want {
				t.Errorf("writes of %d bytes of %q: failure seen %v, want %v", step, c.out, f.seen(), c.want)
			}
		}
	}
}
