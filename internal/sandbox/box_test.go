package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

func newBoxSandbox(t *testing.T) *Sandbox {
	t.Helper()
	sb, err := New(&Options{SessionBoxes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("no bubblewrap box here")
	}
	t.Cleanup(sb.CloseBoxes)
	return sb
}

// boxSpec is a spec of session key in dir.
func boxSpec(key, dir string, out *bytes.Buffer, script string) *Spec {
	return &Spec{Args: []string{"sh", "-c", script}, Dir: dir, Session: key, UID: 2_500_000 + len(key), Stdout: out, Stderr: out}
}

// openedBox is the box of session key, opened by a run of true in dir.
func openedBox(t *testing.T, sb *Sandbox, key, dir string) *Box {
	t.Helper()
	var out bytes.Buffer
	if exit, err := sb.Run(testCtx(t), boxSpec(key, dir, &out, "true")); err != nil || exit.Code != 0 {
		t.Fatalf("run: %v %+v %s", err, exit, out.String())
	}
	bx := sb.Box(key)
	if bx == nil {
		t.Fatal("no box after a run")
	}
	return bx
}

func TestSessionBoxRunsShareOneBox(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	ns := func() string {
		var out bytes.Buffer
		exit, err := sb.Run(testCtx(t), boxSpec("s1", dir, &out, "readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net; id -u"))
		if err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
		return out.String()
	}
	a, b := ns(), ns()
	if a != b {
		t.Errorf("two runs of one session saw different namespaces:\n%s\n%s", a, b)
	}
	if !strings.HasSuffix(a, "1000\n") {
		t.Errorf("runs as %q, want uid 1000 inside", a)
	}
	bx := sb.Box("s1")
	if bx == nil {
		t.Fatal("no box for s1")
	}
	if bx.Procs() != 0 {
		t.Errorf("%d processes still registered after their runs", bx.Procs())
	}
	// Exit codes and signals come from the box init's wait status.
	for _, tc := range []struct {
		script string
		code   int
		sig    syscall.Signal
	}{{"exit 3", 3, 0}, {"kill -KILL $$", 137, syscall.SIGKILL}, {"kill -TERM $$", 143, syscall.SIGTERM}} {
		var out bytes.Buffer
		exit, err := sb.Run(testCtx(t), boxSpec("s1", dir, &out, tc.script))
		if err != nil || exit.Code != tc.code || exit.Signal != tc.sig {
			t.Errorf("%q: %v code %d signal %v, want %d %v", tc.script, err, exit.Code, exit.Signal, tc.code, tc.sig)
		}
	}
}

func TestSessionBoxBackgroundProcessLivesUntilClose(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	var out bytes.Buffer
	// setsid leaves the run's process group: it outlives the run, in the
	// box. The run ends once the sleeper is in its own session; it prints
	// the sleeper's pid in the box (the shell's, which then execs sleep),
	// so the test need not race the exec to recognise it.
	exit, err := sb.Run(testCtx(t), boxSpec("bg", dir, &out, "mkfifo p; setsid sh -c 'echo $$ >p; exec sleep 1000' </dev/null >/dev/null 2>&1 & read x <p; echo $x"))
	if err != nil || exit.Code != 0 {
		t.Fatalf("run: %v %+v %s", err, exit, out.String())
	}
	bx := sb.Box("bg")
	if bx.Usage().Tasks == 0 && bx.cg != nil {
		if _, ok := bx.cg.dir("pids"); ok {
			t.Errorf("the box's cgroup counts no task though sleep runs in it")
		}
	}
	inner, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("the run printed %q, want the sleeper's pid", out.String())
	}
	// Find the sleeper on the host: the process the box sees as inner,
	// working in dir, running as the session's uid.
	sleeper, ok := sandboxtest.HostPID(inner, dir)
	if !ok {
		t.Fatal("the background sleep is not running after its run ended")
	}
	if fi, err := os.Stat("/proc/" + strconv.Itoa(sleeper)); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(2_500_000+len("bg")) {
		t.Fatalf("the sleeper %d does not run as the session's uid: %v", sleeper, err)
	}
	pidfd, err := pidfdOpen(sleeper)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(pidfd)
	sb.CloseBox("bg")
	waitPidfd(t, pidfd)
	if sb.Box("bg") != nil {
		t.Error("the box is still registered after CloseBox")
	}
}

