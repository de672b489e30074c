package workspace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestInfo(t *testing.T) {
	w, ws, outside := setup(t, Options{Names: func(uid, gid uint32) (string, string) { return "u", "g" }})
	write(t, filepath.Join(ws, "d/f.txt"), "hello")
	if err := os.Chmod(filepath.Join(ws, "d/f.txt"), 0o640); err != nil {
		t.Fatal(err)
	}
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(ws, "out"))
	e, err := w.Info("d/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "f.txt" || e.Path != "d/f.txt" || e.Type != "file" || e.Size != 5 || e.Permissions != "-rw-r-----" || e.Owner != "u" || e.Group != "g" || e.ModTime.IsZero() {
		t.Fatalf("file: %+v", e)
	}
	if e, err = w.Info("d"); err != nil || e.Type != "dir" || e.Permissions[0] != 'd' || e.Size <= 0 { // a directory's size is stat's
		t.Fatalf("dir: %+v %v", e, err)
	}
	// A link out is described as a link, never followed.
	if e, err = w.Info("out"); err != nil || e.Type != "symlink" || e.Target != filepath.Join(outside, "secret") || e.Size != 0 || e.Permissions[0] != 'l' {
		t.Fatalf("link: %+v %v", e, err)
	}
	_, err = w.Info("out/x")
	wantErr(t, err, ErrOutside, "out")
	_, err = w.Info("nope")
	wantErr(t, err, ErrNotFound, "nope")
}

func TestMakeDir(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	e, existed, err := w.MakeDir("a/b/c")
	if err != nil || existed || e.Type != "dir" || e.Path != "a/b/c" {
		t.Fatalf("%+v %v %v", e, existed, err)
	}
	if _, existed, err = w.MakeDir("a/b"); err != nil || !existed {
		t.Fatalf("again: %v %v", existed, err)
	}
	write(t, filepath.Join(ws, "file"), "x")
	_, _, err = w.MakeDir("file")
	wantErr(t, err, ErrNotDir, "file")
	// A link to a directory outside: neither "existed" nor made there.
	symlink(t, outside, filepath.Join(ws, "out"))
	_, _, err = w.MakeDir("out/new")
	wantErr(t, err, ErrOutside, "out")
	_, _, err = w.MakeDir("out")
	wantErr(t, err, ErrOutside, "out")
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a directory appeared outside: %v", err)
	}
}

func TestMove(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	write(t, filepath.Join(ws, "a.txt"), "A")
	e, err := w.Move("a.txt", "sub/dir/b.txt")
	if err != nil || e.Path != "sub/dir/b.txt" || e.Size != 1 {
		t.Fatalf("%+v %v", e, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "sub/dir/b.txt")); string(b) != "A" {
		t.Fatalf("moved content %q", b)
	}
	// Out through a link to a directory outside, either way: refused.
	symlink(t, outside, filepath.Join(ws, "out"))
	_, err = w.Move("sub/dir/b.txt", "out/stolen")
	wantErr(t, err, ErrOutside, "out")
	_, err = w.Move("out/secret", "mine")
	wantErr(t, err, ErrOutside, "out")
	_, err = w.Move("../outside/secret", "mine")
	wantErr(t, err, ErrOutside, "..")
	// A link is moved itself, not what it points to.
	if _, err = w.Move("out", "moved-link"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(ws, "moved-link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("moved link: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Fatalf("the outside secret changed: %q", b)
	}
	_, err = w.Move("sub", "sub/inner")
	wantErr(t, err, ErrInvalid, "into itself")
	_, err = w.Move("nope", "x")
	wantErr(t, err, ErrNotFound, "nope")
}

// A session swaps a directory for a link out while the server moves and
// removes through it: nothing outside changes.
func TestSymlinkSwapRaceMoveAndRemove(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	os.Mkdir(filepath.Join(ws, "real"), 0o755)
	stop := flip(t, filepath.Join(ws, "dirlink"), filepath.Join(ws, "real"), outside)
	defer stop()
	for range 500 {
		write(t, filepath.Join(ws, "src"), "pwned")
		w.Move("src", "dirlink/secret")
		w.Move("dirlink/secret", "got")
		w.Remove("dirlink/secret")
		w.MakeDir("dirlink/made")
	}
	stop()
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Fatalf("the outside secret changed: %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "got")); err == nil && string(b) == "SECRET" {
		t.Fatal("the outside secret was moved in")
	}
}

func TestRemoveALinkNotItsTarget(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	symlink(t, outside, filepath.Join(ws, "out"))
	if _, err := w.Remove("out"); err != nil {
		t.Fatal(err)
	}
	_, err := w.Remove("../outside")
	wantErr(t, err, ErrOutside, "..")
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Fatalf("the outside secret is gone: %q", b)
	}
}

