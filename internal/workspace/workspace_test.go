package workspace

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// setup makes a workspace and, beside it, an "outside" directory holding a
// secret file, and opens the workspace.
func setup(t *testing.T, opts Options) (w *FS, ws, outside string) {
	t.Helper()
	base := t.TempDir()
	ws, outside = filepath.Join(base, "ws"), filepath.Join(base, "outside")
	for _, d := range []string{ws, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret"), "SECRET")
	w, err := Open(ws, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, ws, outside
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, target error, msg string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q does not say %q", err, msg)
	}
}

func TestRel(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"", ".", nil},
		{".", ".", nil},
		{"a/b.txt", "a/b.txt", nil},
		{"./a//b/../c", "a/c", nil},
		{"a/..", ".", nil},
		{ws, ".", nil},
		{ws + "/x/y", "x/y", nil},
		{"..", "", ErrOutside},
		{"../outside/secret", "", ErrOutside},
		{"a/../../x", "", ErrOutside},
		{ws + "/../outside/secret", "", ErrOutside},
		{"/etc/passwd", "", ErrOutside},
		{ws + "x/y", "", ErrOutside}, // a sibling whose name starts like the workspace
		{"a\x00b", "", ErrInvalid},
		{"/home/user", ".", nil}, // the box's name of the workspace
		{"/home/user/x/y", "x/y", nil},
		{"~", ".", nil}, // the shell's name of the workspace
		{"~/x/y", "x/y", nil},
		{"~/../x", "", ErrOutside},
		{"~x", "~x", nil}, // a name, not a home
		{"/home/user/../x", "", ErrOutside},
		{"/home/username/x", "", ErrOutside},
	} {
		got, err := w.Rel(tc.in)
		if err != nil && !strings.Contains(tc.in, ws) && strings.Contains(err.Error(), ws) {
			t.Errorf("Rel(%q): the error names the host path: %v", tc.in, err)
		}
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Rel(%q) = %q, %v; want %v", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Rel(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestReadText(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	write(t, filepath.Join(ws, "dir/hello.txt"), "héllo\n")
	c, err := w.Read("dir/hello.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Data) != "héllo\n" || !c.Text || !c.Complete || c.Size != 7 || c.Path != "dir/hello.txt" || c.Mode != 0o644 {
		t.Fatalf("%+v", c)
	}
	// An absolute path inside the workspace is the same file.
	if c, err := w.Read(filepath.Join(ws, "dir/hello.txt"), 0, 0); err != nil || string(c.Data) != "héllo\n" {
		t.Fatalf("%v %+v", err, c)
	}
	// Open: the file itself, described as Read describes it.
	f, oc, err := w.Open("dir/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, err := io.ReadAll(f); err != nil || string(b) != "héllo\n" || oc.Size != 7 || oc.Path != "dir/hello.txt" || oc.Mode != 0o644 || oc.Data != nil {
		t.Fatalf("Open: %q %v %+v", b, err, oc)
	}
}