func TestSessionBoxTimeoutKillsTheRun(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(testCtx(t))
	var out bytes.Buffer
	p, err := sb.Start(ctx, boxSpec("to", dir, &out, "echo started; exec sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	exit := p.Wait()
	if !exit.Canceled || exit.Signal != syscall.SIGKILL {
		t.Errorf("exit %+v, want canceled by SIGKILL", exit)
	}
	// The box stays usable.
	out.Reset()
	exit, err = sb.Run(testCtx(t), boxSpec("to", dir, &out, "echo again"))
	if err != nil || out.String() != "again\n" {
		t.Errorf("after a cancel: %v %+v %q", err, exit, out.String())
	}
}

func TestSessionBoxStartErrors(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	var out bytes.Buffer
	spec := boxSpec("err", dir, &out, "")
	spec.Args = []string{"no-such-program-quro"}
	_, err := sb.Run(testCtx(t), spec)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing program: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, err := sb.Run(testCtx(t), boxSpec("err", dir, &out, "cat x")); err != nil || out.String() != "hi" {
		t.Errorf("after a failed start: %v %q", err, out.String())
	}
}

func pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }

// waitPidfd waits until the process of pidfd has exited.
func waitPidfd(t *testing.T, pidfd int) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 30_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("the process did not end: %v", err)
		}
		return
	}
}

// TestAttackSessionBoxInit: a process spawned in the session box tries to
// reach the box's init (pid 1, which holds the control socket and the
// capabilities to spawn) and the server: signal it, ptrace it, read its
// /proc files, take its descriptors. Every attempt fails, the box keeps
// spawning, and the server's processes are not even visible.
func TestAttackSessionBoxInit(t *testing.T) {
	e := newAttackEnv(t)
	ctx := testCtx(t)
	script := `
for s in KILL TERM STOP INT; do kill -$s 1 2>/dev/null && echo "SIGNALLED-$s"; done
cat /proc/1/environ >/dev/null 2>&1 && echo READ-ENVIRON
ls /proc/1/fd >/dev/null 2>&1 && echo LISTED-FDS
cat /proc/1/maps >/dev/null 2>&1 && echo READ-MAPS
readlink /proc/1/exe >/dev/null 2>&1 && echo READ-EXE
for f in /proc/1/fd/*; do cat "$f" >/dev/null 2>&1 && echo "OPENED-$f"; done
python3 - <<'PY'
` + pyErrno + `
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for req in (PTRACE_ATTACH, PTRACE_SEIZE):
    if libc.ptrace(req, 1, 0, 0) == 0:
        print("PTRACED", req)
# pidfd_open + pidfd_getfd: steal the control socket.
fd = libc.syscall(434, 1, 0)
if fd >= 0:
    for n in range(3, 64):
        if libc.syscall(438, fd, n, 0) >= 0:
            print("STOLE-FD", n)
PY
ls /proc | grep -E '^[0-9]+$' | while read p; do
  tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null; echo " [$p]"
done
echo DONE`
	out, exit := e.attack(t, ctx, script, nil)
	// (The script's own text shows in the cmdline listing: only lines that
	// start with a marker count.)
	for _, line := range strings.Split(out, "\n") {
		for _, bad := range []string{"SIGNALLED", "READ-ENVIRON", "LISTED-FDS", "READ-MAPS", "READ-EXE", "OPENED-", "PTRACED", "STOLE-FD"} {
			if strings.HasPrefix(line, bad) {
				t.Errorf("the attack reached the box init: %s", line)
			}
		}
	}
	if !strings.Contains(out, "DONE") || exit.Code != 0 {
		t.Fatalf("the attack did not run to its end: %+v\n%s", exit, out)
	}
	// The box's /proc holds the box init and the attack's own processes:
	// nothing of the server (this test binary runs only as the box init).
	self, _ := os.Executable()
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, filepath.Base(self)) || (strings.Contains(line, "__quro_box") && !strings.HasSuffix(line, " [1]")) {
			t.Errorf("a process of the server is visible in the box: %q", line)
		}
	}
	if !strings.Contains(out, "__quro_box") {
		t.Errorf("the box init is not pid 1 of the box:\n%s", out)
	}
	// The init survived and still spawns.
	out, exit = e.attack(t, ctx, "echo still", nil)
	if out != "still\n" || exit.Code != 0 {
		t.Fatalf("the box no longer spawns after the attack: %q %+v", out, exit)
	}
	e.stillAnswers(t)
}

