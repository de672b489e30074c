package e2b_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process/processconnect"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// procClient is a Connect client of sandbox id's process service, with
// the JSON codec, as the SDKs use it.
func (e *env) procClient(id string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(e.sandboxClient(id, e2b.EnvdPort), e.URL, connect.WithProtoJSON())
}

// events reads a process stream (Start or Connect) on a goroutine.
type events struct {
	c    chan *process.ProcessEvent
	err  error // once c is closed
	stop context.CancelFunc
}

type eventReceiver interface {
	Receive() bool
	Err() error
}

func readEvents[T interface{ GetEvent() *process.ProcessEvent }](s interface {
	eventReceiver
	Msg() T
}, stop context.CancelFunc) *events {
	ev := &events{c: make(chan *process.ProcessEvent, 1024), stop: stop}
	go func() {
		defer close(ev.c)
		for s.Receive() {
			ev.c <- s.Msg().GetEvent()
		}
		ev.err = s.Err()
	}()
	return ev
}

func (e *env) start(t *testing.T, id string, req *process.StartRequest, header map[string]string) *events {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if ms, ok := header["Connect-Timeout-Ms"]; ok {
		d, _ := time.ParseDuration(ms + "ms")
		ctx, cancel = context.WithTimeout(ctx, d)
		t.Cleanup(cancel)
	}
	r := connect.NewRequest(req)
	for k, v := range header {
		if k != "Connect-Timeout-Ms" {
			r.Header().Set(k, v)
		}
	}
	s, err := e.procClient(id).Start(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	return readEvents(s, cancel)
}

func (e *env) connectTo(t *testing.T, id string, sel *process.ProcessSelector) *events {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := e.procClient(id).Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	return readEvents(s, cancel)
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// next is the stream's next event (nil once it ended).
func (ev *events) next(t *testing.T) *process.ProcessEvent {
	t.Helper()
	return <-ev.c
}

// startPid reads the first event, which must be start{pid}.
func (ev *events) startPid(t *testing.T) uint32 {
	t.Helper()
	first := ev.next(t)
	if first.GetStart() == nil {
		t.Fatalf("the first event is %v (stream error %v), not start", first, ev.err)
	}
	return first.GetStart().GetPid()
}

// output reads data events until one of them completes want in the
// stream's output; it returns everything read. It fails on the end.
func (ev *events) until(t *testing.T, kind, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		e := ev.next(t)
		switch {
		case e == nil:
			t.Fatalf("the stream ended (%v) before %q; got %q", ev.err, want, got.String())
		case e.GetEnd() != nil:
			t.Fatalf("the process ended (%v) before %q; got %q", e.GetEnd(), want, got.String())
		case e.GetData() != nil:
			d := e.GetData()
			switch kind {
			case "stdout":
				got.Write(d.GetStdout())
			case "stderr":
				got.Write(d.GetStderr())
			case "pty":
				got.Write(d.GetPty())
			}
		}
	}
	return got.String()
}

// end reads to the end event, collecting stdout and stderr, and checks
// the stream ends after it.
func (ev *events) end(t *testing.T) (end *process.ProcessEvent_EndEvent, stdout, stderr string) {
	t.Helper()
	var o, s strings.Builder
	for e := range ev.c {
		switch {
		case e.GetData() != nil:
			o.Write(e.GetData().GetStdout())
			s.Write(e.GetData().GetStderr())
		case e.GetEnd() != nil:
			end = e.GetEnd()
			if more := ev.next(t); more != nil {
				t.Fatalf("an event after the end: %v", more)
			}
			if ev.err != nil {
				t.Fatalf("the stream failed after the end: %v", ev.err)
			}
			return end, o.String(), s.String()
		case e.GetStart() != nil:
			t.Fatalf("a second start event: %v", e)
		}
	}
	t.Fatalf("the stream ended without an end event: %v (stdout %q)", ev.err, o.String())
	return nil, "", ""
}

func bash(cmd string, stdin bool) *process.StartRequest {
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}, Stdin: &stdin}
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

