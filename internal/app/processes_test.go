package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/runcode"
)

// output collects what a streaming process call reports, and tells on
// a channel whenever something arrived.
type output struct {
	mu      sync.Mutex
	streams map[string]*strings.Builder
	more    chan struct{}
}

func newOutput() *output {
	return &output{streams: map[string]*strings.Builder{}, more: make(chan struct{}, 1)}
}

func (o *output) fn(stream string, p []byte) {
	o.mu.Lock()
	if o.streams[stream] == nil {
		o.streams[stream] = &strings.Builder{}
	}
	o.streams[stream].Write(p)
	o.mu.Unlock()
	select {
	case o.more <- struct{}{}:
	default:
	}
}

func (o *output) get(stream string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if b := o.streams[stream]; b != nil {
		return b.String()
	}
	return ""
}

// waitFor waits until stream holds sub (or the call ends: then fails).
func (o *output) waitFor(t *testing.T, stream, sub string, ended <-chan struct{}) {
	t.Helper()
	for !strings.Contains(o.get(stream), sub) {
		select {
		case <-o.more:
		case <-ended:
			if !strings.Contains(o.get(stream), sub) {
				t.Fatalf("the call ended without %q in %s: %q", sub, stream, o.get(stream))
			}
		}
	}
}

// streamCall runs a streaming process capability in the background:
// started is closed with the pid once the process runs (or is attached),
// done once the call has returned.
type streamCall struct {
	out     *output
	started chan int
	done    chan struct{}
	res     *ProcessResult
	err     error
	cancel  context.CancelFunc
}

func startStream(t *testing.T, a *App, c controller.Caller, name string, args any) *streamCall {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	sc := &streamCall{out: newOutput(), started: make(chan int, 1), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	sc.cancel = cancel
	t.Cleanup(cancel)
	ctx = runcode.WithOutput(ctx, sc.out.fn)
	ctx = runcode.WithStarted(ctx, func(pid int) { sc.started <- pid })
	go func() {
		defer close(sc.done)
		reply, err := a.Controller.Call(ctx, c, name, b)
		sc.err = err
		if err == nil {
			sc.res = reply.Output.(*ProcessResult)
		}
	}()
	return sc
}

// pid waits for the start (or attach) and returns the pid.
func (sc *streamCall) pid(t *testing.T) int {
	t.Helper()
	select {
	case pid := <-sc.started:
		return pid
	case <-sc.done:
		t.Fatalf("the call ended before the process ran: %v", sc.err)
	}
	return 0
}

func (sc *streamCall) wait(t *testing.T) *ProcessResult {
	t.Helper()
	<-sc.done
	if sc.err != nil {
		t.Fatalf("call: %v", sc.err)
	}
	return sc.res
}

func codeOf(err error) capability.Code {
	var ce *capability.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// TestProcessOutlivesItsCall: a process whose starting call goes away
// runs on; connect_process sees only what it prints after attaching;
// its stdin is a pipe kept open until close_process_stdin (EOF), and it
// leaves the table when it ends.
func TestProcessOutlivesItsCall(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "p", "")
	start := startStream(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Tag: "echoer", Stdin: true,
		Cmd: "sh", Args: []string{"-c", `echo early; read x; echo "got $x"; cat; echo eof`}})
	pid := start.pid(t)
	start.out.waitFor(t, "stdout", "early\n", start.done)
	start.cancel() // the caller goes away
	res := start.wait(t)
	if !res.Running || res.Pid != pid {
		t.Fatalf("start_process after its caller left: %+v", res)
	}
	list := mustCall(t, a, "list_processes", SessionRef{Session: s.ID}).(*ProcessList)
	if len(list.Processes) != 1 || list.Processes[0].Pid != pid || list.Processes[0].Tag != "echoer" || list.Processes[0].Config.Cmd != "sh" {
		t.Fatalf("list_processes: %+v", list.Processes)
	}

	conn := startStream(t, a, admin, "connect_process", ProcessSelector{Session: s.ID, Tag: "echoer"})
	if got := conn.pid(t); got != pid {
		t.Fatalf("connect by tag found pid %d, want %d", got, pid)
	}
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: pid}, Data: "hello\n"})
	conn.out.waitFor(t, "stdout", "got hello\n", conn.done)
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: pid}, DataBase64: "cmF3IGJ5dGVzCg=="})
	conn.out.waitFor(t, "stdout", "raw bytes\n", conn.done)
	mustCall(t, a, "close_process_stdin", ProcessSelector{Session: s.ID, Pid: pid})
	end := conn.wait(t)
	if end.Running || end.ExitCode != 0 || !end.Exited || end.Status != "exit status 0" || end.Error != "" {
		t.Fatalf("end after EOF: %+v", end)
	}
	if got := conn.out.get("stdout"); strings.Contains(got, "early") || got != "got hello\nraw bytes\neof\n" {
		t.Fatalf("connect_process saw %q: want only what came after it attached", got)
	}
	_, err := call(t, a, "connect_process", ProcessSelector{Session: s.ID, Pid: pid})
	if codeOf(err) != capability.NotFound {
		t.Fatalf("connect to an ended process: %v", err)
	}
	if list := mustCall(t, a, "list_processes", SessionRef{Session: s.ID}).(*ProcessList); len(list.Processes) != 0 {
		t.Fatalf("an ended process is still listed: %+v", list.Processes)
	}
}

