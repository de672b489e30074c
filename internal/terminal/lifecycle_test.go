package terminal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
	"golang.org/x/sys/unix"
)

// TestShellStatesMoveForwardOnly: the shell goes idle → starting → ready
// ↔ running, and once closing nothing leads back: not a transition asked
// for directly, not a command, not a start.
func TestShellStatesMoveForwardOnly(t *testing.T) {
	// The table: out of closing only closed, out of closed nothing.
	for from := StateIdle; from <= StateClosed; from++ {
		for to := StateIdle; to <= StateClosed; to++ {
			s := NewShell(ShellOptions{})
			s.state = from
			ok := s.setStateLocked(to)
			back := from >= StateClosing && !(from == StateClosing && to == StateClosed)
			if ok && back {
				t.Errorf("%v → %v allowed", from, to)
			}
			if ok && s.state != to || !ok && s.state != from {
				t.Errorf("%v → %v: ok %v, state %v", from, to, ok, s.state)
			}
		}
	}

	s, ws, _ := newShell(t, nil)
	if st := s.State(); st != StateIdle {
		t.Fatalf("new shell: %v", st)
	}
	exec(t, s, "true", ExecOptions{})
	if st := s.State(); st != StateReady {
		t.Fatalf("after a command: %v", st)
	}
	res := exec(t, s, "read x; echo got $x", ExecOptions{})
	if !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	if st := s.State(); st != StateRunning {
		t.Fatalf("waiting for input: %v", st)
	}
	s.SendInput("y\n")
	if res, err := s.Wait(context.Background(), time.Minute); err != nil || res.Output != "got y\n" {
		t.Fatalf("%+v %v", res, err)
	}
	if st := s.State(); st != StateReady {
		t.Fatalf("after the answer: %v", st)
	}
	// A command that kills its shell: restarted within the run, ready again.
	if res := exec(t, s, "exit 3", ExecOptions{}); !res.ShellRestarted || s.State() != StateReady || !s.Status().Alive {
		t.Fatalf("after exit: %+v, %v", res, s.State())
	}
	s.Close()
	if st := s.State(); st != StateClosed {
		t.Fatalf("after Close: %v", st)
	}
	if _, err := s.Exec(context.Background(), "touch "+ws+"/after", ExecOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("exec after close: %v", err)
	}
	if err := s.Start(); !errors.Is(err, ErrClosed) {
		t.Errorf("start after close: %v", err)
	}
	if err := s.SendInput("x"); !errors.Is(err, ErrClosed) {
		t.Errorf("input after close: %v", err)
	}
	if _, err := s.Wait(context.Background(), time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("wait after close: %v", err)
	}
	if st := s.State(); st != StateClosed || s.Status().Alive {
		t.Fatalf("after calls on a closed shell: %v %+v", st, s.Status())
	}
	if _, err := os.Stat(filepath.Join(ws, "after")); err == nil {
		t.Error("a command ran after Close")
	}
	s.Close() // twice is fine
}

// TestCloseDuringStartPublishesNothing: a shell closed while its process
// starts ends as closed, and the process that was starting is killed, not
// made the shell's.
func TestCloseDuringStartPublishesNothing(t *testing.T) {
	s, _, _ := newShell(t, nil)
	errc := make(chan error, 1)
	go func() { errc <- s.Start() }()
	s.mu.Lock()
	s.waitLocked(context.Background(), func() bool { return s.state != StateIdle })
	s.mu.Unlock()
	s.Close()
	if err := <-errc; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("start: %v", err)
	}
	if st := s.State(); st != StateClosed {
		t.Fatalf("state %v", st)
	}
	s.mu.Lock()
	sp := s.sp
	s.mu.Unlock()
	if sp != nil {
		t.Fatal("a process was published after Close")
	}
}