func TestReadBinaryAndNUL(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	for name, data := range map[string][]byte{
		"nul":     []byte("text\x00with a NUL"),
		"invalid": {0xff, 0xfe, 'a'},
		"png":     {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0},
	} {
		if err := os.WriteFile(filepath.Join(ws, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := w.Read(name, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if c.Text || !bytes.Equal(c.Data, data) {
			t.Errorf("%s: text=%v data %q", name, c.Text, c.Data)
		}
	}
}

func TestReadRange(t *testing.T) {
	w, ws, _ := setup(t, Options{MaxRead: 10})
	write(t, filepath.Join(ws, "big"), "0123456789abcdefghij")
	_, err := w.Read("big", 0, 0)
	wantErr(t, err, ErrTooLarge, `"big" is 20 bytes, over the 10 bytes one read returns`)
	c, err := w.Read("big", 5, 10)
	if err != nil || string(c.Data) != "56789abcde" || c.Complete || c.Size != 20 || c.Offset != 5 {
		t.Fatalf("%v %+v", err, c)
	}
	c, err = w.Read("big", 15, 10) // the end of the file
	if err != nil || string(c.Data) != "fghij" {
		t.Fatalf("%v %+v", err, c)
	}
	c, err = w.Read("big", 15, 0) // from an offset to the end, within the limit
	if err != nil || string(c.Data) != "fghij" {
		t.Fatalf("%v %+v", err, c)
	}
	c, err = w.Read("big", 30, 5) // past the end: nothing
	if err != nil || len(c.Data) != 0 {
		t.Fatalf("%v %+v", err, c)
	}
	_, err = w.Read("big", 0, 11)
	wantErr(t, err, ErrTooLarge, "limit 11 is over the 10 bytes")
	_, err = w.Read("big", -1, 5)
	wantErr(t, err, ErrInvalid, "must not be negative")
}

func TestReadRefusals(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	secret := filepath.Join(outside, "secret")
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	symlink(t, secret, filepath.Join(ws, "abs-link"))
	symlink(t, "../outside/secret", filepath.Join(ws, "rel-link"))
	symlink(t, "/etc/passwd", filepath.Join(ws, "passwd"))
	symlink(t, outside, filepath.Join(ws, "outdir"))
	symlink(t, "../../outside", filepath.Join(ws, "sub/deep"))
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		err  error
		msg  string
	}{
		{"abs-link", ErrOutside, "symbolic link"},
		{"rel-link", ErrOutside, "symbolic link"},
		{"passwd", ErrOutside, "symbolic link"},
		{"outdir/secret", ErrOutside, "symbolic link"},
		{"sub/deep/secret", ErrOutside, "symbolic link"},
		{"../outside/secret", ErrOutside, "leads out"},
		{secret, ErrOutside, "not inside the session workspace"},
		{"/etc/passwd", ErrOutside, "not inside"},
		{"missing.txt", ErrNotFound, `"missing.txt": no such file`},
		{"sub", ErrIsDir, `"sub" is a directory`},
		{"", ErrIsDir, `"." is a directory`},
		{"fifo", ErrInvalid, "not a regular file (named pipe)"}, // and returns at once
		{"abs-link/x", ErrOutside, ""},
	} {
		c, err := w.Read(tc.path, 0, 0)
		if err == nil {
			t.Errorf("Read(%q) = %q, want an error", tc.path, c.Data)
			continue
		}
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Read(%q): %v, want %v saying %q", tc.path, err, tc.err, tc.msg)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Read(%q) leaked the secret in %v", tc.path, err)
		}
		// Open (a file sent by the kernel's copy) refuses alike.
		if f, _, oerr := w.Open(tc.path); oerr == nil {
			f.Close()
			t.Errorf("Open(%q) opened it, want %v", tc.path, err)
		} else if oerr.Error() != err.Error() {
			t.Errorf("Open(%q): %v, want Read's %v", tc.path, oerr, err)
		}
	}
	// A parent that is a file.
	write(t, filepath.Join(ws, "file"), "x")
	_, err := w.Read("file/x", 0, 0)
	wantErr(t, err, ErrNotDir, "not a directory")
}

