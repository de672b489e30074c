package app

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/boxfs"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/terminal"
)

// sh runs command in the session's shell and returns its output.
func sh(t *testing.T, a *App, session, command string) string {
	t.Helper()
	return mustCall(t, a, "terminal_exec", TerminalExecInput{Session: session, Command: command}).(*terminal.Result).Output
}

// TestFilesReachTheBox: the file capabilities address the box's /tmp and
// paths the session made elsewhere, as a program of the session: what the
// API writes the session's code reads and the other way round, and new
// files are the session's.
func TestFilesReachTheBox(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "boxfiles", "")

	w := mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/test-git/x", Content: "from the api\n"}).(*FileWritten)
	if w.Path != "/tmp/test-git/x" || !w.Created {
		t.Errorf("write_file: %+v", w)
	}
	if out := sh(t, a, s.ID, "cat /tmp/test-git/x; stat -c '%u %a' /tmp/test-git/x /tmp/test-git; id -u"); !strings.Contains(out, "from the api\n") {
		t.Errorf("the session does not see the file:\n%s", out)
	} else if f := strings.Fields(out); len(f) < 8 || f[3] != f[7] || f[5] != f[7] || f[4] != "644" {
		t.Errorf("owner and mode, want the session's uid and 644:\n%s", out)
	}
	sh(t, a, s.ID, "mkdir -p /tmp/made/sub && printf 'from the box' > /tmp/made/sub/y && ln -s sub/y /tmp/made/link")
	r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/made/sub/y"}).(*FileContent)
	if r.Content != "from the box" || r.Path != "/tmp/made/sub/y" || !r.Complete {
		t.Errorf("read_file: %+v", r)
	}
	l := mustCall(t, a, "list_files", ListFilesInput{Session: s.ID, Path: "/tmp/made", Recursive: true}).(*FileList)
	var got []string
	for _, e := range l.Entries {
		got = append(got, e.Path+":"+e.Type+":"+e.Target)
	}
	if strings.Join(got, " ") != "/tmp/made/link:symlink:sub/y /tmp/made/sub:dir: /tmp/made/sub/y:file:" {
		t.Errorf("list_files: %v", got)
	}
	st := mustCall(t, a, "stat_file", PathInput{Session: s.ID, Path: "/tmp/made/link"}).(*FileInfo)
	if st.Entry.Type != "symlink" || st.Entry.Target != "sub/y" || st.Entry.TargetType != "file" {
		t.Errorf("stat_file of a link: %+v", st.Entry)
	}
	// Through the link, appended, then moved into the workspace.
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/made/link", Content: "!", Append: true})
	mustCall(t, a, "move_file", MoveFileInput{Session: s.ID, Source: "/tmp/made/sub/y", Destination: "moved/y"})
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "moved/y"}).(*FileContent); r.Content != "from the box!" {
		t.Errorf("moved into the workspace: %q", r.Content)
	}
	if d := mustCall(t, a, "make_dir", PathInput{Session: s.ID, Path: "/tmp/made/new"}).(*FileInfo); d.Existed || d.Entry.Type != "dir" {
		t.Errorf("make_dir: %+v", d)
	}
	mustCall(t, a, "remove_file", PathInput{Session: s.ID, Path: "/tmp/made"})
	if out := sh(t, a, s.ID, "ls /tmp/made 2>&1; echo $?"); !strings.Contains(out, "No such file") {
		t.Errorf("remove_file left /tmp/made:\n%s", out)
	}
	// The box's system files read as the box shows them.
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/proc/self/status"}).(*FileContent); !strings.Contains(r.Content, "Uid:\t") || strings.Contains(r.Content, "Uid:\t0\t") {
		t.Errorf("/proc/self/status is not a program of the session's:\n%s", r.Content)
	}
	_, err := call(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/nope"})
	if ce := wantCode(t, err, capability.NotFound); !strings.Contains(ce.Message, "/tmp/nope") {
		t.Errorf("not found names %q", ce.Message)
	}
	// A paused box answers clearly (its helper could not run), the
	// workspace still reads, and after a resume the box's files do.
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/p", Content: "p"})
	if p := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult); !p.Paused {
		t.Skipf("the box did not pause: %+v", p)
	}
	_, err = call(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/p"})
	if ce := wantCode(t, err, capability.Unavailable); !strings.Contains(ce.Message, "resume") {
		t.Errorf("paused: %q", ce.Message)
	}
	mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "moved/y"})
	mustCall(t, a, "resume_session", SessionRef{Session: s.ID})
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/p"}).(*FileContent); r.Content != "p" {
		t.Errorf("after the resume: %+v", r)
	}
}

