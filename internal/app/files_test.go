package app

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/terminal"
)

func fileCall[T any](t *testing.T, a *App, name string, args any) T {
	t.Helper()
	reply, err := call(t, a, name, args)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	if reply.Text == "" {
		t.Fatalf("%s: no text", name)
	}
	return reply.Output.(T)
}

func runShell(t *testing.T, a *App, code string) *runcode.Result {
	t.Helper()
	res := runCode(t, a, RunCodeInput{Code: code, Lang: "sh"})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, stdout %q stderr %q %s", code, res.ExitCode, res.Stdout, res.Stderr, res.Error)
	}
	return res
}

// A file write_file made belongs to the session: code in the sandbox (its
// own uid when the server is root) reads it, appends to it, edits it in
// place (sed -i replaces the file, so the directory must be writable too)
// and removes a file beside it.
func TestWriteFileThenCodeChangesIt(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	w := fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "notes/a.txt", Content: "hello\n"})
	if w.Path != "notes/a.txt" || !w.Created || w.Wrote != 6 || w.Mode != "0644" {
		t.Fatalf("%+v", w)
	}
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "notes/b.txt", Content: "bye"})
	res := runShell(t, a, "cat notes/a.txt && echo more >> notes/a.txt && sed -i s/hello/HELLO/ notes/a.txt && rm notes/b.txt && mkdir notes/sub")
	if res.Stdout != "hello\n" {
		t.Fatalf("%+v", res)
	}
	c := fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: "notes/a.txt"})
	if c.Content != "HELLO\nmore\n" || c.Encoding != "utf-8" || !c.Complete || c.Size != 11 {
		t.Fatalf("%+v", c)
	}
	// Replacing keeps it the session's.
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "notes/a.txt", Content: "again\n"})
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "notes/a.txt", Content: "and more\n", Append: true})
	if res := runShell(t, a, "echo third >> notes/a.txt && cat notes/a.txt"); res.Stdout != "again\nand more\nthird\n" {
		t.Fatalf("%+v", res)
	}
	if os.Geteuid() == 0 {
		sess, err := a.Sessions.Get(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		uid := sess.UID
		for _, p := range []string{"notes", "notes/a.txt"} {
			fi, err := os.Stat(filepath.Join(sess.Workspace(), p))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
				t.Errorf("%s belongs to uid %d, want the session's %d", p, st.Uid, uid)
			}
		}
	}
}

// What code writes, read_file reads: text as text, bytes as base64; and
// bytes written as base64 reach the code unchanged.
func TestCodeAndFileAPIShareFiles(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	runShell(t, a, `mkdir -p out && printf 'héllo\n' > out/t.txt && printf 'a\000b\377' > out/b.bin`)
	c := fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: "out/t.txt"})
	if c.Content != "héllo\n" || c.Encoding != "utf-8" {
		t.Fatalf("%+v", c)
	}
	reply, err := call(t, a, "read_file", ReadFileInput{Path: "out/b.bin"})
	if err != nil {
		t.Fatal(err)
	}
	c = reply.Output.(*FileContent)
	if got, _ := base64.StdEncoding.DecodeString(c.Content); c.Encoding != "base64" || !bytes.Equal(got, []byte("a\x00b\xff")) {
		t.Fatalf("%+v", c)
	}
	if !strings.Contains(reply.Text, "base64") {
		t.Fatalf("text %q", reply.Text)
	}
	bin := []byte{0, 1, 2, 0x80, 0xff, '\n'}
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "in.bin", Content: base64.StdEncoding.EncodeToString(bin), Encoding: "base64"})
	if res := runShell(t, a, "od -An -tx1 in.bin | tr -d ' \\n'"); res.Stdout != "00010280ff0a" {
		t.Fatalf("%+v", res)
	}
	// An absolute path inside the workspace names the same file.
	sess, _ := a.Sessions.Get(t.Context(), "")
	if c := fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: filepath.Join(sess.Workspace(), "out/t.txt")}); c.Path != "out/t.txt" {
		t.Fatalf("%+v", c)
	}
	// A part of the file.
	if c := fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: "out/t.txt", Offset: 3, Limit: 3}); c.Content != "llo" || c.Complete || c.Size != 7 {
		t.Fatalf("%+v", c)
	}
	l := fileCall[*FileList](t, a, "list_files", ListFilesInput{Recursive: true})
	var got []string
	for _, e := range l.Entries {
		got = append(got, e.Path+":"+e.Type)
	}
	if want := "in.bin:file out:dir out/b.bin:file out/t.txt:file"; strings.Join(got, " ") != want {
		t.Fatalf("list %q, want %q", got, want)
	}
}

