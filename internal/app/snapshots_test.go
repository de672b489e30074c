package app

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/terminal"
)

func shIn(t testing.TB, a *App, sess, code string) *runcode.Result {
	t.Helper()
	return runCode(t, a, RunCodeInput{Lang: "sh", Session: sess, Code: code})
}

// shOK is shIn for code that must succeed: a run that did not (an error,
// a timeout, a non-zero exit) fails the test with what it said, rather
// than leave a later check to fail on what it did not write.
func shOK(t testing.TB, a *App, sess, code string) *runcode.Result {
	t.Helper()
	r := shIn(t, a, sess, code)
	if r.ExitCode != 0 || r.Error != "" || r.Interrupted {
		t.Fatalf("%q in session %q: exit %d, error %q, interrupted %v, notes %q\nstdout: %s\nstderr: %s",
			code, sess, r.ExitCode, r.Error, r.Interrupted, r.Notes, r.Stdout, r.Stderr)
	}
	return r
}

func snapshot(t testing.TB, a *App, in SnapshotInput) *SnapshotInfo {
	t.Helper()
	reply, err := call(t, a, "snapshot_session", in)
	if err != nil {
		t.Fatalf("snapshot_session %+v: %v", in, err)
	}
	return reply.Output.(*SnapshotInfo)
}

func fork(t testing.TB, a *App, in ForkInput) *ForkResult {
	t.Helper()
	reply, err := call(t, a, "fork_session", in)
	if err != nil {
		t.Fatalf("fork_session %+v: %v", in, err)
	}
	return reply.Output.(*ForkResult)
}