// TestInterruptThenKill: Interrupt is the one way to stop a run in two
// stages, in a session box as in a box of its own: a program that stops
// on SIGINT (or SIGHUP) is not killed; one that ignores it is killed
// after the grace. The test binary ignores SIGINT and SIGHUP meanwhile,
// as a server started under nohup or as a script's background job does
// (make test's side runs are): an ignored signal survives fork and exec,
// and the program must still start with both at their default.
func TestInterruptThenKill(t *testing.T) {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	t.Cleanup(func() { signal.Reset(syscall.SIGINT, syscall.SIGHUP) })
	sb := newBoxSandbox(t)
	for _, key := range []string{"intr", ""} {
		dir := t.TempDir()
		for _, tc := range []struct {
			sig    syscall.Signal
			script string
			killed bool
			// grace: the program that ends on the signal gets a grace
			// no load outlasts (the test waits for its exit, not the
			// grace); the one that ignores it is killed at its end.
			grace time.Duration
		}{
			{syscall.SIGINT, "echo ready; exec sleep 1000", false, time.Minute},
			{syscall.SIGINT, "trap '' INT; echo ready; while :; do sleep 1; done", true, 500 * time.Millisecond},
			{syscall.SIGHUP, "echo ready; exec sleep 1000", false, time.Minute},
		} {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			spec := boxSpec(key, dir, nil, tc.script)
			spec.Stdout, spec.Stderr = w, w
			p, err := sb.Start(testCtx(t), spec)
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 6)
			if _, err := io.ReadFull(r, buf); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			var exit Exit
			go func() { exit = p.Wait(); close(exited) }()
			killed := p.Interrupt(tc.sig, 50*time.Millisecond, tc.grace, exited)
			<-exited
			r.Close()
			if killed != tc.killed {
				t.Errorf("box %q, %v, %q: killed %v, want %v (exit %+v)", key, tc.sig, tc.script, killed, tc.killed, exit)
			}
			want := tc.sig
			if tc.killed {
				want = syscall.SIGKILL
			}
			if exit.Signal != want {
				t.Errorf("box %q, %v, %q: ended by %v, want %v", key, tc.sig, tc.script, exit.Signal, want)
			}
		}
	}
}

// BenchmarkSpawn: `true` spawned in a warm session box, against a box of
// its own per run (the path before session boxes) and a bare fork-exec.
//
//	go test -run '^$' -bench BenchmarkSpawn -benchtime 200x ./internal/sandbox/
//
// QURO_BENCH_GAP=50ms waits that long (untimed) between runs, as an agent
// does between calls (the box's spawner, made after the warm-up run, serves
// every timed run either way).
func BenchmarkSpawn(b *testing.B) {
	spawnGap, _ := time.ParseDuration(os.Getenv("QURO_BENCH_GAP"))
	sb, err := New(&Options{SessionBoxes: true})
	if err != nil {
		b.Fatal(err)
	}
	if !sb.Boxed() {
		b.Skip("no bubblewrap box here")
	}
	defer sb.CloseBoxes()
	dir := b.TempDir()
	ctx := context.Background()
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"session-box", func() error {
			_, err := sb.Run(ctx, &Spec{Args: []string{"true"}, Dir: dir, Session: "bench", UID: 2_600_000})
			return err
		}},
		{"own-box", func() error {
			_, err := sb.Run(ctx, &Spec{Args: []string{"true"}, Dir: dir, UID: 2_600_000})
			return err
		}},
		{"fork-exec", func() error { return exec.Command("/bin/true").Run() }},
	} {
		b.Run(c.name, func(b *testing.B) {
			if err := c.run(); err != nil { // warm: the session box is made
				b.Fatal(err)
			}
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if spawnGap > 0 {
					// An agent thinks between runs. Not timed.
					b.StopTimer()
					time.Sleep(spawnGap)
					b.StartTimer()
				}
				start := time.Now()
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
		})
	}
}

