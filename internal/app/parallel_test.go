package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/terminal"
)

// gatedShell makes a fifo "gate" in s's workspace and runs, through
// terminal_exec, a command that blocks until release opens it; it returns
// once that command runs, with the session's shell to watch its line.
func gatedShell(t *testing.T, a *App, s *SessionInfo) (sh *terminal.Shell, release func(), first <-chan error) {
	t.Helper()
	texec(t, a, s.ID, "mkfifo gate")
	done := make(chan error, 1)
	go func() {
		_, err := call(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "read l <gate; echo first >>order", TimeoutMS: 120000})
		done <- err
	}()
	sess, err := a.Sessions.Get(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sh, err = a.Terminals.Shell(sess); err != nil {
		t.Fatal(err)
	}
	waitLine(t, sh, 0)
	return sh, func() {
		if err := os.WriteFile(filepath.Join(sess.Workspace(), "gate"), []byte("go\n"), 0); err != nil {
			t.Error(err)
		}
	}, done
}

func waitLine(t *testing.T, sh *terminal.Shell, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sh.WaitLine(ctx, n); err != nil {
		t.Fatalf("never %d call(s) in line: %v", n, err)
	}
}

// TestParallelTerminalExecRunInArrivalOrder: terminal_exec calls sent to
// one session while a command runs (a model's parallel tool calls) wait
// for it and run one by one in the order they came, and each gets its
// own result.
func TestParallelTerminalExecRunInArrivalOrder(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "par", "")
	sh, release, first := gatedShell(t, a, s)
	type answer struct {
		name string
		res  *terminal.Result
		err  error
	}
	answers := make(chan answer, 2)
	for i, name := range []string{"second", "third"} {
		go func() {
			reply, err := call(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "echo " + name + " >>order; echo " + name, TimeoutMS: 120000})
			an := answer{name: name, err: err}
			if err == nil {
				an.res = reply.Output.(*terminal.Result)
			}
			answers <- an
		}()
		waitLine(t, sh, i+1)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		an := <-answers
		if an.err != nil || an.res.ExitCode != 0 || an.res.Output != an.name+"\n" {
			t.Fatalf("%s: %+v %v", an.name, an.res, an.err)
		}
	}
	if res := texec(t, a, s.ID, "cat order"); res.Output != "first\nsecond\nthird\n" {
		t.Fatalf("order: %q", res.Output)
	}
}

// TestBusyTerminalNamesWhatRuns: a call whose wait in line runs out gets
// a busy error that says what runs, for how long, and what to do — never
// to interrupt the other call's command — and it ran nothing.
func TestBusyTerminalNamesWhatRuns(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "busy", "")
	_, release, first := gatedShell(t, a, s)
	_, err := call(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "echo late >>order", TimeoutMS: 300})
	ce := wantCode(t, err, capability.Busy)
	for _, want := range []string{"`read l <gate; echo first >>order`", "has run for", "ran nothing", "start_process"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("%q lacks %q", ce.Message, want)
		}
	}
	for _, bad := range []string{`\u0003`, "interrupt", "Ctrl-C", "/data/", "sessions/"} {
		if strings.Contains(ce.Message, bad) {
			t.Errorf("%q holds %q", ce.Message, bad)
		}
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if res := texec(t, a, s.ID, "cat order"); res.Output != "first\n" {
		t.Fatalf("the refused call ran: %q", res.Output)
	}
}

// TestCommandWaitingForInputThenNextCall: a command that waits for input
// says so and how to answer; answered, it ends; left unanswered, the next
// terminal_exec interrupts it, runs, and says what it interrupted.
func TestCommandWaitingForInputThenNextCall(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "asks", "")
	for _, cmd := range []string{"read x; echo got $x", `python3 -c 'print("got", input())'`} {
		res := texec(t, a, s.ID, cmd)
		if !res.WaitingForInput || !strings.Contains(res.Text(), "send_input") {
			t.Fatalf("%s: %+v", cmd, res)
		}
		res = mustCall(t, a, "send_input", SendInputInput{Session: s.ID, Data: "v\n"}).(*terminal.Result)
		if res.Running || res.ExitCode != 0 || !strings.Contains(res.Output, "got v") {
			t.Fatalf("%s answered: %+v", cmd, res)
		}
		if res := texec(t, a, s.ID, cmd); !res.WaitingForInput {
			t.Fatalf("%s again: %+v", cmd, res)
		}
		res = texec(t, a, s.ID, "echo next")
		if res.Output != "next\n" || res.ExitCode != 0 || !strings.Contains(res.Text(), "which waited for input") {
			t.Fatalf("the next call after %s was left unanswered: %+v", cmd, res)
		}
	}
}

