package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
)

func ptr[T any](v T) *T { return &v }

// editFails calls edit_file expecting an error of code that says msg, and
// that names no host path.
func editFails(t *testing.T, a *App, in EditFileInput, code capability.Code, msg string) {
	t.Helper()
	_, err := call(t, a, "edit_file", in)
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(ce.Message, msg) {
		t.Errorf("edit_file %+v: %v, want %s saying %q", in, err, code, msg)
		return
	}
	noHostPath(t, a, ce.Message)
}

// noHostPath fails when s names where the server keeps its data.
func noHostPath(t *testing.T, a *App, s string) {
	t.Helper()
	sess, err := a.Sessions.Get(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sess.Workspace(), filepath.Dir(filepath.Dir(sess.Workspace()))} {
		if strings.Contains(s, p) {
			t.Errorf("%q shows the host path %s", s, p)
		}
	}
}

func readText(t *testing.T, a *App, p string) *FileContent {
	t.Helper()
	return fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: p})
}

// edit_file's three commands, on the paths a model sends (/home/user/…,
// ~/…, relative), as the session's code sees the result.
func TestEditFile(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	src := "#!/bin/sh\n\nmain() {\n    echo hello\n    return 0\n}\n\nmain \"$@\"\n"
	runShell(t, a, "mkdir -p app && cat > app/main.sh <<'EOF'\n"+src+"EOF\nchmod 755 app/main.sh")

	// view: the whole file, then a range, numbered as cat -n.
	v := fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "view", Path: "/home/user/app/main.sh"})
	if v.Lines != 8 || v.Path != "app/main.sh" || !strings.HasPrefix(v.Shown, "     1\t#!/bin/sh\n     2\t\n     3\tmain() {\n") || v.More {
		t.Fatalf("%+v", v)
	}
	reply, err := call(t, a, "edit_file", EditFileInput{Command: "view", Path: "app/main.sh", ViewRange: []int{3, 4}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "app/main.sh lines 3-4 of 8:\n     3\tmain() {\n     4\t    echo hello"; reply.Text != want {
		t.Fatalf("view_range text %q, want %q", reply.Text, want)
	}
	if v := fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "view", Path: "~/app/main.sh", ViewRange: []int{7, -1}}); v.Shown != "     7\t\n     8\tmain \"$@\"\n" {
		t.Fatalf("view [7, -1]: %q", v.Shown)
	}

	// str_replace: one match, replaced by two lines; the answer shows them.
	reply, err = call(t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "app/main.sh",
		OldStr: "    echo hello\n", NewStr: "    name=${1:-world}\n    echo \"hello $name\"\n"})
	if err != nil {
		t.Fatal(err)
	}
	e := reply.Output.(*FileEdited)
	if e.Lines != 9 || !strings.HasPrefix(reply.Text, "edited app/main.sh: 1 line(s) replaced, now lines 4-5 (9 lines in all):\n") ||
		!strings.Contains(reply.Text, "     5\t    echo \"hello $name\"\n") || !strings.Contains(reply.Text, "     1\t#!/bin/sh") {
		t.Fatalf("%q", reply.Text)
	}
	noHostPath(t, a, reply.Text)
	// insert after the first line and after the last.
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "insert", Path: "app/main.sh", InsertLine: ptr(1), NewStr: "# greet: says hello\n"})
	reply, err = call(t, a, "edit_file", EditFileInput{Command: "insert", Path: "app/main.sh", InsertLine: ptr(10), NewStr: "# end"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reply.Text, "edited app/main.sh: inserted line 11 (11 lines in all):\n") || !strings.HasSuffix(reply.Text, "    11\t# end") {
		t.Fatalf("%q", reply.Text)
	}
	// Deleting: new_str empty.
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "app/main.sh", OldStr: "    return 0\n"})
	// The session runs the result; the file kept its mode and stays the
	// session's to change.
	res := runShell(t, a, "./app/main.sh quro && echo '# more' >> app/main.sh && tail -n 2 app/main.sh")
	if res.Stdout != "hello quro\n# end\n# more\n" {
		t.Fatalf("%+v", res)
	}
	if c := readText(t, a, "app/main.sh"); c.Mode != "0755" || !strings.HasPrefix(c.Content, "#!/bin/sh\n# greet: says hello\n\nmain() {\n") || strings.Contains(c.Content, "return 0") {
		t.Fatalf("%+v", c)
	}

	// Match counts, with the lines.
	runShell(t, a, "printf 'x = 1\\ny = 2\\nx = 1\\nz = 3\\nx = 1\\n' > dup.py")
	editFails(t, a, EditFileInput{Command: "str_replace", Path: "dup.py", OldStr: "x = 1", NewStr: "x = 9"}, capability.InvalidArgument,
		"dup.py: old_str matches 3 times, at lines 1, 3, 5: add surrounding lines to old_str to make it unique")
	editFails(t, a, EditFileInput{Command: "str_replace", Path: "dup.py", OldStr: "x=1", NewStr: "x = 9"}, capability.InvalidArgument,
		"dup.py: old_str was not found (0 matches)")
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "dup.py", OldStr: "x = 1\nz", NewStr: "x = 9\nz"})
	if c := readText(t, a, "dup.py"); c.Content != "x = 1\ny = 2\nx = 9\nz = 3\nx = 1\n" {
		t.Fatalf("%q", c.Content)
	}

	// CRLF: viewed without \r, edited with \n, written back with \r\n.
	runShell(t, a, "printf 'a\\r\\nb\\r\\nc\\r\\n' > win.txt")
	if v := fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "view", Path: "win.txt"}); v.Shown != "     1\ta\n     2\tb\n     3\tc\n" {
		t.Fatalf("%q", v.Shown)
	}
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "win.txt", OldStr: "a\nb\n", NewStr: "A\nB\nB2\n"})
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "insert", Path: "win.txt", InsertLine: ptr(4), NewStr: "d"})
	if c := readText(t, a, "win.txt"); c.Content != "A\r\nB\r\nB2\r\nc\r\nd\r\n" {
		t.Fatalf("%q", c.Content)
	}

	// A directory view lists it; the workspace itself by /home/user.
	reply, err = call(t, a, "edit_file", EditFileInput{Command: "view", Path: "/home/user"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reply.Text, "/home/user/ (directory, 2 levels, ") || !strings.Contains(reply.Text, "\napp/main.sh\n") || !strings.Contains(reply.Text, "\ndup.py\n") {
		t.Fatalf("%q", reply.Text)
	}

	// What cannot work says why, and what to do.
	runShell(t, a, "printf 'PNG\\0\\1\\2' > img.bin && printf '\\377\\376x\\n' > latin.txt && touch empty.txt")
	for _, tc := range []struct {
		in   EditFileInput
		code capability.Code
		msg  string
	}{
		{EditFileInput{Command: "view", Path: "img.bin"}, capability.InvalidArgument, `"img.bin" is not UTF-8 text`},
		{EditFileInput{Command: "str_replace", Path: "latin.txt", OldStr: "x", NewStr: "y"}, capability.InvalidArgument, "not UTF-8 text"},
		{EditFileInput{Command: "create", Path: "n.txt"}, capability.InvalidArgument, "write_file creates a file"},
		{EditFileInput{Command: "str_replce", Path: "dup.py"}, capability.InvalidArgument, "did you mean str_replace?"},
		{EditFileInput{Command: "view", Path: "nope.py"}, capability.NotFound, "no such file"},
		{EditFileInput{Command: "str_replace", Path: "app", OldStr: "x"}, capability.InvalidArgument, "edit_file edits a file"},
		{EditFileInput{Command: "str_replace", Path: "dup.py", NewStr: "x"}, capability.InvalidArgument, "str_replace needs old_str"},
		{EditFileInput{Command: "str_replace", Path: "dup.py", OldStr: "y = 2", NewStr: "y = 2"}, capability.InvalidArgument, "nothing to change"},
		{EditFileInput{Command: "str_replace", Path: "dup.py", OldStr: "  y = 2\n  x = 9", NewStr: "y"}, capability.InvalidArgument, "but it matches at line 2 if the spaces and tabs"},
		{EditFileInput{Command: "insert", Path: "dup.py", NewStr: "x"}, capability.InvalidArgument, "insert needs insert_line"},
		{EditFileInput{Command: "insert", Path: "dup.py", NewStr: "x", InsertLine: ptr(6)}, capability.InvalidArgument, "insert_line 6 is outside the file, which has 5 lines"},
		{EditFileInput{Command: "view", Path: "dup.py", ViewRange: []int{9, -1}}, capability.InvalidArgument, "the file has lines 1 to 5"},
		{EditFileInput{Command: "view", Path: "dup.py", ViewRange: []int{1}}, capability.InvalidArgument, "view_range is [first, last]"},
		{EditFileInput{Command: "view", Path: "dup.py", OldStr: "x"}, capability.InvalidArgument, "view takes path and view_range only"},
		{EditFileInput{Command: "insert", Path: "dup.py", InsertLine: ptr(1), NewStr: "a\x00b"}, capability.InvalidArgument, "NUL byte"},
	} {
		editFails(t, a, tc.in, tc.code, tc.msg)
	}
	if v := fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "view", Path: "empty.txt"}); v.Summary != "empty.txt is empty" {
		t.Fatalf("%+v", v)
	}
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "insert", Path: "empty.txt", InsertLine: ptr(0), NewStr: "first"})
	if c := readText(t, a, "empty.txt"); c.Content != "first\n" {
		t.Fatalf("%q", c.Content)
	}

	// A big file's view is cut with the range that shows the next part.
	runShell(t, a, "seq 1 20000 > big.txt")
	reply, err = call(t, a, "edit_file", EditFileInput{Command: "view", Path: "big.txt"})
	if err != nil {
		t.Fatal(err)
	}
	v = reply.Output.(*FileEdited)
	if !v.More || len(reply.Text) > 17<<10 || !strings.Contains(reply.Text, "(cut at 16 KiB; view_range [") {
		t.Fatalf("%d bytes: %.300q", len(reply.Text), reply.Text)
	}

	// Audited as write_file is: the path, the texts only by size.
	reply, err = call(t, a, "get_audit_log", AuditInput{Capability: "edit_file"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `command="str_replace" new_str=<7 bytes> old_str=<7 bytes> path="dup.py"`; !strings.Contains(reply.Text, want) {
		t.Errorf("audit log lacks %s:\n%s", want, reply.Text)
	}
	if strings.Contains(reply.Text, "x = 9") {
		t.Errorf("the audit log shows an edit's text:\n%s", reply.Text)
	}
}

// The attacks write_file withstands, through edit_file: the session's code
// plants links out of the workspace, and paths lead out by "..". Nothing
// outside is read or changed, and no error shows a host path.
func TestEditFileRefusesEscapes(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("SECRET\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runShell(t, a, "ln -s /etc/passwd pw && ln -s "+outside+" outdir && ln -s ../../.. up && ln -s "+secret+" sec && "+
		"printf 'inside\\n' > in.txt && ln -s in.txt ok && mkfifo fifo")
	// Paths of the box outside the workspace are the box's own, edited as
	// the session's user: its /etc/passwd is not the session's to change,
	// and the host's files are not in it.
	for _, p := range []string{"/home/user/../../etc/passwd", "/etc/passwd", secret} {
		for _, in := range []EditFileInput{
			{Command: "view", Path: p},
			{Command: "str_replace", Path: p, OldStr: "root:x:0:0:", NewStr: "PWNED"},
			{Command: "insert", Path: p, InsertLine: ptr(0), NewStr: "PWNED"},
		} {
			reply, err := call(t, a, "edit_file", in)
			if err == nil {
				if in.Command != "view" || strings.Contains(reply.Text, "SECRET") {
					t.Errorf("edit_file %s %s: %s", in.Command, p, reply.Text)
				}
				continue
			}
			if c := codeOf(err); c != capability.PermissionDenied && c != capability.NotFound {
				t.Errorf("edit_file %s %s: %v, want permission_denied or not_found", in.Command, p, err)
			}
		}
	}
	for _, p := range []string{"pw", "outdir/secret", "up/etc/passwd", "sec", "../secret", "a/../../x", "~/../x"} {
		for _, in := range []EditFileInput{
			{Command: "view", Path: p},
			{Command: "str_replace", Path: p, OldStr: "SECRET", NewStr: "PWNED"},
			{Command: "insert", Path: p, InsertLine: ptr(0), NewStr: "PWNED"},
		} {
			_, err := call(t, a, "edit_file", in)
			var ce *capability.Error
			if !errors.As(err, &ce) || ce.Code != capability.PermissionDenied {
				t.Errorf("edit_file %s %s: %v, want permission_denied", in.Command, p, err)
				continue
			}
			if strings.Contains(ce.Message, "SECRET") || strings.Contains(ce.Message, "root:x:") {
				t.Errorf("edit_file %s %s leaked: %v", in.Command, p, err)
			}
			noHostPath(t, a, ce.Message)
		}
	}
	// A FIFO the session planted does not hang the call.
	editFails(t, a, EditFileInput{Command: "view", Path: "fifo"}, capability.InvalidArgument, "not a regular file")
	if b, _ := os.ReadFile(secret); string(b) != "SECRET\n" {
		t.Fatalf("the file outside changed: %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
	// A link that stays inside is edited through, and stays a link.
	fileCall[*FileEdited](t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "ok", OldStr: "inside", NewStr: "edited"})
	if res := runShell(t, a, "cat in.txt && readlink ok"); res.Stdout != "edited\nin.txt\n" {
		t.Fatalf("%+v", res)
	}
}

// An edit that cannot be written leaves the file as it was, and no
// temporary file beside it: one past the write limit, and one into a
// full disk.
func TestEditFileFailedWriteLeavesTheFile(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Limits: Limits{Tenant: TenantLimits{Disk: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	// 7.5 MiB of lines and a marker: the edit would make it over 8 MiB.
	runShell(t, a, "head -c 7864320 /dev/zero | tr '\\0' 'a' | fold -w 99 > big.txt && echo MARK >> big.txt && sha256sum big.txt > big.sum")
	editFails(t, a, EditFileInput{Command: "str_replace", Path: "big.txt", OldStr: "MARK", NewStr: strings.Repeat("b", 1<<20)},
		capability.InvalidArgument, "the edited file would be 8.6 MiB, over the 8 MiB one write takes")
	runShell(t, a, "sha256sum -c big.sum && test -z \"$(ls -A | grep quro-tmp)\"")

	if err := a.tenants.disks.Enforced(); err != nil {
		t.Logf("no kernel disk quota here, the full disk is not tried: %v", err)
		return
	}
	res := runCode(t, a, RunCodeInput{Lang: "shell", Code: "head -c 60M /dev/zero > fill; echo rc=$?"})
	if !strings.Contains(res.Stdout, "rc=1") {
		t.Fatalf("the disk did not fill: %+v", res)
	}
	editFails(t, a, EditFileInput{Command: "str_replace", Path: "big.txt", OldStr: "MARK", NewStr: "MARKED"},
		capability.ResourceExhausted, "no space left on the session's disk")
	runShell(t, a, "rm fill && sha256sum -c big.sum && test -z \"$(ls -A | grep quro-tmp)\"")
}

// Edits of one file sent in the same turn (parallel tool calls) all land:
// none writes over another's.
func TestEditFileParallelEditsAllLand(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	const n = 12
	var src strings.Builder
	for i := range n {
		fmt.Fprintf(&src, "value_%d = 0\n", i)
	}
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "conf.py", Content: src.String()})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = call(t, a, "edit_file", EditFileInput{Command: "str_replace", Path: "conf.py",
				OldStr: fmt.Sprintf("value_%d = 0\n", i), NewStr: fmt.Sprintf("value_%d = %d\n", i, i+1)})
		})
	}
	wg.Wait()
	var want strings.Builder
	for i := range n {
		if errs[i] != nil {
			t.Errorf("edit %d: %v", i, errs[i])
		}
		fmt.Fprintf(&want, "value_%d = %d\n", i, i+1)
	}
	if c := readText(t, a, "conf.py"); c.Content != want.String() {
		t.Fatalf("%q, want %q", c.Content, want.String())
	}
	if len(a.edits.m) != 0 {
		t.Fatalf("edit locks left: %v", a.edits.m)
	}
}
