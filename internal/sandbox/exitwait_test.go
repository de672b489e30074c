package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// osThreads is this process's OS thread count.
func osThreads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// goroutinesIn is how many goroutines have fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(fn))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestWaitingHoldsNoThread: n runs live at once, each with a goroutine in
// Wait, then end one by one. The server's OS threads must not grow by
// about n: a goroutine that waits for a process parks in the poller (on
// the run's pidfd) instead of blocking a thread in waitid, and the Go
// runtime never gives back a thread it once made, so before this a
// thousand waits left a thousand threads for good. 40 runs, as
// TestSessionBoxesHoldNoThread's boxes: a thread per wait would be 40
// against a bound of 10, and the threads did not grow at all with 100
// (whose starts in a row took 230 s of make test's serial tests at a
// load of 150).
func TestWaitingHoldsNoThread(t *testing.T) {
	const n = 40
	sb := newSandbox(t)
	ctx := longCtx(t, 5*time.Minute) // n starts in a row, on a loaded machine
	start := func() (*Process, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// One-shot (no Session): a box of its own, waited on by Wait.
		p, err := sb.Start(ctx, &Spec{Args: []string{"cat"}, Dir: t.TempDir(), Stdin: r})
		if err != nil {
			w.Close()
			t.Fatal(err)
		}
		return p, w
	}
	// A first run, so that what any start needs once is there.
	p, w := start()
	w.Close()
	p.Wait()
	runtime.GC()
	base := osThreads(t)

	procs, stdins := make([]*Process, n), make([]*os.File, n)
	for i := range n {
		procs[i], stdins[i] = start()
	}
	done := make([]chan Exit, n)
	for i, p := range procs {
		done[i] = make(chan Exit, 1)
		go func() { done[i] <- p.Wait() }()
	}
	// Every goroutine has entered Wait (where it either parks or blocks
	// in waitid) before any run ends.
	for goroutinesIn("sandbox.(*Process).Wait(") < n {
		runtime.Gosched()
	}
	live := osThreads(t)
	for i := range n {
		stdins[i].Close() // cat ends at EOF
		if e := <-done[i]; e.Code != 0 {
			t.Errorf("run %d: exit %+v", i, e)
		}
	}
	after := osThreads(t)
	t.Logf("OS threads: %d before, %d with %d runs waited on, %d after they ended", base, live, n, after)
	if grew := max(live, after) - base; grew > n/4 {
		t.Errorf("the server's OS threads grew by %d with %d runs waited on (%d before, %d live, %d after): a thread per wait",
			grew, n, base, live, after)
	}
}

// TestSessionBoxesHoldNoThread: n session boxes open at once, then
// closed. A box's end is waited for all its life (bubblewrap's exit), in
// the poller: the OS threads do not grow by about n.
func TestSessionBoxesHoldNoThread(t *testing.T) {
	const n = 40
	sb := newBoxSandbox(t)
	ctx := longCtx(t, 5*time.Minute)
	runIn := func(key string) {
		var out bytes.Buffer
		exit, err := sb.Run(ctx, boxSpec(key, t.TempDir(), &out, "true"))
		if err != nil || exit.Code != 0 {
			t.Fatalf("run in %s: %v %+v %s", key, err, exit, out.String())
		}
	}
	runIn("threads-warm")
	sb.CloseBox("threads-warm")
	runtime.GC()
	base := osThreads(t)
	for i := range n {
		runIn(fmt.Sprintf("threads-%d", i))
	}
	// Every box's waiting goroutine has entered its wait.
	for goroutinesIn("os/exec.(*Cmd).Wait(")+goroutinesIn("sandbox.(*exitWatch).wait(") < n {
		runtime.Gosched()
	}
	live := osThreads(t)
	for i := range n {
		sb.CloseBox(fmt.Sprintf("threads-%d", i))
	}
	after := osThreads(t)
	t.Logf("OS threads: %d before, %d with %d boxes open, %d after they closed", base, live, n, after)
	if grew := max(live, after) - base; grew > n/4 {
		t.Errorf("the server's OS threads grew by %d with %d session boxes open (%d before, %d live, %d after): a thread per box",
			grew, n, base, live, after)
	}
}

// killedServerEnv makes the test binary a server for
// TestKilledServerLeavesNoBoxProcess: it opens a session box and a
// one-shot run, both sleeping, after a burst of concurrent runs (so that
// the forks are spread over the runtime's threads), says "ready" and
// waits to be killed.
const killedServerEnv = "QURO_SANDBOX_TEST_KILLED_SERVER"

func init() {
	if dir := os.Getenv(killedServerEnv); dir != "" {
		os.Exit(killedServer(dir))
	}
}