func TestFileAPIRefusals(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	// The session's code plants links out of the workspace, a big file,
	// a file in the way of a directory.
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("SECRET"), 0o644)
	runShell(t, a, "ln -s /etc/passwd pw && ln -s "+outside+" outdir && ln -s ../../.. up && mkdir d && touch f && head -c 9437184 /dev/zero > big")
	for _, tc := range []struct {
		name string
		args any
		code capability.Code
		msg  string
	}{
		{"read_file", ReadFileInput{Path: "pw"}, capability.PermissionDenied, "symbolic link"},
		{"read_file", ReadFileInput{Path: "up/etc/passwd"}, capability.PermissionDenied, "symbolic link"},
		{"read_file", ReadFileInput{Path: "../../../../../etc/passwd"}, capability.PermissionDenied, "leads out"},
		{"write_file", WriteFileInput{Path: "/etc/passwd", Content: "x"}, capability.PermissionDenied, "/etc/passwd: permission denied"},
		{"read_file", ReadFileInput{Path: "outdir/secret"}, capability.PermissionDenied, "symbolic link"},
		{"read_file", ReadFileInput{Path: "nope.txt"}, capability.NotFound, "no such file"},
		{"read_file", ReadFileInput{Path: "d"}, capability.InvalidArgument, "is a directory: list_files lists a directory"},
		{"read_file", ReadFileInput{Path: "big"}, capability.InvalidArgument, `"big" is 9 MiB, over the 8 MiB one read returns: too large; read it in parts with offset and limit`},
		{"read_file", ReadFileInput{Path: "big", Limit: 9 << 20}, capability.InvalidArgument, "limit 9437184 is over the 8 MiB"},
		{"read_file", ReadFileInput{Path: "f", Offset: -1}, capability.InvalidArgument, "must not be negative"},
		{"read_file", ReadFileInput{}, capability.InvalidArgument, "path"},
		{"read_file", map[string]any{"path": "f", "bogus": 1}, capability.InvalidArgument, "bogus"},
		{"write_file", WriteFileInput{Path: "pw", Content: "x"}, capability.PermissionDenied, "symbolic link to /etc/passwd"},
		{"write_file", WriteFileInput{Path: "outdir/secret", Content: "x"}, capability.PermissionDenied, "symbolic link"},
		{"write_file", WriteFileInput{Path: "outdir/new", Content: "x"}, capability.PermissionDenied, "symbolic link"},
		{"write_file", WriteFileInput{Path: "../x", Content: "x"}, capability.PermissionDenied, "leads out"},
		{"write_file", WriteFileInput{Path: "f/x", Content: "x"}, capability.InvalidArgument, `"f" is a file, not a directory`},
		{"write_file", WriteFileInput{Path: "d", Content: "x"}, capability.InvalidArgument, "is a directory"},
		{"write_file", WriteFileInput{Path: "b", Content: "!!", Encoding: "base64"}, capability.InvalidArgument, "not valid base64"},
		{"write_file", WriteFileInput{Path: "b", Content: "x", Encoding: "latin1"}, capability.InvalidArgument, "use utf-8 (the default) or base64"},
		{"write_file", WriteFileInput{Path: "b", Content: strings.Repeat("x", 8<<20+1)}, capability.InvalidArgument, "over the 8 MiB one write takes"},
		{"write_file", map[string]any{"path": "b"}, capability.InvalidArgument, "content"},
		{"list_files", ListFilesInput{Path: "outdir"}, capability.PermissionDenied, "symbolic link"},
		{"list_files", ListFilesInput{Path: "/nope"}, capability.NotFound, "/nope: no such file or directory in the session's box"},
		{"list_files", ListFilesInput{Path: "f"}, capability.InvalidArgument, "is a file, not a directory: read_file reads a file"},
		{"list_files", ListFilesInput{Path: "nope"}, capability.NotFound, "no such file"},
		{"list_files", ListFilesInput{Depth: 17}, capability.InvalidArgument, "depth must be between 1 and 16"},
		{"list_files", ListFilesInput{MaxEntries: 10001}, capability.InvalidArgument, "max_entries"},
		{"list_files", ListFilesInput{Session: "nope"}, capability.NotFound, "session not found"},
		{"create_project", CreateProjectInput{Template: "rust", Name: "p"}, capability.InvalidArgument, "choose one of node, python, shell"},
		{"create_project", CreateProjectInput{Template: "python", Name: "../p"}, capability.InvalidArgument, "invalid project name"},
		{"create_project", CreateProjectInput{Template: "python", Name: "outdir/p"}, capability.PermissionDenied, "symbolic link"},
		{"create_project", CreateProjectInput{Template: "python", Name: "f"}, capability.AlreadyExists, `"f" is a file`},
	} {
		_, err := call(t, a, tc.name, tc.args)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(ce.Message, tc.msg) {
			t.Errorf("%s %+v: %v, want %s saying %q", tc.name, tc.args, err, tc.code, tc.msg)
		}
		if err != nil && (strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "root:x:")) {
			t.Errorf("%s %+v leaked: %v", tc.name, tc.args, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Fatalf("outside file changed: %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
	// A big file is read in parts.
	c := fileCall[*FileContent](t, a, "read_file", ReadFileInput{Path: "big", Offset: 9<<20 - 4, Limit: 8 << 20})
	if c.Length != 4 || c.Encoding != "base64" || c.Size != 9<<20 {
		t.Fatalf("%+v", c)
	}
	// Links are listed, not followed.
	l := fileCall[*FileList](t, a, "list_files", ListFilesInput{Recursive: true})
	for _, e := range l.Entries {
		if e.Name == "secret" || strings.HasPrefix(e.Path, "up/") {
			t.Fatalf("listing followed a link: %+v", e)
		}
		if e.Path == "pw" && (e.Type != "symlink" || e.Target != "/etc/passwd") {
			t.Fatalf("%+v", e)
		}
	}
}

// Each template, created in a session other than the default and then run
// exactly as its result says: the calls name that session (the project's
// files exist only in its workspace), so they work copied as they are.
func TestCreateProjectRuns(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	_, nodeErr := a.Sandbox.LookPath("node")
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "projects"}); err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range []string{"python", "node", "shell"} {
		t.Run(tmpl, func(t *testing.T) {
			name := "proj-" + tmpl
			reply, err := call(t, a, "create_project", CreateProjectInput{Session: "projects", Template: tmpl, Name: name})
			if err != nil {
				t.Fatal(err)
			}
			p := reply.Output.(*ProjectCreated)
			if p.Path != name || len(p.Run) == 0 || !strings.Contains(reply.Text, "run it with") || !strings.Contains(reply.Text, " && ") {
				t.Fatalf("%+v\n%s", p, reply.Text)
			}
			if n := strings.Count(reply.Text, `"session":"`+p.Session+`"`); n != len(p.Run) {
				t.Fatalf("%d of %d hints name session %s:\n%s", n, len(p.Run), p.Session, reply.Text)
			}
			for _, r := range p.Run {
				if r.Args["session"] != p.Session {
					t.Fatalf("%s %v: not in session %s", r.Capability, r.Args, p.Session)
				}
				if strings.Contains(r.What, "node") && strings.HasPrefix(r.Capability, "terminal") && nodeErr != nil {
					t.Logf("skipped %q: no node in the sandbox", r.What)
					continue
				}
				out, err := call(t, a, r.Capability, r.Args)
				if err != nil {
					t.Fatalf("%s %v: %v", r.Capability, r.Args, err)
				}
				var text string
				switch o := out.Output.(type) {
				case *runcode.Result:
					if o.ExitCode != 0 || o.Error != "" {
						t.Fatalf("%s %v: %+v", r.Capability, r.Args, o)
					}
					text = o.Stdout + o.Stderr
				case *terminal.Result:
					if o.ExitCode != 0 {
						t.Fatalf("%s %v: %+v", r.Capability, r.Args, o)
					}
					text = o.Output
				}
				if !strings.Contains(text, r.Expect) {
					t.Errorf("%s %v: output %q, want %q", r.Capability, r.Args, text, r.Expect)
				}
			}
			// A second time is refused: the directory is no longer empty.
			_, err = call(t, a, "create_project", CreateProjectInput{Session: "projects", Template: tmpl, Name: name})
			var ce *capability.Error
			if !errors.As(err, &ce) || ce.Code != capability.AlreadyExists {
				t.Fatalf("%v", err)
			}
		})
	}
	// The brief ways too: exec() in the session's Python and run_code shell.
	if res := runCode(t, a, RunCodeInput{Session: "projects", Code: "exec(open('proj-python/main.py').read())"}); !strings.Contains(res.Stdout, "Hello, proj-python!") {
		t.Errorf("%+v", res)
	}
	if res := runCode(t, a, RunCodeInput{Session: "projects", Lang: "sh", Code: "sh proj-shell/run.sh && python3 proj-python/main.py"}); res.Stdout != "Hello, proj-shell!\nHello, proj-python!\n" {
		t.Errorf("%+v", res)
	}
}