// Start streams start{pid} first, the output, then end as envd words it;
// the process runs in /home/user with the request's variables.
func TestEnvdStartEvents(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	req := bash(`echo "$PWD $HOME $GREETING"; echo oops >&2; exit 3`, false)
	req.Process.Envs = map[string]string{"GREETING": "hi"}
	ev := e.start(t, id, req, nil)
	if pid := ev.startPid(t); pid == 0 {
		t.Fatal("pid 0")
	}
	end, stdout, stderr := ev.end(t)
	if stdout != "/home/user /home/user hi\n" || stderr != "oops\n" {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
	if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" || end.GetError() != "exit status 3" {
		t.Fatalf("end: %v", end)
	}

	ev = e.start(t, id, bash("cd /tmp && pwd", false), nil)
	ev.startPid(t)
	end, stdout, _ = ev.end(t)
	if end.GetExitCode() != 0 || end.Error != nil || end.GetStatus() != "exit status 0" || stdout != "/tmp\n" {
		t.Fatalf("success: %v %q", end, stdout)
	}

	cwd := "/home/user/sub"
	req = bash("mkdir -p sub", false)
	ev = e.start(t, id, req, nil)
	ev.startPid(t)
	ev.end(t)
	req = bash("pwd", false)
	req.Process.Cwd = &cwd
	ev = e.start(t, id, req, nil)
	ev.startPid(t)
	if _, stdout, _ = ev.end(t); stdout != "/home/user/sub\n" {
		t.Fatalf("cwd: %q", stdout)
	}

	// root is not a user a Quro sandbox has.
	r := connect.NewRequest(bash("id", false))
	r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	s, err := e.procClient(id).Start(context.Background(), r)
	if err == nil {
		for s.Receive() {
			t.Fatalf("an event as root: %v", s.Msg())
		}
		err = s.Err()
	}
	if codeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "has no root") ||
		!strings.Contains(err.Error(), "apt-get install") || !strings.Contains(err.Error(), "install_packages") {
		t.Fatalf("as root (want why and what to use instead): %v", err)
	}
	r = connect.NewRequest(bash("true", false))
	r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	ev = readEvents(mustStart(t, e, id, r), func() {})
	ev.startPid(t)
	if end, _, _ := ev.end(t); end.GetExitCode() != 0 {
		t.Fatalf("as user: %v", end)
	}
}

