package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

func needBoxes(t *testing.T, a *App) {
	t.Helper()
	if !a.Sandbox.SessionBoxes() || os.Geteuid() != 0 {
		t.Skip("needs session boxes and root")
	}
}

// needEmbedded skips in a build without the embedded Python (-tags slim):
// the test is about the resident worker.
func needEmbedded(t *testing.T, _ *App) {
	t.Helper()
	if wantPython != "python/embedded" {
		t.Skip("no embedded Python in this build")
	}
}

func newSession(t *testing.T, a *App, name, network string) *SessionInfo {
	t.Helper()
	return mustCall(t, a, "create_session", CreateSessionInput{Name: name, Network: network}).(*SessionInfo)
}

func status(t *testing.T, a *App, id string) *SessionInfo {
	t.Helper()
	return mustCall(t, a, "get_session_status", SessionRef{Session: id}).(*SessionInfo)
}

// TestEverySessionProcessIsInItsBox: the resident shell, the Python
// worker and one-shot runs of a session share one pid namespace — its
// box's — and another session's differs.
func TestEverySessionProcessIsInItsBox(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "one", "")
	other := newSession(t, a, "two", "")
	ns := func(sess, lang, code string) string {
		res := runCode(t, a, RunCodeInput{Session: sess, Lang: lang, Code: code})
		if res.ExitCode != 0 {
			t.Fatalf("%s: %+v", lang, res)
		}
		return strings.TrimSpace(res.Stdout)
	}
	py := ns(s.ID, "python", "import os; print(os.readlink('/proc/self/ns/pid'))")
	sh := ns(s.ID, "sh", "readlink /proc/self/ns/pid")
	term := strings.TrimSpace(texec(t, a, s.ID, "readlink /proc/self/ns/pid").Output)
	if py != sh || sh != term {
		t.Errorf("one session, several pid namespaces: python %s, sh %s, terminal %s", py, sh, term)
	}
	if o := ns(other.ID, "sh", "readlink /proc/self/ns/pid"); o == sh {
		t.Errorf("two sessions share the pid namespace %s", o)
	}
	// The interactive terminal, started in a subdirectory of the
	// workspace (the shell's cwd), is spawned in the same box.
	texec(t, a, s.ID, "mkdir -p sub && cd sub")
	before := a.Sandbox.Box(s.ID).Procs()
	if _, err := a.OpenPTY(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if got := a.Sandbox.Box(s.ID).Procs(); got != before+1 {
		t.Errorf("the PTY's shell is not in the session's box: %d processes there, was %d", got, before)
	}
	if got := a.Sandbox.BoxStats().Outside; got != 0 {
		t.Errorf("%d runs did not fit their session's box", got)
	}
	st := status(t, a, s.ID)
	if st.Resources == nil || st.Resources.Processes < 2 || st.Resources.MemoryLimit == 0 || st.Resources.TasksLimit == 0 {
		t.Errorf("status resources %+v: want the shell and the worker, and the box's limits", st.Resources)
	}
}

// TestSessionNetworkEverywhere: the session's policy holds for the
// embedded Python worker, JS's fetch and shell runs alike: "host" reaches
// a loopback server of the host, "none" reaches nothing.
func TestSessionNetworkEverywhere(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello-from-host") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/"
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	codes := map[string]string{
		"python": "import urllib.request\nprint(urllib.request.urlopen(" + strconv.Quote(url) + ", timeout=10).read().decode())",
		"js":     "const r = await fetch(" + strconv.Quote(url) + "); console.log(await r.text())",
		"bash":   "exec 3<>/dev/tcp/127.0.0.1/" + port + " && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3",
	}
	for _, policy := range []string{"host", "none"} {
		s := newSession(t, a, "net-"+policy, policy)
		for lang, code := range codes {
			res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: lang, Code: code})
			reached := strings.Contains(res.Stdout, "hello-from-host")
			if policy == "host" && !reached {
				t.Errorf("%s with network host did not reach the host's loopback server: %+v", lang, res)
			}
			if policy == "none" && (reached || res.ExitCode == 0) {
				t.Errorf("%s with network none: %+v", lang, res)
			}
		}
	}
}