// TestProcessEnds: exit codes, SIGKILL and the timeout, in envd's words.
func TestProcessEnds(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "e", "")
	res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sh", Args: []string{"-c", "echo out; echo err >&2; exit 3"}}).(*ProcessResult)
	if res.ExitCode != 3 || !res.Exited || res.Status != "exit status 3" || res.Error != "exit status 3" || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("exit 3: %+v", res)
	}

	// The pid is the one the process has in its box.
	sc := startStream(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Cmd: "sh", Args: []string{"-c", "echo $$; exec sleep 100000"}})
	pid := sc.pid(t)
	sc.out.waitFor(t, "stdout", "\n", sc.done)
	if got := strings.TrimSpace(sc.out.get("stdout")); got != fmt.Sprint(pid) {
		t.Fatalf("the process says its pid is %s; start_process said %d", got, pid)
	}
	mustCall(t, a, "signal_process", SignalProcessInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: pid}, Signal: "SIGKILL"})
	res = sc.wait(t)
	if res.ExitCode != -1 || res.Exited || res.Status != "signal: killed" || res.Error != "signal: killed" {
		t.Fatalf("after SIGKILL: %+v", res)
	}

	res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sleep", Args: []string{"100000"}, TimeoutMS: 100}).(*ProcessResult)
	if res.ExitCode != -1 || res.Status != "signal: killed" {
		t.Fatalf("after its timeout: %+v", res)
	}

	// A working directory is entered in the box; one the box has not is
	// refused before anything starts (envd's invalid_argument), without
	// boxes it fails the process, not the server.
	res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "pwd", Cwd: "/tmp"}).(*ProcessResult)
	if res.Stdout != "/tmp\n" || res.ExitCode != 0 {
		t.Fatalf("cwd /tmp: %+v", res)
	}
	if a.Sandbox.Boxed() {
		res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sh", Args: []string{"-c", `pwd; echo "$HOME"; mkdir sub`}}).(*ProcessResult)
		if res.Stdout != "/home/user\n/home/user\n" {
			t.Fatalf("default directory and HOME: %+v", res)
		}
		res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "pwd", Cwd: "sub"}).(*ProcessResult)
		if res.Stdout != "/home/user/sub\n" {
			t.Fatalf("relative cwd: %+v", res)
		}
	}
	if a.Sandbox.Boxed() {
		_, err := call(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "pwd", Cwd: "/nowhere"})
		if codeOf(err) != capability.InvalidArgument || !strings.Contains(err.Error(), "cwd /nowhere does not exist") {
			t.Fatalf("cwd /nowhere: %v", err)
		}
	} else {
		res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "pwd", Cwd: "/nowhere"}).(*ProcessResult)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "/nowhere") {
			t.Fatalf("cwd /nowhere: %+v", res)
		}
	}
	_, err := call(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "true", Env: map[string]string{"LD_PRELOAD": "/x.so"}})
	if codeOf(err) != capability.InvalidArgument {
		t.Fatalf("LD_PRELOAD: %v", err)
	}
}