// A writable bind is the run's own directory under another name (the
// workspace at /home/user): what the box writes there is in the directory,
// cd works, and Landlock lets it write.
func TestWritableBindIsTheDirectoryAgain(t *testing.T) {
	sb := newSandbox(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	out, errOut, exit := run(t, sb, ctx,
		`cd /home/user && echo hi > made-inside && mkdir -p sub && ls -d "$PWD" && cat /home/user/seen-from-host`,
		func(s *Spec) {
			s.Dir = dir
			s.Binds = []Bind{{Src: dir, Dst: HomeUser, Writable: true}}
			if err := os.WriteFile(filepath.Join(dir, "seen-from-host"), []byte("host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	if exit.Code != 0 || out != "/home/user\nhost\n" {
		t.Fatalf("exit %d, out %q, err %q", exit.Code, out, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "made-inside")); err != nil || string(b) != "hi\n" {
		t.Fatalf("the write through /home/user is not in the directory: %q %v", b, err)
	}
}

// Attack: a writable bind of a host path that is not the run's own
// directory would hand the box more of the host; it is refused before
// anything starts.
func TestWritableBindOutsideTheRunIsRefused(t *testing.T) {
	sb := newSandbox(t)
	ctx := testCtx(t)
	for _, src := range []string{"/etc", t.TempDir(), "relative/dir"} {
		_, err := sb.Run(ctx, &Spec{Args: []string{"true"}, Dir: t.TempDir(), Session: "test-" + t.Name(),
			Binds: []Bind{{Src: src, Dst: HomeUser, Writable: true}}})
		if !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("writable bind of %s: %v, want ErrInvalidSpec", src, err)
		}
	}
}

// TestSessionBoxShowsOnlyTheReadyEntries: of a directory of several
// entries (the App's <data>/python: the interpreter's tree beside other
// builds' trees, locks and leftovers), a session box shows only what
// Options.BoxReadOnlyNow names when the box is made. An entry renamed into
// place later (an installer replacing a damaged tree) is what the next run
// naming it sees: an idle box is made again, a busy one leaves the run a
// box of its own.
func TestSessionBoxShowsOnlyTheReadyEntries(t *testing.T) {
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(base, "python")
	tree, other := filepath.Join(py, "tree"), filepath.Join(py, "other")
	write := func(dir, name, text string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(tree, "version", "v1")
	write(other, "secret", "planted")
	if err := os.WriteFile(filepath.Join(py, ".lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sb, err := New(&Options{SessionBoxes: true, BoxReadOnlyNow: func() []string { return []string{tree} }})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("no bubblewrap box here")
	}
	t.Cleanup(sb.CloseBoxes)
	dir := t.TempDir()
	run := func(script string) string {
		t.Helper()
		var out bytes.Buffer
		spec := boxSpec("s1", dir, &out, script)
		spec.ReadOnly = []string{tree}
		if _, err := sb.Run(testCtx(t), spec); err != nil {
			t.Fatalf("run: %v %s", err, out.String())
		}
		return out.String()
	}
	got := run("cat " + tree + "/version; echo; ls -A " + py + "; cat " + other + "/secret 2>/dev/null || echo hidden")
	if want := "v1\ntree\nhidden\n"; got != want {
		t.Fatalf("the box shows %q, want %q (only the ready entry)", got, want)
	}

	// A new tree renamed into place while the box is idle: the box is
	// made again, and shows it.
	reinstall := func(version string) {
		t.Helper()
		tmp := filepath.Join(py, ".extract-"+version)
		write(tmp, "version", version)
		if err := os.Rename(tree, filepath.Join(py, ".extract-old-"+version)); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tree); err != nil {
			t.Fatal(err)
		}
	}
	reinstall("v2")
	if got := run("cat " + tree + "/version"); got != "v2" {
		t.Fatalf("after a reinstall an idle box's run sees %q, want v2", got)
	}

	// While a process keeps the box busy: the run gets a box of its own.
	p, err := sb.Start(testCtx(t), boxSpec("s1", dir, &bytes.Buffer{}, "sleep 60"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	outside := sb.BoxStats().Outside
	reinstall("v3")
	if got := run("cat " + tree + "/version"); got != "v3" {
		t.Fatalf("after a reinstall a busy box's run sees %q, want v3", got)
	}
	if sb.BoxStats().Outside != outside+1 {
		t.Fatalf("the run beside the busy box was not in a box of its own: %+v", sb.BoxStats())
	}
}

// A signal to a process in a session box is a message to the box's init,
// which sends it by kill(2) when it reads it, maybe after its sender has
// gone on (a SIGINT for one run of the Python worker landed in the next).
// SignalsDelivered returns once it has been sent: the process, which
// blocks these signals so that they stay pending, has each one pending
// then, every time.
func TestSignalsDeliveredWaitsForTheBoxInit(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 here")
	}
	sb := newBoxSandbox(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const first, last = 34, 60 // real-time signals: nothing else sends them
	spec := boxSpec("sigsync", t.TempDir(), nil, "exec python3 -c 'import signal, time\n"+
		"signal.pthread_sigmask(signal.SIG_BLOCK, range("+strconv.Itoa(first)+", "+strconv.Itoa(last+1)+"))\n"+
		"print(\"ready\", flush=True)\ntime.sleep(3600)'")
	spec.Stdout, spec.Stderr = w, w
	p, err := sb.Start(testCtx(t), spec)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Kill(); p.Wait() }()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("the process said %q, %v", buf, err)
	}
	pending := func() uint64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "ShdPnd:\t"); ok {
				n, err := strconv.ParseUint(v, 16, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatal("no ShdPnd in the process's status")
		return 0
	}
	for sig := first; sig <= last; sig++ {
		p.Signal(syscall.Signal(sig))
		if err := p.SignalsDelivered(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		if got := pending(); got&(1<<(sig-1)) == 0 {
			t.Fatalf("signal %d is not pending once SignalsDelivered returned (pending %#x)", sig, got)
		}
	}
}

// EndSession answers once the box's init is sent SIGKILL: the box leaves
// the registry at once and no run of the session makes another;
// AwaitEnded then waits until bubblewrap has exited, every process of the
// box is gone and its cgroup removed — the events a destroy's background
// release waits for before it frees the session's disk.
func TestEndSessionKillsNowAndAwaitEndedWaitsForTheEnd(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	var out bytes.Buffer
	exit, err := sb.Run(testCtx(t), boxSpec("end", dir, &out, "mkfifo p; setsid sh -c 'echo $$ >p; exec sleep 1000' </dev/null >/dev/null 2>&1 & read x <p; echo $x"))
	if err != nil || exit.Code != 0 {
		t.Fatalf("run: %v %+v %s", err, exit, out.String())
	}
	inner, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("the run printed %q, want the sleeper's pid", out.String())
	}
	sleeper, ok := sandboxtest.HostPID(inner, dir)
	if !ok {
		t.Fatal("the background sleep is not running after its run ended")
	}
	pidfd, err := pidfdOpen(sleeper)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	bx := sb.Box("end")
	if bx == nil {
		t.Fatal("no box after a run")
	}
	var cgDirs []string
	if bx.cg != nil {
		cgDirs = bx.cg.dirs
	}
	sb.EndSession("end")
	if sb.Box("end") != nil {
		t.Error("the box is still registered after EndSession")
	}
	if _, err := sb.Run(testCtx(t), boxSpec("end", dir, &out, "true")); !errors.Is(err, ErrSessionEnded) {
		t.Errorf("a run after EndSession: %v, want ErrSessionEnded", err)
	}
	sb.AwaitEnded("end")
	select {
	case <-bx.Done():
	default:
		t.Error("AwaitEnded returned before bubblewrap exited")
	}
	// Its pidfd is readable once the sleeper has exited: at once here.
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Errorf("the box's sleeper %d still runs after AwaitEnded (%v)", sleeper, err)
		}
		break
	}
	for _, d := range cgDirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("the box's cgroup %s is left after AwaitEnded: %v", d, err)
		}
	}
	sb.AwaitEnded("end") // ended already: at once
}

