package app

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
	"github.com/quro-dev/quro/internal/soak"
	"github.com/quro-dev/quro/internal/terminal"
	"golang.org/x/sys/unix"
)

func mustCall(t testing.TB, a *App, name string, args any) any {
	t.Helper()
	reply, err := call(t, a, name, args)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return reply.Output
}

func texec(t testing.TB, a *App, session, cmd string) *terminal.Result {
	t.Helper()
	return mustCall(t, a, "terminal_exec", TerminalExecInput{Command: cmd, Session: session}).(*terminal.Result)
}

func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	info := mustCall(t, a, "create_session", CreateSessionInput{Name: "work"}).(*SessionInfo)
	if len(info.ID) != 32 || info.Alive || info.Network != "none" {
		t.Fatalf("%+v", info)
	}
	if res := texec(t, a, "work", "mkdir -p proj && cd proj && echo hi"); res.Output != "hi\n" || !strings.HasSuffix(res.Cwd, "/proj") {
		t.Fatalf("%+v", res)
	}
	st := mustCall(t, a, "get_session_status", SessionRef{Session: "work"}).(*SessionInfo)
	if !st.Alive || st.Busy || st.Mode != "pipe" || !strings.HasSuffix(st.Cwd, "/proj") || st.LastExit != 0 {
		t.Fatalf("%+v", st)
	}
	list := mustCall(t, a, "list_sessions", Empty{}).(*SessionList)
	if len(list.Sessions) != 2 {
		t.Fatalf("%d sessions", len(list.Sessions))
	}
	mustCall(t, a, "set_default_session", SessionRef{Session: "work"})
	if res := texec(t, a, "", "pwd"); !strings.HasSuffix(res.Output, "/proj\n") {
		t.Fatalf("default did not switch: %+v", res)
	}
	// destroy kills everything, including a process that left the shell's group
	res := texec(t, a, "work", "setsid nohup sleep 1000 >/dev/null 2>&1 & echo $!")
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	pid, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil {
		t.Fatalf("pid from %q: %v", res.Output, err)
	}
	pid = hostPID(t, a, pid, info.Workspace)
	mustCall(t, a, "destroy_session", SessionRef{Session: "work"})
	waitExit(t, pid)
	a.Sessions.WaitReleases() // the workspace goes in the destroy's background release
	if _, err := os.Stat(info.Workspace); !os.IsNotExist(err) {
		t.Errorf("workspace survived destroy: %v", err)
	}
	_, err = call(t, a, "get_session_status", SessionRef{Session: "work"})
	wantCode(t, err, capability.NotFound) // the destroyed session is gone
	// a fresh default session takes over
	if res := texec(t, a, "", "echo back"); res.Output != "back\n" {
		t.Fatalf("%+v", res)
	}
}

// waitExit waits on a pidfd until pid has terminated.
func waitExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("process %d survived its session (%v)", pid, err)
		}
		return
	}
}

func TestEnvAppliesToShellAndRunCode(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	texec(t, a, "", "true") // a running shell must see the change too
	v := "hello world"
	out := mustCall(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{"GREETING": &v}}).(*EnvOutput)
	if out.Env["GREETING"] != v {
		t.Fatalf("%+v", out)
	}
	if res := texec(t, a, "", `echo "$GREETING"`); res.Output != v+"\n" {
		t.Fatalf("shell: %q", res.Output)
	}
	if res := runCode(t, a, RunCodeInput{Code: "import os; print(os.environ['GREETING'])"}); res.Stdout != v+"\n" {
		t.Fatalf("python: %+v", res)
	}
	mustCall(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{"GREETING": nil}})
	if res := texec(t, a, "", `echo "${GREETING:-gone}"`); res.Output != "gone\n" {
		t.Fatalf("unset: %q", res.Output)
	}
	got := mustCall(t, a, "get_session_env", SessionRef{}).(*EnvOutput)
	if len(got.Env) != 0 {
		t.Fatalf("%+v", got)
	}
	for _, bad := range []string{"1X", "A-B", "A B", ""} {
		if _, err := call(t, a, "set_session_env", SetEnvInput{Env: map[string]*string{bad: &v}}); err == nil {
			t.Errorf("variable name %q accepted", bad)
		}
	}
}

func TestSessionsSurviveARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, err := New(context.Background(), dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	mustCall(t, a, "create_session", CreateSessionInput{Name: "keep"})
	v := "1"
	mustCall(t, a, "set_session_env", SetEnvInput{Session: "keep", Env: map[string]*string{"KEEP": &v}})
	texec(t, a, "keep", "mkdir -p a/b && cd a/b && echo data > f.txt")
	a.Close()

	b, err := New(context.Background(), dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st := mustCall(t, b, "get_session_status", SessionRef{Session: "keep"}).(*SessionInfo)
	if st.Alive || !strings.HasSuffix(st.Cwd, "/a/b") {
		t.Fatalf("after restart: %+v", st)
	}
	if res := texec(t, b, "keep", "pwd; cat f.txt; echo $KEEP"); !strings.HasSuffix(res.Output, "/a/b\ndata\n1\n") {
		t.Fatalf("revived session: %q", res.Output)
	}
}

func TestTerminalExecBadInput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, tc := range []struct {
		args string
		code capability.Code
	}{
		{`{"command":""}`, capability.InvalidArgument},
		{`{"command":"a\u0000b"}`, capability.InvalidArgument},
		{`{"command":"true","session":"ghost"}`, capability.NotFound},
		{`{"command":"true","timeout_ms":-1}`, capability.InvalidArgument},
		{`{"cmd":"true"}`, capability.InvalidArgument},
	} {
		_, err := a.Controller.Call(context.Background(), admin, "terminal_exec", json.RawMessage(tc.args))
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != tc.code {
			t.Errorf("%s: %v, want %s", tc.args, err, tc.code)
		}
	}
	// waiting for input, then answered
	res := texec(t, a, "", "read x")
	if !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	res = mustCall(t, a, "send_input", SendInputInput{Data: "v\n"}).(*terminal.Result)
	if res.Running || res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	if _, err := call(t, a, "send_input", SendInputInput{Data: "x"}); err == nil {
		t.Fatal("send_input with nothing waiting succeeded")
	}
}