// The schemas and descriptions say what the REST routes rely on.
func TestFileCapabilitiesDeclared(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for name, args := range map[string][]string{
		"read_file":      {"session", "path", "offset", "limit"},
		"write_file":     {"session", "path", "content", "encoding", "append"},
		"list_files":     {"session", "path", "recursive", "depth", "max_entries"},
		"create_project": {"session", "template", "name"},
	} {
		c, ok := a.Controller.Registry().Get(name)
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		b, _ := json.Marshal(c.InputSchema)
		for _, arg := range args {
			if !strings.Contains(string(b), `"`+arg+`"`) {
				t.Errorf("%s has no argument %s: %s", name, arg, b)
			}
		}
	}
}

// A 10,000-character path was a 500: the kernel's ENAMETOOLONG came back
// unclassified. Every path-taking capability now answers invalid_argument
// (HTTP 400) saying the path is too long.
func TestPathTooLongIsInvalidArgument(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	long := strings.Repeat("a", 10000)
	longName := "d/" + strings.Repeat("b", 300)
	for _, tc := range []struct {
		name string
		args any
	}{
		{"read_file", ReadFileInput{Path: long}},
		{"read_file", ReadFileInput{Path: longName}},
		{"write_file", WriteFileInput{Path: long, Content: "x"}},
		{"write_file", WriteFileInput{Path: longName, Content: "x"}},
		{"list_files", ListFilesInput{Path: long}},
		{"edit_file", EditFileInput{Command: "view", Path: long}},
		{"edit_file", EditFileInput{Command: "str_replace", Path: longName, OldStr: "a", NewStr: "b"}},
		{"run_js_file", RunJSFileInput{Path: long + ".js"}},
		{"call_js_function", CallJSFunctionInput{Path: longName + ".js", Function: "f"}},
		{"export_session_log", ExportLogInput{Path: long}},
	} {
		_, err := call(t, a, tc.name, tc.args)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.InvalidArgument || !strings.Contains(ce.Message, "too long") {
			t.Errorf("%s: %v, want invalid_argument saying the path is too long", tc.name, err)
		}
	}
}