// TestBoxFilesAttacks runs the attacks on the box's file access: links
// the session plants toward the host's files, another session's workspace
// and the server's data directory read only what the box shows (here:
// nothing); the server's /proc is out of reach; the box's read-only system
// directories refuse writes; no error names a host path.
func TestBoxFilesAttacks(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "attacker", "")
	v := newSession(t, a, "victim", "")
	mustCall(t, a, "write_file", WriteFileInput{Session: v.ID, Path: "secret", Content: "victim's secret"})
	victim, err := a.Sessions.Get(context.Background(), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	host := map[string]string{
		"shadow": "/etc/shadow",
		"victim": filepath.Join(victim.Workspace(), "secret"),
		"data":   a.DataDir,
		"db":     filepath.Join(a.DataDir, "quro.db"),
		"server": "/proc/" + strconv.Itoa(os.Getpid()) + "/environ",
		"root":   "/proc/1/root/etc/hostname",
	}
	var plant strings.Builder
	for name, target := range host {
		plant.WriteString("ln -s '" + target + "' /tmp/" + name + "; ")
	}
	sh(t, a, s.ID, plant.String())
	shadow, _ := os.ReadFile("/etc/shadow")
	for name, target := range host {
		for _, p := range []string{"/tmp/" + name, target} {
			reply, err := call(t, a, "read_file", ReadFileInput{Session: s.ID, Path: p})
			if err == nil {
				c := reply.Output.(*FileContent).Content
				if strings.Contains(c, "victim's secret") || (len(shadow) > 0 && c == string(shadow)) || strings.Contains(c, a.DataDir) {
					t.Errorf("read_file %s (-> %s) read the host's file: %.200q", p, target, c)
				}
				continue
			}
			if p != target && strings.Contains(err.Error(), a.DataDir) {
				t.Errorf("read_file %s: the error names a host path: %v", p, err)
			}
			if c := codeOf(err); c != capability.NotFound && c != capability.PermissionDenied && c != capability.InvalidArgument {
				t.Errorf("read_file %s: %v", p, err)
			}
		}
		if _, err := call(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/" + name, Content: "x"}); err == nil && name == "victim" {
			if b, _ := os.ReadFile(host["victim"]); string(b) != "victim's secret" {
				t.Errorf("a write through a link changed the victim's file: %q", b)
			}
		}
	}
	if b, _ := os.ReadFile(host["victim"]); string(b) != "victim's secret" {
		t.Errorf("the victim's file changed: %q", b)
	}
	// The server's own /proc/self is not reachable: /proc/self is the helper's.
	c := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/proc/self/cmdline"}).(*FileContent)
	if b, _ := base64.StdEncoding.DecodeString(c.Content); c.Encoding != "base64" || !strings.Contains(string(b), "__quro_boxfs") {
		t.Errorf("/proc/self/cmdline is not the box helper's: %+v", c)
	}
	// Read-only system directories and root's files refuse the session.
	for _, p := range []string{"/usr/bin/quro-planted", "/etc/passwd", "/run/quro/bin/quro"} {
		_, err := call(t, a, "write_file", WriteFileInput{Session: s.ID, Path: p, Content: "x"})
		if ce := wantCode(t, err, capability.PermissionDenied); !strings.Contains(ce.Message, p) || strings.Contains(ce.Message, a.DataDir) {
			t.Errorf("write_file %s: %v", p, ce)
		}
	}
	if _, err := os.Stat("/usr/bin/quro-planted"); err == nil {
		t.Errorf("a write reached the host's /usr/bin")
	}
}