// TestProcessLimitAndDestroy: a session runs at most proc.DefaultMax
// processes; destroying it ends every one.
func TestProcessLimitAndDestroy(t *testing.T) {
	t.Parallel()
	// The start window (whether a background start fails at once) is
	// not what this test checks: each of its 64 sleeps would wait it out.
	a := newAppWindow(t, time.Millisecond)
	s := newSession(t, a, "lim", "")
	ns := boxPidNS(t, a, s.ID)
	// A sleep no other test runs.
	forever := fmt.Sprintf("%d.%d", 100000+rand.IntN(100000), os.Getpid())
	for i := range proc.DefaultMax {
		res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sleep", Args: []string{forever}, Background: true, Tag: fmt.Sprint(i)}).(*ProcessResult)
		if !res.Running {
			t.Fatalf("background start: %+v", res)
		}
	}
	_, err := call(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "true"})
	if codeOf(err) != capability.ResourceExhausted || !strings.Contains(err.Error(), "signal_process") {
		t.Fatalf("process %d: %v", proc.DefaultMax+1, err)
	}
	// Another session has its own count.
	other := newSession(t, a, "other", "")
	if res := mustCall(t, a, "start_process", StartProcessInput{Session: other.ID, Cmd: "true"}).(*ProcessResult); res.ExitCode != 0 {
		t.Fatalf("other session: %+v", res)
	}

	// Every process ran in its session's box: none had a box of its own,
	// which a destroy of the session does not end.
	if o := a.Sandbox.BoxStats().Outside; o != 0 {
		t.Fatalf("%d runs got a box of their own outside their session's", o)
	}
	var pidfds []int
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	for _, info := range a.procs.List(s.ID) {
		fd, err := unix.PidfdOpen(hostPid(t, a, ns, info.Pid), 0)
		if err != nil {
			t.Fatal(err)
		}
		pidfds = append(pidfds, fd)
	}
	mustCall(t, a, "destroy_session", SessionRef{Session: s.ID})
	for _, fd := range pidfds {
		if err := awaitExit(t, fd); err != nil {
			t.Fatalf("a process outlived its session's destroy: %v", err)
		}
	}
	if n := len(a.procs.List(s.ID)); n != 0 {
		t.Fatalf("%d processes left in the table of a destroyed session", n)
	}
}

// TestProcessesAcrossTenantsAndSessions: the attack — guess the pids and
// tags of another session's and another tenant's processes and act on
// them — finds nothing, and the process runs on.
func TestProcessesAcrossTenantsAndSessions(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	alice := controller.Caller{Path: "test", Tenant: "alice", Scope: capability.ScopeExec}
	bob := controller.Caller{Path: "test", Tenant: "bob", Scope: capability.ScopeExec}
	mk := func(c controller.Caller, name string) string {
		reply, err := callAs(t, a, c, "create_session", CreateSessionInput{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return reply.Output.(*SessionInfo).ID
	}
	sa := mk(alice, "a1")
	sa2 := mk(alice, "a2")
	sb := mk(bob, "b1")
	victim := startStream(t, a, alice, "start_process", StartProcessInput{Session: sa, Cmd: "sleep", Args: []string{"100000"}, Tag: "secret"})
	pid := victim.pid(t)
	// Bob's own session gets a process too, so his table is not empty.
	mine := mustCallAs(t, a, bob, "start_process", StartProcessInput{Session: sb, Cmd: "sleep", Args: []string{"100000"}, Background: true}).(*ProcessResult)

	type try struct {
		who     controller.Caller
		session string
	}
	confined := alice
	confined.Session = sa2 // code in alice's other session
	for _, tr := range []try{{bob, sb}, {bob, sa}, {alice, sa2}, {confined, sa}, {confined, ""}} {
		for _, sel := range []ProcessSelector{{Pid: pid}, {Tag: "secret"}, {Pid: mine.Pid}} {
			sel.Session = tr.session
			if tr.who.Tenant == "bob" && sel.Pid == mine.Pid && tr.session == sb {
				continue // bob's own
			}
			for name, args := range map[string]any{
				"signal_process":      SignalProcessInput{ProcessSelector: sel, Signal: "SIGKILL"},
				"send_process_input":  ProcessInputInput{ProcessSelector: sel, Data: "x"},
				"close_process_stdin": sel,
				"resize_process":      ResizeProcessInput{ProcessSelector: sel, Cols: 10, Rows: 10},
				"connect_process":     sel,
			} {
				_, err := callAs(t, a, tr.who, name, args)
				if codeOf(err) != capability.NotFound {
					t.Errorf("%s as %s/%q on %+v: %v (want not_found)", name, tr.who.Tenant, tr.who.Session, sel, err)
				}
			}
		}
		reply, err := callAs(t, a, tr.who, "list_processes", SessionRef{Session: tr.session})
		if err == nil {
			for _, p := range reply.Output.(*ProcessList).Processes {
				if p.Tag == "secret" {
					t.Errorf("list_processes as %s/%q shows alice's process", tr.who.Tenant, tr.who.Session)
				}
			}
		}
	}
	if len(a.procs.List(sa)) != 1 {
		t.Fatal("alice's process is gone")
	}
	mustCallAs(t, a, alice, "signal_process", SignalProcessInput{ProcessSelector: ProcessSelector{Session: sa, Tag: "secret"}, Signal: "SIGKILL"})
	if res := victim.wait(t); res.Status != "signal: killed" {
		t.Fatalf("alice's own kill: %+v", res)
	}
}

// boxPidNS is the pid namespace of session id's box, as its processes
// see it ("pid:[N]"; "" when runs are not boxed).
func boxPidNS(t *testing.T, a *App, id string) string {
	t.Helper()
	if !a.Sandbox.Boxed() {
		return ""
	}
	res := mustCall(t, a, "start_process", StartProcessInput{Session: id, Cmd: "readlink", Args: []string{"/proc/self/ns/pid"}}).(*ProcessResult)
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "pid:[") {
		t.Fatalf("the session box's pid namespace: %+v", res)
	}
	return strings.TrimSpace(res.Stdout)
}

// hostPid is the host pid of the process that is pid inner in the pid
// namespace ns (boxPidNS). The namespace names the process, not its
// arguments: a process spawned in a box is reported started just before
// its exec, when it still has the arguments of the box's zygote.
func hostPid(t *testing.T, a *App, ns string, inner int) int {
	t.Helper()
	if !a.Sandbox.Boxed() {
		return inner
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + d.Name() + "/ns/pid"); err != nil || l != ns {
			continue
		}
		status, err := os.ReadFile("/proc/" + d.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if f := strings.Fields(rest); len(f) >= 2 && f[len(f)-1] == strconv.Itoa(inner) {
					pid, _ := strconv.Atoi(d.Name())
					return pid
				}
			}
		}
	}
	t.Fatalf("no process on the host is pid %d in the box's pid namespace %s", inner, ns)
	return 0
}

