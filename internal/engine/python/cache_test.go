//go:build !slim

package python

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/runcode"
)

// TestSharedRootServesEveryDataDirectory: the interpreter prepared in the
// machine's cache (SharedRoot) by one data directory's engine is used as
// it is by another's, with no extraction, and runs there; a cache that
// others could have written (a file made writable, a file added by
// another user, in the tree, pip's directory or the worker module's) is
// refused and prepared again, each one back as the server wrote it.
func TestSharedRootServesEveryDataDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := SharedRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	installed := func(data string) (string, bool) {
		t.Helper()
		e := NewEmbedded(data, testSB, &EmbeddedOptions{InstallRoot: root, NoSpare: true})
		defer e.Close()
		dir, extracted, err := e.Installed(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return dir, extracted
	}
	tree, extracted := installed(t.TempDir())
	if !extracted || !strings.HasPrefix(tree, root+"/") {
		t.Fatalf("the first data directory: %s extracted=%v; want it extracted under %s", tree, extracted, root)
	}

	// A second data directory: nothing extracted, nothing in it, and a
	// run works. (The box paths a session box shows the tree at, which
	// keep host paths out of results, are internal/app's.)
	data2 := t.TempDir()
	e2 := NewEmbedded(data2, testSB, &EmbeddedOptions{InstallRoot: root, NoSpare: true})
	defer e2.Close()
	if dir, extracted, err := e2.Installed(ctx); err != nil || extracted || dir != tree {
		t.Fatalf("the second data directory: %s extracted=%v %v; want %s reused", dir, extracted, err, tree)
	}
	// Another build's upkeep (keeping none of these) removes nothing an
	// engine uses: it holds their locks.
	if removed, err := removeOldTrees(root, nil); err != nil || len(removed) > 0 {
		t.Errorf("another build's upkeep removed %v (%v) while an engine used them", removed, err)
	}
	if m, _ := filepath.Glob(filepath.Join(data2, "python", "3.*")); len(m) > 0 {
		t.Errorf("the second data directory got a tree of its own: %v", m)
	}
	r := run(t, e2, newSession(t), "import json; print(json.dumps([6*7]))")
	if r.ExitCode != 0 || r.out != "[42]\n" {
		t.Fatalf("a run on the shared tree: exit %d %q %q", r.ExitCode, r.out, r.err)
	}

	// Tampering, each noticed by the check alone; then one preparation
	// redoes all of them.
	m := mustManifest(t)
	mod := filepath.Join(tree, "lib", "python3.14", "json", "decoder.py")
	fi, err := os.Stat(mod)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(mod, fi.Mode()|0o002); err != nil {
		t.Fatal(err)
	}
	if err := intact(tree, m); err == nil || !strings.Contains(err.Error(), "decoder.py is writable by others") {
		t.Errorf("a world-writable module: intact says %v", err)
	}
	if err := os.Chmod(mod, fi.Mode()); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(tree, "lib", "python3.14", "site-packages", "zz-evil.pth")
	if err := os.WriteFile(evil, []byte("import os\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(evil, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := intact(tree, m); err == nil || !strings.Contains(err.Error(), "zz-evil.pth belongs to uid 65534") {
		t.Errorf("a file of another user: intact says %v", err)
	}
	if err := os.Chmod(mod, fi.Mode()|0o002); err != nil {
		t.Fatal(err)
	}
	pipInit := filepath.Join(PipDir(root), "pip", "__init__.py")
	if err := os.Chmod(pipInit, 0o666); err != nil {
		t.Fatal(err)
	}
	workerPy := filepath.Join(workerDir(root), workerModule+".py")
	if err := os.Chown(workerPy, 65534, 65534); err != nil {
		t.Fatal(err)
	}

	if dir, extracted := installed(t.TempDir()); !extracted || dir != tree {
		t.Fatalf("a tampered cache: %s extracted=%v; want %s extracted again", dir, extracted, tree)
	}
	if err := trustedTree(root); err != nil {
		t.Errorf("after the preparation: %v", err)
	}
	if _, err := os.Lstat(evil); !os.IsNotExist(err) {
		t.Errorf("the added file is still there: %v", err)
	}
	if err := intact(tree, m); err != nil {
		t.Errorf("the tree prepared again: %v", err)
	}
	if _, extracted := installed(t.TempDir()); extracted {
		t.Errorf("the repaired cache was extracted again")
	}
}

// TestSharedRootRefusesWhatOthersCanWrite: a cache directory another user
// owns or could write, or one under such a directory (unless sticky, as
// /tmp), is not used; "off" and no directory mean the data directory.
func TestSharedRootRefusesWhatOthersCanWrite(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode, uid int) string {
		t.Helper()
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, -1); err != nil {
			t.Fatal(err)
		}
		return d
	}
	mkg := func(name string, mode os.FileMode, uid, gid int) string {
		t.Helper()
		d := mk(name, mode, uid)
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
		return d
	}
	me := os.Geteuid()
	for _, c := range []struct {
		dir, want string
	}{
		{mk("world", 0o777, me), "world is writable by others"},
		{mk("group", 0o775, me) + "/q", ""}, // root's group (the test's)
		{mkg("staff", 0o775, me, 50) + "/q", "staff is writable by others"},
		{mk("other", 0o755, 65534), "other belongs to uid 65534"},
		{filepath.Join(mk("open", 0o777, me), "quro"), "open is writable by others (-rwxrwxrwx) and not sticky"},
		{filepath.Join(mk("sticky", 0o777|os.ModeSticky, me), "quro"), ""},
		{filepath.Join(mk("nobodys", 0o755, 65534), "quro"), "nobodys belongs to uid 65534"},
		{CacheOff, "is off"},
		{"", "no cache directory"},
	} {
		got, err := SharedRoot(c.dir)
		switch {
		case c.want == "" && (err != nil || got != c.dir):
			t.Errorf("%s: %q %v; want it used", c.dir, got, err)
		case c.want != "" && (err == nil || got != "" || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %q %v; want refused: %s", c.dir, got, err, c.want)
		}
	}
	// A root server run with another user's HOME (whose home and cache
	// directory are that user's) makes nothing there.
	if m, _ := filepath.Glob(filepath.Join(base, "nobodys", "*")); len(m) > 0 {
		t.Errorf("made in another user's directory: %v", m)
	}
	// The sticky directory's mode as os.Chmod sets it (ModeSticky).
	if fi, err := os.Stat(filepath.Join(base, "sticky")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("sticky: %v %v", fi, err)
	}
}