// TestConcurrentCallsAndClose hammers one shell with commands, input,
// waits, status reads and starts from many goroutines, then closes it under
// them. Every call ends with its own output or a clear error (busy, not
// running, closed); none hangs, and nothing of the shell is left. Run it
// with -race.
func TestConcurrentCallsAndClose(t *testing.T) {
	s, _, _ := newShell(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec(t, s, "true", ExecOptions{})
	s.mu.Lock()
	pids := s.sp.proc.CgroupPids()
	s.mu.Unlock()

	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	enough := make(chan struct{}) // closed once some commands went through
	fail := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		t.Errorf(format, a...)
	}
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				want := fmt.Sprintf("g%d-%d", g, i)
				var cmd string
				switch i % 3 {
				case 0:
					cmd = "echo " + want
				case 1:
					cmd = "read x; echo " + want + "$x"
				default:
					cmd = "echo " + want + "; exit 4" // kills its shell: a restart
				}
				res, err := s.Exec(ctx, cmd, ExecOptions{})
				switch {
				case errors.Is(err, ErrBusy):
					s.SendInput("\n")
					if _, err := s.Wait(ctx, time.Minute); err != nil && !errors.Is(err, ErrNotRunning) && !errors.Is(err, ErrClosed) {
						fail("wait: %v", err)
					}
					s.Status()
				case errors.Is(err, ErrClosed):
					return
				case err != nil:
					fail("exec %q: %v", cmd, err)
				case res.WaitingForInput:
					// Someone's newline may answer it first, and another
					// command start before this Wait: Wait is for whatever
					// runs or just ended.
					s.SendInput("\n")
					if _, err := s.Wait(ctx, time.Minute); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNotRunning) {
						fail("wait after input: %v", err)
					}
				default:
					if !strings.HasPrefix(res.Output, want) {
						fail("%q printed %q (%+v)", cmd, res.Output, res)
					}
					mu.Lock()
					if ran++; ran == 12 {
						close(enough)
					}
					mu.Unlock()
				}
				if g == 0 {
					s.Start()
				}
			}
		}()
	}
	<-enough
	s.Close()
	wg.Wait()
	if st := s.State(); st != StateClosed || s.Status().Alive {
		t.Fatalf("after Close: %v %+v", st, s.Status())
	}
	for _, p := range pids {
		if syscall.Kill(p, 0) == nil {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); !strings.Contains(string(b), ") Z ") {
				t.Errorf("process %d of the shell's box still runs: %s", p, b)
			}
		}
	}
}

// TestCloseWhileACommandRuns: Close ends a long command at once; the
// Exec waiting for it returns ErrClosed (not a timeout), and no process
// of the shell is left.
func TestCloseWhileACommandRuns(t *testing.T) {
	for _, box := range []string{"own", "session"} {
		t.Run(box, func(t *testing.T) {
			s, ws := newShellIn(t, box)
			fifo := filepath.Join(ws, "started")
			if err := syscall.Mkfifo(fifo, 0o666); err != nil {
				t.Fatal(err)
			}
			os.Chmod(fifo, 0o666)
			type out struct {
				res *Result
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := s.Exec(context.Background(), "trap '' INT; sleep 1000 & echo > started; wait", ExecOptions{Timeout: 10 * time.Minute})
				done <- out{res, err}
			}()
			// Read to the end (a writer left without a reader dies of
			// SIGPIPE): the sleep is forked, in the shell's group.
			if _, err := os.ReadFile(fifo); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			pids := s.sp.proc.CgroupPids()
			group := s.sp.proc.Group()
			s.mu.Unlock()
			// A pidfd of each process of the shell's group but the shell,
			// taken before Close: it polls readable once that very process
			// has exited. SIGKILL to the group ends them, each a moment
			// after the shell: their exits are the kernel's work.
			var children []int
			for _, p := range pids {
				if p == group || pgidOf(p) != group {
					continue
				}
				fd, err := unix.PidfdOpen(p, 0)
				if err != nil {
					t.Fatalf("pidfd of %d: %v", p, err)
				}
				children = append(children, fd)
			}
			t.Cleanup(func() {
				for _, fd := range children {
					unix.Close(fd)
				}
			})
			s.Close()
			o := <-done
			if !errors.Is(o.err, ErrClosed) || !strings.Contains(o.err.Error(), "destroyed") {
				t.Fatalf("exec under Close: %+v %v", o.res, o.err)
			}
			if len(pids) == 0 {
				t.Skip("no cgroup here to list the box's processes")
			}
			if len(children) == 0 {
				t.Fatalf("no child of the shell among the box's processes %v", pids)
			}
			// Close killed them: each exits well within the bound (a sleep
			// left alive would run for 1000 s).
			for _, fd := range children {
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, err := unix.Poll(fds, 10_000)
				for errors.Is(err, unix.EINTR) {
					n, err = unix.Poll(fds, 10_000)
				}
				if err != nil || n != 1 {
					t.Errorf("a child of the shell still runs 10 s after Close (poll: %d %v)", n, err)
				}
			}
		})
	}
}

