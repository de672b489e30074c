package app

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/workspace"
)

// make_dir, move_file and remove_file work on what the session's code
// made, and what they make belongs to the session: its code writes into a
// directory make_dir made. stat_file names owners as the box does.
func TestFileOpsWithTheSessionsCode(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	d := fileCall[*FileInfo](t, a, "make_dir", PathInput{Path: "made/deep"})
	if d.Existed || d.Entry.Type != "dir" || d.Entry.Path != "made/deep" {
		t.Fatalf("%+v", d.Entry)
	}
	if again := fileCall[*FileInfo](t, a, "make_dir", PathInput{Path: "made/deep"}); !again.Existed {
		t.Fatalf("second make_dir: %+v", again)
	}
	runShell(t, a, "echo from-code > made/deep/f.txt && ln -s /etc/passwd made/link")
	st := fileCall[*FileInfo](t, a, "stat_file", PathInput{Path: "made/deep/f.txt"})
	if st.Entry.Size != 10 || st.Entry.Type != "file" || st.Entry.Permissions != "-rw-r--r--" {
		t.Fatalf("%+v", st.Entry)
	}
	if os.Geteuid() == 0 && (st.Entry.Owner != "user" || st.Entry.Group != "user") {
		t.Fatalf("owner %q:%q, want the box's name of the session's user, quro", st.Entry.Owner, st.Entry.Group)
	}
	if l := fileCall[*FileInfo](t, a, "stat_file", PathInput{Path: "made/link"}); l.Entry.Type != "symlink" || l.Entry.Target != "/etc/passwd" {
		t.Fatalf("%+v", l.Entry)
	}
	m := fileCall[*FileInfo](t, a, "move_file", MoveFileInput{Source: "made/deep/f.txt", Destination: "other/g.txt"})
	if m.Entry.Path != "other/g.txt" {
		t.Fatalf("%+v", m.Entry)
	}
	if res := runShell(t, a, "cat other/g.txt && echo more >> other/g.txt && touch other/new"); res.Stdout != "from-code\n" {
		t.Fatalf("%+v", res)
	}
	if os.Geteuid() == 0 {
		sess, err := a.Sessions.Get(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"made", "made/deep", "other"} {
			fi, err := os.Stat(filepath.Join(sess.Workspace(), p))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != sess.UID {
				t.Errorf("%s belongs to uid %d, want the session's %d", p, st.Uid, sess.UID)
			}
		}
	}
	// remove_file removes the link, not /etc/passwd, and whole trees.
	fileCall[*Removed](t, a, "remove_file", PathInput{Path: "made/link"})
	fileCall[*Removed](t, a, "remove_file", PathInput{Path: "other"})
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	if res := runShell(t, a, "ls -A other made 2>&1; true"); res.Stdout != "ls: cannot access 'other': No such file or directory\nmade:\ndeep\n" {
		t.Fatalf("%q", res.Stdout)
	}
	for _, tc := range []struct {
		name string
		args any
		code capability.Code
	}{
		{"stat_file", PathInput{Path: "nope"}, capability.NotFound},
		{"make_dir", PathInput{Path: "/etc/quro-made"}, capability.PermissionDenied}, // the box's /etc is not the session's
		{"move_file", MoveFileInput{Source: "made", Destination: "../x"}, capability.PermissionDenied},
		{"remove_file", PathInput{Path: ""}, capability.InvalidArgument},
		{"remove_file", PathInput{Path: "."}, capability.InvalidArgument},
		{"make_dir", PathInput{Path: "made/deep/../../.."}, capability.PermissionDenied},
	} {
		_, err := call(t, a, tc.name, tc.args)
		wantCode(t, err, tc.code)
	}
}