func TestScreenAndLogExport(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	texec(t, a, "", "printf 'plain \\033[31mred\\033[0m\\n'")
	out := mustCall(t, a, "export_session_log", ExportLogInput{Path: "logs/session.log"}).(*Done)
	def, _ := a.Sessions.Get(context.Background(), "")
	b, err := os.ReadFile(filepath.Join(def.Workspace(), out.Message))
	if err != nil || !strings.Contains(string(b), `plain \x1b[31mred\x1b[0m`) {
		t.Fatalf("log %q: %q %v", out.Message, b, err)
	}
	if _, err := call(t, a, "export_session_log", ExportLogInput{Path: "../escape.log"}); err == nil {
		t.Fatal("log written outside the workspace")
	}
	scr := mustCall(t, a, "read_screen", SessionRef{}).(*Screen)
	if scr.Cols == 0 || scr.Rows == 0 {
		t.Fatalf("%+v", scr)
	}
}

func TestPatrolRestartsTheDefaultShellAndReapsOrphans(t *testing.T) {
	a := newApp(t, nil)
	res := texec(t, a, "", "echo $$")
	pid, _ := strconv.Atoi(strings.TrimSpace(res.Output))
	def, _ := a.Sessions.Default(context.Background())
	// kill the default shell from outside
	pid = hostPID(t, a, pid, def.Workspace())
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
	sh, _ := a.Terminals.Shell(def)
	<-sh.Done()
	rep := a.Terminals.PatrolOnce(context.Background(), a.patrolHooks())
	if !rep.RestartedDefault || !sh.Status().Alive {
		t.Fatalf("%+v alive=%v", rep, sh.Status().Alive)
	}
	// a leftover directory of a session that no longer exists, with a process in it
	ghost := filepath.Join(a.DataDir, "sessions", "ffffffffffffffffffffffffffffffff", "workspace")
	os.MkdirAll(ghost, 0o755)
	var opid int
	if a.Sandbox.Boxed() {
		// A box sees no other session's directory and its processes die
		// with it; the patrol's reaping is for what runs on the host.
		cmd := exec.Command("sleep", "1000")
		cmd.Dir = ghost
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		opid = cmd.Process.Pid
	} else {
		orphan := texec(t, a, "", "cd "+ghost+" && (setsid sleep 1000 >/dev/null 2>&1 & echo $!)")
		opid, _ = strconv.Atoi(strings.TrimSpace(orphan.Output))
	}
	rep = a.Terminals.PatrolOnce(context.Background(), a.patrolHooks())
	if rep.KilledOrphans < 1 {
		t.Fatalf("%+v", rep)
	}
	waitExit(t, opid)
}

// Commands in one session leave no goroutine or file descriptor behind: a
// leak of one per command, or one per few dozen, shows as more than the
// slack of 2 after 150; the soak run (make test-soak) repeats it 10,000
// times for a rarer leak. (150, not the 500 it was: the count is the
// test's cost, serial, over 2 minutes of make test on a loaded machine,
// and a leak rarer than one in 50 commands is the soak run's to find.)
func TestManyCommandsLeaveNoGoroutinesOrFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("150 commands")
	}
	manyCommandsLeaveNothing(t, 150)
}

func TestSoakManyCommandsLeaveNoGoroutinesOrFiles(t *testing.T) {
	soak.Skip(t)
	manyCommandsLeaveNothing(t, 10_000)
}

func manyCommandsLeaveNothing(t *testing.T, n int) {
	a := newApp(t, nil)
	texec(t, a, "", "true")
	runtime.GC()
	g0, f0 := runtime.NumGoroutine(), countFDs(t)
	for i := 0; i < n; i++ {
		if res := texec(t, a, "", "echo "+strconv.Itoa(i)); res.Output != strconv.Itoa(i)+"\n" {
			t.Fatalf("command %d: %+v", i, res)
		}
	}
	runtime.GC()
	g1, f1 := runtime.NumGoroutine(), countFDs(t)
	if g1 > g0+2 || f1 > f0+2 {
		t.Fatalf("goroutines %d -> %d, fds %d -> %d", g0, g1, f0, f1)
	}
}

func countFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// hostPID returns the host pid of the process that code in a session saw as
// pid: the same number without a box; in a box, the process whose innermost
// pid is pid and whose working directory lies in the session's workspace.
func hostPID(t *testing.T, a *App, pid int, workspace string) int {
	t.Helper()
	if !a.Sandbox.Boxed() {
		return pid
	}
	hp, ok := sandboxtest.HostPID(pid, workspace)
	if !ok {
		t.Fatalf("no process %d of the box in %s", pid, workspace)
	}
	return hp
}
