package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// Bad package names never reach apt: each is refused before anything
// else, whatever the session.
func TestInstallPackagesBadInput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, pkgs := range [][]string{
		nil, {}, {"-o", "APT::Get::AllowUnauthenticated=1"}, {"-oAPT::Sandbox::User=root"}, {"foo;rm"}, {"foo bar"},
		{"jq", "--reinstall"}, {"Jq"}, {"j"}, {"jq=-1"}, {"jq=1.6 x"}, {"../jq"}, {"jq\n"}, {"$(id)"},
		{"jq", "a*"}, make([]string, 65), {"jq-"}, {"coreutils-"}, {"sl=5.02-1+"}, {"sl:amd64+"}, {"cowsa?"}, {"a|b"}, {"^jq$"}, {"[jq]"},
	} {
		_, err := call(t, a, "install_packages", InstallPackagesInput{Packages: pkgs})
		if capCode(err) != capability.InvalidArgument {
			t.Errorf("%q: %v, want invalid_argument", pkgs, err)
		}
	}
	for _, ok := range []string{"jq", "python3-numpy", "g++", "libc6:amd64", "jq=1.6-2.1+deb12u2", "tzdata=2024a-0+deb12u1", "libstdc++6=1:12.2.0-14"} {
		if err := rootfs.CheckPackage(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if _, err := call(t, a, "install_packages", InstallPackagesInput{Packages: []string{"jq"}, TimeoutMS: 5000}); capCode(err) != capability.InvalidArgument {
		t.Errorf("timeout 5000: %v", err)
	}
	// A manager that is not apt or pip says which ones there are.
	if _, err := call(t, a, "install_packages", InstallPackagesInput{Manager: "npm", Packages: []string{"left-pad"}}); capCode(err) != capability.InvalidArgument ||
		!strings.Contains(err.Error(), `manager "npm"`) || !strings.Contains(err.Error(), "apt") || !strings.Contains(err.Error(), "pip") {
		t.Errorf("manager npm: %v, want invalid_argument naming npm, apt and pip", err)
	}
	// The host userland is not a rootfs.
	_, err := call(t, a, "install_packages", InstallPackagesInput{Packages: []string{"jq"}})
	if capCode(err) != capability.InvalidArgument || !strings.Contains(err.Error(), "rootfs=NAME") {
		t.Errorf("host session: %v", err)
	}
}

// A session with network none is told what it needs, and apt is never
// started: here the rootfs's lock is held, so a call that went as far as
// apt would wait for it (and say so on its output) instead of answering
// at once.
func TestInstallPackagesNeedsNetwork(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	m := rootfs.New(rootfs.DirIn(a.DataDir))
	if err := os.MkdirAll(m.Path("default"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Path("default"), rootfs.Marker), []byte(`{"name":"default"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	unlock, err := m.Lock(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := a.Sessions.CreateWith(context.Background(), "offline", session.CreateOptions{Rootfs: "default"}); err != nil {
		t.Fatal(err)
	}
	ctx, out := observeOutput(context.Background())
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args, _ := json.Marshal(InstallPackagesInput{Session: "offline", Packages: []string{"jq"}, TimeoutMS: 60000})
	_, err = a.Controller.Call(ctx, admin, "install_packages", args)
	if capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), "network internet") ||
		!strings.Contains(err.Error(), "create_session") || !strings.Contains(err.Error(), "apt was not started") {
		t.Fatalf("network none: %v", err)
	}
	// A refusal after a wait would say it waited (and a wait to the
	// call's end is deadline_exceeded, not the refusal above). Not a
	// bound of 5 s on the call: on a loaded machine the call alone can
	// take longer.
	if strings.Contains(out(), "waiting for another change") {
		t.Errorf("the refusal waited for the rootfs's lock first: %q", out())
	}
}

// observeOutput returns ctx with an observer of the call's output
// (runcode.WithOutput) that keeps all of it, and a function that reads
// what it kept so far.
func observeOutput(ctx context.Context) (context.Context, func() string) {
	var mu sync.Mutex
	var b strings.Builder
	keep := func(_ string, p []byte) {
		mu.Lock()
		b.Write(p)
		mu.Unlock()
	}
	read := func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
	return runcode.WithOutput(ctx, keep), read
}

// copyTestRootfs gives a data directory holding a private copy of the
// shared test rootfs, so that installing packages never changes the cache.
func copyTestRootfs(t *testing.T) string {
	t.Helper()
	testRootfs(t) // skips where there is none, built first if needed
	data := t.TempDir()
	start := time.Now()
	rootfstest.Copy(t, rootfs.DirIn(data))
	t.Logf("rootfs copied in %s", time.Since(start).Round(time.Millisecond))
	return data
}

// The end-to-end test: a real install through install_packages into a
// copy of the test rootfs, used by a new session; concurrent installs
// wait for each other; the shared cache is untouched; a call waits for
// the lock another holds, saying so, within its timeout (waitsForTheLock,
// on the same copy: a copy of its own cost a rootfs copy and an install).
func TestInstallPackagesInRealRootfs(t *testing.T) {
	t.Parallel() // its own copy of the test rootfs; apt takes tens of seconds
	cache := testRootfs(t)
	cacheStatus, err := os.ReadFile(filepath.Join(cache.Path(rootfs.DefaultName), "var/lib/dpkg/status"))
	if err != nil {
		t.Fatal(err)
	}
	data := copyTestRootfs(t)
	// Lists a day old: the first install updates them, the second not.
	rootfstest.SetListsUpdated(t, rootfs.New(rootfs.DirIn(data)), rootfs.DefaultName, time.Now().Add(-rootfs.ListsMaxAge-time.Hour))
	a, err := New(context.Background(), data, &Options{Python: testPython, Network: hostAllowed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	ctx := context.Background()
	if _, err := a.Sessions.CreateWith(ctx, "apt", session.CreateOptions{Rootfs: "default", Network: "host"}); err != nil {
		t.Fatal(err)
	}
	install := func(ctx context.Context, pkgs ...string) *InstallPackagesResult {
		t.Helper()
		b, _ := json.Marshal(InstallPackagesInput{Session: "apt", Packages: pkgs})
		start := time.Now()
		reply, err := a.Controller.Call(ctx, admin, "install_packages", b)
		if err != nil {
			t.Fatalf("install_packages %v: %v", pkgs, err)
		}
		res := reply.Output.(*InstallPackagesResult)
		t.Logf("install_packages %v: %s (updated=%v, waited %.0f ms)", pkgs, time.Since(start).Round(time.Millisecond), res.Updated, res.WaitedMS)
		if res.ExitCode != 0 {
			t.Fatalf("install_packages %v: %s", pkgs, reply.Text)
		}
		return res
	}

	// Progress reaches the observer while apt runs.
	obs, streamed := observeOutput(ctx)
	res := install(obs, "jq")
	if !res.Updated || !strings.Contains(strings.Join(res.Installed, ","), "jq ") || !strings.Contains(res.Output, "Setting up jq") {
		t.Fatalf("%+v", res)
	}
	if !strings.Contains(streamed(), "Unpacking jq") {
		t.Errorf("streamed %q", streamed())
	}
	if text := res.Text(); !strings.HasPrefix(text, "installed into rootfs default: ") || !strings.Contains(text, "--- apt output ---") {
		t.Errorf("text %q", text)
	}
	info, err := rootfs.New(rootfs.DirIn(data)).Info("default")
	if err != nil || len(info.Added) != 1 || info.Added[0] != "jq" || info.ListsUpdated.IsZero() {
		t.Errorf("marker %+v %v", info, err)
	}
	// Installing it again changes nothing, and the fresh lists are not
	// fetched again.
	if res := install(ctx, "jq"); res.Updated || len(res.Installed) != 0 || !strings.HasPrefix(res.Text(), "already installed") {
		t.Errorf("again: %+v", res)
	}

	// A new session on the rootfs, with no network, has it.
	if _, err := a.Sessions.CreateWith(ctx, "later", session.CreateOptions{Rootfs: "default"}); err != nil {
		t.Fatal(err)
	}
	reply, err := call(t, a, "python_run", PythonRunInput{Session: "later",
		Code: "import subprocess\nprint(subprocess.run(['jq', '-c', '.a'], input='{\"a\":[1,2]}', capture_output=True, text=True).stdout)"})
	if err != nil {
		t.Fatal(err)
	}
	if pr := reply.Output.(*PythonRunResult); pr.ExitCode != 0 || strings.TrimSpace(pr.Stdout) != "[1,2]" {
		t.Fatalf("jq in a new session: %+v", pr)
	}
	// Its own code cannot change the rootfs: read-only, and not root.
	reply, err = call(t, a, "python_run", PythonRunInput{Session: "later",
		Code: "import os\ntry:\n    open('/usr/bin/jq', 'a')\nexcept OSError as e:\n    print('refused', e.errno)\nprint(os.getuid())"})
	if err != nil {
		t.Fatal(err)
	}
	if pr := reply.Output.(*PythonRunResult); !strings.HasPrefix(pr.Stdout, "refused") || strings.HasSuffix(strings.TrimSpace(pr.Stdout), "\n0") {
		t.Errorf("a session wrote the rootfs: %+v", pr)
	}

	// The install box: root of the rootfs, and of nothing else it shows.
	var box strings.Builder
	cur, _ := os.ReadFile("/proc/sys/vm/swappiness")
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Minute) // a bound on a failure, for a loaded machine
	defer bcancel()
	exit, err := a.Sandbox.Run(bctx, &sandbox.Spec{
		Args: []string{"sh", "-c", `id -u; touch /usr/share/quro-probe && echo usr-writable
echo ` + strings.TrimSpace(string(cur)) + ` > /proc/sys/vm/swappiness && echo SYSCTL-WRITTEN
ls /root /home 2>&1 | head -2; ls ` + data + ` 2>&1 | head -1; grep -c . /proc/self/status >/dev/null && echo done`},
		Dir: t.TempDir(), Network: "none", Rootfs: rootfs.New(rootfs.DirIn(data)).Path("default"), RootfsAdmin: true,
		Stdout: &box, Stderr: &box,
	})
	if err != nil || exit.Code != 0 {
		t.Fatalf("install box: %v %+v %s", err, exit, box.String())
	}
	if out := box.String(); !strings.Contains(out, "0\nusr-writable\n") || strings.Contains(out, "SYSCTL-WRITTEN") ||
		strings.Contains(out, "quro.db") || !strings.HasSuffix(out, "done\n") {
		t.Errorf("install box saw:\n%s", out)
	}

	// Concurrent installs into one rootfs wait for each other (two apts at
	// once would fail on dpkg's lock); both succeed.
	var wg sync.WaitGroup
	results := make([]*InstallPackagesResult, 2)
	for i, p := range []string{"sl", "tree"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = install(ctx, p)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if results[0].WaitedMS < 100 && results[1].WaitedMS < 100 {
		t.Errorf("neither install waited: %.0f ms, %.0f ms", results[0].WaitedMS, results[1].WaitedMS)
	}

	// The shared cache is as it was.
	if now, err := os.ReadFile(filepath.Join(cache.Path(rootfs.DefaultName), "var/lib/dpkg/status")); err != nil || string(now) != string(cacheStatus) || strings.Contains(string(now), "Package: jq\n") {
		t.Errorf("the shared test rootfs changed")
	}

	waitsForTheLock(t, a, rootfs.New(rootfs.DirIn(data)))
}

// waitsForTheLock: a call waits for the rootfs lock held by someone
// else (here the test, through m), and goes on once it is released; a
// call whose timeout passes while it waits is deadline_exceeded. Part of
// TestInstallPackagesInRealRootfs, on its copy of the test rootfs, where
// sl is installed: the call after the wait runs apt without a download.
func waitsForTheLock(t *testing.T, a *App, m *rootfs.Manager) {
	t.Helper()
	unlock, err := m.Lock(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	// A guard, not a measurement: apt-get update fetches the lists from
	// the mirror, which took 14 s of a minute on a loaded CI machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The call says on its output when it finds the lock held and begins
	// to wait: the lock is let go only then. (A fixed second here let a
	// call that reached the lock after the second pass without waiting:
	// the test then proved nothing.)
	waiting := make(chan struct{})
	var once sync.Once
	ctx = runcode.WithOutput(ctx, func(_ string, p []byte) {
		if bytes.Contains(p, []byte("# waiting for another change of rootfs")) {
			once.Do(func() { close(waiting) })
		}
	})
	done := make(chan error, 1)
	var res *InstallPackagesResult
	go func() {
		var err error
		res, err = a.installPackages(ctx, "default", []string{"sl"}, 5*time.Minute, nil)
		done <- err
	}()
	select {
	case err := <-done:
		unlock()
		t.Fatalf("returned while the lock was held: %v", err)
	case <-waiting:
	case <-time.After(2 * time.Minute): // a guard: the line comes as soon as the call reaches the lock
		unlock()
		t.Fatal("the call did not say it waits for the lock")
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The call says it waited. How long is not the test's to know.
	if res.WaitedMS <= 0 || res.ExitCode != 0 || !strings.HasPrefix(res.Output, `# waiting for another change of rootfs "default" to finish`) {
		t.Errorf("%+v", res)
	}
	// A timeout while waiting is a clear deadline_exceeded.
	unlock, err = m.Lock(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = a.installPackages(ctx, "default", []string{"sl"}, 300*time.Millisecond, nil)
	if capCode(err) != capability.DeadlineExceeded || !strings.Contains(err.Error(), "another install") {
		t.Errorf("timeout while waiting: %v", err)
	}
}

// The attack of the security report, on a real rootfs with real apt: a
// name apt would read as a pattern (cowsa. matched a hundred packages), a
// remove/install marker, an architecture or version the lists do not
// have, and a package whose install would remove one other sessions use
// are all refused before apt changes anything; an exec token may not
// install at all. The lists, older than rootfs.ListsFreshFor, are updated
// for the first unknown name and not again for the others (a model that
// misspells names fetches the mirror's lists once, not once a call), each
// refusal saying they are fresh. Then a package left unpacked
// (half-installed) makes installs refused until repair_rootfs (admin only)
// settles it.
func TestInstallPackagesLiteralNamesNoRemovalAndRepair(t *testing.T) {
	t.Parallel() // its own copy of the test rootfs
	data := copyTestRootfs(t)
	// Past the window, within the day: no install updates them first, and
	// an unknown name does, whenever the shared rootfs was built.
	rootfstest.SetListsUpdated(t, rootfs.New(rootfs.DirIn(data)), rootfs.DefaultName, time.Now().Add(-rootfs.ListsFreshFor-time.Minute))
	a, err := New(context.Background(), data, &Options{Python: testPython, Network: hostAllowed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.Sandbox.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	// apt's output, where each command it runs is a "$ apt-get …" line.
	ctx, aptOut := observeOutput(context.Background())
	updates := func() int {
		n := 0
		for line := range strings.Lines(aptOut()) {
			if strings.HasPrefix(line, "$ apt-get ") && strings.HasSuffix(line, " update\n") {
				n++
			}
		}
		return n
	}
	token := func(scopes ...string) controller.Caller {
		t.Helper()
		c, _ := callerOfToken(t, a, "acme", scopes...)
		return c
	}
	execTok, installTok := token("read", "exec"), token("read", "exec", "install")
	if _, err := a.Controller.Call(ctx, execTok, "create_session", json.RawMessage(`{"name":"apt","rootfs":"default","network":"host"}`)); err != nil {
		t.Fatal(err)
	}
	root := rootfs.New(rootfs.DirIn(data)).Path("default")
	status := func() string {
		b, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/status"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	orig := status()
	install := func(c controller.Caller, pkgs ...string) (*InstallPackagesResult, error) {
		b, _ := json.Marshal(InstallPackagesInput{Session: "apt", Packages: pkgs})
		reply, err := a.Controller.Call(ctx, c, "install_packages", b)
		if err != nil {
			return nil, err
		}
		return reply.Output.(*InstallPackagesResult), nil
	}

	// exec does not cover install.
	if _, err := install(execTok, "sl"); capCode(err) != capability.PermissionDenied || !strings.Contains(err.Error(), `needs scope "install"`) {
		t.Fatalf("exec token: %v", err)
	}
	for _, tc := range []struct {
		pkg, want string
		unknown   bool // to the lists, not refused by its form
	}{
		{"cowsa.", "did you mean cowsay", true},
		{"python3.1.", "not a package", true},
		{"jq-", "remove this package", false},
		{"sl:i386", "not offered for architecture i386", true},
		{"sl=0.0-1", "no version 0.0-1", true},
		{"cowsay+", "not a package", true},
		{"sl=5.02-1+", "ends in '+'", false},
	} {
		_, err := install(installTok, tc.pkg)
		if capCode(err) != capability.InvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing was installed") {
			t.Errorf("%q: %v, want invalid_argument with %q", tc.pkg, err, tc.want)
		}
		if tc.unknown && !strings.Contains(err.Error(), "the apt lists are fresh (updated ") {
			t.Errorf("%q: %v, want it to say the lists are fresh", tc.pkg, err)
		}
	}
	if status() != orig {
		t.Fatal("a refused name changed dpkg's status")
	}
	if n := updates(); n != 1 {
		t.Errorf("five unknown names in five calls ran apt-get update %d times, want once (the first: the lists were past rootfs.ListsFreshFor)", n)
	}
	// How long reading the lists takes (each install does it once).
	listStart := time.Now()
	av, files, err := rootfs.AptLists(root)
	if err != nil || files == 0 || !av.Has("cowsay") {
		t.Fatalf("lists: %d files, %v", files, err)
	}
	t.Logf("apt lists: %d files, %d names, read in %s", files, len(av), time.Since(listStart).Round(time.Millisecond))
	// libelogind0 conflicts with libsystemd0, which apt itself needs:
	// apt's plan would remove it, so nothing runs.
	if _, err := install(installTok, "libelogind0"); capCode(err) != capability.InvalidArgument ||
		!strings.Contains(err.Error(), "would remove") || !strings.Contains(err.Error(), "libsystemd0") {
		t.Errorf("a removing install: %v", err)
	}
	if status() != orig {
		t.Fatal("a refused removal changed dpkg's status")
	}

	// An exact name holding a '.' (a regex character to apt) is taken
	// literally: python3.11 is installed, so nothing changes.
	if res, err := install(installTok, "python3.11"); err != nil || res.ExitCode != 0 || len(res.Installed)+len(res.Upgraded) != 0 {
		t.Fatalf("python3.11: %+v %v", res, err)
	}
	if status() != orig {
		t.Fatal("installing an installed package changed dpkg's status")
	}
	// A real install with the install scope works (with the native
	// architecture named: apt takes it as it is).
	sl := "sl"
	if runtime.GOARCH == "amd64" {
		sl = "sl:amd64"
	}
	res, err := install(installTok, sl)
	if err != nil || res.ExitCode != 0 || len(res.Unsettled) != 0 || !strings.Contains(strings.Join(res.Installed, ","), "sl ") {
		t.Fatalf("sl: %+v %v", res, err)
	}
	// Break it the way an interrupted install does: sl unpacked, not
	// configured.
	var box strings.Builder
	exit, err := a.Sandbox.Run(ctx, &sandbox.Spec{
		Args: []string{"sh", "-c", "dpkg -r sl && dpkg --unpack /var/cache/apt/archives/sl_*.deb"},
		Dir:  t.TempDir(), Network: "none", Rootfs: root, RootfsAdmin: true, Stdout: &box, Stderr: &box,
	})
	if err != nil || exit.Code != 0 {
		t.Fatalf("breaking sl: %v %+v %s", err, exit, box.String())
	}
	if bad, err := rootfs.Unsettled(root); err != nil || len(bad) != 1 || bad[0] != "sl (unpacked)" {
		t.Fatalf("unsettled: %q %v", bad, err)
	}
	broken := status()
	if _, err := install(installTok, "tree"); capCode(err) != capability.Unavailable || !strings.Contains(err.Error(), "sl (unpacked)") ||
		!strings.Contains(err.Error(), "quro rootfs repair default") {
		t.Errorf("install on a half-installed rootfs: %v", err)
	}
	if status() != broken {
		t.Fatal("the refused install changed dpkg's status")
	}
	// Repair is admin's.
	if _, err := a.Controller.Call(ctx, installTok, "repair_rootfs", json.RawMessage(`{"rootfs":"default"}`)); capCode(err) != capability.PermissionDenied {
		t.Errorf("repair with install scope: %v", err)
	}
	reply, err := a.Controller.Call(ctx, admin, "repair_rootfs", json.RawMessage(`{"rootfs":"default"}`))
	if err != nil {
		t.Fatal(err)
	}
	rr := reply.Output.(*RepairRootfsResult)
	if rr.ExitCode != 0 || len(rr.Before) != 1 || len(rr.After) != 0 || !strings.Contains(reply.Text, "repaired: sl (unpacked) now installed") {
		t.Fatalf("repair: %+v\n%s", rr, reply.Text)
	}
	if _, ok := rootfs.Installed(root)["sl"]; !ok {
		t.Error("sl is not installed after the repair")
	}
	if res, err := install(installTok, "tree"); err != nil || res.ExitCode != 0 {
		t.Errorf("install after the repair: %+v %v", res, err)
	}
}