// TestSessionLoopbackUnderNone: a session without network has its box's
// loopback: a server that start_process leaves running is reached by the
// session's later shell, Python and bash runs; another session's box is
// another namespace, where the same port answers nothing, and the host's
// loopback is out of reach of both.
func TestSessionLoopbackUnderNone(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	host := sandboxtest.ListenHost(t, "hello-from-host")
	s := newSession(t, a, "loop-none", "none")
	other := newSession(t, a, "loop-other", "none")
	// The server says it listens through a FIFO: its write blocks until
	// the first run opens the FIFO, whose read blocks until the write.
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: "mkfifo ready"}); res.ExitCode != 0 {
		t.Fatalf("mkfifo: %+v", res)
	}
	srv := "import http.server\n" +
		"class H(http.server.BaseHTTPRequestHandler):\n" +
		" def do_GET(self):\n  self.send_response(200); self.end_headers(); self.wfile.write(b'hello-from-the-box')\n" +
		"s = http.server.HTTPServer(('127.0.0.1', 8765), H)\nopen('ready', 'w').write('up\\n')\ns.serve_forever()\n"
	mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", srv}, Background: true})
	for _, run := range []struct{ lang, code string }{
		{"bash", "read up < ready && exec 3<>/dev/tcp/127.0.0.1/8765 && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"},
		{"python", "import urllib.request\nprint(urllib.request.urlopen('http://localhost:8765/', timeout=10).read().decode())"},
	} {
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: run.lang, Code: run.code})
		if !strings.Contains(res.Stdout, "hello-from-the-box") {
			t.Errorf("%s in the server's session did not reach it: %+v", run.lang, res)
		}
	}
	res := runCode(t, a, RunCodeInput{Session: other.ID, Lang: "bash", Code: "exec 3<>/dev/tcp/127.0.0.1/8765 && cat <&3; echo rc=$?"})
	if strings.Contains(res.Stdout, "hello-from-the-box") || !strings.Contains(res.Stdout+res.Stderr, "refused") {
		t.Errorf("another session reached the server: %+v", res)
	}
	port := strconv.Itoa(host.Port)
	for _, id := range []string{s.ID, other.ID} {
		res := runCode(t, a, RunCodeInput{Session: id, Lang: "bash", Code: "exec 3<>/dev/tcp/127.0.0.1/" + port + " && cat <&3; echo rc=$?"})
		if strings.Contains(res.Stdout, "hello-from-host") || !strings.Contains(res.Stdout+res.Stderr, "refused") {
			t.Errorf("a none session reached the host's loopback: %+v", res)
		}
	}
	if n := host.Accepted.Load(); n != 0 {
		t.Errorf("the host's listener saw %d connections from none sessions", n)
	}
}

// findProc returns the host pid of the process of uid whose command line
// contains marker.
func findProc(t *testing.T, uid int, marker string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fi, err := os.Stat("/proc/" + e.Name())
		if err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != uid {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(b), marker) {
			return pid
		}
	}
	t.Fatalf("no process of uid %d runs %q", uid, marker)
	return 0
}

// TestBackgroundProcessIsTheSessionsUntilDestroy: a process a run left
// behind (setsid, out of its group) stays in the session's box: its memory
// counts against the session, and destroying the session kills it.
func TestBackgroundProcessIsTheSessionsUntilDestroy(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "bg", "")
	sess, err := a.Sessions.ByIDAnyTenant(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	// 150 MiB touched, then the run ends once the hog is ready (a FIFO,
	// no sleep): the hog is in its own session, so it outlives the run.
	const hog = "import time; x = bytearray(150 << 20); x[::4096] = b'1' * len(x[::4096]); open('ready', 'w').close(); open('go').read(); time.sleep(100000)  # quro-hog"
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "sh", Code: "mkfifo go; setsid python3 -c \"" + hog + "\" </dev/null >/dev/null 2>&1 & " +
		"echo > go; while [ ! -e ready ]; do :; done; echo started"})
	if strings.TrimSpace(res.Stdout) != "started" {
		t.Fatalf("run: %+v", res)
	}
	pid := findProc(t, sess.UID, "quro-hog")
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	st := status(t, a, s.ID)
	if st.Resources == nil || st.Resources.MemoryBytes < 150<<20 {
		t.Errorf("the session's memory does not count its background process: %+v", st.Resources)
	}
	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 30_000)
	for errors.Is(err, unix.EINTR) { // a signal to this thread (a child's SIGCHLD), not the exit
		n, err = unix.Poll(fds, 30_000)
	}
	if n != 1 || err != nil {
		t.Fatalf("the background process outlived its session's destroy: %v", err)
	}
}