// boxHelper is session id's file helper (nil: none yet).
func boxHelper(a *App, id string) *boxfs.Helper {
	a.boxFiles.mu.Lock()
	defer a.boxFiles.mu.Unlock()
	return a.boxFiles.helpers[id]
}

// signalHelper sends sig to the session's file helper as the host would
// (the session's own code may not signal it: its runs are Landlock
// domains of their own), standing for a helper that dies or hangs.
func signalHelper(t *testing.T, h *boxfs.Helper, sig syscall.Signal) {
	t.Helper()
	pid := h.Pid()
	if pid == 0 {
		t.Fatal("no helper runs")
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
}

// TestBoxFilesHelper: the session's box paths are served by one
// long-lived helper: a killed
// helper is replaced at the next call, a stopped one (the session holding
// every file call up) is killed after the timeout and replaced; a pause
// ends it and a call after the resume starts another; reads and writes
// of several MiB go through it in pieces, byte for byte.
func TestBoxFilesHelper(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "helper", "")
	for i := range 5 {
		mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/h/" + strconv.Itoa(i), Content: "x"})
		mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/h/" + strconv.Itoa(i)})
	}
	mustCall(t, a, "list_files", ListFilesInput{Session: s.ID, Path: "/tmp/h"})
	h := boxHelper(a, s.ID)
	if h == nil || h.Starts() != 1 || !h.Running() {
		t.Fatalf("11 calls: want one helper started and running, got %v", h)
	}

	// Killed: the next call starts another.
	signalHelper(t, h, syscall.SIGKILL)
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/h/0"}).(*FileContent); r.Content != "x" {
		t.Errorf("after the kill: %+v", r)
	}
	if h.Starts() != 2 {
		t.Errorf("after the kill: %d starts, want 2", h.Starts())
	}

	// Stuck: the call ends at the timeout with a clear error, the helper
	// is killed, the next call has a new one.
	a.boxFilesTimeout = 3 * time.Second
	signalHelper(t, h, syscall.SIGSTOP)
	_, err := call(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/h/1"})
	if ce := wantCode(t, err, capability.DeadlineExceeded); !strings.Contains(ce.Message, "/tmp/h/1") || strings.Contains(ce.Message, a.DataDir) {
		t.Errorf("a stopped helper: %v", ce)
	}
	a.boxFilesTimeout = 0
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/h/1"}).(*FileContent); r.Content != "x" {
		t.Errorf("after the stop: %+v", r)
	}
	if h.Starts() != 3 {
		t.Errorf("after the stop: %d starts, want 3", h.Starts())
	}

	// Large content, written and read back in pieces through the helper.
	big := make([]byte, 6<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	enc := base64.StdEncoding.EncodeToString(big)
	mustCall(t, a, "write_file", WriteFileInput{Session: s.ID, Path: "/tmp/big", Content: enc, Encoding: "base64"})
	var got []byte
	for off := int64(0); off < int64(len(big)); {
		r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/big", Offset: off, Limit: 2 << 20}).(*FileContent)
		b, err := base64.StdEncoding.DecodeString(r.Content)
		if err != nil || len(b) == 0 {
			t.Fatalf("read at %d: %v (%d bytes)", off, err, len(b))
		}
		got = append(got, b...)
		off += int64(len(b))
	}
	if !bytes.Equal(got, big) {
		t.Errorf("6 MiB through the helper came back different (%d bytes)", len(got))
	}
	if h.Starts() != 3 {
		t.Errorf("the large read and write started helpers: %d starts, want 3", h.Starts())
	}

	// A pause ends the helper; after the resume a call starts another.
	if p := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult); !p.Paused {
		t.Skipf("the box did not pause: %+v", p)
	}
	if h.Running() {
		t.Errorf("the helper runs on in a paused session")
	}
	mustCall(t, a, "resume_session", SessionRef{Session: s.ID})
	if r := mustCall(t, a, "read_file", ReadFileInput{Session: s.ID, Path: "/tmp/h/2"}).(*FileContent); r.Content != "x" {
		t.Errorf("after the resume: %+v", r)
	}
	// The session's end forgets it.
	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	if boxHelper(a, s.ID) != nil || h.Running() {
		t.Errorf("the helper outlived its session")
	}
}