// BenchmarkStartChecks is what a start on a prepared install root spends
// checking the interpreter's tree: intact (the walk of trustedTree
// included) and the walk alone, as tree-ms and walk-ms:
//
//	go test -run '^$' -bench StartChecks -benchtime 50x ./internal/engine/python/
func BenchmarkStartChecks(b *testing.B) {
	inst, err := ensureInstalled(context.Background(), testData, nil)
	if err != nil {
		b.Fatal(err)
	}
	m, err := readManifest()
	if err != nil {
		b.Fatal(err)
	}
	var trees, walks []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := intact(inst.Dir, m); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := trustedTree(inst.Dir); err != nil {
			b.Fatal(err)
		}
		trees, walks = append(trees, t1.Sub(t0)), append(walks, time.Since(t1))
	}
	slices.Sort(trees)
	slices.Sort(walks)
	b.ReportMetric(float64(trees[len(trees)/2].Microseconds())/1e3, "tree-ms")
	b.ReportMetric(float64(walks[len(walks)/2].Microseconds())/1e3, "walk-ms")
}

// TestNonRootServerSharesNoCache: a server that is not root has no
// default cache (its sessions may run as its uid under minimal isolation,
// and could write a cache the owner checks would then trust), and one it
// is given under a sticky world-writable directory (/tmp) is refused:
// its sessions could write there.
func TestNonRootServerSharesNoCache(t *testing.T) {
	if os.Getenv("QURO_TEST_NONROOT_CACHE") != "" {
		dir := os.Getenv("QURO_TEST_NONROOT_CACHE")
		_, err := SharedRoot(filepath.Join(dir, "cache"))
		fmt.Printf("default=%q shared=%v\n", DefaultCacheRoot(), err)
		// A tree its own primary group may write: members of that group
		// (other users) could swap it after the check.
		tree := filepath.Join(dir, "grouptree")
		if err := os.Mkdir(tree, 0o755); err != nil {
			fmt.Println(err)
		}
		if err := os.Chmod(tree, 0o775); err != nil {
			fmt.Println(err)
		}
		fmt.Printf("group=%v\n", trustedTree(tree))
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("runs itself as another user: needs root")
	}
	// Not t.TempDir: its parent is 0700, which uid 65534 cannot pass.
	sticky, err := os.MkdirTemp("", "quro-nonroot-cache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sticky) })
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	// The test binary, where uid 65534 can run it.
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(sticky, "python.test")
	if err := os.WriteFile(self, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run", "^TestNonRootServerSharesNoCache$")
	cmd.Dir = sticky
	cmd.Env = []string{"HOME=" + sticky, "QURO_TEST_NONROOT_CACHE=" + sticky}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid 65534: %v %s", err, out)
	}
	if !strings.Contains(string(out), `default="" shared=`) || !strings.Contains(string(out), "a server that is not root keeps its cache out of shared directories") ||
		!strings.Contains(string(out), "grouptree is writable by others (-rwxrwxr-x)") {
		t.Errorf("as uid 65534: %s", out)
	}
}

// TestPreparationErrorNamesNoHostPath: a preparation that fails in the
// install root (here its python/ is a file) answers a run, and the next
// preparation, with an error a tenant reads (hostpath.Tenant: run_code's
// results, the controller's classification) without the root's host
// path; the error itself, the operator's status line and log have it whole.
func TestPreparationErrorNamesNoHostPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "python"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var status []string
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log")) // the server's log: written from the preparation's goroutine
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	e := NewEmbedded(t.TempDir(), testSB, &EmbeddedOptions{InstallRoot: root, NoSpare: true, Logger: slog.New(slog.NewTextHandler(logFile, nil)), Status: func(s string) {
		mu.Lock()
		defer mu.Unlock()
		status = append(status, s)
	}})
	defer e.Close()
	_, err = e.Run(ctx, &runcode.Request{Code: "print(1)", Lang: "python", Session: newSession(t), Timeout: time.Minute})
	if err == nil || strings.Contains(hostpath.Tenant(err), root) || !strings.Contains(hostpath.Tenant(err), "not a directory") || !strings.Contains(err.Error(), root) {
		t.Fatalf("the run's error: %v (a tenant reads %q)", err, hostpath.Tenant(err))
	}
	if _, _, err := e.Installed(ctx); err == nil || strings.Contains(hostpath.Tenant(err), root) || !strings.Contains(err.Error(), root) {
		t.Errorf("the next preparation's error: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(status, func(s string) bool { return strings.Contains(s, root) && strings.Contains(s, "failed") }) {
		t.Errorf("the status lines do not name the failure whole: %q", status)
	}
	if l, _ := os.ReadFile(logFile.Name()); !strings.Contains(string(l), root) || !strings.Contains(string(l), "preparing the embedded Python failed") {
		t.Errorf("the server's log does not have the failure whole: %q", l)
	}
}

// TestEarlyBoxShowsOnlyAWalkedTree: a box made before the server's
// preparation has ended shows a tree an earlier preparation completed
// only when the walk finds nobody else could have written it: a tree
// with its completion marker but a file another user owns is not shown.
func TestEarlyBoxShowsOnlyAWalkedTree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := SharedRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	first := NewEmbedded(t.TempDir(), testSB, &EmbeddedOptions{InstallRoot: root, NoSpare: true})
	tree, _, err := first.Installed(ctx)
	first.Close()
	if err != nil {
		t.Fatal(err)
	}
	// No preparation has started in these engines: BoxDirs starts it and
	// gives what an earlier one completed once it has walked that.
	fresh := func() []string {
		e := NewEmbedded(t.TempDir(), testSB, &EmbeddedOptions{InstallRoot: root, NoSpare: true})
		defer e.Close()
		return e.BoxDirs()
	}
	if dirs := fresh(); !slices.Contains(dirs, tree) || !slices.Contains(dirs, PipDir(root)) {
		t.Fatalf("a trusted tree is not shown early: %v", dirs)
	}
	evil := filepath.Join(tree, "lib", "python3.14", "site-packages", "zz-evil.pth")
	if err := os.WriteFile(evil, []byte("import os\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(evil, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	pipInit := filepath.Join(PipDir(root), "pip", "__init__.py")
	if err := os.Chmod(pipInit, 0o666); err != nil {
		t.Fatal(err)
	}
	if dirs := fresh(); slices.Contains(dirs, tree) || slices.Contains(dirs, PipDir(root)) {
		t.Errorf("a tree and a pip directory others wrote are shown early: %v", dirs)
	}
}
