//go:build !slim

package python

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// The worker buffers stdout (see quro_worker.py). These tests run the real
// worker in its box and wait on events only: a test that needs output to
// arrive while the code is still running makes the code wait on a FIFO that
// the test opens only once the output arrived. A worker that failed to
// deliver the output in time leaves the code blocked until the run's
// timeout, and the test fails on the timeout it reports, never on a clock.

// liveTimeout bounds runs that hang when a flush is missing.
const liveTimeout = 20 * time.Second

// watchedBuffer collects a run's output and closes a channel once the
// output contains a given text.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func watch(want string) *watchedBuffer {
	return &watchedBuffer{want: want, seen: make(chan struct{})}
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.want != "" && strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// eventsOnly makes the workers started by the test flush stdout only at
// the events (input, an interrupt, stderr, exit, an audited call), without
// the flush thread, so that a test sees those flushes alone. The session
// is new, so its worker starts with the setting.
func eventsOnly(t *testing.T) *session.Session {
	t.Helper()
	old := workerFlushInterval
	workerFlushInterval = 0
	s := newSession(t)
	t.Cleanup(func() {
		testEng.Stop(s.ID)
		workerFlushInterval = old
	})
	// Start the worker now: a slow start must not eat a run's timeout.
	run(t, testEng, s, "pass")
	return s
}

func fifo(t *testing.T, s *session.Session, name string) string {
	t.Helper()
	p := filepath.Join(s.Workspace(), name)
	// The box's user is not the test's: the FIFO is open to all (the
	// workspace is the test's own temporary directory).
	if err := syscall.Mkfifo(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	return p
}

// unblockFIFO opens the other end of a FIFO without blocking, so that a
// goroutine of a failed test blocked opening it is let go.
func unblockFIFO(p string, flag int) {
	if f, err := os.OpenFile(p, flag|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
}

func runTo(t *testing.T, ctx context.Context, s *session.Session, code string, out, errw *watchedBuffer) *runcode.Result {
	t.Helper()
	res, err := testEng.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: liveTimeout, Stdout: out, Stderr: errw})
	if err != nil {
		t.Fatalf("engine error: %v", err)
	}
	return res
}

// A line printed before the code blocks reaches the sink while the code is
// blocked: here the code waits on a FIFO that the test opens only once the
// line arrived. Nothing but the flush thread sends it (open() of a FIFO is
// not a flush event).
func TestOutputIsLiveWhileCodeBlocks(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "pass")
	liveWhileBlocked(t, s, "")
}