// A CloseBoxes (a server's Close) that comes while EndSession (a
// destroy) is killing a box waits for that box's end too: the hook runs
// it right after the kill, where the box was in neither the registry nor
// the ending boxes, and CloseBoxes returned with the box's end not begun
// (App.Close then went on to unmount the disks under it).
func TestCloseBoxesDuringEndSessionWaitsForTheEnd(t *testing.T) {
	sb := newBoxSandbox(t)
	bx := openedBox(t, sb, "closing", t.TempDir())
	ran := false
	hook := func(key string) {
		if key != "closing" {
			return
		}
		ran = true
		sb.CloseBoxes()
		select {
		case <-bx.ended:
		default:
			t.Error("CloseBoxes returned while the box EndSession killed had not ended")
		}
	}
	endSessionKilledHook.Store(&hook)
	t.Cleanup(func() { endSessionKilledHook.Store(nil) })
	sb.EndSession("closing")
	if !ran {
		t.Fatal("the hook did not run")
	}
	sb.AwaitEnded("closing")
}

// A burst of destroys ends its boxes at most cap(teardowns) at once in the
// background; the others wait for a slot, and a waiter of a box still
// waiting (AwaitEnded: a destroy's release) waits for a slot or for its
// end, never behind the bound for good. The hook holds the first ends in
// their slots, so that the rest must queue (the former code started every
// end at once); then they go, and every box's bubblewrap and cgroup are
// gone.
func TestEndSessionBurstIsBounded(t *testing.T) {
	sb := newBoxSandbox(t)
	const n, bound = 6, 2
	keys := make([]string, n)
	boxes := make([]*Box, n)
	var cgDirs []string
	for i := range keys {
		keys[i] = fmt.Sprintf("burst%d", i)
		var out bytes.Buffer
		if exit, err := sb.Run(testCtx(t), boxSpec(keys[i], t.TempDir(), &out, "true")); err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
		if boxes[i] = sb.Box(keys[i]); boxes[i] == nil {
			t.Fatal("no box after a run")
		}
		if boxes[i].cg != nil {
			cgDirs = append(cgDirs, boxes[i].cg.dirs...)
		}
	}
	r := sb.boxes
	r.teardowns = make(chan struct{}, bound)
	gate := make(chan struct{})
	changed := make(chan struct{}, 1)
	var most atomic.Int32
	r.teardownHook = func(start bool) {
		if start {
			k := r.tearing.Load()
			if k > bound {
				t.Errorf("%d box ends at once, bound %d", k, bound)
			}
			for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
			}
		}
		select {
		case changed <- struct{}{}:
		default:
		}
		if start {
			<-gate
		}
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		ctx := testCtx(t)
		for !ok() {
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %d ending, %d queued", what, r.tearing.Load(), r.queued.Load())
			}
		}
	}
	for _, k := range keys {
		sb.EndSession(k)
	}
	until("the bound's ends held and the rest queued", func() bool { return r.tearing.Load() == bound && r.queued.Load() == n-bound })
	waiting := -1
	for i, bx := range boxes {
		if !bx.begun.Load() {
			waiting = i
		}
	}
	if waiting < 0 {
		t.Fatal("every end began though the slots are held")
	}
	awaited := make(chan struct{})
	go func() {
		sb.AwaitEnded(keys[waiting])
		close(awaited)
	}()
	until("the waiter queued", func() bool { return r.queued.Load() == n-bound+1 })
	select {
	case <-awaited:
		t.Fatal("AwaitEnded returned while its box's end waits for a slot")
	default:
	}
	close(gate)
	<-awaited
	select {
	case <-boxes[waiting].Done():
	default:
		t.Error("AwaitEnded returned before bubblewrap exited")
	}
	for _, k := range keys {
		sb.AwaitEnded(k)
	}
	until("every slot given back", func() bool { return r.tearing.Load() == 0 && r.queued.Load() == 0 && len(r.teardowns) == 0 })
	if m := most.Load(); m != bound {
		t.Errorf("at most %d ends at once, want the bound %d", m, bound)
	}
	for i, bx := range boxes {
		select {
		case <-bx.ended:
		default:
			t.Errorf("box %s has not ended", keys[i])
		}
	}
	for _, d := range cgDirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("a box's cgroup %s is left: %v", d, err)
		}
	}
}