// The attack: session code planted a FIFO; Tools.Files.read on it hung
// the run forever, past timeout_ms, holding one of the tenant's 16 call
// slots, and after 16 such calls the tenant got 429 for good. Now each read,
// write and list of the FIFO (and of a link out) fails at once with a clear
// error and frees its slot: 20 calls in a row, then a normal call, all
// answered, none resource_exhausted.
func TestJSFilesOnAFIFODoNotHoldSlots(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	runShell(t, a, "mkfifo fifo && ln -s /etc/passwd pw && printf 'module.exports.f = () => Tools.Files.read(\"fifo\")\\n' > m.js")
	codes := []string{
		"Tools.Files.read('fifo')",
		"Tools.Files.write('fifo', 'x')",
		"Tools.Files.write('fifo', 'x', {append: true})",
		"Tools.Files.list('fifo')",
		"Tools.Files.read('pw')",
	}
	for i := range 20 {
		code := codes[i%len(codes)]
		reply, err := call(t, a, "run_code", RunCodeInput{Code: code, Lang: "js", TimeoutMS: 60000})
		if err != nil {
			t.Fatalf("attempt %d (%s): %v", i+1, code, err)
		}
		res := reply.Output.(*runcode.Result)
		if res.ExitCode != 1 || res.TimedOut || !strings.Contains(res.Stderr, "Tools.Files.") ||
			!(strings.Contains(res.Stderr, "not a regular file") || strings.Contains(res.Stderr, "not a directory") || strings.Contains(res.Stderr, "outside the session workspace")) {
			t.Fatalf("attempt %d (%s): %+v", i+1, code, res)
		}
	}
	reply, err := call(t, a, "call_js_function", CallJSFunctionInput{Path: "m.js", Function: "f"})
	if err != nil {
		t.Fatal(err)
	}
	if res := reply.Output.(*runcode.Result); res.ExitCode != 1 || !strings.Contains(res.Stderr, `"fifo" is not a regular file (named pipe)`) {
		t.Fatalf("%+v", res)
	}
	if res := runCode(t, a, RunCodeInput{Code: "6 * 7", Lang: "js"}); !strings.Contains(res.Stdout, "42") {
		t.Fatalf("%+v", res)
	}
}

// What the JS engine writes belongs to the session, as what write_file
// writes: the session's code (its own uid in the box) appends to it and
// replaces the directory's content.
func TestJSWritesBelongToTheSession(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	res := runCode(t, a, RunCodeInput{Code: "Tools.Files.write('js/out/a.txt', 'from js'); 1", Lang: "js"})
	if res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	runShell(t, a, "echo ' and the shell' >> js/out/a.txt && touch js/out/b && rm js/out/b && cat js/out/a.txt")
	if os.Geteuid() == 0 {
		def, _ := a.Sessions.Default(t.Context())
		want := def.UID
		for _, p := range []string{"js", "js/out", "js/out/a.txt"} {
			fi, err := os.Stat(filepath.Join(def.Workspace(), p))
			if err != nil {
				t.Fatal(err)
			}
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != want {
				t.Errorf("%s belongs to %d, not the session's uid %d", p, uid, want)
			}
		}
	}
}