// liveWhileBlocked runs code in s that prints a line and blocks on a FIFO
// that the test opens only once the line arrived, and fails (with what
// it says of the worker's state) when the line came only after.
func liveWhileBlocked(t *testing.T, s *session.Session, state string) {
	t.Helper()
	gate := fifo(t, s, "gate")
	out, errw := watch("before\n"), watch("")
	go func() {
		<-out.seen
		if f, err := os.OpenFile(gate, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	res := runTo(t, ctx, s, "print('before')\nopen('gate').read()\nprint('after')", out, errw)
	unblockFIFO(gate, os.O_RDONLY)
	if res.TimedOut || out.String() != "before\nafter\n" {
		t.Fatalf("%sthe line printed before the code blocked was not delivered while it was blocked: timed out %v, out %q, err %q",
			state, res.TimedOut, out.String(), errw.String())
	}
}

// chunks records each write it gets.
type chunks struct {
	mu sync.Mutex
	w  []string
}

func (c *chunks) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w = append(c.w, string(p))
	return len(p), nil
}

// stderr is line-buffered as CPython's: print() writes each argument, the
// separators and the end one by one, and the sink gets whole lines. Slow's
// str() runs between those writes (a loop: a sleep would flush), so a
// part of a line written alone would long be in the pipe when the rest
// comes; without the flush thread, nothing but the line's end sends it.
func TestStderrLinesWhole(t *testing.T) {
	s := eventsOnly(t)
	var out bytes.Buffer
	errw := &chunks{}
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	code := "import sys\nclass Slow:\n    def __str__(self):\n        for _ in range(300000): pass\n        return 'slow'\n" +
		"for i in range(5):\n    print('line', i, Slow(), file=sys.stderr)"
	res, err := testEng.Run(ctx, &runcode.Request{Code: code, Lang: "python", Session: s, Timeout: liveTimeout, Stdout: &out, Stderr: errw})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	var want strings.Builder
	for i := range 5 {
		fmt.Fprintf(&want, "line %d slow\n", i)
	}
	if got := strings.Join(errw.w, ""); got != want.String() {
		t.Fatalf("stderr %q, want %q", got, want.String())
	}
	for _, c := range errw.w {
		if !strings.HasSuffix(c, "\n") {
			t.Errorf("a part of a line reached the sink alone: %q (all: %q)", c, errw.w)
		}
	}
}

// stderr is line-buffered, but a part of a line is not held while the
// code blocks: the flush thread sends it (a progress message without its
// end, then a wait).
func TestStderrPartOfLineIsLiveWhileCodeBlocks(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "pass")
	gate := fifo(t, s, "gate")
	out, errw := watch(""), watch("working...")
	go func() {
		<-errw.seen
		if f, err := os.OpenFile(gate, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	res := runTo(t, ctx, s, "import sys\nsys.stderr.write('working...')\nopen('gate').read()\nprint(' done', file=sys.stderr)", out, errw)
	unblockFIFO(gate, os.O_RDONLY)
	if res.TimedOut || errw.String() != "working... done\n" {
		t.Fatalf("the part of a stderr line written before the code blocked was not delivered while it was blocked: timed out %v, out %q, err %q",
			res.TimedOut, out.String(), errw.String())
	}
}

// time.sleep flushes stdout at once (an audited call), without the flush
// thread: the test interrupts the sleep when it sees the line.
func TestOutputBeforeSleepIsDelivered(t *testing.T) {
	s := eventsOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	out, errw := watch("a\n"), watch("")
	go func() {
		select {
		case <-out.seen:
			cancel()
		case <-ctx.Done():
		}
	}()
	res := runTo(t, ctx, s, "import time\nprint('a')\ntime.sleep(3600)", out, errw)
	if res.TimedOut || !res.Interrupted || out.String() != "a\n" || !strings.Contains(errw.String(), "KeyboardInterrupt") {
		t.Fatalf("the line printed before time.sleep was not delivered during the sleep: %+v out %q err %q", res, out.String(), errw.String())
	}
}

// The writes of stdout and stderr keep the order of the calls, whatever
// the way they are written. fd 2 is made a copy of fd 1 for the run, so the
// one pipe shows the order of the system calls.
func TestStdoutStderrOrderKept(t *testing.T) {
	t.Parallel()
	code := `import os, sys, subprocess, ctypes
libc = ctypes.CDLL(None)
saved = os.dup(2)
os.dup2(1, 2)
for i in range(400):
    print("o%d" % i)
    print("e%d" % i, file=sys.stderr)
    sys.stdout.buffer.write(b"b%d\n" % i)
    sys.stdout.write("t%d\n" % i)
    sys.stdout.buffer.write(b"B%d\n" % i)
    os.write(2, b"w%d\n" % i)
    sys.stdout.write("u%d\n" % i)
    sys.stderr.buffer.write(b"x%d\n" % i)
    if i % 100 == 0:
        print("p%d" % i)
        subprocess.run(["echo", "s%d" % i])
        print("q%d" % i)
        libc.printf(b"c%d\n", i)
        print("r%d" % i)
        os.system("echo y%d" % i)
os.dup2(saved, 2)
os.close(saved)
print("end")`
	var want strings.Builder
	for i := range 400 {
		fmt.Fprintf(&want, "o%d\ne%d\nb%d\nt%d\nB%d\nw%d\nu%d\nx%d\n", i, i, i, i, i, i, i, i)
		if i%100 == 0 {
			fmt.Fprintf(&want, "p%d\ns%d\nq%d\nc%d\nr%d\ny%d\n", i, i, i, i, i, i)
		}
	}
	want.WriteString("end\n")
	for _, tc := range []struct {
		name string
		s    func(t *testing.T) *session.Session
	}{
		{"timer", func(t *testing.T) *session.Session { return newSession(t) }},
		{"events-only", eventsOnly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, testEng, tc.s(t), code)
			if r.out != want.String() || r.err != "" {
				t.Fatalf("order lost:\n%s\nerr %q", firstDiff(r.out, want.String()), r.err)
			}
		})
	}
}

func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(i-40, 0)
	return fmt.Sprintf("at byte %d: got %q, want %q", i, got[from:min(len(got), i+40)], want[from:min(len(want), i+40)])
}