// TestPauseAndResume: a paused session keeps its Python variables, shell
// state and running processes, answers its status without waking, and
// wakes on use.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	needEmbedded(t, a)
	s := newSession(t, a, "p", "")
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "x = 41"}); res.ExitCode != 0 {
		t.Fatal(res)
	}
	texec(t, a, s.ID, "mkdir -p sub; cd sub; export KEPT=yes; (while :; do :; done) & echo $! > spinner.pid")
	p := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult)
	if !p.Paused {
		t.Fatalf("pause: %+v", p)
	}
	bx := a.Sandbox.Box(s.ID)
	sess, err := a.Sessions.ByIDAnyTenant(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	v1Freezer := false
	if _, err := os.Stat("/sys/fs/cgroup/freezer/quro"); err == nil {
		v1Freezer = true
	}
	frozenTasks := func() {
		t.Helper()
		if !v1Freezer {
			return
		}
		// The v1 freezer shows each frozen task in state D: every process
		// of the session, the busy spinner too.
		pids := procsOfUID(sess.UID)
		if len(pids) < 3 {
			t.Errorf("only %d processes of the session found", len(pids))
		}
		for _, pid := range pids {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 0 && f[0] != "D" {
				t.Errorf("process %d of the paused session is in state %s, not frozen", pid, f[0])
			}
		}
	}
	frozenTasks()
	st := status(t, a, s.ID)
	frozenTasks()
	if st.Resources == nil || !st.Resources.Paused || !bx.Paused() {
		t.Errorf("status of a paused session: %+v; the status call must not wake it", st.Resources)
	}
	if _, err := call(t, a, "pause_session", SessionRef{Session: s.ID}); err != nil {
		t.Errorf("pausing a paused session: %v", err)
	}
	// Use wakes it, with everything where it was.
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print(x + 1)"}); strings.TrimSpace(res.Stdout) != "42" {
		t.Errorf("Python after resume: %+v", res)
	}
	if bx.Paused() {
		t.Error("still paused after a run")
	}
	out := texec(t, a, s.ID, "pwd; echo $KEPT; kill -0 $(cat spinner.pid) && echo spinning").Output
	if !strings.Contains(out, "/sub\nyes\nspinning") {
		t.Errorf("shell after resume: %q", out)
	}
	// And explicitly.
	mustCall(t, a, "pause_session", SessionRef{Session: s.ID})
	r := mustCall(t, a, "resume_session", SessionRef{Session: s.ID}).(*PauseResult)
	if r.Paused || bx.Paused() {
		t.Errorf("resume: %+v", r)
	}
}

// A command waiting for input in a paused session gets its answer:
// send_input resumes the box like any call that runs something.
func TestSendInputResumesAPausedSession(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "asks", "")
	res := mustCall(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "read x; echo got $x", TimeoutMS: 20000}).(*terminal.Result)
	if !res.WaitingForInput {
		t.Fatalf("the command does not wait for input: %+v", res)
	}
	mustCall(t, a, "pause_session", SessionRef{Session: s.ID})
	if bx := a.Sandbox.Box(s.ID); bx == nil || !bx.Paused() {
		t.Fatal("the session is not paused")
	}
	res = mustCall(t, a, "send_input", SendInputInput{Session: s.ID, Data: "hi\n", TimeoutMS: 20000}).(*terminal.Result)
	if res.Running || res.ExitCode != 0 || !strings.Contains(res.Output, "got hi") {
		t.Fatalf("the answer to a paused session's command: %+v", res)
	}
	if a.Sandbox.Box(s.ID).Paused() {
		t.Error("still paused after send_input")
	}
}