// A run handed the session's idle box must still find it open when it
// spawns, though a run of another shape comes between (on a fresh data
// directory the Python worker, once the embedded Python was prepared,
// named the interpreter's tree, which a box made before did not show; it
// replaced the idle box and a start_process that had just been handed
// that box failed with "the session box was closed"). The hook stops the
// first run at that moment; the run of the other shape goes to a box of
// its own, the first run spawns in the session's box, and once both have
// ended the idle box is replaced as before.
func TestBoxHandedToARunIsNotReplacedUnderIt(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	tree := t.TempDir()
	if err := os.Chmod(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "version"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	const key = "claimed"
	run := func(spec *Spec, out *bytes.Buffer) {
		t.Helper()
		if exit, err := sb.Run(testCtx(t), spec); err != nil || exit.Code != 0 {
			t.Fatalf("run: %v %+v %s", err, exit, out.String())
		}
	}
	var first bytes.Buffer
	run(boxSpec(key, dir, &first, "true"), &first) // the box, without tree
	bx := sb.Box(key)
	if bx == nil {
		t.Fatal("no box for the session")
	}

	var other bytes.Buffer
	otherSpec := boxSpec(key, dir, &other, "cat "+tree+"/version")
	otherSpec.ReadOnly = []string{tree}
	outside := sb.BoxStats().Outside
	armed := make(chan struct{}, 1)
	armed <- struct{}{}
	hook := func(k string) {
		if k != key {
			return
		}
		select {
		case <-armed: // once: the other run must not stop here
		default:
			return
		}
		run(otherSpec, &other)
	}
	boxClaimedHook.Store(&hook)
	t.Cleanup(func() { boxClaimedHook.Store(nil) })

	var out bytes.Buffer
	run(boxSpec(key, dir, &out, "echo in the box"), &out)
	if len(armed) != 0 {
		t.Fatal("the hook never ran: the run was not handed the session's box")
	}
	if out.String() != "in the box\n" || other.String() != "v1" {
		t.Fatalf("the runs printed %q and %q", out.String(), other.String())
	}
	if sb.Box(key) != bx {
		t.Fatal("the box handed to the run was replaced under it")
	}
	if got := sb.BoxStats().Outside; got != outside+1 {
		t.Fatalf("the run of the other shape was not in a box of its own: outside %d, want %d", got, outside+1)
	}
	bx.mu.Lock()
	claims := bx.claims
	bx.mu.Unlock()
	if claims != 0 || bx.Procs() != 0 {
		t.Fatalf("the idle box still has %d claims and %d processes", claims, bx.Procs())
	}

	// Idle again, the box is replaced by the run that needs tree.
	other.Reset()
	run(otherSpec, &other)
	if sb.Box(key) == bx || sb.BoxStats().Outside != outside+1 {
		t.Fatalf("the idle box was not replaced for the run of the other shape: %+v", sb.BoxStats())
	}
}

// TestStartsInHome: a run that asks to start in HomeUser starts there
// whichever box takes it, and the box enters it without a shell when it
// shows the workspace there: the session box's init (an idle box), or
// bubblewrap (a box of its own, when the session's box is busy with a run
// of another shape, as start_process over quro mcp met it); without that
// view the box's sh tries, and its failure is the run's (exit 1), never a
// refused spec.
func TestStartsInHome(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "seen"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	home := []Bind{{Src: dir, Dst: HomeUser, Writable: true}}
	homeSpec := func(out *bytes.Buffer, script string) *Spec {
		spec := boxSpec("home", dir, out, script)
		spec.Binds, spec.StartsInHome = home, true
		return spec
	}
	// No shell first when the box shows the workspace at HomeUser; the
	// box's sh when it does not.
	var out bytes.Buffer
	if pl, err := sb.prepare(homeSpec(&out, "pwd")); err != nil || pl.spec.Args[0] != "sh" || !pl.spec.StartsInHome {
		t.Fatalf("prepare with the workspace at %s: %v, args %q", HomeUser, err, pl.spec.Args)
	}
	noBind := boxSpec("nobind", t.TempDir(), &out, "pwd")
	noBind.StartsInHome = true
	if pl, err := sb.prepare(noBind); err != nil || pl.spec.StartsInHome || !slices.Equal(pl.spec.Args, EnterDirArgs(HomeUser, noBind.Args)) {
		t.Fatalf("prepare without the workspace at %s: %v, args %q", HomeUser, err, pl.spec.Args)
	}

	// The session box's init enters it.
	exit, err := sb.Run(testCtx(t), homeSpec(&out, `pwd; ls; id -u`))
	if err != nil || exit.Code != 0 || out.String() != HomeUser+"\nseen\n1000\n" {
		t.Fatalf("a run that starts in %s: %v %+v %q", HomeUser, err, exit, out.String())
	}
	bx := sb.Box("home")
	if bx == nil {
		t.Fatal("no box for the session")
	}

	// The box busy with a run that waits for its stdin; a run of another
	// shape (one more read-only tree) gets a box of its own: bubblewrap
	// enters HomeUser.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	defer stdinW.Close()
	var busyOut bytes.Buffer
	busy := homeSpec(&busyOut, "cat >/dev/null; echo done")
	busy.Stdin = stdinR
	p, err := sb.Start(testCtx(t), busy)
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := os.Chmod(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := sb.BoxStats().Outside
	out.Reset()
	other := homeSpec(&out, `pwd; ls`)
	other.ReadOnly = []string{tree}
	exit, err = sb.Run(testCtx(t), other)
	if err != nil || exit.Code != 0 || out.String() != HomeUser+"\nseen\n" {
		t.Fatalf("a run beside the busy box that starts in %s: %v %+v %q", HomeUser, err, exit, out.String())
	}
	if got := sb.BoxStats().Outside; got != outside+1 || sb.Box("home") != bx {
		t.Fatalf("the run of the other shape was not in a box of its own: outside %d, want %d", got, outside+1)
	}
	stdinW.Close()
	if exit := p.Wait(); exit.Code != 0 || busyOut.String() != "done\n" {
		t.Fatalf("the busy run: %+v %q", exit, busyOut.String())
	}

	// Without the workspace at HomeUser, in the session's box and in a
	// box of its own: the box's sh cannot enter it, and says so.
	for _, spec := range []*Spec{noBind, {Args: []string{"pwd"}, Dir: dir, StartsInHome: true}} {
		out.Reset()
		spec.Stdout, spec.Stderr = &out, &out
		exit, err := sb.Run(testCtx(t), spec)
		if err != nil || exit.Code != 1 || !strings.Contains(out.String(), HomeUser) {
			t.Errorf("StartsInHome without the workspace at %s (session %q): %v %+v %q, want exit 1 and sh's word", HomeUser, spec.Session, err, exit, out.String())
		}
	}
}

// expireOnRead is a Stdin whose first read expires ctx: the run's start
// has sent its program to the box (the stdin copy begins just before the
// start waits for the init child's status). It then reads as empty.
type expireOnRead struct{ ctx *sandboxtest.Expiring }

func (r expireOnRead) Read([]byte) (int, error) {
	r.ctx.Expire()
	return 0, io.EOF
}

// TestStartInAStuckBoxEndsWithItsContext: the box init of a session is
// stopped (as a foreign tracer leaves it), so that the status of a start
// never comes and the kill sent at the start's end is never carried out.
// The start ends all the same when its context does, with a start error;
// the box that does not answer is closed (its init killed, its processes
// with it), and the session's next run gets a new box.
func TestStartInAStuckBoxEndsWithItsContext(t *testing.T) {
	sb := newBoxSandbox(t)
	sb.stuckGrace = 100 * time.Millisecond // the box init is stopped: it never answers
	dir := t.TempDir()
	bx := openedBox(t, sb, "stuck", dir)
	if err := syscall.Kill(bx.pid1, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(bx.pid1, syscall.SIGCONT) })

	ctx := sandboxtest.NewExpiring(testCtx(t))
	var out bytes.Buffer
	spec := boxSpec("stuck", dir, &out, "echo never")
	spec.Stdin = expireOnRead{ctx}
	_, err := sb.Run(ctx, spec)
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "canceled while the sandbox was starting") {
		t.Fatalf("a start in a stuck box: %v, want a start error saying it was canceled", err)
	}
	select {
	case <-bx.Done():
	default:
		t.Fatal("the box that did not answer is still running")
	}
	out.Reset()
	if exit, err := sb.Run(testCtx(t), boxSpec("stuck", dir, &out, "echo again")); err != nil || exit.Code != 0 || out.String() != "again\n" {
		t.Fatalf("the next run: %v %+v %q", err, exit, out.String())
	}
	if nb := sb.Box("stuck"); nb == nil || nb == bx {
		t.Fatal("the next run did not get a new box")
	}
}