// Output printed before an exception comes before its traceback.
func TestOutputBeforeTraceback(t *testing.T) {
	s := eventsOnly(t)
	r := run(t, testEng, s, "import os\nos.dup2(1, 2)\nprint('a')\nraise ValueError('x')")
	if !strings.HasPrefix(r.out, "a\nTraceback (most recent call last):\n") || !strings.HasSuffix(r.out, "ValueError: x\n") {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	// And an interrupt's.
	r = run(t, testEng, s, "import os\nos.dup2(1, 2)\nprint('b')\nraise KeyboardInterrupt")
	if !strings.HasPrefix(r.out, "b\nTraceback (most recent call last):\n") || !strings.HasSuffix(r.out, "KeyboardInterrupt\n") {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
}

// input() sends what was printed and its prompt before it waits: here
// stdin is a FIFO that the test writes only once the prompt arrived.
func TestOutputBeforeInputIsDelivered(t *testing.T) {
	s := eventsOnly(t)
	in := fifo(t, s, "in")
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	out, errw := watch("a\nname? "), watch("")
	go func() {
		f, err := os.OpenFile(in, os.O_WRONLY, 0) // the code opens it first
		if err != nil {
			return
		}
		defer f.Close()
		select {
		case <-out.seen:
			f.WriteString("ann\n")
		case <-ctx.Done():
		}
	}()
	res := runTo(t, ctx, s, "import sys\nsys.stdin = open('in')\nprint('a')\nname = input('name? ')\nprint('hi', name)\nsys.stdin.close()\nsys.stdin = sys.__stdin__", out, errw)
	unblockFIFO(in, os.O_RDONLY)
	if res.TimedOut || out.String() != "a\nname? hi ann\n" {
		t.Fatalf("output before input() was not delivered before it waited: %+v out %q err %q", res, out.String(), errw.String())
	}
	// Without stdin, the prompt and what came before it are delivered
	// before the EOFError's traceback.
	r := run(t, testEng, s, "import os\nos.dup2(1, 2)\nprint('b')\ninput('q? ')")
	if !strings.HasPrefix(r.out, "b\nq? Traceback") || !strings.Contains(r.out, "EOFError: input() has no standard input") {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
}

// The interrupt flushes what the code printed: code that swallows the
// KeyboardInterrupt is killed after the grace, and its output is not lost.
// The code tells the test it is running through a FIFO (neither open()
// nor a write to another descriptor flushes stdout).
func TestInterruptFlushesOutput(t *testing.T) {
	t.Parallel()
	s := eventsOnly(t)
	ready := fifo(t, s, "ready")
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	go func() {
		f, err := os.Open(ready)
		if err != nil {
			return
		}
		defer f.Close()
		var b [1]byte
		if n, _ := f.Read(b[:]); n == 1 {
			cancel()
		}
	}()
	code := `import os
print("a")
fd = os.open("ready", os.O_WRONLY)
os.write(fd, b"1")
while True:
    try:
        while True:
            pass
    except KeyboardInterrupt:
        pass`
	out, errw := watch(""), watch("")
	res := runTo(t, ctx, s, code, out, errw)
	unblockFIFO(ready, os.O_WRONLY)
	if res.TimedOut || !res.Interrupted || out.String() != "a\n" {
		t.Fatalf("output before the interrupt was lost: %+v out %q err %q", res, out.String(), errw.String())
	}
}

// What the code printed before the worker ends abruptly is delivered when
// the way it ends passes through Python (os._exit, os.abort, os.kill of
// itself, a crash in a ctypes call), and a forked child's output too.
func TestOutputBeforeWorkerDies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, code, out string }{
		{"os._exit", "import os\nprint('a')\nos._exit(3)", "a\n"},
		{"os.abort", "import os\nprint('b')\nos.abort()", "b\n"},
		{"SIGKILL", "import os, signal\nprint('c')\nos.kill(os.getpid(), signal.SIGKILL)", "c\n"},
		{"segfault", "import ctypes\nprint('d')\nctypes.string_at(0)", "d\n"},
		{"fork", forkCode, "p1\nchild\np2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := eventsOnly(t)
			r := run(t, testEng, s, tc.code)
			if r.out != tc.out {
				t.Fatalf("out %q, want %q; err %q notes %q", r.out, tc.out, r.err, r.Notes)
			}
		})
	}
}

const forkCode = "import os\nprint('p1')\npid = os.fork()\nif pid == 0:\n    print('child')\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('p2')"