// awaitExit waits until the process of pidfd fd has exited, for as long
// as the test may run (its -timeout, less a minute to report), never a
// fixed time, which a loaded machine passes.
func awaitExit(t *testing.T, fd int) error {
	wait := -1
	if d, ok := t.Deadline(); ok {
		wait = max(int(time.Until(d).Milliseconds())-60_000, 1000)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, wait)
		switch {
		case errors.Is(err, unix.EINTR): // a signal to this thread (a child's SIGCHLD), not the exit
			continue
		case err != nil:
			return err
		case n != 1:
			return errors.New("still running when the test's time ran out")
		}
		return nil
	}
}

func mustCallAs(t *testing.T, a *App, c controller.Caller, name string, args any) any {
	t.Helper()
	reply, err := callAs(t, a, c, name, args)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return reply.Output
}

// TestSlowViewerIsDetached: a viewer that does not read never holds up
// the process nor another viewer; it is told it fell behind.
func TestSlowViewerIsDetached(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "slow", "")
	res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Stdin: true, Background: true,
		Cmd: "sh", Args: []string{"-c", "read go; head -c 200000000 /dev/zero; echo done"}}).(*ProcessResult)
	p, err := a.procs.Get(s.ID, proc.Selector{Pid: res.Pid})
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	fast := startStream(t, a, admin, "connect_process", ProcessSelector{Session: s.ID, Pid: res.Pid})
	b, _ := json.Marshal(ProcessSelector{Session: s.ID, Pid: res.Pid})
	started := make(chan struct{})
	slowDone := make(chan error, 1)
	go func() {
		ctx := runcode.WithOutput(context.Background(), func(string, []byte) { <-block })
		ctx = runcode.WithStarted(ctx, func(int) { close(started) })
		_, err := a.Controller.Call(ctx, admin, "connect_process", b)
		slowDone <- err
	}()
	<-started
	fast.pid(t)
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: res.Pid}, Data: "go\n"})
	<-p.Done() // the process ended although one viewer never read
	close(block)
	// It is told why: how much of the output waited for it.
	if err := <-slowDone; codeOf(err) != capability.ResourceExhausted || !strings.Contains(err.Error(), "still runs") ||
		!strings.Contains(err.Error(), fmt.Sprintf("of process %d's output waited for this reader (at most", res.Pid)) {
		t.Fatalf("the slow viewer: %v", err)
	}
	// The other viewer read on: it saw the end (unless the machine was
	// too slow for it too: then it is told so, as the slow one).
	<-fast.done
	if fast.err == nil && (!strings.HasSuffix(fast.out.get("stdout"), "done\n") || fast.res.ExitCode != 0) {
		t.Fatalf("the other viewer: %+v", fast.res)
	} else if fast.err != nil && codeOf(fast.err) != capability.ResourceExhausted {
		t.Fatalf("the other viewer: %v", fast.err)
	}
}