func TestReadFollowsLinksInside(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	write(t, filepath.Join(ws, "real/data.txt"), "inside")
	symlink(t, "real/data.txt", filepath.Join(ws, "link"))
	symlink(t, filepath.Join(ws, "real/data.txt"), filepath.Join(ws, "abslink"))
	symlink(t, "real", filepath.Join(ws, "dirlink"))
	symlink(t, "../real/data.txt", filepath.Join(ws, "real/up"))
	os.Mkdir(filepath.Join(ws, "real/sub"), 0o755)
	symlink(t, "real/sub", filepath.Join(ws, "dirlink2"))
	symlink(t, "../data.txt", filepath.Join(ws, "real/sub/up2"))
	// Path names the file after a last link is followed.
	for p, want := range map[string]string{
		"link": "real/data.txt", "abslink": "real/data.txt", "dirlink/data.txt": "dirlink/data.txt",
		"real/up": "real/data.txt", "dirlink/up": "real/data.txt",
		// ../data.txt from real/sub (which dirlink2 names) is real/data.txt
		"dirlink2/up2": "real/data.txt",
	} {
		if c, err := w.Read(p, 0, 0); err != nil || string(c.Data) != "inside" || c.Path != want {
			t.Errorf("Read(%q): %v %+v", p, err, c)
		}
	}
	// os.Root never follows an absolute link in the middle of a path, even
	// one that points inside; the error says so.
	symlink(t, filepath.Join(ws, "real"), filepath.Join(ws, "absdir"))
	_, err := w.Read("absdir/data.txt", 0, 0)
	wantErr(t, err, ErrOutside, "only relative links that stay inside are followed")
}