// watch runs a Watch in the background and hands its events over a
// channel; it returns once the watches are in place.
func watch(t *testing.T, w *FS, p string, o WatchOptions) (events chan Event, done chan error, cancel func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events, done = make(chan Event, 1000), make(chan error, 1)
	ready := make(chan struct{})
	o.Ready = func() { close(ready) }
	go func() {
		done <- w.Watch(ctx, p, o, func(e Event) { events <- e })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("watch %q: %v", p, err)
	}
	t.Cleanup(cancel)
	return events, done, cancel
}

// next is the next event that matches name and type.
func next(t *testing.T, events chan Event, name, typ string) Event {
	t.Helper()
	for e := range events {
		if strings.HasPrefix(e.Name, "watch ended") {
			t.Fatal(e.Name)
		}
		if e.Name == name && e.Type == typ {
			return e
		}
	}
	t.Fatal("the watch ended")
	return Event{}
}

func TestWatch(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	os.Mkdir(filepath.Join(ws, "d"), 0o755)
	events, done, cancel := watch(t, w, "d", WatchOptions{Recursive: true, IncludeEntry: true})
	write(t, filepath.Join(ws, "d/a.txt"), "hi")
	if e := next(t, events, "a.txt", EventCreate); e.Entry == nil || e.Entry.Path != "d/a.txt" {
		t.Fatalf("create: %+v", e)
	}
	next(t, events, "a.txt", EventWrite)
	os.Chmod(filepath.Join(ws, "d/a.txt"), 0o600)
	next(t, events, "a.txt", EventChmod)
	// A new subdirectory is watched too (recursive).
	os.Mkdir(filepath.Join(ws, "d/sub"), 0o755)
	next(t, events, "sub", EventCreate)
	write(t, filepath.Join(ws, "d/sub/deep.txt"), "x")
	next(t, events, "sub/deep.txt", EventCreate)
	os.Rename(filepath.Join(ws, "d/a.txt"), filepath.Join(ws, "d/b.txt"))
	next(t, events, "a.txt", EventRename)
	next(t, events, "b.txt", EventCreate)
	os.Remove(filepath.Join(ws, "d/b.txt"))
	next(t, events, "b.txt", EventRemove)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The watched directory goes (as when the session is destroyed): the
// watch ends by itself.
func TestWatchEndsWithTheDirectory(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	os.MkdirAll(filepath.Join(ws, "d/e"), 0o755)
	_, done, _ := watch(t, w, "d", WatchOptions{Recursive: true})
	if err := os.RemoveAll(filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrWatchEnded) {
		t.Fatalf("watch ended with %v", err)
	}
}

// Links out are neither watched at the start nor followed when they
// appear: changes outside are never reported.
func TestWatchNeverLeadsOut(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	symlink(t, outside, filepath.Join(ws, "out"))
	ctx := context.Background()
	err := w.Watch(ctx, "out", WatchOptions{}, func(Event) {})
	wantErr(t, err, ErrOutside, "out")
	err = w.Watch(ctx, "../outside", WatchOptions{}, func(Event) {})
	wantErr(t, err, ErrOutside, "..")

	events, _, cancel := watch(t, w, ".", WatchOptions{Recursive: true})
	defer cancel()
	symlink(t, outside, filepath.Join(ws, "later"))
	next(t, events, "later", EventCreate)
	write(t, filepath.Join(outside, "changed"), "x")
	// A marker written after the outside change: every event before it
	// has been read by then, and none may be about the outside.
	write(t, filepath.Join(ws, "marker"), "m")
	for e := range events {
		if strings.Contains(e.Name, "changed") || strings.HasPrefix(e.Name, "out/") || strings.HasPrefix(e.Name, "later/") {
			t.Fatalf("an outside change was reported: %+v", e)
		}
		if e.Name == "marker" {
			break
		}
	}
}

// A directory is swapped for a link out between its creation and the
// moment a recursive watch adds it (the watch is held in its callback
// meanwhile, so the swap always wins): the watch never reaches outside.
func TestWatchSwapRace(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, hold := make(chan Event, 1000), make(chan struct{})
	ready := make(chan struct{})
	held := false
	go func() {
		err := w.Watch(ctx, ".", WatchOptions{Recursive: true, Ready: func() { close(ready) }}, func(e Event) {
			if !held {
				held = true
				<-hold
			}
			events <- e
		})
		if ctx.Err() == nil {
			events <- Event{Name: "watch ended: " + fmt.Sprint(err)}
		}
		close(events)
	}()
	<-ready
	write(t, filepath.Join(ws, "first"), "1") // the watch now waits in its callback
	d := filepath.Join(ws, "swap")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(d)
	symlink(t, outside, d)
	os.Mkdir(filepath.Join(ws, "real"), 0o755)
	os.Remove(filepath.Join(ws, "real"))
	symlink(t, "../outside", filepath.Join(ws, "real"))
	close(hold)
	next(t, events, "swap", EventCreate)
	write(t, filepath.Join(outside, "changed"), "x")
	write(t, filepath.Join(ws, "marker"), "m")
	for e := range events {
		if strings.Contains(e.Name, "changed") || strings.HasPrefix(e.Name, "watch ended") {
			t.Fatalf("an outside change was reported, or the watch ended: %+v", e)
		}
		if e.Name == "marker" {
			break
		}
	}
}

// Each type of file has one name (Entry.Type, messages) and one letter
// (Entry.Permissions, as ls -l writes it), from one table.
func TestInfoTypes(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	write(t, filepath.Join(ws, "f"), "x")
	if err := os.Mkdir(filepath.Join(ws, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, "f", filepath.Join(ws, "l"))
	if err := syscall.Mkfifo(filepath.Join(ws, "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(ws, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ path, typ, perm string }{
		{"f", "file", "-rw-r--r--"},
		{"d", "dir", "drwxr-xr-x"},
		{"l", "symlink", "lrwxrwxrwx"},
		{"p", "other", "prw-r--r--"},
		{"s", "other", "s"},
	} {
		e, err := w.Info(tc.path)
		if err != nil || e.Type != tc.typ || !strings.HasPrefix(e.Permissions, tc.perm) {
			t.Errorf("%s: %+v %v; want %s %s", tc.path, e, err, tc.typ, tc.perm)
		}
	}
	for m, want := range map[os.FileMode]string{
		0o644: "file -", os.ModeDir: "dir d", os.ModeSymlink: "symlink l", os.ModeNamedPipe: "named pipe p",
		os.ModeSocket: "socket s", os.ModeDevice | os.ModeCharDevice: "device c", os.ModeDevice: "device b", os.ModeIrregular: "other -",
	} {
		if name, letter := kindOf(m); name+" "+letter != want {
			t.Errorf("%v: %s %s, want %s", m, name, letter, want)
		}
	}
}

// When the server's process is out of descriptors (as when the host's
// inotify instances are used up: the same errnos, EMFILE and ENFILE),
// Watch says so with ErrWatchLimit, not a bare errno. The limit is this
// test process's own RLIMIT_NOFILE, lowered for the test (no test of this
// package runs in parallel) and restored: nothing host-wide is used up.
// The Hub is the test's own, so that it has no instance yet.
func TestWatchLimit(t *testing.T) {
	w, _, _ := setup(t, Options{})
	h := NewHub(HubLimits{})
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// Hold descriptors up to a low limit.
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	low := old
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatal(err)
			}
			break
		}
		held = append(held, f)
	}
	err := w.Watch(context.Background(), "", WatchOptions{Hub: h}, func(Event) {})
	if !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "inotify instances") {
		t.Fatalf("watch with no descriptor left: %v", err)
	}
}