// TestProcessBadInput: what a caller chooses is bounded, and refused with
// a reason: tag length, timeout, a too large command, viewers per process.
func TestProcessBadInput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "bad", "")
	for name, in := range map[string]StartProcessInput{
		"long tag":         {Session: s.ID, Cmd: "true", Tag: strings.Repeat("t", proc.MaxTag+1)},
		"negative timeout": {Session: s.ID, Cmd: "true", TimeoutMS: -1},
		"huge timeout":     {Session: s.ID, Cmd: "true", TimeoutMS: 1 << 62},
		"huge argument":    {Session: s.ID, Cmd: "echo", Args: []string{strings.Repeat("a", 2<<20)}},
		"no program":       {Session: s.ID},
		"bad pty":          {Session: s.ID, Cmd: "true", PTY: &proc.Size{Cols: 0, Rows: 5000}},
		// The loader obeys LD_PRELOAD at start-up; an environment cannot
		// carry a NUL (it would cut the value the process sees).
		"loader variable": {Session: s.ID, Cmd: "true", Env: map[string]string{"LD_PRELOAD": "/home/user/x.so"}},
		"NUL in a value":  {Session: s.ID, Cmd: "true", Env: map[string]string{"A": "a\x00b"}},
		"bad name":        {Session: s.ID, Cmd: "true", Env: map[string]string{"A=B": "c"}},
	} {
		_, err := call(t, a, "start_process", in)
		if codeOf(err) != capability.InvalidArgument {
			t.Errorf("%s: %v (want invalid_argument)", name, err)
		}
	}
	if n := len(a.procs.List(s.ID)); n != 0 {
		t.Fatalf("%d processes after refused starts", n)
	}

	res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sleep", Args: []string{"100000"}, Background: true}).(*ProcessResult)
	var viewers []*streamCall
	for range proc.MaxViewers {
		v := startStream(t, a, admin, "connect_process", ProcessSelector{Session: s.ID, Pid: res.Pid})
		v.pid(t)
		viewers = append(viewers, v)
	}
	_, err := call(t, a, "connect_process", ProcessSelector{Session: s.ID, Pid: res.Pid})
	if codeOf(err) != capability.ResourceExhausted {
		t.Fatalf("viewer %d: %v", proc.MaxViewers+1, err)
	}
	mustCall(t, a, "signal_process", SignalProcessInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: res.Pid}, Signal: "KILL"})
	for _, v := range viewers {
		if end := v.wait(t); end.Status != "signal: killed" {
			t.Fatalf("a viewer's end: %+v", end)
		}
	}
}

// TestProcessRunsInTheSessionsBox: a process started beside a running
// Python worker (HOME /home/user for the one, the workspace path for the
// other) is in the same box: it sees what the worker wrote to the box's
// private /tmp, and the worker among its processes. (The box's shape once
// held HOME, and such a process got a box of its own.)
func TestProcessRunsInTheSessionsBox(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if !a.Sandbox.SessionBoxes() {
		t.Skip("needs session boxes")
	}
	s := newSession(t, a, "box", "")
	mustCall(t, a, "run_code", RunCodeInput{Session: s.ID, Lang: "python", Code: "open('/tmp/from-python', 'w').write('worker was here')"})
	res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sh",
		Args: []string{"-c", `cat /tmp/from-python; echo; echo "$HOME"; cat /proc/[0-9]*/cmdline | tr '\0' ' ' | grep -c quro_worker`}}).(*ProcessResult)
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "worker was here\n/home/user\n") || strings.HasSuffix(res.Stdout, "\n0\n") {
		t.Fatalf("the process is not in the session's box: %+v", res)
	}
}