// watch_dir streams the changes the session's code makes, to a streaming
// caller, as they happen: "ready" first, then one event per change.
func TestWatchDirStreamsTheSessionsChanges(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	fileCall[*FileInfo](t, a, "make_dir", PathInput{Path: "w"})
	type out struct {
		stream string
		data   []byte
	}
	ch := make(chan out, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx = runcode.WithOutput(ctx, func(stream string, p []byte) { ch <- out{stream, append([]byte(nil), p...)} })
	done := make(chan error, 1)
	var reply *Watched
	go func() {
		r, err := a.Controller.Call(ctx, admin, "watch_dir", json.RawMessage(`{"path":"w","recursive":true,"include_entry":true}`))
		if err == nil {
			reply = r.Output.(*Watched)
		}
		done <- err
	}()
	if o := <-ch; o.stream != WatchStreamReady {
		t.Fatalf("first %q %s", o.stream, o.data)
	}
	runShell(t, a, "mkdir w/sub && echo hi > w/sub/a.txt")
	seen := map[string]bool{}
	for !seen["create w/sub/a.txt"] {
		o := <-ch
		var e workspace.Event
		if err := json.Unmarshal(o.data, &e); err != nil || o.stream != WatchStreamEvent {
			t.Fatalf("%q %s: %v", o.stream, o.data, err)
		}
		key := e.Type + " " + e.Name
		if e.Entry != nil {
			key = e.Type + " " + e.Entry.Path
		}
		seen[key] = true
	}
	if !seen["create w/sub"] {
		t.Fatalf("events %v", seen)
	}
	cancel()
	if err := <-done; err != nil {
		// The caller went away: the controller may say so.
		t.Logf("watch_dir after cancel: %v", err)
	} else if len(reply.Events) < 2 {
		t.Fatalf("%+v", reply)
	}
	// Without a stream the watch is bounded by timeout_ms.
	w := fileCall[*Watched](t, a, "watch_dir", WatchDirInput{Path: "w", TimeoutMS: 1})
	if w.Path != "w" {
		t.Fatalf("%+v", w)
	}
}

// One session runs at most MaxWatchesPerSession watches at once (under
// its tenant's cap); the next is refused, resource_exhausted, saying what
// to do, and one ending frees a slot. Another session is not affected.
func TestWatchDirBoundedPerSession(t *testing.T) {
	a := newApp(t, nil)
	type watch struct {
		cancel context.CancelFunc
		done   chan error
	}
	start := func(session string) (*watch, error) {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{}, 1)
		ctx = runcode.WithOutput(ctx, func(stream string, _ []byte) {
			if stream == WatchStreamReady {
				ready <- struct{}{}
			}
		})
		w := &watch{cancel: cancel, done: make(chan error, 1)}
		args, _ := json.Marshal(WatchDirInput{Session: session})
		go func() {
			_, err := a.Controller.Call(ctx, admin, "watch_dir", args)
			w.done <- err
		}()
		select {
		case <-ready:
			return w, nil
		case err := <-w.done:
			cancel()
			return nil, err
		}
	}
	var running []*watch
	defer func() {
		for _, w := range running {
			w.cancel()
			<-w.done
		}
	}()
	for i := range MaxWatchesPerSession {
		w, err := start("")
		if err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
		running = append(running, w)
	}
	over, err := start("")
	if over != nil {
		running = append(running, over) // ended with the others
	}
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "8 watches running") {
		t.Fatalf("the watch over the bound: %q", ce.Message)
	}
	// A non-streaming watch_dir counts too.
	_, err = call(t, a, "watch_dir", WatchDirInput{TimeoutMS: 1})
	wantCode(t, err, capability.ResourceExhausted)
	// Another session watches.
	mustCall(t, a, "create_session", CreateSessionInput{Name: "other"})
	w, err := start("other")
	if err != nil {
		t.Fatalf("another session: %v", err)
	}
	running = append(running, w)
	// One ending frees its slot.
	running[0].cancel()
	<-running[0].done
	running = running[1:]
	w, err = start("")
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	running = append(running, w)
}

// write_file's metadata is kept on the replaced file (its user.e2b.*
// xattrs, which the session's code reads), shown by stat_file and
// list_files, and gone with the next replacement without it; with append,
// or invalid, it is refused and nothing is written.
func TestWriteFileMetadata(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	md := map[string]string{"author": "mish", "stage": "draft 1"}
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "m/a.txt", Content: "x", Metadata: md})
	if st := fileCall[*FileInfo](t, a, "stat_file", PathInput{Path: "m/a.txt"}); !maps.Equal(st.Entry.Metadata, md) {
		t.Fatalf("stat: %+v", st.Entry)
	}
	if l := fileCall[*FileList](t, a, "list_files", ListFilesInput{Path: "m"}); len(l.Entries) != 1 || !maps.Equal(l.Entries[0].Metadata, md) {
		t.Fatalf("list: %+v", l.Entries)
	}
	if res := runShell(t, a, `python3 -c "import os; print(os.getxattr('m/a.txt', 'user.e2b.stage').decode())"`); res.Stdout != "draft 1\n" {
		t.Fatalf("%+v", res)
	}
	fileCall[*FileWritten](t, a, "write_file", WriteFileInput{Path: "m/a.txt", Content: "y"})
	if st := fileCall[*FileInfo](t, a, "stat_file", PathInput{Path: "m/a.txt"}); st.Entry.Metadata != nil {
		t.Fatalf("a replacement kept the metadata: %+v", st.Entry)
	}
	for _, in := range []WriteFileInput{
		{Path: "m/b.txt", Metadata: map[string]string{"Author": "x"}},
		{Path: "m/b.txt", Metadata: map[string]string{"bad key": "x"}},
		{Path: "m/b.txt", Metadata: map[string]string{"k": "line\n"}},
		{Path: "m/b.txt", Metadata: map[string]string{"k": strings.Repeat("v", 5000)}},
		{Path: "m/b.txt", Metadata: map[string]string{"k": "v"}, Append: true},
	} {
		_, err := call(t, a, "write_file", in)
		wantCode(t, err, capability.InvalidArgument)
	}
	_, err := call(t, a, "stat_file", PathInput{Path: "m/b.txt"})
	wantCode(t, err, capability.NotFound) // a refused write wrote nothing
}