func killedServer(dir string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "killed server:", err)
		return 1
	}
	sb, err := New(&Options{SessionBoxes: true})
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			spec := &Spec{Args: []string{"true"}, Dir: dir}
			if i%2 == 0 {
				spec.Session = fmt.Sprintf("burst-%d", i)
			}
			_, _ = sb.Run(ctx, spec)
		})
	}
	wg.Wait()
	for _, session := range []string{"killed", ""} {
		if _, err := sb.Start(ctx, &Spec{Args: []string{"sleep", "1000"}, Dir: dir, Session: session}); err != nil {
			return fail(err)
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
	return 0
}

// TestKilledServerLeavesNoBoxProcess: a server killed with SIGKILL runs no
// cleanup, yet no process it started outlives it (bubblewrap's
// parent-death signal, tied to the thread that forked it, --die-with-parent,
// and a box init that ends with its control socket), also after a burst
// of concurrent starts and with every wait parked in the poller.
func TestKilledServerLeavesNoBoxProcess(t *testing.T) {
	if !newBoxSandbox(t).Boxed() {
		t.Skip("no bubblewrap box here")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(self, "-test.run=^$")
	srv.Env = append(os.Environ(), killedServerEnv+"="+t.TempDir())
	srv.Stderr = os.Stderr
	stdin, err := srv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("the server did not start its runs (%q)", line)
	}
	procs, err := readProcs()
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, p := range procs {
		parent[p.pid] = p.ppid
	}
	below := func(pid int) bool {
		for pid > 1 {
			if pid = parent[pid]; pid == srv.Process.Pid {
				return true
			}
		}
		return false
	}
	var pidfds []int
	var names []string
	for _, p := range procs {
		if !below(p.pid) {
			continue
		}
		fd, err := pidfdOpen(p.pid)
		if err != nil {
			continue // ended meanwhile
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.pid))
		pidfds = append(pidfds, fd)
		names = append(names, fmt.Sprintf("%d %s", p.pid, bytes.TrimSpace(comm)))
	}
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	// bubblewrap and the box's init and sleep, twice (session box, one-shot).
	if len(pidfds) < 4 {
		t.Fatalf("the server's runs are not there: %v", names)
	}
	srv.Process.Kill()
	srv.Wait()
	for i, fd := range pidfds {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 30_000)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n != 1 {
				t.Errorf("process %s outlived its killed server", names[i])
			}
			break
		}
	}
}

// TestBurstOfClosesGivesMemoryBack: once the open boxes fell to half of
// their peak and the closes stopped, the server gives its free memory back
// to the kernel (one forced GC and scavenge, debug.FreeOSMemory) instead
// of keeping it until the runtime's paced scavenger gets to it.
func TestBurstOfClosesGivesMemoryBack(t *testing.T) {
	const n = 8
	sb := newBoxSandbox(t)
	ctx := longCtx(t, 5*time.Minute)
	gave := make(chan struct{}, 1)
	sb.boxes.mu.Lock()
	sb.boxes.minPeak = n
	sb.boxes.gaveBack = func() { gave <- struct{}{} }
	sb.boxes.mu.Unlock()
	forced := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	for i := range n {
		var out bytes.Buffer
		if exit, err := sb.Run(ctx, boxSpec(fmt.Sprintf("burst-%d", i), t.TempDir(), &out, "true")); err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
	}
	before := forced()
	for i := range n {
		sb.CloseBox(fmt.Sprintf("burst-%d", i))
	}
	select {
	case <-gave:
	case <-ctx.Done():
		t.Fatal("the burst of closes gave no memory back")
	}
	if forced() == before {
		t.Error("no forced GC ran")
	}
	sb.boxes.mu.Lock()
	peak, empty := sb.boxes.peak, len(sb.boxes.boxes) == 0
	sb.boxes.mu.Unlock()
	if peak != 0 || !empty {
		t.Errorf("after the give-back: peak %d, boxes empty %v; want 0, true", peak, empty)
	}
}

// TestWatchPid: WatchPid calls exited when the process has ended (a
// zombie not reaped yet counts), not while it runs (stop first: never),
// and at once for a pid that is gone.
func TestWatchPid(t *testing.T) {
	live := exec.Command("sleep", "1000")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer live.Wait()
	defer live.Process.Kill()
	called := make(chan struct{}, 1)
	stop := WatchPid(live.Process.Pid, func() { called <- struct{}{} })
	stop() // returns with the watch over: exited is not called after it
	select {
	case <-called:
		t.Fatal("exited was called for a process that runs")
	default:
	}

	ended := make(chan struct{})
	stop = WatchPid(live.Process.Pid, func() { close(ended) })
	defer stop()
	// Killed and not reaped: a zombie, ended for the watch.
	if err := live.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-testCtx(t).Done():
		t.Fatal("exited was not called for a process that was killed")
	}

	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	now := false
	WatchPid(gone.Process.Pid, func() { now = true })()
	if !now {
		t.Error("exited was not called at once for a pid that is gone")
	}
}