func TestWrite(t *testing.T) {
	w, ws, _ := setup(t, Options{MaxWrite: 16})
	res, err := w.Write("a/b/c.txt", []byte("one"), false)
	if err != nil || !res.Created || res.Size != 3 || res.Path != "a/b/c.txt" || res.Mode != 0o644 {
		t.Fatalf("%v %+v", err, res)
	}
	if err := os.Chmod(filepath.Join(ws, "a/b/c.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err = w.Write("a/b/c.txt", []byte("two"), false)
	if err != nil || res.Created || res.Mode != 0o755 {
		t.Fatalf("replacing: %v %+v", err, res)
	}
	res, err = w.Write("a/b/c.txt", []byte("+3"), true)
	if err != nil || res.Size != 5 || res.Wrote != 2 {
		t.Fatalf("appending: %v %+v", err, res)
	}
	if res, err := w.Write("new-by-append", []byte("x"), true); err != nil || !res.Created {
		t.Fatalf("append creates: %v %+v", err, res)
	}
	b, _ := os.ReadFile(filepath.Join(ws, "a/b/c.txt"))
	fi, _ := os.Stat(filepath.Join(ws, "a/b/c.txt"))
	if string(b) != "two+3" || fi.Mode().Perm() != 0o755 {
		t.Fatalf("%q %v", b, fi.Mode())
	}
	// Binary content round-trips.
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	if _, err := w.Write("bin", bin, false); err != nil {
		t.Fatal(err)
	}
	if c, err := w.Read("bin", 0, 0); err != nil || !bytes.Equal(c.Data, bin) || c.Text {
		t.Fatalf("%v %+v", err, c)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(filepath.Join(ws, "a/b"))
	if len(ents) != 1 {
		t.Fatalf("entries %v", ents)
	}
}

func TestWriteRefusals(t *testing.T) {
	w, ws, outside := setup(t, Options{MaxWrite: 16})
	secret := filepath.Join(outside, "secret")
	write(t, filepath.Join(ws, "file"), "x")
	os.Mkdir(filepath.Join(ws, "dir"), 0o755)
	symlink(t, secret, filepath.Join(ws, "abs-link"))
	symlink(t, "../outside/secret", filepath.Join(ws, "rel-link"))
	symlink(t, "../outside/new", filepath.Join(ws, "dangling-out"))
	symlink(t, outside, filepath.Join(ws, "outdir"))
	for _, tc := range []struct {
		path string
		app  bool
		data string
		err  error
		msg  string
	}{
		{"abs-link", false, "pwned", ErrOutside, "symbolic link to " + secret},
		{"abs-link", true, "pwned", ErrOutside, "symbolic link to"},
		{"rel-link", false, "pwned", ErrOutside, "symbolic link to ../outside/secret"},
		{"dangling-out", false, "pwned", ErrOutside, "symbolic link"},
		{"outdir/secret", false, "pwned", ErrOutside, "symbolic link"},
		{"outdir/new", false, "pwned", ErrOutside, "symbolic link"},
		{"outdir/sub/new", false, "pwned", ErrOutside, "symbolic link"},
		{"../outside/secret", false, "pwned", ErrOutside, "leads out"},
		{secret, false, "pwned", ErrOutside, "not inside"},
		{"file/x.txt", false, "x", ErrNotDir, `"file" is a file, not a directory`},
		{"file/a/b.txt", false, "x", ErrNotDir, `"file" is a file`},
		{"dir", false, "x", ErrIsDir, `"dir" is a directory`},
		{"dir", true, "x", ErrIsDir, `"dir" is a directory`},
		{"", false, "x", ErrIsDir, "the workspace itself"},
		{"big", false, strings.Repeat("x", 17), ErrTooLarge, "17 bytes of content is over the 16 bytes one write takes"},
	} {
		_, err := w.Write(tc.path, []byte(tc.data), tc.app)
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Write(%q, append=%v): %v, want %v saying %q", tc.path, tc.app, err, tc.err, tc.msg)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "SECRET" {
		t.Fatalf("the outside file was changed: %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(ws, "big")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused write left a file: %v", err)
	}
}

func TestWriteThroughLinkInside(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	write(t, filepath.Join(ws, "conf/v2.txt"), "old")
	symlink(t, "conf/v2.txt", filepath.Join(ws, "current"))
	res, err := w.Write("current", []byte("new"), false)
	if err != nil || res.Path != "conf/v2.txt" {
		t.Fatalf("%v %+v", err, res)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "conf/v2.txt")); string(b) != "new" {
		t.Fatalf("target %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(ws, "current")); fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatal("the link was replaced instead of written through")
	}
}

func TestWriteOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files away")
	}
	const uid = 2_345_678
	w, ws, _ := setup(t, Options{Owner: &Owner{UID: uid, GID: uid}})
	if _, err := w.Write("new/dir/f.txt", []byte("x"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("new/dir/g.txt", []byte("x"), true); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"new", "new/dir", "new/dir/f.txt", "new/dir/g.txt"} {
		fi, err := os.Lstat(filepath.Join(ws, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != uid {
			t.Errorf("%s belongs to %d:%d, want %d", p, st.Uid, st.Gid, uid)
		}
	}
}

func TestList(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	write(t, filepath.Join(ws, "b.txt"), "bb")
	write(t, filepath.Join(ws, "a/x.py"), "print(1)")
	write(t, filepath.Join(ws, "a/deeper/y"), "")
	write(t, filepath.Join(ws, ".quro/outputs/run.stdout"), "out")
	symlink(t, outside, filepath.Join(ws, "outdir"))
	symlink(t, "/etc/passwd", filepath.Join(ws, "a/passwd"))

	paths := func(l *Listing) string {
		var p []string
		for _, e := range l.Entries {
			p = append(p, e.Path+":"+e.Type)
		}
		return strings.Join(p, " ")
	}
	l, err := w.List("", ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(l); got != ".quro:dir a:dir b.txt:file outdir:symlink" {
		t.Fatalf("depth 1: %s", got)
	}
	if l.Entries[2].Size != 2 || l.Entries[2].Mode != "0644" || l.Entries[2].ModTime.IsZero() || l.Entries[3].Target != outside {
		t.Fatalf("%+v", l.Entries)
	}
	l, err = w.List(".", ListOptions{Depth: MaxDepth})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(l); got != ".quro:dir a:dir a/deeper:dir a/deeper/y:file a/passwd:symlink a/x.py:file b.txt:file outdir:symlink" {
		t.Fatalf("recursive: %s", got)
	}
	if len(l.Skipped) != 1 || !strings.HasPrefix(l.Skipped[0], ".quro:") || l.Truncated {
		t.Fatalf("skipped %q truncated %v", l.Skipped, l.Truncated)
	}
	l, err = w.List(".quro", ListOptions{Depth: 2})
	if err != nil || paths(l) != ".quro/outputs:dir .quro/outputs/run.stdout:file" {
		t.Fatalf("%v %s", err, paths(l))
	}
	l, err = w.List("", ListOptions{Depth: MaxDepth, MaxEntries: 3})
	if err != nil || !l.Truncated || len(l.Entries) != 3 {
		t.Fatalf("%v %+v", err, l)
	}

	for _, tc := range []struct {
		path  string
		depth int
		err   error
		msg   string
	}{
		{"outdir", 1, ErrOutside, "symbolic link"},
		{"a/passwd", 1, ErrOutside, "symbolic link"},
		{"../outside", 1, ErrOutside, "leads out"},
		{outside, 1, ErrOutside, "not inside"},
		{"b.txt", 1, ErrNotDir, `"b.txt" is a file`},
		{"nope", 1, ErrNotFound, "no such file"},
		{"", MaxDepth + 1, ErrInvalid, "depth 17"},
	} {
		_, err := w.List(tc.path, ListOptions{Depth: tc.depth})
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("List(%q): %v, want %v saying %q", tc.path, err, tc.err, tc.msg)
		}
	}
}

func TestMkdirAllRefusesALinkOut(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	symlink(t, outside, filepath.Join(ws, "out"))
	if _, err := w.MkdirAll("out/made"); !errors.Is(err, ErrOutside) {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "made")); err == nil {
		t.Fatal("made a directory outside")
	}
}

// flip swaps the symbolic link at link between the targets, each rename
// atomic, until stop is closed.
func flip(t *testing.T, link string, targets ...string) (stop func()) {
	t.Helper()
	for i, target := range targets {
		symlink(t, target, link+".flip"+string(rune('0'+i)))
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			tmp := link + ".tmp"
			os.Remove(tmp)
			os.Symlink(targets[i%len(targets)], tmp)
			os.Rename(tmp, link)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// The session's code may swap a link between an inside file and a secret
// outside while the server reads: the secret must never come back.
func TestSymlinkSwapRaceRead(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	write(t, filepath.Join(ws, "inside"), "inside")
	stop := flip(t, filepath.Join(ws, "link"), filepath.Join(ws, "inside"), filepath.Join(outside, "secret"))
	defer stop()
	os.Mkdir(filepath.Join(ws, "real"), 0o755)
	write(t, filepath.Join(ws, "real/secret"), "inside too")
	stopDir := flip(t, filepath.Join(ws, "dirlink"), filepath.Join(ws, "real"), outside)
	defer stopDir()
	ok, refused := 0, 0
	for range 1000 {
		for _, p := range []string{"link", "dirlink/secret"} {
			c, err := w.Read(p, 0, 0)
			if f, _, oerr := w.Open(p); oerr == nil {
				b, _ := io.ReadAll(f)
				f.Close()
				if strings.Contains(string(b), "SECRET") {
					t.Fatalf("open %q opened the outside secret", p)
				}
			}
			switch {
			case err == nil && strings.Contains(string(c.Data), "SECRET"):
				t.Fatalf("read %q returned the outside secret", p)
			case err == nil:
				ok++
			case errors.Is(err, ErrOutside), errors.Is(err, ErrNotFound):
				refused++
			default:
				t.Fatalf("read %q: %v", p, err)
			}
		}
	}
	t.Logf("%d reads inside, %d refused", ok, refused)
}

// The same race against writes and listings: nothing outside changes and
// no listing shows outside names.
func TestSymlinkSwapRaceWriteAndList(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	os.Mkdir(filepath.Join(ws, "real"), 0o755)
	write(t, filepath.Join(ws, "target"), "inside")
	stopDir := flip(t, filepath.Join(ws, "dirlink"), filepath.Join(ws, "real"), outside)
	defer stopDir()
	stopFile := flip(t, filepath.Join(ws, "filelink"), filepath.Join(ws, "target"), filepath.Join(outside, "secret"))
	defer stopFile()
	for i := range 500 {
		w.Write("dirlink/secret", []byte("pwned"), i%2 == 0)
		w.Write("dirlink/new", []byte("pwned"), false)
		w.Write("filelink", []byte("pwned"), i%2 == 0)
		if l, err := w.List("dirlink", ListOptions{Depth: 2}); err == nil {
			for _, e := range l.Entries {
				if e.Name == "secret" && e.Size == int64(len("SECRET")) {
					// real/secret is written with "pwned" (5 bytes) only.
					t.Fatalf("listing showed the outside directory: %+v", l.Entries)
				}
			}
		}
	}
	stopDir()
	stopFile()
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Fatalf("the outside secret changed: %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
}

func TestExistsAndRemove(t *testing.T) {
	w, ws, outside := setup(t, Options{})
	write(t, filepath.Join(ws, "d/f"), "x")
	symlink(t, outside, filepath.Join(ws, "out"))
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(ws, "secretlink"))
	for p, want := range map[string]bool{"d": true, "d/f": true, "nope": false, "d/nope": false} {
		if ok, err := w.Exists(p); err != nil || ok != want {
			t.Errorf("Exists(%q) = %v, %v", p, ok, err)
		}
	}
	_, err := w.Exists("out/secret")
	wantErr(t, err, ErrOutside, "symbolic link")
	_, err = w.Exists("../outside/secret")
	wantErr(t, err, ErrOutside, "leads out")
	// Removing a link removes the link, never what it points to.
	for _, p := range []string{"out", "secretlink", "d"} {
		if _, err := w.Remove(p); err != nil {
			t.Fatalf("Remove(%q): %v", p, err)
		}
		if _, err := os.Lstat(filepath.Join(ws, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "SECRET" {
		t.Fatalf("outside touched: %q %v", b, err)
	}
	_, err = w.Remove(".")
	wantErr(t, err, ErrInvalid, "cannot remove the workspace itself")
	_, err = w.Remove("nope")
	wantErr(t, err, ErrNotFound, "no such file")
	_, err = w.Remove("../outside")
	wantErr(t, err, ErrOutside, "leads out")
}

// A path over the kernel's limits is an invalid argument that says so, in
// every operation, not an unclassified ENAMETOOLONG.
func TestPathTooLong(t *testing.T) {
	w, _, _ := setup(t, Options{})
	long := strings.Repeat("a", 10000)
	name := "d/" + strings.Repeat("b", 256)
	for _, p := range []string{long, name} {
		_, err := w.Read(p, 0, 0)
		wantErr(t, err, ErrInvalid, "path is too long")
		_, err = w.Write(p, []byte("x"), false)
		wantErr(t, err, ErrInvalid, "path is too long")
		_, err = w.List(p, ListOptions{})
		wantErr(t, err, ErrInvalid, "path is too long")
		_, err = w.Exists(p)
		wantErr(t, err, ErrInvalid, "path is too long")
		_, err = w.Remove(p)
		wantErr(t, err, ErrInvalid, "path is too long")
		_, _, err = w.Stat(p)
		wantErr(t, err, ErrInvalid, "path is too long")
	}
	// Just under the limits is a path like any other.
	ok := strings.Repeat("c", MaxName)
	if _, err := w.Write(ok, []byte("x"), false); err != nil {
		t.Fatal(err)
	}
}

// A FIFO is never opened for blocking I/O: reads, writes and appends are
// refused at once, also with no reader on the other end (ENXIO).
func TestFIFORefused(t *testing.T) {
	w, ws, _ := setup(t, Options{})
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	_, err := w.Read("fifo", 0, 0)
	wantErr(t, err, ErrInvalid, "not a regular file (named pipe)")
	_, err = w.Write("fifo", []byte("x"), false)
	wantErr(t, err, ErrInvalid, "not a regular file (named pipe)")
	_, err = w.Write("fifo", []byte("x"), true)
	wantErr(t, err, ErrInvalid, "not a regular file")
}