func sessionNames(t *testing.T, a *App) []string {
	t.Helper()
	reply, err := call(t, a, "list_sessions", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range reply.Output.(*SessionList).Sessions {
		names = append(names, s.Name)
	}
	return names
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// The session's code leaves links to /etc/passwd and out of the
// workspace, a FIFO, a private directory, a set-uid file and a hard link.
// The snapshot copies the links as links (the server reads nothing through
// them), skips the FIFO and says so, drops the set-uid bit; the forks get
// the files, the variables, the working directory and the network policy,
// are independent of each other and of the source, and carry no Python
// state.
func TestSnapshotAndFork(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "src", Network: "host"}); err != nil {
		t.Fatal(err)
	}
	v := "bar"
	if _, err := call(t, a, "set_session_env", SetEnvInput{Session: "src", Env: map[string]*string{"FOO": &v}}); err != nil {
		t.Fatal(err)
	}
	res := shIn(t, a, "src", `set -e
mkdir -p sub/private && chmod 700 sub/private && echo secret > sub/private/s.txt
echo hello > a.txt && ln a.txt hard.txt
ln -s /etc/passwd passwd-link
ln -s ../../../../../../../../etc/hostname up-link
mkfifo fifo
echo x > suid && chmod 4755 suid
chmod 2750 sub
stat -c %a suid sub`)
	if res.ExitCode != 0 || res.Stdout != "4755\n2750\n" {
		t.Fatalf("setup: %+v", res)
	}
	if _, err := call(t, a, "terminal_exec", TerminalExecInput{Session: "src", Command: "cd sub"}); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, a, "run_code", RunCodeInput{Session: "src", Code: "x = 41"}); err != nil {
		t.Fatal(err)
	}

	snap := snapshot(t, a, SnapshotInput{Session: "src", Name: "s1"})
	if snap.Symlinks != 2 || snap.Hardlinks != 1 || !slices.Contains(snap.Skipped, "fifo (fifo)") || snap.SkippedCount != 1 {
		t.Errorf("snapshot: %+v", snap)
	}
	if snap.Cwd != "sub" || snap.Network != "host" || !slices.Contains(snap.EnvNames, "FOO") {
		t.Errorf("settings not snapshotted: %+v", snap)
	}
	reply, _ := call(t, a, "snapshot_session", SnapshotInput{Session: "src", Name: "s1"})
	if reply != nil {
		t.Error("a second snapshot of the same name was taken")
	}
	if text := snap.Text(); !strings.Contains(text, "NOT included: running processes, Python variables") || !strings.Contains(text, "skipped 1: fifo (fifo)") {
		t.Errorf("the result's text does not say what is left out:\n%s", text)
	}
	for _, want := range []string{"running processes", "Python variables", "shell variables", "FIFOs"} {
		if !strings.Contains(snap.NotIncluded, want) {
			t.Errorf("not_included does not say %q: %s", want, snap.NotIncluded)
		}
	}
	// On the host: the snapshot is private, links are links, no set-uid.
	sdir := filepath.Join(a.DataDir, "snapshots", snap.ID)
	if fi, err := os.Stat(sdir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("snapshot directory: %v %v", fi, err)
	}
	checkCopy(t, filepath.Join(sdir, "workspace"), -1)

	out := fork(t, a, ForkInput{Snapshot: "s1", Count: 3, NamePrefix: "f"})
	if len(out.Copies) != 3 {
		t.Fatalf("fork: %+v", out)
	}
	for i, c := range out.Copies {
		if !c.OK || c.Name != "f-"+string(rune('1'+i)) || c.Index != i+1 {
			t.Errorf("copy %d: %+v", i, c)
		}
		s, err := a.Sessions.Get(context.Background(), c.Session)
		if err != nil {
			t.Fatal(err)
		}
		checkCopy(t, s.Workspace(), s.UID)
		if s.Network != "host" || s.Env["FOO"] != "bar" || s.Cwd != filepath.Join(s.Workspace(), "sub") {
			t.Errorf("%s: network %q env %v cwd %q", s.Name, s.Network, s.Env, s.Cwd)
		}
	}
	// Inside the fork's box: the files, the links as links, no FIFO, the
	// variables and the directory; the link out of the workspace leads
	// nowhere the box could not already see.
	res = shIn(t, a, "f-1", `cat a.txt sub/private/s.txt; readlink passwd-link up-link; stat -c %a suid sub sub/private
[ -p fifo ] && echo fifo || echo no-fifo; [ hard.txt -ef a.txt ] && echo linked; echo "FOO=$FOO"`)
	want := "hello\nsecret\n/etc/passwd\n../../../../../../../../etc/hostname\n755\n750\n700\nno-fifo\nlinked\nFOO=bar\n"
	if res.Stdout != want {
		t.Errorf("in the fork:\n%s\nwant\n%s\nstderr %s", res.Stdout, want, res.Stderr)
	}
	term, err := call(t, a, "terminal_exec", TerminalExecInput{Session: "f-1", Command: "pwd"})
	if err != nil || !strings.HasSuffix(strings.TrimSpace(term.Output.(*terminal.Result).Output), "/sub") {
		t.Errorf("the fork's shell does not start in sub: %v %+v", err, term)
	}
	// No Python state crossed.
	py := runCode(t, a, RunCodeInput{Session: "f-1", Code: "print(globals().get('x'))"})
	if strings.TrimSpace(py.Stdout) != "None" {
		t.Errorf("a Python variable crossed into the fork: %q", py.Stdout)
	}
	// Independent: a write in f-1 changes neither f-2 nor the source.
	shIn(t, a, "f-1", "echo changed > a.txt")
	for _, s := range []string{"f-2", "f-3", "src"} {
		if got := shIn(t, a, s, "cat a.txt").Stdout; got != "hello\n" {
			t.Errorf("%s's a.txt is %q after f-1 wrote its own", s, got)
		}
	}
	// A snapshot outlives its forks' changes and can be deleted; the
	// forks keep their files.
	if _, err := call(t, a, "delete_snapshot", SnapshotRef{Snapshot: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sdir); !os.IsNotExist(err) {
		t.Errorf("the snapshot's files outlived it: %v", err)
	}
	// Its fork lock went with it (the forks above took it).
	if _, held := snapLocks.Load(a.snapLockKey(snap.ID)); held {
		t.Error("the deleted snapshot's lock is still kept")
	}
	if got := shIn(t, a, "f-2", "cat a.txt").Stdout; got != "hello\n" {
		t.Errorf("f-2 lost its files with the snapshot: %q", got)
	}
	// fork {session}: snapshot and fork in one call, the snapshot gone
	// after.
	out = fork(t, a, ForkInput{Session: "f-1", NamePrefix: "g"})
	if len(out.Copies) != 1 || shIn(t, a, "g-1", "cat a.txt").Stdout != "changed\n" {
		t.Errorf("fork of a session: %+v", out)
	}
	if list, _ := call(t, a, "list_snapshots", Empty{}); len(list.Output.(*SnapshotList).Snapshots) != 0 {
		t.Errorf("the snapshot of fork {session} was kept: %s", list.Text)
	}
}