// newAppWindow is newApp with start_process's start window.
func newAppWindow(t *testing.T, window time.Duration) *App {
	t.Helper()
	return newAppWith(t, &Options{ProcessStartWindow: window})
}

// TestBackgroundProcessThatEndsAtOnce: start_process with background:true
// reports a process that ends within its start window as ended, with its
// exit code and output; command is a shell line, cmd a program with args.
func TestBackgroundProcessThatEndsAtOnce(t *testing.T) {
	t.Parallel()
	a := newAppWindow(t, time.Minute) // the window ends at the exit, long before
	s := newSession(t, a, "dies", "")
	res := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Background: true,
		Command: "echo starting; echo 'port in use' >&2; exit 3"}).(*ProcessResult)
	if res.Running || res.ExitCode != 3 || !res.Exited || res.Stdout != "starting\n" || res.Stderr != "port in use\n" {
		t.Fatalf("%+v", res)
	}
	if txt := res.Text(); !strings.Contains(txt, "ended: exit status 3") || !strings.Contains(txt, "port in use") {
		t.Fatalf("%q", txt)
	}
	_, err := call(t, a, "start_process", StartProcessInput{Session: s.ID, Command: "sh", Cmd: "bash"})
	if ce := wantCode(t, err, capability.InvalidArgument); !strings.Contains(ce.Message, "not both") {
		t.Fatalf("%q", ce.Message)
	}
	_, err = call(t, a, "start_process", StartProcessInput{Session: s.ID, Command: "sh", Args: []string{"-c", "true"}})
	if ce := wantCode(t, err, capability.InvalidArgument); !strings.Contains(ce.Message, "args go with cmd") {
		t.Fatalf("%q", ce.Message)
	}
	_, err = call(t, a, "start_process", StartProcessInput{Session: s.ID})
	if ce := wantCode(t, err, capability.InvalidArgument); !strings.Contains(ce.Message, "command") {
		t.Fatalf("%q", ce.Message)
	}
	res = mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sh", Args: []string{"-c", "exit 4"}, Background: true}).(*ProcessResult)
	if res.Running || res.ExitCode != 4 {
		t.Fatalf("cmd and args: %+v", res)
	}
}

// TestReadProcessOutput: read_process_output returns what a process
// printed since an offset, says how much of it the ring dropped, and
// still answers for a process that ended.
func TestReadProcessOutput(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "ring", "")
	// About 90 KiB, more than the ring keeps, then a prompt.
	script := `i=0; while [ $i -lt 2000 ]; do echo "line $i ........................................"; i=$((i+1)); done; echo done; read x; echo "got $x"`
	start := startStream(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Tag: "talker", Stdin: true, Command: script})
	start.pid(t)
	start.out.waitFor(t, "stdout", "done\n", start.done)
	sel := ProcessSelector{Session: s.ID, Tag: "talker"}
	o := mustCall(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel}).(*ProcessOutput)
	total := int64(len(start.out.get("stdout")))
	if !o.Running || o.Next != total || o.Dropped != total-proc.RingSize || len(o.Output) != proc.RingSize || !strings.HasSuffix(o.Output, "done\n") {
		t.Fatalf("running: next %d dropped %d len %d (printed %d)", o.Next, o.Dropped, len(o.Output), total)
	}
	if txt := o.Text(); !strings.Contains(txt, "dropped") || !strings.Contains(txt, "next since=") {
		t.Fatalf("%q", txt[:200])
	}
	o2 := mustCall(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel, Since: o.Next}).(*ProcessOutput)
	if o2.Output != "" || o2.Dropped != 0 || o2.Next != o.Next {
		t.Fatalf("nothing new: %+v", o2)
	}
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: sel, Data: "hi\n"})
	if res := start.wait(t); res.Running || res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	o3 := mustCall(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel, Since: o.Next}).(*ProcessOutput)
	if o3.Running || o3.End == nil || o3.End.ExitCode != 0 || o3.Output != "got hi\n" || o3.Dropped != 0 {
		t.Fatalf("ended: %+v", o3)
	}
	_, err := call(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel, Since: -1})
	wantCode(t, err, capability.InvalidArgument)
	_, err = call(t, a, "read_process_output", ReadOutputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: 999999}})
	wantCode(t, err, capability.NotFound)
}