// The flush thread is the worker's: a fork of code without threads of its
// own does not warn that the process has threads, and the child's output
// keeps its place. With a thread of the code's, Python's warning stays.
func TestForkWithFlushThread(t *testing.T) {
	s := newSession(t)
	r := run(t, testEng, s, forkCode)
	if r.out != "p1\nchild\np2\n" || r.err != "" {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
	r = run(t, testEng, s, "import threading\nev = threading.Event()\nth = threading.Thread(target=ev.wait)\nth.start()\n"+forkCode+"\nev.set()\nth.join()")
	if r.out != "p1\nchild\np2\n" || !strings.Contains(r.err, "DeprecationWarning") {
		t.Fatalf("out %q err %q", r.out, r.err)
	}
}

// flushThread is the worker's flush thread in s's worker (the worker's
// one task that is not its main thread: the tests' code starts none) and
// what /proc says of it.
func flushThread(t *testing.T, s *session.Session) (syscallNr func() string, switches func() string) {
	t.Helper()
	sl, err := testEng.slot(s.ID)
	if err != nil || sl.worker() == nil {
		t.Fatal("no worker for the session")
	}
	pid := workerProcess(strconv.Itoa(sl.worker().pid))
	if pid == "" {
		t.Fatal("no python process running the worker under its pid")
	}
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		t.Fatal(err)
	}
	var tid string
	for _, task := range tasks {
		if task.Name() != pid {
			tid = task.Name()
		}
	}
	if len(tasks) != 2 || tid == "" {
		t.Fatalf("the worker has %d tasks, want itself and its flush thread", len(tasks))
	}
	dir := "/proc/" + pid + "/task/" + tid + "/"
	syscallNr = func() string {
		b, _ := os.ReadFile(dir + "syscall")
		if f := strings.Fields(string(b)); len(f) > 0 {
			return f[0]
		}
		return ""
	}
	switches = func() string {
		b, _ := os.ReadFile(dir + "status")
		var sw []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "ctxt_switches") {
				sw = append(sw, l)
			}
		}
		return strings.Join(sw, "; ")
	}
	return syscallNr, switches
}

// workerProcess is pid if it runs the worker, else the first of its
// descendants that does (pid is the box's bwrap where the worker runs in a
// box of its own).
func workerProcess(pid string) string {
	if cl, _ := os.ReadFile("/proc/" + pid + "/cmdline"); bytes.Contains(cl, []byte("quro_worker")) && !bytes.HasPrefix(cl, []byte("bwrap")) {
		return pid
	}
	tasks, _ := os.ReadDir("/proc/" + pid + "/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/children")
		for _, c := range strings.Fields(string(b)) {
			if w := workerProcess(c); w != "" {
				return w
			}
		}
	}
	return ""
}

// waitInRead waits until the flush thread is blocked in read(2) (of its
// timerfd). The deadline is a guard against a hang, not a measurement.
func waitInRead(t *testing.T, syscallNr func() string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for syscallNr() != strconv.Itoa(syscall.SYS_READ) {
		if time.Now().After(deadline) {
			t.Fatalf("the flush thread is not in read(2) after 3 minutes: in syscall %q", syscallNr())
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a wait for something to settle
	}
}

// A run shorter than the flush interval does not wake the flush thread:
// it waits on a timerfd that a run arms for one interval after its start
// (here an hour: no run of the test lasts that long), not on a lock that
// every run's start released, which woke it and handed it the GIL.
func TestShortRunLeavesFlushThreadAsleep(t *testing.T) {
	old := workerFlushInterval
	workerFlushInterval = time.Hour
	s := newSession(t)
	t.Cleanup(func() {
		testEng.Stop(s.ID)
		workerFlushInterval = old
	})
	run(t, testEng, s, "pass")
	syscallNr, switches := flushThread(t, s)
	waitInRead(t, syscallNr)
	before := switches()
	for range 5 {
		if r := run(t, testEng, s, "print(1)"); r.out != "1\n" {
			t.Fatalf("out %q err %q", r.out, r.err)
		}
	}
	if after := switches(); after != before || syscallNr() != strconv.Itoa(syscall.SYS_READ) {
		t.Fatalf("five short runs woke the flush thread: %s, then %s (in syscall %s)", before, after, syscallNr())
	}
}

// Code that closes the flush thread's timerfd and puts a pipe of its own
// under its number loses none of the pipe's bytes to the thread, and the
// next run's output is still live while the code blocks (the thread falls
// back to the lock at each run's start).
func TestFlushThreadLeavesCodesDescriptor(t *testing.T) {
	s := newSession(t)
	run(t, testEng, s, "pass")
	r := run(t, testEng, s, `import os
fd = -1
for f in os.listdir('/proc/self/fd'):
    try:
        if os.readlink('/proc/self/fd/' + f) == 'anon_inode:[timerfd]':
            fd = int(f)
    except OSError:
        pass
rd, wr = os.pipe()
os.write(wr, b'12345678abcdefgh')
os.dup2(rd, fd)
print(fd > 2)`)
	if r.out != "True\n" {
		t.Fatalf("no timerfd found: out %q err %q", r.out, r.err)
	}
	liveWhileBlocked(t, s, "with the timerfd gone, ")
	if r := run(t, testEng, s, "os.set_blocking(fd, False)\nprint(os.read(fd, 64))"); r.out != "b'12345678abcdefgh'\n" {
		t.Fatalf("the code's pipe under the timerfd's number: out %q err %q", r.out, r.err)
	}
}