// A command that ends at once, started in the background as the SDKs do
// (commands.run(..., background) takes the start event's pid as the
// handle's): its start event names the pid the program had in the box,
// the one it printed as its own, never 0 nor a pid read after it ended.
// Each start's program may end before the server has sent the start.
func TestEnvdStartPidOfAProgramThatEndsAtOnce(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	for i := range 8 {
		ev := e.start(t, id, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo $$"}}}, nil)
		pid := ev.startPid(t)
		end, stdout, _ := ev.end(t)
		if end.GetExitCode() != 0 {
			t.Fatalf("start %d: %v", i, end)
		}
		own, err := strconv.Atoi(strings.TrimSpace(stdout))
		if err != nil {
			t.Fatalf("start %d printed %q", i, stdout)
		}
		if pid == 0 || int(pid) != own {
			t.Fatalf("start %d: the start event's pid is %d, the program's own %d", i, pid, own)
		}
	}
}

func mustStart(t *testing.T, e *env, id string, r *connect.Request[process.StartRequest]) *connect.ServerStreamForClient[process.StartResponse] {
	t.Helper()
	s, err := e.procClient(id).Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A background command: its client goes away and it runs on; Connect
// (by pid or tag) sees its later output; SIGKILL ends it with envd's
// words, and then it is gone (NotFound everywhere).
func TestEnvdBackgroundConnectKill(t *testing.T) {
	// Tell when the server has seen the Start stream's client go.
	returned := make(chan string, 16)
	e := newEnv(t, &app.Options{Observers: []controller.Observer{func(_ context.Context, r *controller.Record) {
		if r.Capability == "start_process" {
			returned <- r.Outcome
		}
	}}})
	id := e.newSession(t)
	c := e.procClient(id)
	tag := "server"
	req := bash(`echo ready; while read line; do echo "echo $line"; done`, true)
	req.Tag = &tag
	ev := e.start(t, id, req, map[string]string{"Keepalive-Ping-Interval": "50"})
	pid := ev.startPid(t)
	ev.until(t, "stdout", "ready\n")
	ev.stop() // the client disconnects
	<-returned

	list, err := c.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != "server" ||
		ps[0].GetConfig().GetCmd() != "/bin/bash" || len(ps[0].GetConfig().GetArgs()) != 3 {
		t.Fatalf("list after the disconnect: %v", ps)
	}

	conn := e.connectTo(t, id, &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "server"}})
	if got := conn.startPid(t); got != pid {
		t.Fatalf("connect by tag: pid %d, want %d", got, pid)
	}
	if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("one\n")}}})); err != nil {
		t.Fatal(err)
	}
	if got := conn.until(t, "stdout", "echo one\n"); strings.Contains(got, "ready") {
		t.Fatalf("connect replayed output from before it attached: %q", got)
	}
	if _, err := c.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	end, _, _ := conn.end(t)
	if end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" || end.GetError() != "signal: killed" {
		t.Fatalf("end after SIGKILL: %v", end)
	}
	_, err = c.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("kill of an ended process: %v (the SDK's kill() returns false on NotFound)", err)
	}
	gone := e.connectTo(t, id, pidSel(pid))
	if e := gone.next(t); e != nil || codeOf(gone.err) != connect.CodeNotFound {
		t.Fatalf("connect to an ended process: %v %v", e, gone.err)
	}
}

// stdin: SendInput, StreamInput (client stream), CloseStdin → EOF.
func TestEnvdStdin(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	ev := e.start(t, id, bash(`read a; echo "a=$a"; cat; echo eof`, true), nil)
	pid := ev.startPid(t)
	if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("1\n")}}})); err != nil {
		t.Fatal(err)
	}
	ev.until(t, "stdout", "a=1\n")
	in := c.StreamInput(context.Background())
	for _, m := range []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: pidSel(pid)}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("two\n")}}}}},
		{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("three\n")}}}}},
	} {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	ev.until(t, "stdout", "two\nthree\n")
	if _, err := c.CloseStdin(context.Background(), connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatal(err)
	}
	end, stdout, _ := ev.end(t)
	if end.GetExitCode() != 0 || stdout != "eof\n" {
		t.Fatalf("after CloseStdin: %v %q", end, stdout)
	}

	// Without stdin: true, input is refused with a reason.
	// It stays until the test says so (a file appears), so that the
	// input finds it running.
	ev = e.start(t, id, bash(`read a; echo "a=$a"; until [ -e /home/user/go-on ]; do sleep 0.01; done`, false), nil)
	pid = ev.startPid(t)
	_, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("1\n")}}}))
	if codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "stdin") {
		t.Fatalf("input without stdin: %v", err)
	}
	if err := os.WriteFile(filepath.Join(workspaceOf(t, e, id), "go-on"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if end, stdout, _ := ev.end(t); end.GetExitCode() != 0 || stdout != "a=\n" {
		t.Fatalf("a process without stdin reads EOF: %v %q", end, stdout)
	}
}

// A PTY: created with a size, fed, resized, killed.
func TestEnvdPTY(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"},
			Envs: map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}},
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}
	ev := e.start(t, id, req, nil)
	pid := ev.startPid(t)
	send := func(s string) {
		t.Helper()
		if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
			Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty\n")
	ev.until(t, "pty", "24 80")
	if _, err := c.Update(context.Background(), connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid),
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	send("stty size\n")
	ev.until(t, "pty", "30 100")
	_, err := c.CloseStdin(context.Background(), connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("CloseStdin of a PTY: %v", err)
	}
	if _, err := c.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if end, _, _ := ev.end(t); end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" {
		t.Fatalf("PTY end: %v", end)
	}
}