// procsOfUID are the host pids whose real uid is uid (from their status:
// a process that is not dumpable has a /proc directory owned by root).
func procsOfUID(uid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f, ok := strings.CutPrefix(line, "Uid:"); ok {
				if fs := strings.Fields(f); len(fs) > 0 && fs[0] == strconv.Itoa(uid) {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}

// TestPauseRefusedDuringACall: a call in flight is never frozen.
func TestPauseRefusedDuringACall(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "busy", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := []byte(`{"session":"` + s.ID + `","lang":"sh","code":"mkfifo f; echo > started; cat f"}`)
		close(started)
		a.Controller.Call(ctx, admin, "run_code", b)
	}()
	<-started
	// Wait until the run is in flight: the FIFO's writer end opens.
	for a.lives.Calls(s.ID) == 0 {
		select {
		case <-done:
			t.Fatal("the run ended early")
		default:
		}
		runtime.Gosched()
	}
	_, err := call(t, a, "pause_session", SessionRef{Session: s.ID})
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.Busy {
		t.Errorf("pause during a call: %v, want busy", err)
	}
	cancel()
	<-done
}

// TestPauseWithStreamsOpen: calls that only follow a running process
// (start_process's own stream, connect_process) or watch the workspace
// (watch_dir) do not hold off a pause, as on E2B: they stay attached to
// the frozen box and go on once it resumes.
func TestPauseWithStreamsOpen(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s := newSession(t, a, "streams", "")
	start := startStream(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Stdin: true,
		Cmd: "sh", Args: []string{"-c", `echo early; while read x; do echo "got $x"; done; echo eof`}})
	pid := start.pid(t)
	start.out.waitFor(t, "stdout", "early\n", start.done)
	if bx := a.Sandbox.Box(s.ID); bx == nil || !bx.CanPause() {
		t.Skip("this machine cannot freeze a box")
	}
	conn := startStream(t, a, admin, "connect_process", ProcessSelector{Session: s.ID, Pid: pid})
	conn.pid(t)
	watchCtx, stopWatch := context.WithCancel(runcode.WithOutput(context.Background(), func(string, []byte) {}))
	defer stopWatch()
	watched := make(chan error, 1)
	go func() {
		_, err := a.Controller.Call(watchCtx, admin, "watch_dir", json.RawMessage(`{"session":"`+s.ID+`"}`))
		watched <- err
	}()
	waitFor(t, "three streams open", func() bool { return a.lives.Calls(s.ID) == 3 })

	p := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult)
	if !p.Paused || !a.Sandbox.Box(s.ID).Paused() {
		t.Fatalf("pause with streams open: %+v", p)
	}
	select {
	case <-start.done:
		t.Fatalf("start_process's stream ended at the pause: %+v %v", start.res, start.err)
	case <-conn.done:
		t.Fatalf("connect_process's stream ended at the pause: %+v %v", conn.res, conn.err)
	case err := <-watched:
		t.Fatalf("watch_dir ended at the pause: %v", err)
	default:
	}
	// Resumed, the process and both of its streams go on.
	mustCall(t, a, "resume_session", SessionRef{Session: s.ID})
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: pid}, Data: "hello\n"})
	start.out.waitFor(t, "stdout", "got hello\n", start.done)
	conn.out.waitFor(t, "stdout", "got hello\n", conn.done)
	mustCall(t, a, "close_process_stdin", ProcessSelector{Session: s.ID, Pid: pid})
	if res := start.wait(t); res.Running || res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, "eof\n") {
		t.Fatalf("start_process after the pause: %+v", res)
	}
	conn.wait(t)
	stopWatch()
	<-watched
}