// checkCopy checks a copied workspace on the host: links are links (with
// the targets the session's code gave them), the FIFO is not there, no file
// is set-uid or set-gid, and everything belongs to uid (when >= 0 and the
// server is root).
func checkCopy(t *testing.T, ws string, uid int) {
	t.Helper()
	for name, target := range map[string]string{"passwd-link": "/etc/passwd", "up-link": "../../../../../../../../etc/hostname"} {
		fi, err := os.Lstat(filepath.Join(ws, name))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("%s: %s is not a link: %v %v", ws, name, fi, err)
			continue
		}
		if got, _ := os.Readlink(filepath.Join(ws, name)); got != target {
			t.Errorf("%s -> %q, want %q", name, got, target)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "fifo")); !os.IsNotExist(err) {
		t.Errorf("the FIFO was copied: %v", err)
	}
	filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		fi, _ := os.Lstat(p)
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			t.Errorf("%s keeps a set-uid or set-gid bit: %v", p, fi.Mode())
		}
		if st := fi.Sys().(*syscall.Stat_t); uid >= 0 && os.Geteuid() == 0 && int(st.Uid) != uid {
			t.Errorf("%s belongs to uid %d, not the session's %d", p, st.Uid, uid)
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(ws, "sub", "private", "s.txt")); err != nil || string(b) != "secret\n" {
		t.Errorf("sub/private/s.txt: %q %v", b, err)
	}
}

// leftovers lists what is under the data directory's sessions, disks and
// snapshots directories.
func leftovers(t *testing.T, a *App) (sessions, disks, snaps []string) {
	t.Helper()
	return dirNames(t, filepath.Join(a.DataDir, "sessions")), dirNames(t, filepath.Join(a.DataDir, "disks")),
		dirNames(t, filepath.Join(a.DataDir, "snapshots"))
}