// A new terminal's start event waits for its first output (a shell is
// ready for what the client types next), and that output follows it,
// whole; a terminal that shows nothing still gets its start event (after
// a bound) and takes input.
func TestEnvdPTYStartsWhenReady(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	pty := &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}
	ready := e.start(t, id, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh",
		Args: []string{"-c", "touch /home/user/printed; printf 'ready-%d' 42; exec cat"}}, Pty: pty}, nil)
	pid := ready.startPid(t)
	// The program had printed before the start event went out.
	if _, err := e.fsClient(id).Stat(context.Background(), connect.NewRequest(&filesystem.StatRequest{Path: "/home/user/printed"})); err != nil {
		t.Errorf("the start event came before the terminal's first output: %v", err)
	}
	ready.until(t, "pty", "ready-42")
	if _, err := c.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	ready.end(t)

	silent := e.start(t, id, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/cat"}, Pty: pty}, nil)
	pid = silent.startPid(t)
	if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("typed\n")}}})); err != nil {
		t.Fatal(err)
	}
	silent.until(t, "pty", "typed")
	if _, err := c.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	silent.end(t)
}

// Connecting to a running terminal (pty.connect) first replays what it
// showed before, so the client can redraw it; then what comes. A
// command's Connect (commands.connect) replays nothing, as envd.
func TestEnvdPTYConnectReplays(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	ev := e.start(t, id, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}, nil)
	pid := ev.startPid(t)
	send := func(s string) {
		t.Helper()
		if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
			Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("echo before-$((6*7))\n")
	ev.until(t, "pty", "before-42")
	ev.stop() // the first client leaves; the terminal runs on

	again := e.connectTo(t, id, pidSel(pid))
	if got := again.startPid(t); got != pid {
		t.Fatalf("connect: start %d, want %d", got, pid)
	}
	send("echo after-$((7*8))\n")
	got := again.until(t, "pty", "after-56")
	if i := strings.Index(got, "before-42"); i < 0 || i > strings.Index(got, "after-56") {
		t.Errorf("the connect did not replay the terminal's earlier output first: %q", got)
	}

	// A command's Connect follows from now on.
	cmd := e.start(t, id, bash("echo early-$((1+1)); read x; echo late-$((2+2))", true), nil)
	cpid := cmd.startPid(t)
	cmd.until(t, "stdout", "early-2")
	conn := e.connectTo(t, id, pidSel(cpid))
	conn.startPid(t)
	if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(cpid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, stdout, _ := conn.end(t); stdout != "late-4\n" {
		t.Errorf("a command's Connect: stdout %q, want only what came after it attached", stdout)
	}
}

// Connect-Timeout-Ms kills the process, and the server says so with
// deadline_exceeded (the SDK's TimeoutError). The client sets no deadline
// of its own (connect-go's client would end the call itself, with its own
// deadline_exceeded, whatever the server did): the header is sent raw.
func TestEnvdTimeoutKills(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	// The session's box first: the deadline is the command's, not the
	// box's making (seconds on a loaded machine, which the deadline would
	// cut short as "canceled while the sandbox was starting").
	warm := e.start(t, id, bash("true", false), nil)
	warm.startPid(t)
	warm.end(t)
	tag := "slow"
	req := bash("echo started; exec sleep 100000", false)
	req.Tag = &tag
	r := connect.NewRequest(req)
	// The deadline must also cover the spawn in the box and the echo:
	// at a load of 80, 3 s passed before "started" was printed.
	r.Header().Set("Connect-Timeout-Ms", "15000")
	s, err := c.Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	ev := readEvents(s, func() {})
	pid := ev.startPid(t)
	ev.until(t, "stdout", "started\n")
	for e := range ev.c {
		if e.GetEnd() != nil {
			t.Fatalf("an end event instead of the deadline: %v", e)
		}
	}
	var ce *connect.Error
	if !errors.As(ev.err, &ce) || ce.Code() != connect.CodeDeadlineExceeded ||
		ce.Message() != "the command's timeout (timeoutMs, Connect-Timeout-Ms) passed: process "+strconv.Itoa(int(pid))+" was killed" {
		t.Fatalf("stream error %v, want the server's deadline_exceeded saying process %d was killed", ev.err, pid)
	}
	// The process is killed: a Connect finds it gone, or sees it end so;
	// then it is no longer listed.
	conn := e.connectTo(t, id, pidSel(pid))
	if first := conn.next(t); first != nil {
		if end, _, _ := conn.end(t); end.GetStatus() != "signal: killed" {
			t.Fatalf("after the timeout: %v", end)
		}
	} else if codeOf(conn.err) != connect.CodeNotFound {
		t.Fatalf("connect after the timeout: %v", conn.err)
	}
	list, err := c.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			t.Fatalf("process %d is still listed after its timeout: %v", pid, p)
		}
	}
}