// TestPrestartedWorker: with PrestartPython, create_session starts the
// session's worker in its box, and the first run uses that worker.
func TestPrestartedWorker(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Network: hostAllowed, PrestartPython: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	needEmbedded(t, a)
	s := newSession(t, a, "pre", "")
	res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "import os; print(os.readlink('/proc/self/ns/pid'))"})
	if res.ExitCode != 0 {
		t.Fatal(res)
	}
	if n := a.Python.Sessions(); n != 1 {
		t.Errorf("%d workers, want the prestarted one only", n)
	}
	if st := status(t, a, s.ID); st.Resources == nil || st.Resources.Processes != 1 {
		t.Errorf("status %+v: want one process (the worker) in the box", st.Resources)
	}
	sh := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "sh", Code: "readlink /proc/self/ns/pid"})
	if sh.Stdout != res.Stdout {
		t.Errorf("the prestarted worker is not in the session's box: %q vs %q", res.Stdout, sh.Stdout)
	}
	// A session destroyed while its worker is being prestarted leaves no box.
	d := newSession(t, a, "gone", "")
	mustCall(t, a, "destroy_session", SessionRef{Session: d.ID})
	a.Python.Close() // waits for the prestart
	if bx := a.Sandbox.Box(d.ID); bx != nil {
		t.Error("a destroyed session's prestarted worker left its box open")
	}
}

// TestDestroyEndsTheCallsInFlight: destroying a session while a terminal
// command (deaf to SIGINT) and a run are in flight in it cancels them and
// waits for them: when destroy_session returns, both have returned — the
// terminal call with a clear "destroyed" error (not found) —, nothing of
// the session runs, and a call that looked the session up before the
// destroy is refused instead of running in it.
func TestDestroyEndsTheCallsInFlight(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	ctx := context.Background()
	s := newSession(t, a, "doomed", "")
	sess, err := a.Sessions.ByIDAnyTenant(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	texec(t, a, s.ID, "true") // the box and its shell
	for _, f := range []string{"term", "run"} {
		p := filepath.Join(sess.Workspace(), f)
		if err := syscall.Mkfifo(p, 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o666)
	}
	type answer struct {
		reply *controller.Reply
		err   error
	}
	start := func(name, args string) chan answer {
		c := make(chan answer, 1)
		go func() {
			r, err := a.Controller.Call(ctx, admin, name, json.RawMessage(args))
			c <- answer{r, err}
		}()
		return c
	}
	term := start("terminal_exec", `{"session":"`+s.ID+`","command":"echo > term; trap '' INT; sleep 1000","timeout_ms":300000}`)
	run := start("run_code", `{"session":"`+s.ID+`","lang":"sh","code":"echo > run; trap '' INT TERM; sleep 1000","timeout_ms":300000}`)
	// Both are in flight once their command wrote to its FIFO (read to
	// the end: a writer left without a reader dies of SIGPIPE).
	for _, f := range []string{"term", "run"} {
		if _, err := os.ReadFile(filepath.Join(sess.Workspace(), f)); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.lives.Calls(s.ID); n != 2 {
		for name, c := range map[string]chan answer{"terminal_exec": term, "run_code": run} {
			select {
			case got := <-c:
				t.Errorf("%s answered before the destroy: %v %+v", name, got.err, got.reply)
			default:
			}
		}
		t.Fatalf("%d calls in flight, want 2", n)
	}

	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	var ce *capability.Error
	select {
	case got := <-term:
		if !errors.As(got.err, &ce) || ce.Code != capability.NotFound || !strings.Contains(ce.Message, "destroyed") {
			t.Errorf("terminal_exec under destroy: %v %+v", got.err, got.reply)
		}
	default:
		t.Error("destroy_session returned while terminal_exec still ran")
	}
	select {
	case got := <-run:
		t.Logf("run_code under destroy: %v %+v", got.err, got.reply)
	default:
		t.Error("destroy_session returned while run_code still ran")
	}
	// The destroy answered once the box's init was sent SIGKILL; its
	// exit and its cgroup's removal go on in the background, which this
	// waits for (the release after them waits for the box's end).
	a.Sessions.WaitReleases()
	if left := procsOfUID(sess.UID); len(left) > 0 {
		t.Errorf("processes of the session still run after its destroy's teardown: %v", left)
	}
	if a.Sandbox.Box(s.ID) != nil {
		t.Error("the session still has a box")
	}
	// A call that looked the session up before the destroy.
	if _, _, err := a.lives.EnterSession(ctx, sess, capability.UseBusy); !errors.As(err, &ce) || ce.Code != capability.NotFound {
		t.Errorf("a call on the destroyed session: %v", err)
	}
	if a.lives.Calls(s.ID) != 0 {
		t.Errorf("%d calls still counted", a.lives.Calls(s.ID))
	}
}

// TestDestroyForgetsTheSessionsTenant: what the App keeps per session goes
// with the session (the map of session ids to tenants grew with every
// session a server ever had).
func TestDestroyForgetsTheSessionsTenant(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	count := func() int {
		a.tenants.mu.Lock()
		defer a.tenants.mu.Unlock()
		return len(a.tenants.ofID)
	}
	before := count()
	for i := range 3 {
		s := newSession(t, a, fmt.Sprintf("gone%d", i), "")
		if res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "sh", Code: "true"}); res.ExitCode != 0 {
			t.Fatalf("run: %+v", res)
		}
		mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	}
	if n := count(); n != before {
		t.Fatalf("%d session tenants kept after their sessions were destroyed (%d before)", n, before)
	}
}

