package js

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The attack: a FIFO planted in the workspace hung Tools.Files.read forever
// (the open blocks until a writer comes), past timeout_ms. Now every
// Tools.Files call on a FIFO, a device or a link out is refused at once
// with a clear error; the run ends well inside its (long) budget, as the
// timedOut=false of each outcome shows.
func TestFilesRefuseFIFOsDevicesAndLinksOut(t *testing.T) {
	e := newEnv(t, nil)
	if err := syscall.Mkfifo(filepath.Join(e.ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	// A FIFO with a reader holding it open: an open for writing would not
	// fail with ENXIO, a write could fill the pipe and block.
	if err := syscall.Mkfifo(filepath.Join(e.ws, "held"), 0o666); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(filepath.Join(e.ws, "held"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := os.Symlink("/etc/passwd", filepath.Join(e.ws, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(e.ws, "devlink")); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ code, want string }{
		{"Tools.Files.read('fifo')", `Tools.Files.read: "fifo" is not a regular file (named pipe)`},
		{"Tools.Files.read('held')", `Tools.Files.read: "held" is not a regular file (named pipe)`},
		{"Tools.Files.write('fifo', 'x')", `Tools.Files.write: "fifo" is not a regular file (named pipe)`},
		{"Tools.Files.write('fifo', 'x', {append: true})", `Tools.Files.write: "fifo" is not a regular file`},
		{"Tools.Files.write('held', 'x'.repeat(1 << 20), {append: true})", `Tools.Files.write: "held" is not a regular file (named pipe)`},
		{"Tools.Files.list('fifo')", `Tools.Files.list: "fifo" is a named pipe, not a directory`},
		{"require('./fifo')", `require("./fifo"): no file "fifo"`},
		{"Tools.Files.read('out')", "path leads outside the session workspace"},
		{"Tools.Files.write('out', 'x')", "path leads outside the session workspace"},
		{"Tools.Files.list('out')", "path leads outside the session workspace"},
		{"Tools.Files.read('devlink')", "path leads outside the session workspace"},
	}
	if os.Geteuid() == 0 {
		if err := syscall.Mknod(filepath.Join(e.ws, "zero"), syscall.S_IFCHR|0o666, 1<<8|5); err != nil {
			t.Fatal(err)
		}
		cases = append(cases,
			struct{ code, want string }{"Tools.Files.read('zero')", `Tools.Files.read: "zero" is not a regular file (device)`},
			struct{ code, want string }{"Tools.Files.write('zero', 'x')", `Tools.Files.write: "zero" is not a regular file (device)`},
			struct{ code, want string }{"Tools.Files.write('zero', 'x', {append: true})", `Tools.Files.write: "zero" is not a regular file (device)`})
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			check{exit: 1, stderr: []string{tc.want}}.verify(t, e.runCtx(t, context.Background(), "js", tc.code, time.Minute, nil))
		})
	}
	// Listing the workspace shows them without opening them.
	check{stdout: []string{`"fifo:other"`, `"out:symlink"`}}.verify(t, e.run(t, "js", "Tools.Files.list('.').map(e => e.name + ':' + e.type)"))
	if b, err := os.ReadFile("/etc/passwd"); err != nil || len(b) == 0 {
		t.Fatalf("/etc/passwd: %v", err)
	}
}

// A host call that blocks does not outlive the run's deadline: bounded
// returns errTimeUp when the deadline passes, whatever the call does.
func TestHostCallBoundedByTheDeadline(t *testing.T) {
	r := &run{ctx: context.Background(), deadline: time.Now().Add(50 * time.Millisecond)}
	block := make(chan struct{})
	defer close(block)
	_, err := r.bounded(func() (any, error) { <-block; return nil, nil })
	if !errors.Is(err, errTimeUp) {
		t.Fatalf("bounded returned %v, want errTimeUp", err)
	}
	// The caller going away ends it too.
	ctx, cancel := context.WithCancel(context.Background())
	r = &run{ctx: ctx, deadline: time.Now().Add(time.Hour)}
	go cancel()
	if _, err := r.bounded(func() (any, error) { <-block; return nil, nil }); !errors.Is(err, errTimeUp) {
		t.Fatalf("bounded after cancel returned %v", err)
	}
	// Past the deadline nothing starts.
	started := false
	r = &run{ctx: context.Background(), deadline: time.Now().Add(-time.Second)}
	if _, err := r.bounded(func() (any, error) { started = true; return nil, nil }); !errors.Is(err, errTimeUp) || started {
		t.Fatalf("bounded past the deadline: %v, started %v", err, started)
	}
}

// What the engine writes belongs to the session's uid (when the server is
// root), as what write_file writes: the session's code can change it.
func TestFilesWrittenBelongToTheSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the server chowns only as root")
	}
	e := newEnv(t, nil)
	check{exactStdout: ptr("➡️ 2\n")}.verify(t, e.run(t, "js", "Tools.Files.write('new/dir/a.txt', 'hi'); Tools.Files.write('new/dir/a.txt', '!', {append: true}); Tools.Files.write('b.json', {k: 1}); 2"))
	want := e.sess.UID
	for _, p := range []string{"new", "new/dir", "new/dir/a.txt", "b.json"} {
		fi, err := os.Stat(filepath.Join(e.ws, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != want || int(st.Gid) != want {
			t.Errorf("%s belongs to %d:%d, not the session's %d", p, st.Uid, st.Gid, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(e.ws, "new/dir/a.txt")); string(b) != "hi!" {
		t.Errorf("content %q", b)
	}
}

// A 10,000-character path is refused as too long, by name, not with an
// engine failure.
func TestFilesPathTooLong(t *testing.T) {
	e := newEnv(t, nil)
	long := strings.Repeat("a", 10000)
	check{exit: 1, stderr: []string{"Tools.Files.read: path is too long: 10000 bytes, over the 4095"}}.verify(t, e.run(t, "js", "Tools.Files.read('"+long+"')"))
	check{exit: 1, stderr: []string{"path is too long: the name", "over the 255 bytes"}}.verify(t, e.run(t, "js", "Tools.Files.write('d/"+strings.Repeat("b", 300)+"', 'x')"))
}