// A stream that is quiet gets keepalive events at the interval the client
// asked for.
func TestEnvdKeepalive(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	ev := e.start(t, id, bash("read x; echo done", true), map[string]string{"Keepalive-Ping-Interval": "1"})
	pid := ev.startPid(t)
	if first := ev.next(t); first.GetKeepalive() == nil {
		t.Fatalf("want a keepalive from a quiet process, got %v (%v)", first, ev.err)
	}
	if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("\n")}}})); err != nil {
		t.Fatal(err)
	}
	if end, stdout, _ := ev.end(t); end.GetExitCode() != 0 || stdout != "done\n" {
		t.Fatalf("end: %v %q", end, stdout)
	}
}

// The attack: code holding sandbox B's access token guesses sandbox A's
// pids and tags. B sees nothing of A, and A's process runs on.
func TestEnvdProcessesAreTheSandboxs(t *testing.T) {
	e := newEnv(t, nil)
	a, b := e.newSession(t), e.newSession(t)
	tag := "victim"
	req := bash("echo up; exec sleep 100000", false)
	req.Tag = &tag
	ev := e.start(t, a, req, nil)
	pid := ev.startPid(t)
	ev.until(t, "stdout", "up\n")
	cb := e.procClient(b)
	list, err := cb.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("B lists %v (%v)", list, err)
	}
	for _, sel := range []*process.ProcessSelector{pidSel(pid), {Selector: &process.ProcessSelector_Tag{Tag: "victim"}}} {
		_, err := cb.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
		if codeOf(err) != connect.CodeNotFound {
			t.Errorf("B kills A's %v: %v", sel, err)
		}
		_, err = cb.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: sel,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}}))
		if codeOf(err) != connect.CodeNotFound {
			t.Errorf("B feeds A's %v: %v", sel, err)
		}
		conn := e.connectTo(t, b, sel)
		if first := conn.next(t); first != nil || codeOf(conn.err) != connect.CodeNotFound {
			t.Errorf("B connects to A's %v: %v %v", sel, first, conn.err)
		}
	}
	// A's own client still reaches it.
	ca := e.procClient(a)
	if _, err := ca.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	if end, _, _ := ev.end(t); end.GetStatus() != "signal: terminated" || end.GetExitCode() != -1 {
		t.Fatalf("A's process after A's SIGTERM: %v", end)
	}
}

