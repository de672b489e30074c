package terminal

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

func newPTY(t *testing.T) (*PTY, *session.Session) { return newPTYQueue(t, 0) }

func newPTYQueue(t *testing.T, queue int) (*PTY, *session.Session) {
	t.Helper()
	return newPTYOpts(t, PTYOptions{ViewerQueue: queue})
}

// newPTYOpts starts an 80x24 PTY with opts (sandbox, session, size and
// prompt filled in).
func newPTYOpts(t *testing.T, opts PTYOptions) (*PTY, *session.Session) {
	t.Helper()
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: "0123456789abcdef0123456789abcdef", Name: "t", Dir: t.TempDir()}
	os.MkdirAll(s.Workspace(), 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	opts.Sandbox, opts.Session, opts.Cols, opts.Rows, opts.Env = sb, s, 80, 24, map[string]string{"PS1": "$ "}
	p, err := StartPTY(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, s
}

// readUntil reads the viewer until want appears in what it has seen.
func readUntil(t *testing.T, v *Viewer, seen *strings.Builder, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(seen.String(), want) {
		select {
		case b, ok := <-v.C:
			if !ok {
				t.Fatalf("viewer closed before %q; saw %d bytes", want, seen.Len())
			}
			seen.Write(b)
		case <-deadline:
			s := seen.String()
			if len(s) > 2000 {
				s = s[:1000] + " … " + s[len(s)-1000:]
			}
			t.Fatalf("no %q within 30 s; saw %q", want, s)
		}
	}
}

// screenUntil waits, on the screen model's parse events, until the screen
// shows want, and returns it.
func screenUntil(t *testing.T, p *PTY, want string) string {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		changed := p.ScreenChanged()
		if s := p.Screen(); strings.Contains(s, want) {
			return s
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %q on the screen within 2 min (%+v):\n%s", want, p.ModelStats(), p.Screen())
		}
	}
}

func TestPTYRunsAShellAndKeepsAScreen(t *testing.T) {
	p, s := newPTY(t)
	v, _ := p.Attach()
	var seen strings.Builder
	p.Write([]byte("cd /tmp && pwd && echo MARK$((6*7))\r"))
	readUntil(t, v, &seen, "MARK42")
	// The screen model shows what a person sees.
	if screen := screenUntil(t, p, "MARK42"); !strings.Contains(screen, "/tmp") {
		t.Fatalf("screen:\n%s", screen)
	}
	// A terminal: tty answers, and the size is what was set. In the
	// bubblewrap box the terminal shows as /dev/console (bubblewrap binds
	// it there); on the host as /dev/pts/N. It is the controlling terminal
	// with job control on: the shell leads the foreground group.
	seen.Reset()
	p.Write([]byte("tty; stty size; case $- in *m*) echo JOBS-$((6*7));; esac; ps -o tpgid= -p $$ | awk '$1>0{print \"FG-\" 6*7}'\r"))
	readUntil(t, v, &seen, "FG-42")
	if out := seen.String(); !strings.Contains(out, "/dev/pts/") && !strings.Contains(out, "/dev/console") || strings.Contains(out, "not a tty") {
		t.Errorf("not a tty: %q", out)
	}
	if out := seen.String(); !strings.Contains(out, "24 80") || !strings.Contains(out, "JOBS-42") {
		t.Errorf("size or job control: %q", out)
	}
	if err := p.Resize(100, 30); err != nil {
		t.Fatal(err)
	}
	seen.Reset()
	p.Write([]byte("stty size\r"))
	readUntil(t, v, &seen, "30 100")
	_ = s
}

func TestPTYInterruptAndReplay(t *testing.T) {
	p, _ := newPTY(t)
	// The prompt may come before the viewer attaches: it is then in the
	// replay, not on the viewer's channel.
	v, replay := p.Attach()
	var seen strings.Builder
	seen.Write(replay)
	// The prompt first: a ^C that comes while bash still reads its profile,
	// before it handles SIGINT, ends the shell.
	readUntil(t, v, &seen, "$ ")
	p.Write([]byte("sleep 1000; echo after-sleep\r"))
	p.Write([]byte{3}) // ^C
	p.Write([]byte("echo INTERRUPTED-OK\r"))
	readUntil(t, v, &seen, "INTERRUPTED-OK\r\n")
	// A second viewer gets the scrollback replayed.
	v2, replay := p.Attach()
	defer p.Detach(v2)
	if !strings.Contains(string(replay), "INTERRUPTED-OK") {
		t.Errorf("replay lacks earlier output: %q", replay)
	}
}