// pgidOf is the process group of host pid p, 0 when it is gone.
func pgidOf(p int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return 0
	}
	g, _ := strconv.Atoi(f[2])
	return g
}

// TestInputDetectionLooksOnlyInTheBox: waiting for input is seen, and the
// detection reads the /proc entries of the shell's own box only — never
// those of a process outside it, here a host process blocked reading a
// pipe, nor the server's. (A walk of the whole /proc reads them all.)
func TestInputDetectionLooksOnlyInTheBox(t *testing.T) {
	for _, box := range []string{"own", "session"} {
		t.Run(box, func(t *testing.T) {
			s, _ := newShellIn(t, box)
			exec(t, s, "true", ExecOptions{})
			s.mu.Lock()
			proc := s.sp.proc
			s.mu.Unlock()
			if proc.CgroupPids() == nil {
				t.Skip("no cgroup layer: the detection falls back to /proc")
			}
			// A host process blocked in read(2) on a pipe.
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pw.Close()
			host := osexec.Command("cat")
			host.Stdin = pr
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			pr.Close()
			defer func() { host.Process.Kill(); host.Wait() }()

			var mu sync.Mutex
			seen := map[int]bool{}
			look := func(pid int) {
				mu.Lock()
				seen[pid] = true
				mu.Unlock()
			}
			inspected.Store(&look)
			defer inspected.Store(nil)

			res := exec(t, s, "printf 'name? '; read name; echo \"hi $name\"", ExecOptions{})
			if !res.WaitingForInput || res.Output != "name? " {
				t.Fatalf("%+v", res)
			}
			mu.Lock()
			got := slices.Sorted(func(yield func(int) bool) {
				for p := range seen {
					if !yield(p) {
						return
					}
				}
			})
			mu.Unlock()
			if len(got) == 0 {
				t.Fatal("the detection looked at no process")
			}
			for _, p := range got {
				if p == host.Process.Pid || p == os.Getpid() {
					t.Errorf("the detection read /proc/%d, a process outside the box (host cat %d, server %d); it read %v", p, host.Process.Pid, os.Getpid(), got)
				}
			}
			s.SendInput("box\n")
			if res, err := s.Wait(context.Background(), time.Minute); err != nil || res.Output != "name? hi box\n" {
				t.Fatalf("%+v %v", res, err)
			}
		})
	}
}

// newShellIn returns a shell in a box of its own ("own") or in a session
// box ("session").
func newShellIn(t *testing.T, box string) (*Shell, string) {
	t.Helper()
	if box == "own" {
		s, ws, _ := newShell(t, nil)
		return s, ws
	}
	sb, err := sandbox.New(&sandbox.Options{SessionBoxes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.SessionBoxes() || os.Geteuid() != 0 {
		t.Skip("needs session boxes and root")
	}
	t.Cleanup(sb.CloseBoxes)
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	os.MkdirAll(ws, 0o755)
	key := "term-" + strings.ReplaceAll(t.Name(), "/", "-")
	s := NewShell(ShellOptions{Sandbox: sb.ForSession(key, 2_600_000+len(key), nil), Workspace: ws, TmpDir: dir, OutputsDir: filepath.Join(ws, ".quro/outputs")})
	t.Cleanup(s.Close)
	return s, ws
}

// BenchmarkInputDetection is one look for a command waiting for input
// (done every 100 ms while a command runs): over the box's processes, and
// over the whole of /proc as before.
//
//	go test -run '^$' -bench InputDetection -benchtime 200x ./internal/terminal/
func BenchmarkInputDetection(b *testing.B) {
	sb, err := sandbox.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ws := filepath.Join(dir, "workspace")
	os.MkdirAll(ws, 0o755)
	s := NewShell(ShellOptions{Sandbox: sb, Workspace: ws, TmpDir: dir, OutputsDir: filepath.Join(ws, ".quro/outputs")})
	defer s.Close()
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	s.mu.Lock()
	sp := s.sp
	s.mu.Unlock()
	pgid := sp.proc.Group()
	for _, bc := range []struct {
		name string
		pids func() []int
	}{{"box", sp.proc.CgroupPids}, {"all-proc", allPids}} {
		b.Run(bc.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				pids := bc.pids()
				n = len(pids)
				blockedOnPipe(pids, pgid, sp.inInode)
			}
			b.ReportMetric(float64(n), "pids/op")
		})
	}
}