// TestConnectProcessTimeout: connect_process returns at its timeout_ms
// saying so, and the process runs on.
func TestConnectProcessTimeout(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "conn", "")
	started := mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Command: "sleep 100000", Background: true}).(*ProcessResult)
	if !started.Running {
		t.Fatalf("%+v", started)
	}
	sel := ProcessSelector{Session: s.ID, Pid: started.Pid}
	res := mustCall(t, a, "connect_process", ConnectProcessInput{ProcessSelector: sel, TimeoutMS: 200}).(*ProcessResult)
	if !res.Running || !res.TimedOut || !strings.Contains(res.Text(), "keeps running") {
		t.Fatalf("%+v", res)
	}
	if list := mustCall(t, a, "list_processes", SessionRef{Session: s.ID}).(*ProcessList); len(list.Processes) != 1 {
		t.Fatalf("the process did not run on: %+v", list)
	}
	_, err := call(t, a, "connect_process", ConnectProcessInput{ProcessSelector: sel, TimeoutMS: -1})
	wantCode(t, err, capability.InvalidArgument)
	mustCall(t, a, "signal_process", SignalProcessInput{ProcessSelector: sel, Signal: "SIGKILL"})
}

// TestParallelPythonRunsWait: a run_code call sent while another Python
// run of the session goes waits for it; one whose wait runs out did not
// start, and says what it waited for and what to do.
func TestParallelPythonRunsWait(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needEmbedded(t, a) // the resident worker's line; one-shot runs do not wait
	s := newSession(t, a, "py", "")
	texec(t, a, s.ID, "mkfifo ready gate")
	sess, err := a.Sessions.Get(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan *runcode.Result, 1)
	go func() {
		reply, err := call(t, a, "run_code", RunCodeInput{Session: s.ID, TimeoutMS: 120000,
			Code: "open('ready', 'w').write('x')\nprint('first', open('gate').read().strip())"})
		if err != nil {
			t.Error(err)
			first <- nil
			return
		}
		first <- reply.Output.(*runcode.Result)
	}()
	if _, err := os.ReadFile(filepath.Join(sess.Workspace(), "ready")); err != nil { // the first run holds the worker
		t.Fatal(err)
	}
	reply, err := call(t, a, "run_code", RunCodeInput{Session: s.ID, TimeoutMS: 300, Code: "open('late', 'w')"})
	if err != nil {
		t.Fatal(err)
	}
	late := reply.Output.(*runcode.Result)
	if !strings.Contains(late.Error, "did not start") || !strings.Contains(late.Error, "another run of this session's Python, busy for") || strings.Contains(late.Error, "interrupt") {
		t.Fatalf("%+v", late)
	}
	second := make(chan *runcode.Result, 1)
	go func() {
		reply, err := call(t, a, "run_code", RunCodeInput{Session: s.ID, TimeoutMS: 120000, Code: "print('second')"})
		if err != nil {
			t.Error(err)
			second <- nil
			return
		}
		second <- reply.Output.(*runcode.Result)
	}()
	if err := os.WriteFile(filepath.Join(sess.Workspace(), "gate"), []byte("go\n"), 0); err != nil {
		t.Fatal(err)
	}
	if r := <-first; r == nil || r.Stdout != "first go\n" {
		t.Fatalf("first: %+v", r)
	}
	if r := <-second; r == nil || r.Stdout != "second\n" {
		t.Fatalf("second: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(sess.Workspace(), "late")); err == nil {
		t.Fatal("the run that did not start ran")
	}
}

// TestReadProcessOutputOfARestartedTag: an offset past all a process
// printed (the next of another process that had the tag) reads the
// process from its start and says so, instead of skipping its output.
func TestReadProcessOutputOfARestartedTag(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := newSession(t, a, "again", "")
	sel := ProcessSelector{Session: s.ID, Tag: "srv"}
	mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Tag: "srv", Command: "echo a long first line of output"})
	first := mustCall(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel}).(*ProcessOutput)
	if first.Running || first.Output != "a long first line of output\n" || first.FromStart {
		t.Fatalf("the first: %+v", first)
	}
	mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Tag: "srv", Command: "echo b"})
	o := mustCall(t, a, "read_process_output", ReadOutputInput{ProcessSelector: sel, Since: first.Next}).(*ProcessOutput)
	if o.Output != "b\n" || !o.FromStart || o.Next != 2 || !strings.Contains(o.Text(), "read from its start") {
		t.Fatalf("the second, read with the first's offset: %+v\n%s", o, o.Text())
	}
	_, err := call(t, a, "read_process_output", ReadOutputInput{ProcessSelector: ProcessSelector{Session: s.ID, Tag: "none"}})
	if ce := wantCode(t, err, capability.NotFound); !strings.Contains(ce.Message, "last 4 ended") {
		t.Fatalf("%q", ce.Message)
	}
}