func TestSlowViewerIsDroppedNotWaitedFor(t *testing.T) {
	p, _ := newPTY(t)
	slow, _ := p.AttachQueue(4) // never read
	fast, _ := p.AttachQueue(1 << 20)
	var seen strings.Builder
	// far more than 4 chunks of output
	p.Write([]byte("seq 1 20000; echo DONE-$((40+2))\r"))
	readUntil(t, fast, &seen, "DONE-42")
	// The slow viewer was closed (dropped) long before: draining ends.
	for range slow.C {
	}
	if !slow.Dropped {
		t.Error("the slow viewer was not dropped")
	}
}

// A terminal that starts in a subdirectory of the workspace runs as the
// session's uid, may write the whole workspace, and leaves the
// subdirectory's owner alone.
func TestPTYStartedInASubdirectory(t *testing.T) {
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: "0123456789abcdef0123456789abcdef", Name: "t", Dir: t.TempDir(), UID: 2_999_998}
	sub := filepath.Join(s.Workspace(), "sub")
	os.MkdirAll(sub, 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	p, err := StartPTY(PTYOptions{Sandbox: sb, Session: s, Cwd: sub, Cols: 80, Rows: 24, Env: map[string]string{"PS1": "$ "}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	v, _ := p.Attach()
	var seen strings.Builder
	p.Write([]byte("pwd; touch ../up.txt && echo WROTE-$((6*7))\r"))
	readUntil(t, v, &seen, "WROTE-42")
	if !strings.Contains(seen.String(), "/sub") {
		t.Errorf("not started in sub: %q", seen.String())
	}
	if os.Geteuid() == 0 {
		want := s.UID
		for _, f := range []string{sub, filepath.Join(s.Workspace(), "up.txt")} {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != want {
				t.Errorf("%s belongs to %d, not the session's uid %d", f, uid, want)
			}
		}
	}
}

func TestPTYEndsWhenTheShellExits(t *testing.T) {
	p, _ := newPTY(t)
	p.Write([]byte("exit\r"))
	<-p.Done()
	if p.Alive() {
		t.Fatal("alive after exit")
	}
	if _, err := p.Write([]byte("x")); err == nil {
		t.Error("write after exit succeeded")
	}
}

func TestWorkspacePath(t *testing.T) {
	ws := t.TempDir()
	os.Symlink("/etc", filepath.Join(ws, "out"))
	for _, tc := range []struct {
		rel string
		ok  bool
	}{
		{"a.log", true}, {"logs/new/a.log", true}, {"/etc/passwd", false}, {"../x", false},
		{"a/../../x", false}, {"out/passwd", false}, {"out", false},
	} {
		_, err := WorkspacePath(ws, tc.rel)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.rel, err)
		}
	}
}

func TestEscapeControl(t *testing.T) {
	got := EscapeControl([]byte("ok\tline\n\x1b[31mred\x07\xff é"))
	if got != "ok\tline\n\\x1b[31mred\\x07\\xff é" {
		t.Errorf("%q", got)
	}
}

// The attack: ESC[65535b (REP) made the screen model print 65,535 cells
// for 8 bytes. Through a real shell on a real PTY, a flood of REPs and
// other counts is cut to the screen: REP prints at most a screen width,
// the screen shows what a terminal of this size shows, and read_screen
// answers with the final screen.
func TestPTYRepeatFloodIsClampedToTheScreen(t *testing.T) {
	// The whole CPU for the model: this test is about the work per byte, not
	// the time budget (under -race on a loaded machine 20% is slow to wait for).
	p, _ := newPTYOpts(t, PTYOptions{ModelBudget: modelWindow}) // 80x24
	v, _ := p.AttachQueue(1 << 20)                              // a viewer that may lag: the output is ~100 KB in small chunks
	var seen strings.Builder
	const floods = 2000
	// Each round: a REP, an insert, a scroll, tab walks, an erase, all with
	// the largest counts; then a clean screen with one REP line on it.
	p.Write([]byte(`for i in $(seq ` + "2000" + `); do printf 'x\033[65535b\033[65535@\033[65535S\033[65535I\033[65535Z\033[65535X\033[99999999999L'; done; ` +
		`printf '\033[2J\033[3;1Hy\033[65535bZ\033[6;1HDONE-%s\n' $((40+2))` + "\r"))
	readUntil(t, v, &seen, "DONE-42")
	screen := screenUntil(t, p, "DONE-42")
	rows := strings.Split(screen, "\n")
	// y and 80 repeats: 80 y's on row 3, the 81st y and Z wrapped to row 4.
	if len(rows) < 5 || rows[2] != strings.Repeat("y", 80) || !strings.HasPrefix(rows[3], "yZ") {
		t.Fatalf("screen:\n%s", screen)
	}
	st := p.ModelStats()
	// Every REP printed at most one screen width (80 cells; the command
	// line echoed holds none: its ESC is the text \033).
	if st.RepeatCells > (floods+1)*80 || st.RepeatCells < 80 {
		t.Fatalf("REP printed %d cells for %d sequences: %+v", st.RepeatCells, floods+1, st)
	}
	if st.Clamped < floods*6 {
		t.Fatalf("counts not clamped: %+v", st)
	}
	t.Logf("%+v", st)
}