// An atomic write (Write over an existing file: a temporary file renamed
// over it) shows in a watch as events about the file only, never about
// the server's temporary file, in the watched directory and below it.
func TestWatchLeavesOutTemporaryFiles(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	os.MkdirAll(filepath.Join(ws, "d/sub"), 0o755)
	write(t, filepath.Join(ws, "d/a.txt"), "old")
	write(t, filepath.Join(ws, "d/sub/b.txt"), "old")
	events, _, _ := watch(t, w, "d", WatchOptions{Recursive: true})
	for _, p := range []string{"d/a.txt", "d/sub/b.txt"} {
		if _, err := w.Write(p, []byte("new"), false); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(ws, "d/end"), "") // its event comes after the writes'
	seen := map[string]bool{}
	for e := range events {
		if strings.Contains(e.Name, ".quro-tmp-") {
			t.Errorf("the watch reported the server's temporary file: %+v", e)
		}
		seen[e.Name] = true
		if e.Name == "end" {
			break
		}
	}
	if !seen["a.txt"] || !seen["sub/b.txt"] {
		t.Errorf("the written files' own events are missing: %v", seen)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".a.txt.quro-tmp-0123456789abcdef": true,
		".x.quro-tmp-ffffffffffffffff":     true,
		"a.txt.quro-tmp-0123456789abcdef":  false, // no leading dot
		".a.txt.quro-tmp-0123456789abcde":  false, // 15 digits
		".a.txt.quro-tmp-0123456789ABCDEF": false, // not lower-case hex
		".quro-tmp-0123456789abcdef":       false, // no name before the mark
		".a.txt":                           false,
	} {
		if got := IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}