// Every process of a session sees its workspace at /home/user too (E2B's
// home): the shell, Python and what they start; and only its own.
func TestWorkspaceIsAlsoHomeUser(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	s1 := newSession(t, a, "home-1", "")
	s2 := newSession(t, a, "home-2", "")
	mustCall(t, a, "write_file", WriteFileInput{Session: s1.ID, Path: "mine.txt", Content: "one"})
	mustCall(t, a, "write_file", WriteFileInput{Session: s2.ID, Path: "mine.txt", Content: "two"})
	if r := texec(t, a, s1.ID, "cat /home/user/mine.txt && echo made > /home/user/from-shell"); !strings.HasPrefix(r.Output, "one") {
		t.Fatalf("shell: %+v", r)
	}
	res := runCode(t, a, RunCodeInput{Session: s2.ID, Lang: "python", Code: "print(open('/home/user/mine.txt').read())"})
	if strings.TrimSpace(res.Stdout) != "two" {
		t.Fatalf("python in the second session: %+v", res)
	}
	got := mustCall(t, a, "read_file", ReadFileInput{Session: s1.ID, Path: "from-shell"}).(*FileContent)
	if strings.TrimSpace(got.Content) != "made" {
		t.Fatalf("a write to /home/user is not in the workspace: %+v", got)
	}
}

// A freeze the kernel did not finish in time (the box was thawed again)
// is unavailable with a Retry-After and a message saying to retry and
// that the session runs on; E2B's pause answers it as 503, which the SDKs
// raise as ServiceBusyError ("please retry"). Another failure of the
// freezer stays unavailable without a hint to retry.
func TestPauseStalledIsRetryable(t *testing.T) {
	t.Parallel()
	s := &session.Session{ID: "0123456789abcdef0123456789abcdef"}
	stalled := fmt.Errorf("%w: cgroup freezer: not FROZEN after 10s (not in the freezer: dd (D io_schedule))", sandbox.ErrFreezeStalled)
	var ce *capability.Error
	if !errors.As(pauseFailed(s, stalled), &ce) || ce.Code != capability.Unavailable || ce.RetryAfter <= 0 ||
		!strings.Contains(ce.Message, "retry") || !strings.Contains(ce.Message, "runs on") || !errors.Is(ce, sandbox.ErrFreezeStalled) {
		t.Errorf("a stalled freeze: %+v", ce)
	}
	if !errors.As(pauseFailed(s, errors.New("cgroup freezer: permission denied")), &ce) || ce.Code != capability.Unavailable || ce.RetryAfter != 0 {
		t.Errorf("another freezer failure: %+v", ce)
	}
}