// Attack: the recorded cwd is the session's choice — `cd /usr` in
// terminal_exec records /usr. A terminal opened there must not make that
// directory the run's writable directory: the sandbox binds the spec's Dir
// read-write and hands it (recursively) to the session's uid, which took
// host directories over. The terminal starts in it, nothing is handed.
func TestPTYInAForeignDirectoryTakesNothingOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the hand-over to the session's uid happens as root only")
	}
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: "0123456789abcdef0123456789abcdee", Name: "t", Dir: t.TempDir(), UID: 2_999_997}
	os.MkdirAll(s.Workspace(), 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	victim := filepath.Join(t.TempDir(), "host-dir") // root's, like /usr
	if err := os.MkdirAll(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := StartPTY(PTYOptions{Sandbox: sb, Session: s, Cwd: victim, Cols: 80, Rows: 24, Env: map[string]string{"PS1": "$ "}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	v, _ := p.Attach()
	var seen strings.Builder
	p.Write([]byte("echo IN-$((6*7))-$(pwd)\r"))
	readUntil(t, v, &seen, "IN-42-")
	for _, f := range []string{victim, filepath.Join(victim, "f")} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() == 0o700 {
			t.Fatalf("%s was handed to the session: uid %d mode %v", f, st.Uid, fi.Mode())
		}
	}
}

// A viewer that attaches while the terminal prints gets every chunk once:
// in its replay or on its channel, never in both and never in neither.
// The shell prints numbered lines while viewers attach one after another;
// each viewer's replay and what it then reads must hold each number once,
// in order, up to the last. (Keeping a chunk in the scrollback and sending
// it to the viewers were two steps: a viewer added between them got the
// chunk twice, and a reconnecting page drew it twice.)
func TestPTYViewerGetsEachChunkOnce(t *testing.T) {
	const lines = 10000
	p, _ := newPTYOpts(t, PTYOptions{ViewerQueue: 1 << 20})
	first, replay := p.Attach()
	var seen strings.Builder
	seen.Write(replay)
	readUntil(t, first, &seen, "$ ")
	fmt.Fprintf(p, "i=0; while [ $i -lt %d ]; do i=$((i+1)); echo L$i; done; echo END$((6*7))\r", lines)
	numbered := regexp.MustCompile(`L(\d+)\r\n`)
	type seenBy struct {
		i    int
		text string
	}
	done := make(chan seenBy)
	viewers := 0
	for {
		// Attach the next viewer as soon as the first has read on: each
		// one lands at another point of the output.
		b, ok := <-first.C
		if !ok {
			t.Fatal("the first viewer was closed")
		}
		seen.Write(b)
		if strings.Contains(seen.String(), "END42\r\n") {
			break
		}
		v, replay := p.Attach()
		viewers++
		go func(i int, v *Viewer, replay []byte) {
			var s strings.Builder
			s.Write(replay)
			for !strings.Contains(s.String(), "END42\r\n") {
				b, ok := <-v.C
				if !ok {
					break
				}
				s.Write(b)
			}
			p.Detach(v)
			done <- seenBy{i, s.String()}
		}(viewers, v, replay)
	}
	for range viewers {
		got := <-done
		want := 1
		for _, m := range numbered.FindAllStringSubmatch(got.text, -1) {
			if n, _ := strconv.Atoi(m[1]); n != want {
				i := strings.Index(got.text, m[0])
				t.Fatalf("viewer %d of %d: line L%d where L%d was due (a chunk twice or lost): %q", got.i, viewers, n, want, got.text[max(0, i-300):i+10])
			}
			want++
		}
		if want != lines+1 {
			t.Fatalf("viewer %d of %d: %d numbered lines, want %d", got.i, viewers, want-1, lines)
		}
	}
	t.Logf("%d viewers attached during the output", viewers)
}