// A fork that cannot make every copy makes none: with room for two more
// sessions, count=3 fails on the third and destroys the first two; with a
// disk quota smaller than the snapshot, the first copy fails ENOSPC. No
// session, directory or disk image is left behind, and the error says
// which copy failed and why.
func TestForkIsAllOrNothing(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed,
		Limits: Limits{SessionsPerTenant: 4, Tenant: TenantLimits{Disk: 32 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	if res := shIn(t, a, "src", "head -c 20M /dev/urandom > big && echo 1 > small"); res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	snapshot(t, a, SnapshotInput{Session: "src", Name: "s"})
	before := sessionNames(t, a)
	bs, bd, _ := leftovers(t, a)

	_, err = call(t, a, "fork_session", ForkInput{Snapshot: "s", Count: 3, NamePrefix: "f"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	for _, want := range []string{"copy 3 of 3 failed", "session limit reached", "(f-1, f-2) were destroyed"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the error %q does not say %q", ce.Message, want)
		}
	}
	after := sessionNames(t, a)
	a.Sessions.WaitReleases() // the copies' disks and directories go in their destroys' background releases
	as, ad, _ := leftovers(t, a)
	if !slices.Equal(before, after) || !slices.Equal(bs, as) || !slices.Equal(bd, ad) {
		t.Errorf("the failed fork left something:\nsessions %v → %v\ndirs %v → %v\ndisks %v → %v", before, after, bs, as, bd, ad)
	}
	// Two fit.
	if out := fork(t, a, ForkInput{Snapshot: "s", Count: 2, NamePrefix: "ok"}); len(out.Copies) != 2 {
		t.Fatalf("%+v", out)
	}
	for _, n := range []string{"ok-1", "ok-2"} {
		if _, err := call(t, a, "destroy_session", SessionRef{Session: n}); err != nil {
			t.Fatal(err)
		}
	}

	if err := a.tenants.disks.Enforced(); err != nil {
		t.Skipf("no kernel disk quota here: %v", err)
	}
	// New sessions get 16 MiB disks: the 20 MiB snapshot does not fit.
	if err := a.setTenantLimits(context.Background(), "", TenantLimits{Disk: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err = call(t, a, "fork_session", ForkInput{Snapshot: "s", Count: 2, NamePrefix: "q"})
	ce = wantCode(t, err, capability.ResourceExhausted)
	for _, want := range []string{"copy 1 of 2 failed", "disk is full", "(q-1) were destroyed"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the error %q does not say %q", ce.Message, want)
		}
	}
	a.Sessions.WaitReleases()
	as, ad, _ = leftovers(t, a)
	if after := sessionNames(t, a); !slices.Equal(before, after) || !slices.Equal(bs, as) || !slices.Equal(bd, ad) {
		t.Errorf("the fork that hit the quota left something:\nsessions %v → %v\ndirs %v → %v\ndisks %v → %v", before, after, bs, as, bd, ad)
	}
}

// A tenant holds at most Limits.Snapshots snapshots and
// Limits.SnapshotBytes bytes of them; a snapshot larger than the
// per-session disk quota cannot be taken. A refusal leaves no files.
func TestSnapshotCeilings(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed,
		Limits: Limits{Snapshots: 2, SnapshotBytes: 3 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	shOK(t, a, "", "head -c 1M /dev/zero > one")
	snapshot(t, a, SnapshotInput{Name: "a"})
	snapshot(t, a, SnapshotInput{Name: "b"})
	snapshotRefused(t, a, SnapshotInput{Name: "c"}, "you hold 2 snapshots")
	if _, err := call(t, a, "delete_snapshot", SnapshotRef{Snapshot: "b"}); err != nil {
		t.Fatal(err)
	}
	// 1 MiB held, 2 MiB left: a 2.5 MiB workspace does not fit.
	shOK(t, a, "", "head -c 1536K /dev/zero > two")
	serverSees(t, a, map[string]int64{"one": 1 << 20, "two": 1536 << 10})
	snapshotRefused(t, a, SnapshotInput{Name: "c"}, "larger than what your snapshots may still hold")
	if _, _, snaps := leftovers(t, a); len(snaps) != 1 {
		t.Errorf("refused snapshots left files: %v", snaps)
	}
	list, _ := call(t, a, "list_snapshots", Empty{})
	if l := list.Output.(*SnapshotList).Snapshots; len(l) != 1 || l[0].Name != "a" || !l[0].Complete || l[0].SizeBytes != 1<<20 {
		t.Errorf("list: %s", list.Text)
	}

	// The per-session disk quota bounds one snapshot, also where no
	// image enforces it (hard links are stored once, so they do not
	// multiply it).
	b, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed,
		Limits: Limits{Tenant: TenantLimits{Disk: 8 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	shOK(t, b, "", "head -c 3M /dev/zero > f; for i in $(seq 20); do ln f f$i; done")
	if s := snapshot(t, b, SnapshotInput{Name: "links"}); s.SizeBytes != 3<<20 || s.Hardlinks != 20 {
		t.Errorf("hard links: %+v", s)
	}
	shOK(t, b, "", "rm f*; truncate -s 1G sparse")
	serverSees(t, b, map[string]int64{"sparse": 1 << 30})
	snapshotRefused(t, b, SnapshotInput{Name: "sparse"}, "larger than your per-session disk quota")
}

// snapshotRefused asks for snapshot in of the default session and wants
// it refused as resource_exhausted, saying want. A snapshot taken instead
// fails the test with what it copied (its size, files and what it
// skipped), which says why it fitted.
func snapshotRefused(t *testing.T, a *App, in SnapshotInput, want string) {
	t.Helper()
	reply, err := call(t, a, "snapshot_session", in)
	if err == nil {
		t.Fatalf("snapshot %q was taken, want it refused (%q): %s", in.Name, want, reply.Text)
	}
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, want) {
		t.Errorf("snapshot %q refused saying %q, want %q", in.Name, ce.Message, want)
	}
}

// serverSees checks that the server, which a snapshot's copy reads as,
// sees the default session's workspace as the session's code does: the
// same filesystem (one device: a second mount of the session's disk
// image would not see the other's writes) and the files the session
// wrote, at their sizes. A ceiling test whose copy read another view
// would pass a snapshot that the session's files do not fit.
func serverSees(t *testing.T, a *App, want map[string]int64) {
	t.Helper()
	def, err := a.Sessions.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	inBox := strings.TrimSpace(shOK(t, a, "", "stat -c %d /home/user").Stdout)
	var st syscall.Stat_t
	if err := syscall.Stat(def.Workspace(), &st); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(st.Dev) != inBox {
		t.Fatalf("the session's workspace is on device %s in its box and %d for the server: not one filesystem", inBox, st.Dev)
	}
	for name, size := range want {
		fi, err := os.Lstat(filepath.Join(def.Workspace(), name))
		if err != nil || fi.Size() != size {
			t.Fatalf("the server sees %s as %v (%v); the session wrote %d bytes", name, fi, err, size)
		}
	}
}

// Bad input is refused with what to do, and nothing is made.
func TestSnapshotBadInput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		name string
		args any
		code capability.Code
		want string
	}{
		{"snapshot_session", SnapshotInput{Name: "../x"}, capability.InvalidArgument, "use 1-64 letters"},
		{"snapshot_session", SnapshotInput{Name: strings.Repeat("a", 32)}, capability.InvalidArgument, "use 1-64 letters"},
		{"snapshot_session", SnapshotInput{Session: "ghost"}, capability.NotFound, "ghost"},
		{"fork_session", ForkInput{}, capability.InvalidArgument, "give a snapshot"},
		{"fork_session", ForkInput{Snapshot: "x", Session: "y"}, capability.InvalidArgument, "not both"},
		{"fork_session", ForkInput{Snapshot: "x", Count: 17}, capability.InvalidArgument, "1 to 16"},
		{"fork_session", ForkInput{Snapshot: "x", Count: -1}, capability.InvalidArgument, "1 to 16"},
		{"fork_session", ForkInput{Snapshot: "ghost"}, capability.NotFound, `snapshot "ghost" not found`},
		{"fork_session", ForkInput{Snapshot: strings.Repeat("0", 32)}, capability.NotFound, "not found"},
		{"delete_snapshot", SnapshotRef{}, capability.InvalidArgument, "name the snapshot"},
		{"delete_snapshot", SnapshotRef{Snapshot: "ghost"}, capability.NotFound, "not found"},
	} {
		_, err := call(t, a, tc.name, tc.args)
		if ce := wantCode(t, err, tc.code); !strings.Contains(ce.Message, tc.want) {
			t.Errorf("%s %+v: %q does not say %q", tc.name, tc.args, ce.Message, tc.want)
		}
	}
	snapshot(t, a, SnapshotInput{Name: "s"})
	_, err := call(t, a, "fork_session", ForkInput{Snapshot: "s", NamePrefix: "bad/name"})
	if ce := wantCode(t, err, capability.InvalidArgument); !strings.Contains(ce.Message, "copy 1 of 1 failed") {
		t.Errorf("bad prefix: %s", ce.Message)
	}
	if names := sessionNames(t, a); len(names) != 1 {
		t.Errorf("sessions after refusals: %v", names)
	}
	// Code calling back from a session can do none of it.
	def, _ := a.Sessions.Default(context.Background())
	inside := controller.Caller{Path: "insession", Scope: capability.ScopeExec, Session: def.ID}
	for name, args := range map[string]any{"snapshot_session": SnapshotInput{}, "fork_session": ForkInput{Snapshot: "s"},
		"list_snapshots": Empty{}, "delete_snapshot": SnapshotRef{Snapshot: "s"}} {
		_, err := callAs(t, a, inside, name, args)
		wantCode(t, err, capability.PermissionDenied)
	}
}

// checkNothingFromOutside walks a snapshot's workspace on the host: every
// regular file must hold what the session wrote ("inside\n", or a part of
// it: a copy may catch a file between its creation and the write, as a
// snapshot of running code can), and no more than the few entries the
// session made may be there.
func checkNothingFromOutside(t *testing.T, ws string) (entries int) {
	t.Helper()
	filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		if p == ws {
			return nil
		}
		entries++
		rel, _ := filepath.Rel(ws, p)
		if d.Type().IsRegular() {
			const want = "inside\n"
			if b, _ := os.ReadFile(p); len(b) > len(want) || string(b) != want[:len(b)] {
				t.Errorf("%s in the snapshot holds %.40q: read from outside the workspace", rel, b)
			}
		}
		return nil
	})
	if entries > 12 {
		t.Errorf("the snapshot holds %d entries, more than the session made", entries)
	}
	return entries
}

// The swap happens exactly between the copy's stat of an entry and its
// open: a directory becomes a link to /, a file a link to /etc/passwd,
// another file a FIFO. Nothing from outside is copied, the copy does not
// hang on the FIFO, and the swapped entries are reported.
func TestSnapshotSwapBetweenStatAndOpen(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	shIn(t, a, "", "mkdir d && echo inside > d/marker && echo inside > f && echo inside > g")
	def, _ := a.Sessions.Default(context.Background())
	ws := def.Workspace()
	a.copyHook = func(rel string) {
		var err error
		switch rel {
		case "d":
			if err = os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "d.moved")); err == nil {
				err = os.Symlink("/", filepath.Join(ws, "d"))
			}
		case "f":
			if err = os.Remove(filepath.Join(ws, "f")); err == nil {
				err = os.Symlink("/etc/passwd", filepath.Join(ws, "f"))
			}
		case "g":
			if err = os.Remove(filepath.Join(ws, "g")); err == nil {
				err = syscall.Mkfifo(filepath.Join(ws, "g"), 0o644)
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
	s := snapshot(t, a, SnapshotInput{Name: "raced"})
	a.copyHook = nil
	for _, want := range []string{"d (changed while copied)", "f (changed while copied)", "g (changed while copied)"} {
		if !slices.Contains(s.Skipped, want) {
			t.Errorf("skipped %v does not hold %q", s.Skipped, want)
		}
	}
	checkNothingFromOutside(t, filepath.Join(a.DataDir, "snapshots", s.ID, "workspace"))
	// The next snapshot copies the links as links.
	s = snapshot(t, a, SnapshotInput{Name: "after"})
	snapWS := filepath.Join(a.DataDir, "snapshots", s.ID, "workspace")
	checkNothingFromOutside(t, snapWS)
	for name, target := range map[string]string{"d": "/", "f": "/etc/passwd"} {
		if got, err := os.Readlink(filepath.Join(snapWS, name)); err != nil || got != target {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
}

// The attack from the session itself: its code swaps a directory for a
// link to / and a file for a link to /etc/passwd, in a loop, in the
// background, while snapshots are taken. No snapshot holds anything from
// outside the workspace.
func TestSnapshotWhileTheSessionSwapsLinks(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "racer"}); err != nil {
		t.Fatal(err)
	}
	start := `mkdir d && echo inside > d/marker && echo inside > f
( echo inside > started; while :; do
    mv d d.real; ln -s / d; rm d; mv d.real d
    ln -s /etc/passwd f.new && mv -f f.new f; echo inside > f.new && mv -f f.new f
  done ) >/dev/null 2>&1 &
while [ ! -e started ]; do :; done; echo up`
	reply, err := call(t, a, "terminal_exec", TerminalExecInput{Session: "racer", Command: start})
	if err != nil || !strings.Contains(reply.Output.(*terminal.Result).Output, "up") {
		t.Fatalf("the loop did not start: %v %+v", err, reply)
	}
	t.Cleanup(func() { call(t, a, "destroy_session", SessionRef{Session: "racer"}) })
	seen := map[string]int{}
	for i := range 30 {
		s := snapshot(t, a, SnapshotInput{Session: "racer", Name: "r" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
		ws := filepath.Join(a.DataDir, "snapshots", s.ID, "workspace")
		checkNothingFromOutside(t, ws)
		for _, name := range []string{"d", "f"} {
			fi, err := os.Lstat(filepath.Join(ws, name))
			switch {
			case err != nil:
				seen[name+" absent"]++
			case fi.Mode()&fs.ModeSymlink != 0:
				seen[name+" link"]++
			default:
				seen[name+" "+fi.Mode().Type().String()]++
			}
		}
		seen[fmtSkipped(s)]++
		if _, err := call(t, a, "delete_snapshot", SnapshotRef{Snapshot: s.ID}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("what the snapshots caught: %v", seen)
}

func fmtSkipped(s *SnapshotInfo) string {
	if s.SkippedCount == 0 {
		return "nothing skipped"
	}
	return "skipped " + strings.Join(s.Skipped, ",")
}

// BenchmarkSnapshotFork50MB measures snapshot_session and fork_session of
// a session whose workspace holds 50 MB: 2000 files of 10 KiB in 20
// directories and one file of 30 MiB. Each fork makes one session (its
// disk image included) and is destroyed outside the timer. Reported:
// medians in ms of a snapshot, of a fork of one copy, and of a fork of 4
// copies divided by 4.
func BenchmarkSnapshotFork50MB(b *testing.B) {
	a := newApp(b, nil)
	res := runCode(b, a, RunCodeInput{Lang: "sh", TimeoutMS: 300000, Code: `set -e
head -c 20480000 /dev/urandom > small.bin
for d in $(seq 20); do mkdir d$d; for f in $(seq 100); do dd if=small.bin of=d$d/f$f bs=10240 count=1 skip=$(( (d*100+f) % 2000 )) status=none; done; done
rm small.bin
head -c 30M /dev/urandom > big.bin
du -sm . | cut -f1`})
	if res.ExitCode != 0 {
		b.Fatalf("%+v", res)
	}
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2]) / float64(time.Millisecond)
	}
	var snaps, one, four []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		s := snapshot(b, a, SnapshotInput{Name: fmt.Sprintf("b%d", i)})
		snaps = append(snaps, time.Since(t0))
		t0 = time.Now()
		out := fork(b, a, ForkInput{Snapshot: s.ID})
		one = append(one, time.Since(t0))
		t0 = time.Now()
		out4 := fork(b, a, ForkInput{Snapshot: s.ID, Count: 4})
		four = append(four, time.Since(t0)/4)
		b.StopTimer()
		if s.SizeBytes < 50e6 || s.Files != 2001 {
			b.Fatalf("the workspace is not the 50 MB it should be: %+v", s)
		}
		for _, c := range append(out.Copies, out4.Copies...) {
			if _, err := call(b, a, "destroy_session", SessionRef{Session: c.Session}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := call(b, a, "delete_snapshot", SnapshotRef{Snapshot: s.ID}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(median(snaps), "ms-snapshot-p50")
	b.ReportMetric(median(one), "ms-fork1-p50")
	b.ReportMetric(median(four), "ms-per-copy-fork4-p50")
}

// A program the server starts while a snapshot is copied (another
// session's box, a helper: here a sleep, started from the copy's hook
// before each entry's open) holds nothing of the session's disk: Close
// unmounts the disk while the program still runs. When the copy's
// descriptors were inherited, the disk stayed mounted (EBUSY) and the
// data directory could not be removed.
func TestCloseUnmountsADiskCopiedWhileProgramsStarted(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed,
		Limits: Limits{Tenant: TenantLimits{Disk: 16 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			a.Close()
		}
	})
	if err := a.tenants.disks.Enforced(); err != nil {
		t.Skipf("no kernel disk quota here: %v", err)
	}
	shOK(t, a, "", "mkdir -p d/e && echo x > d/e/f && echo y > g")
	def, err := a.Sessions.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !quota.Mounted(def.Dir) {
		t.Fatal("the default session has no disk mounted")
	}
	var started []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range started {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		// What the former code left behind (the disk, and the bind of
		// the sessions' directory Close keeps above a disk still
		// mounted), so that TempDir's removal does not fail too.
		if quota.Mounted(def.Dir) {
			_ = syscall.Unmount(def.Dir, syscall.MNT_DETACH)
			_ = syscall.Unmount(filepath.Dir(def.Dir), syscall.MNT_DETACH)
		}
	})
	a.copyHook = func(string) {
		c := exec.Command("sleep", "600")
		if err := c.Start(); err != nil {
			t.Error(err)
			return
		}
		started = append(started, c)
	}
	snapshot(t, a, SnapshotInput{Name: "s"})
	a.copyHook = nil
	if len(started) == 0 {
		t.Fatal("the copy's hook never ran")
	}
	closed = true
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if quota.Mounted(def.Dir) {
		t.Errorf("after Close, the session's disk is still mounted while %d programs started during the copy run", len(started))
	}
}