// TestEndOfACommandIsKeptForWait: a command answered by send_input may end
// before the caller's Wait; Wait still returns its end, once.
func TestEndOfACommandIsKeptForWait(t *testing.T) {
	s, _, _ := newShell(t, nil)
	if res := exec(t, s, "read x; echo got $x", ExecOptions{}); !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	if err := s.SendInput("late\n"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.waitLocked(context.Background(), func() bool { return s.state == StateReady })
	s.mu.Unlock()
	res, err := s.Wait(context.Background(), time.Minute)
	if err != nil || res.Output != "got late\n" || res.Running {
		t.Fatalf("%+v %v", res, err)
	}
	if _, err := s.Wait(context.Background(), time.Minute); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second wait: %v", err)
	}
}

// TestIdleStopNeverTakesARunningShell: CloseIfIdle checks and closes in
// one step: a shell running a command (even one waiting for input) is
// kept, a ready one past the cutoff is closed.
func TestIdleStopNeverTakesARunningShell(t *testing.T) {
	s, _, _ := newShell(t, nil)
	future := time.Now().Add(time.Hour)
	if s.CloseIfIdle(future) {
		t.Fatal("closed a shell that never started")
	}
	if res := exec(t, s, "read x", ExecOptions{}); !res.WaitingForInput {
		t.Fatalf("%+v", res)
	}
	if s.CloseIfIdle(future) || s.State() != StateRunning {
		t.Fatalf("closed a running shell: %v", s.State())
	}
	s.SendInput("\n")
	if _, err := s.Wait(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if s.CloseIfIdle(time.Now().Add(-time.Hour)) {
		t.Fatal("closed a shell used within the idle time")
	}
	if !s.CloseIfIdle(future) || s.State() != StateClosed || s.Status().Alive {
		t.Fatalf("idle shell not closed: %v %+v", s.State(), s.Status())
	}
}

// TestAShellThatDoesNotComeUpSaysSo: a shell whose bash does not answer
// its setup (here stopped, as a machine at a load of 100 once kept one
// past a flat 10 s) fails its start after the start bound with ErrStart,
// saying what happened and that the next command starts it again, not
// with an error the server can only call internal; the next command
// does start it.
func TestAShellThatDoesNotComeUpSaysSo(t *testing.T) {
	s, _, _ := newShell(t, func(o *ShellOptions) { o.StartTimeout = 2 * time.Second })
	stopped := make(chan int, 1)
	hook := func(p *sandbox.Process) { stopped <- stopBox(t, p) }
	spawnedHook.Store(&hook)
	err := s.Start()
	spawnedHook.Store(nil)
	if n := <-stopped; n == 0 {
		t.Skip("the shell's box has no run cgroup to stop its processes by")
	}
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "did not answer its setup within 2s") ||
		!strings.Contains(err.Error(), "the next command starts it again") {
		t.Fatalf("start of a shell that does not answer: %v", err)
	}
	if st := s.State(); st != StateIdle {
		t.Fatalf("state after the failed start: %v", st)
	}
	if r := exec(t, s, "echo up", ExecOptions{}); r.Output != "up\n" || r.ExitCode != 0 {
		t.Fatalf("the next command: %+v", r)
	}
}

// stopBox stops every process of p's box with SIGSTOP and returns how
// many it stopped. One listing is not enough: a process listed while it
// forks is stopped after its fork, and the child, missing from the list,
// runs on (the shell then answered its setup). So each round waits until
// every stopped process is seen stopped — any fork it was making is then
// done and its child in the cgroup — and lists again, until a listing
// finds no process not already stopped.
func stopBox(t *testing.T, p *sandbox.Process) int {
	stopped := map[int]bool{}
	for {
		more := false
		for _, pid := range p.CgroupPids() {
			if !stopped[pid] {
				syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid] = true
				more = true
			}
		}
		if !more {
			return len(stopped)
		}
		for pid := range stopped {
			waitStopped(t, pid)
		}
	}
}

// waitStopped waits until pid is stopped, or gone, or waiting for a
// vfork child to exec ("D": a spawner whose child was stopped before its
// exec never reaches the stopped state; its fork is done and the child
// is in the cgroup), reading its state from /proc/PID/stat.
func waitStopped(t *testing.T, pid int) {
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // gone
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && strings.IndexByte("TtDZX", b[i+2]) >= 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("pid %d not stopped within a minute", pid)
			return
		}
		time.Sleep(time.Millisecond) // a poll: /proc gives no event for a stop
	}
}