// A status message that carries a pidfd is the box init's answer for a
// program its spawner started: its writer's credentials are the box
// init's, never the program's. When the program ended and was reaped
// before the server read the pidfd, the pid is 0 (gone), not the init's.
func TestStatusPidOfAProgramGoneIsNotTheWriters(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	defer unix.Close(pidfd)
	cred := syscall.UnixCredentials(&syscall.Ucred{Pid: 4242, Uid: 0, Gid: 0})
	fd, err := unix.Dup(pidfd)
	if err != nil {
		t.Fatal(err)
	}
	if got := statusPid(append(syscall.UnixRights(fd), cred...)); got != cmd.Process.Pid {
		t.Fatalf("a live program's pidfd: pid %d, want %d", got, cmd.Process.Pid)
	}
	cmd.Wait() // reaped: the pidfd names no process now
	if fd, err = unix.Dup(pidfd); err != nil {
		t.Fatal(err)
	}
	if got := statusPid(append(syscall.UnixRights(fd), cred...)); got != 0 {
		t.Fatalf("a reaped program's pidfd: pid %d, want 0 (not the writer's 4242)", got)
	}
	if got := statusPid(cred); got != 4242 {
		t.Fatalf("no pidfd: pid %d, want the writer's 4242", got)
	}
}

// A program that ended before the server looked at it has the pid it had
// in the box, the one the box init named at its spawn: the server is held
// before it reads the start's status until the program's end came, in
// both ways a box starts a program (an init child, then the spawner
// started after it). Read from /proc then, it would be gone: a pidfd's
// pid 0, or a host pid.
func TestBoxPidOfAProgramEndedBeforeAnyoneLooked(t *testing.T) {
	sb := newBoxSandbox(t)
	dir := t.TempDir()
	hold := func(p *Process) { <-p.ended }
	statusHook.Store(&hold)
	t.Cleanup(func() { statusHook.Store(nil) })
	ways := map[bool]bool{}
	for i := 0; i < 3; i++ {
		var out bytes.Buffer
		p, err := sb.Start(testCtx(t), boxSpec("ended-pid", dir, &out, "echo $$"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.ended:
		default:
			t.Fatal("Start returned before the program's end: the hold did not hold")
		}
		if exit := p.Wait(); exit.Code != 0 {
			t.Fatalf("run %d: %+v %q", i, exit, out.String())
		}
		own, err := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatalf("run %d printed %q", i, out.String())
		}
		p.bx.mu.Lock()
		ways[p.bySpawner] = true
		p.bx.mu.Unlock()
		if got := p.BoxPid(); got != own || got < 2 {
			t.Fatalf("run %d (by spawner: %v): BoxPid %d, the program's own pid %d", i, p.bySpawner, got, own)
		}
	}
	if !ways[false] || !ways[true] {
		t.Fatalf("the runs went one way only (by spawner: %v): both must be seen", ways)
	}
}

// The box init's Started is parsed within bounds: only a decimal pid a
// spawned program can have (2 up to the kernel's limit) names one.
func TestParseBoxPid(t *testing.T) {
	for s, want := range map[string]int{
		"2": 2, "17": 17, "4194304": maxBoxPid,
		"": 0, "0": 0, "1": 0, "-5": 0, "+5": 0, " 5": 0, "5x": 0, "4194305": 0,
		"99999999999999999999": 0, "0x10": 0, "١٢": 0,
	} {
		if got := parseBoxPid(s); got != want {
			t.Errorf("parseBoxPid(%q) = %d, want %d", s, got, want)
		}
	}
}