// A sandbox killed under a running command: the stream ends as a dropped
// connection ("terminated", which makes the SDK probe the sandbox's
// health), and only once the sandbox is gone, so that the probe finds it
// gone and the SDK says it was killed.
func TestEnvdSandboxKilledDuringRun(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	ev := e.start(t, id, bash("echo up; exec sleep 100000", false), nil)
	ev.startPid(t)
	ev.until(t, "stdout", "up\n")
	destroyed := make(chan error, 1)
	go func() {
		_, err := e.App.Controller.Call(context.Background(),
			controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", json.RawMessage(`{"session":"`+id+`"}`))
		destroyed <- err
	}()
	for e := range ev.c {
		if e.GetEnd() != nil {
			t.Fatalf("an end event for a killed sandbox: %v", e)
		}
	}
	if codeOf(ev.err) != connect.CodeUnknown || !strings.Contains(ev.err.Error(), "terminated") {
		t.Fatalf("stream error %v, want unknown: terminated", ev.err)
	}
	if _, err := e.App.Sessions.ByIDAnyTenant(context.Background(), id); err == nil {
		t.Fatal("the stream ended while the sandbox still existed: the SDK's health probe would find it running")
	}
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
}

// Long-lived processes and E2B's calls: with one run slot and one
// process per sandbox, a running background command holds no run slot
// (another sandbox's command runs), a second process in its sandbox is
// refused as ResourceExhausted (the SDKs' RateLimitError) naming the
// limit and how to raise it, and the kill still goes through.
func TestEnvdProcessLimitIsResourceExhausted(t *testing.T) {
	e := newEnv(t, &app.Options{Limits: app.Limits{RunsPerTenant: 1, ProcessesPerSession: 1}})
	id, other := e.newSession(t), e.newSession(t)
	ev := e.start(t, id, bash("echo up; sleep 100000", false), nil)
	pid := ev.startPid(t)
	ev.until(t, "stdout", "up\n")
	run := e.start(t, other, bash("echo another", false), nil)
	run.startPid(t)
	if end, stdout, _ := run.end(t); end.GetExitCode() != 0 || stdout != "another\n" {
		t.Fatalf("a command beside a running background one, at one run slot: %v %q", end, stdout)
	}
	s, err := e.procClient(id).Start(context.Background(), connect.NewRequest(bash("echo second", false)))
	if err == nil {
		for s.Receive() {
			t.Fatalf("an event of a process past the limit: %v", s.Msg())
		}
		err = s.Err()
	}
	wantConnect(t, err, connect.CodeResourceExhausted, "the session already runs 1 background processes (its limit is 1)")
	wantConnect(t, err, connect.CodeResourceExhausted, "quro serve --processes-per-session")
	if _, err := e.procClient(id).SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("kill at the limit: %v", err)
	}
	if end, _, _ := ev.end(t); end.GetStatus() != "signal: killed" {
		t.Fatalf("end after the kill: %v", end)
	}
}

// Attack: a process started through envd learns the server's data
// directory (a temporary directory named after the test here) from its
// box: the mount points, its directories, its variables, /etc/passwd,
// the other processes' directories. None of them names it (the mount
// table's bind sources are the kernel's: docs/security.md).
func TestEnvdProcessSeesNoHostPath(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	ev := e.start(t, id, bash(`cut -d' ' -f5 /proc/self/mountinfo; pwd -P; readlink /proc/self/cwd /proc/[0-9]*/cwd; `+
		`tr '\0' '\n' < /proc/self/environ; cat /etc/passwd; echo "TMP=$(cd "$TMPDIR" && pwd -P)"`, false), nil)
	ev.startPid(t)
	end, stdout, stderr := ev.end(t)
	if end.GetExitCode() != 0 || !strings.Contains(stdout, "\n/home/user\n") || !strings.Contains(stdout, "TMP=/run/quro/tmp\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", end.GetExitCode(), stdout, stderr)
	}
	if name := strings.SplitN(t.Name(), "/", 2)[0]; strings.Contains(stdout+stderr, name) {
		t.Fatalf("the box shows the data directory (%s):\n%s%s", name, stdout, stderr)
	}
}
