package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/soak"
)

// tenantEnv is a sandbox whose runs belong to tenant "a" (directories under
// a/) or "b" (under b/), with the given ceilings, each tenant named uniquely
// so that parallel test processes never share a tenant cgroup. Its tenants
// are named by the test too, so the tests that read only their own
// tenants' cgroups run side by side (t.Parallel): together 135 s of the
// package's serial tests at a load of 150.
type tenantEnv struct {
	sb      *Sandbox
	root    string
	a, b    string // tenant names
	aLimits Limits
	bLimits Limits
	boxes   bool // runs of a session directory (a/s1) are spawned in its session box
	// gone are session directories the tenant resolver no longer knows
	// (forget): a destroyed session's, whose row and tenant the app
	// drops before its destroy answers.
	mu   sync.Mutex
	gone map[string]bool
}

// forget makes dir's session unknown to the tenant resolver, as the app's
// destroy makes a session's.
func (e *tenantEnv) forget(dir string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone == nil {
		e.gone = map[string]bool{}
	}
	e.gone[dir] = true
}

func newTenantEnv(t *testing.T, lim Limits) *tenantEnv {
	t.Helper()
	return newTenantEnvWith(t, lim, &Options{})
}

// newTenantEnvWith is newTenantEnv with o's options (its Tenant is set
// here).
func newTenantEnvWith(t *testing.T, lim Limits, o *Options) *tenantEnv {
	t.Helper()
	e := &tenantEnv{root: t.TempDir(), aLimits: lim, bLimits: lim, boxes: o.SessionBoxes}
	sfx := fmt.Sprintf("%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	e.a, e.b = "a-"+sfx, "b-"+sfx
	o.Tenant = func(dir string) (Tenant, bool) {
		rel, err := filepath.Rel(e.root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			return Tenant{}, false
		}
		e.mu.Lock()
		gone := e.gone[dir]
		e.mu.Unlock()
		if gone {
			return Tenant{}, false
		}
		switch strings.SplitN(rel, "/", 2)[0] {
		case "a":
			return Tenant{Name: e.a, Limits: e.aLimits}, true
		case "b":
			return Tenant{Name: e.b, Limits: e.bLimits}, true
		}
		return Tenant{}, false
	}
	sb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.layers.check(IsolationFull); err != nil {
		t.Fatalf("the tenant tests need every layer: %v", err)
	}
	e.sb = sb
	t.Cleanup(func() {
		for _, n := range []string{e.a, e.b} {
			for _, base := range sb.layers.cg.base {
				os.Remove(filepath.Join(base, TenantCgroupName("", n)))
			}
		}
	})
	t.Cleanup(sb.CloseBoxes) // first: the boxes hold the tenants' cgroups
	return e
}

// session is the session box of a run in dir: its path below the root
// (a/s1) when the env has boxes, else none.
func (e *tenantEnv) session(dir string) string {
	if !e.boxes {
		return ""
	}
	rel, _ := filepath.Rel(e.root, dir)
	return rel
}

// dir makes a session directory of tenant ("a" or "b").
func (e *tenantEnv) dir(t *testing.T, tenant, session string) string {
	d := filepath.Join(e.root, tenant, session)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// holder is a long-lived run (like a terminal or a Python worker) that
// did something and holds it; ready is its first line of output.
type holder struct {
	p     *Process
	ready string
	out   *bufio.Reader
	done  chan struct{} // closed when the run has ended
	exit  Exit
}

func (e *tenantEnv) hold(t *testing.T, dir, script string) *holder {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := e.sb.Start(ctx, &Spec{Args: []string{"sh", "-c", script}, Dir: dir, Stdout: w, Stderr: w, Session: e.session(dir)})
	w.Close()
	if err != nil {
		r.Close()
		cancel()
		t.Fatalf("Start: %v", err)
	}
	h := &holder{p: p, out: bufio.NewReader(r), done: make(chan struct{})}
	go func() { h.exit = p.Wait(); close(h.done) }()
	t.Cleanup(func() {
		cancel()
		<-h.done
		r.Close()
	})
	h.ready, _ = h.out.ReadString('\n')
	return h
}

// rest reads the holder's output to its end.
func (h *holder) rest() string {
	b, _ := io.ReadAll(h.out)
	return string(b)
}

// A tenant's background processes count against its memory ceiling
// across sessions: a second session of tenant A that allocates while a
// first one holds memory is stopped by the kernel in A's tenant cgroup
// (OOM), while tenant B, with the same ceiling, allocates as much at the
// same time.
func TestTenantMemoryCeilingSpansSessions(t *testing.T) {
	t.Parallel() // its own sandbox and tenants (tenantEnv)
	e := newTenantEnv(t, Limits{Memory: 256 << 20, Tasks: 1000})
	const alloc = `python3 -c "
import sys, time
b = bytearray(%d << 20)
for i in range(0, len(b), 4096): b[i] = 1
print('ALLOCATED', flush=True)
time.sleep(%d)
"`
	a1 := e.hold(t, e.dir(t, "a", "s1"), fmt.Sprintf(alloc, 170, 1000))
	if !strings.Contains(a1.ready, "ALLOCATED") {
		t.Fatalf("the first session of A could not allocate 170 MiB: %q", a1.ready+a1.rest())
	}
	// B is not charged for A's memory.
	out, errOut, _ := run(t, e.sb, testCtx(t), fmt.Sprintf(alloc, 170, 0), func(s *Spec) { s.Dir = e.dir(t, "b", "s1") })
	if !strings.Contains(out, "ALLOCATED") {
		t.Fatalf("tenant B was charged for A's memory: %q %q", out, errOut)
	}
	// A's second session pushes A over its ceiling.
	out, errOut, exit := run(t, e.sb, testCtx(t), fmt.Sprintf(alloc, 170, 0), func(s *Spec) { s.Dir = e.dir(t, "a", "s2") })
	u, _ := e.sb.TenantUsage(e.a)
	if u.MemoryPeak < 250<<20 || u.MemoryPeak > 256<<20 {
		t.Fatalf("A's memory ceiling was not what stopped the kernel tenant cgroup (usage %+v); second run: %q %q %+v", u, out, errOut, exit)
	}
	if u.MemoryLimit != 256<<20 {
		t.Errorf("A's memory ceiling in the kernel is %d, want %d", u.MemoryLimit, 256<<20)
	}
	if strings.Contains(out, "ALLOCATED") {
		// The kernel chose the first session's process (the largest then):
		// its run ends. Its end is seen once the box has reaped it and its
		// output is drained, which on a loaded machine can come after the
		// second run's result: wait for it.
		select {
		case <-a1.done:
		case <-testCtx(t).Done():
			t.Fatalf("both sessions of A hold 170 MiB under a 256 MiB ceiling: %+v", u)
		}
	}
	if ub, _ := e.sb.TenantUsage(e.b); ub.MemoryPeak >= 256<<20 {
		t.Errorf("tenant B reached its ceiling: %+v", ub)
	}
}

// An OOM kill at the tenant's memory ceiling is reported as one and
// named: a session whose own limit (192 MiB) is above its tenant's
// ceiling (128 MiB) allocates past the ceiling, in its session box and in
// a run of its own; a tenant whose ceiling is above the session's limit
// reads the session's limit instead. A kill in one session of a tenant is
// not counted for another of its sessions running at the same time.
func TestTenantCeilingOOMIsReported(t *testing.T) {
	t.Parallel() // its own sandbox and tenants (tenantEnv)
	own := DefaultLimits()
	own.Memory = 192 << 20
	e := newTenantEnvWith(t, Limits{Memory: 128 << 20, Tasks: 1000}, &Options{SessionBoxes: true, Limits: &own})
	e.bLimits = Limits{Memory: 1 << 30, Tasks: 1000}
	const alloc = `python3 -c "
b = bytearray(300 << 20)
for i in range(0, len(b), 4096): b[i] = 1
print('ALLOCATED', flush=True)
"`
	oom := func(t *testing.T, dir, session string) Exit {
		t.Helper()
		out, errOut, exit := run(t, e.sb, testCtx(t), alloc, func(s *Spec) { s.Dir, s.Session = dir, session })
		if strings.Contains(out, "ALLOCATED") || !exit.OOMKilled {
			t.Fatalf("300 MiB were not stopped by an OOM kill: %q %q %+v", out, errOut, exit)
		}
		return exit
	}
	// A's first session runs all along, small.
	idle := e.hold(t, e.dir(t, "a", "s1"), "echo ready; exec sleep 1000")
	if idle.ready != "ready\n" {
		t.Fatalf("holder: %q", idle.ready+idle.rest())
	}
	s2 := e.dir(t, "a", "s2")
	exit := oom(t, s2, e.session(s2))
	if !exit.OOM.Tenant || exit.OOM.Own || exit.OOM.TenantBytes != 128<<20 {
		t.Errorf("a kill at the tenant's ceiling reads %+v", exit.OOM)
	}
	if got, want := exit.OOM.Reason(), "the tenant's memory ceiling (128 MiB, all of its sessions together) was reached"; got != want {
		t.Errorf("the reason reads %q, want %q", got, want)
	}
	idle.p.Kill()
	<-idle.done
	if idle.exit.OOMKilled {
		t.Errorf("the other session's run, killed by hand, reads as OOM-killed: %+v", idle.exit)
	}
	// A run of its own (no session box) beneath the same tenant.
	exit = oom(t, e.dir(t, "a", "s3"), "")
	if got, want := exit.OOM.Reason(), "the tenant's memory ceiling (128 MiB, all of its sessions together) was reached"; got != want {
		t.Errorf("a run of its own: the reason reads %q, want %q", got, want)
	}
	// B's ceiling is above the session's own limit.
	b1 := e.dir(t, "b", "s1")
	exit = oom(t, b1, e.session(b1))
	if exit.OOM.Tenant || !exit.OOM.Own {
		t.Errorf("a kill at the session's own limit reads %+v", exit.OOM)
	}
	if got, want := exit.OOM.Reason(), "the session's memory limit (192 MiB) was reached"; got != want {
		t.Errorf("the reason reads %q, want %q", got, want)
	}
}

// A fork bomb split across two sessions of one tenant stops at the
// tenant's process ceiling, and another tenant can still start processes.
func TestTenantProcessCeilingSpansSessions(t *testing.T) {
	t.Parallel() // its own sandbox and tenants (tenantEnv)
	const ceiling = 80
	e := newTenantEnv(t, Limits{Tasks: ceiling, CPUPercent: 150})
	a1 := e.hold(t, e.dir(t, "a", "s1"), `for i in $(seq 50); do sleep 1000 & done; echo HELD; wait`)
	if !strings.Contains(a1.ready, "HELD") {
		t.Fatalf("the first session of A could not start 50 processes: %q", a1.ready+a1.rest())
	}
	// The second session forks until the kernel refuses.
	out, errOut, _ := run(t, e.sb, testCtx(t), `n=0; while [ $n -lt 100 ]; do sleep 1000 & n=$((n+1)); done 2>/dev/null; echo started $n; cat /sys/fs/cgroup/pids.current 2>/dev/null; true`,
		func(s *Spec) { s.Dir = e.dir(t, "a", "s2") })
	u, _ := e.sb.TenantUsage(e.a)
	if u.TasksLimit != ceiling {
		t.Fatalf("A's pids ceiling in the kernel is %d, want %d", u.TasksLimit, ceiling)
	}
	if strings.Contains(out, "started 100") || u.TasksPeak > ceiling {
		t.Fatalf("the second session was not stopped at A's ceiling of %d (usage %+v): %q %q", ceiling, u, out, errOut)
	}
	if base := e.sb.layers.cg.base["cpu"]; base != "" && !e.sb.layers.cg.v2["cpu"] {
		if q := readUint(filepath.Join(base, TenantCgroupName("", e.a), "cpu.cfs_quota_us")); q != 150000 {
			t.Errorf("A's CPU ceiling in the kernel is a quota of %d µs per 100 ms, want 150000", q)
		}
	}
	// B, with the same ceiling, starts its 50 while A holds its own.
	out, errOut, _ = run(t, e.sb, testCtx(t), `for i in $(seq 50); do sleep 1000 & done; echo B-OK`, func(s *Spec) { s.Dir = e.dir(t, "b", "s1") })
	if !strings.Contains(out, "B-OK") || errOut != "" {
		t.Fatalf("tenant B was stopped by A's processes: %q %q", out, errOut)
	}
}

// A tenant at its process ceiling is refused at Start with a message that
// names the tenant, the ceiling and what to do.
func TestTenantAtCeilingIsRefusedWithAClearMessage(t *testing.T) {
	t.Parallel() // its own sandbox and tenants (tenantEnv)
	const ceiling = 40
	e := newTenantEnv(t, Limits{Tasks: ceiling})
	a1 := e.hold(t, e.dir(t, "a", "s1"), `for i in $(seq 36); do sleep 1000 & done; echo HELD; wait`)
	if !strings.Contains(a1.ready, "HELD") {
		t.Fatalf("holder: %q", a1.ready+a1.rest())
	}
	var out bytes.Buffer
	_, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: e.dir(t, "a", "s2"), Stdout: &out})
	if !errors.Is(err, ErrTenantCeiling) {
		t.Fatalf("Run = %v, want ErrTenantCeiling", err)
	}
	for _, want := range []string{"tenant " + e.a, "process ceiling of 40", "quro tenant limits set"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the message %q does not say %q", err, want)
		}
	}
	if _, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: e.dir(t, "b", "s1")}); err != nil {
		t.Fatalf("tenant B refused: %v", err)
	}
}

// Run cgroups of a server that died (SIGKILL leaves them) are killed and
// removed when a server starts; those of a live pid are kept.
func TestStaleRunCgroupsAreReaped(t *testing.T) {
	sb := newSandbox(t)
	c := sb.layers.cg
	if !c.has("memory", "pids") {
		t.Skip("no cgroups layer here")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	tenantDir := TenantCgroupName("", fmt.Sprintf("stale-%d", os.Getpid()))
	stale := []string{fmt.Sprintf("run-%d-1-x", pid), filepath.Join(tenantDir, fmt.Sprintf("run-%d-2-y%s", pid, pidNSTag()))}
	kept := "run-1-keep-" + strconv.Itoa(os.Getpid()) // pid 1 is alive
	// A dead pid of another pid namespace (another container) is not ours.
	otherNS := fmt.Sprintf("run-%d-3-z-n1", pid)
	victim := exec.Command("sleep", "1000")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	gone := make(chan error, 1)
	go func() { gone <- victim.Wait() }()
	t.Cleanup(func() {
		victim.Process.Kill()
		for _, base := range c.base {
			os.Remove(filepath.Join(base, kept))
			os.Remove(filepath.Join(base, otherNS))
			os.Remove(filepath.Join(base, tenantDir))
		}
	})
	for _, ctrl := range []string{"memory", "pids"} {
		for _, d := range append(stale, kept, otherNS) {
			if err := os.MkdirAll(filepath.Join(c.base[ctrl], d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		// The victim sits in the nested stale cgroup.
		if err := os.WriteFile(filepath.Join(c.base[ctrl], stale[1], "cgroup.procs"), []byte(strconv.Itoa(victim.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	c.reapStale()
	if err := <-gone; err == nil {
		t.Fatal("the process in the stale cgroup exited by itself")
	}
	for _, ctrl := range []string{"memory", "pids"} {
		for _, d := range stale {
			if _, err := os.Stat(filepath.Join(c.base[ctrl], d)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: stale cgroup %s is still there (%v)", ctrl, d, err)
			}
		}
		if _, err := os.Stat(filepath.Join(c.base[ctrl], kept)); err != nil {
			t.Errorf("%s: the cgroup of a live pid was removed: %v", ctrl, err)
		}
		if _, err := os.Stat(filepath.Join(c.base[ctrl], otherNS)); err != nil {
			t.Errorf("%s: the cgroup of another pid namespace was removed: %v", ctrl, err)
		}
	}
}

// A session paused when its server was killed leaves its processes frozen
// in a stale run cgroup. A frozen process dies of SIGKILL only once
// thawed: the reaper kills and thaws them, so the next server starts
// promptly and nothing of the old session lives on.
func TestStaleFrozenRunIsReaped(t *testing.T) {
	sb := newSandbox(t)
	c := sb.layers.cg
	if !c.has("memory", "pids") || c.base["freezer"] == "" || c.v2["freezer"] {
		t.Skip("no v1 freezer here (cgroup v2's freezer lets SIGKILL through)")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("run-%d-1-frozen%s", dead.Process.Pid, pidNSTag())
	victim := exec.Command("sleep", "1000")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	gone := make(chan error, 1)
	go func() { gone <- victim.Wait() }()
	r := &runCgroup{byCtrl: map[string]string{}}
	for _, ctrl := range []string{"memory", "pids", "freezer"} {
		d := filepath.Join(c.base[ctrl], stale)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		r.byCtrl[ctrl] = d
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(victim.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = r.thaw()
		victim.Process.Kill()
		for _, d := range r.byCtrl {
			os.Remove(d)
		}
	})
	if err := r.freeze(); err != nil {
		t.Fatal(err)
	}
	c.reapStale()
	select {
	case err := <-gone:
		if err == nil {
			t.Fatal("the frozen process exited by itself")
		}
	case <-testCtx(t).Done():
		t.Fatal("the frozen process of the stale run is still alive after the reaper")
	}
	for ctrl, d := range r.byCtrl {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: stale cgroup %s is still there (%v)", ctrl, d, err)
		}
	}
}

// Tenants are their data directory's: two servers (Sandboxes of two
// scopes) with a tenant of the same name keep separate cgroups, so one's
// processes never count against the other's ceilings, and a server that
// closes removes its tenant cgroups once they are empty.
func TestTenantCgroupsArePerScope(t *testing.T) {
	name := fmt.Sprintf("scoped-%d", os.Getpid())
	newScoped := func(scope string) (*Sandbox, string) {
		root := t.TempDir()
		sb, err := New(&Options{TenantScope: scope, Tenant: func(string) (Tenant, bool) {
			return Tenant{Name: name, Limits: Limits{Tasks: 1000}}, true
		}})
		if err != nil {
			t.Fatal(err)
		}
		if !sb.layers.ok(LayerCgroups) {
			t.Skip("no cgroups here")
		}
		return sb, root
	}
	one, dir1 := newScoped(t.TempDir())
	two, _ := newScoped(t.TempDir())
	e := &tenantEnv{sb: one}
	h := e.hold(t, dir1, "echo ready; exec sleep 1000")
	if h.ready != "ready\n" {
		t.Fatalf("holder: %q", h.ready+h.rest())
	}
	if u, _ := one.TenantUsage(name); u.Tasks == 0 && one.layers.cg.base["pids"] != "" {
		t.Fatalf("the holder is not counted in its own server's tenant: %+v", u)
	}
	if u, _ := two.TenantUsage(name); u.Tasks != 0 {
		t.Fatalf("another data directory's tenant of the same name counts the holder: %+v", u)
	}
	// Closing while the holder runs leaves its tenant cgroup (in use);
	// once it has ended, a close removes it.
	one.ReleaseTenants()
	dirs := func() (n int) {
		for _, base := range one.layers.cg.base {
			if _, err := os.Stat(filepath.Join(base, TenantCgroupName(one.layers.cg.scope, name))); err == nil {
				n++
			}
		}
		return n
	}
	if dirs() == 0 {
		t.Fatal("a tenant cgroup in use was removed")
	}
	h.p.Kill()
	<-h.done
	// The run's own cgroup is gone once Wait returned; the tenant's is
	// made again by the next run, then released for good.
	if _, _, exit := run(t, one, testCtx(t), "true", func(s *Spec) { s.Dir = dir1 }); exit.Code != 0 {
		t.Fatalf("a run after a release: %+v", exit)
	}
	one.ReleaseTenants()
	if n := dirs(); n != 0 {
		t.Fatalf("%d tenant cgroups left after the server closed", n)
	}
}

// A run's cgroup is removed once its last process has exited, however
// long that takes: remove waits for the exit (on the process's pidfd)
// instead of giving up after a fixed count of retries, which at a load of
// 20 left the run's cgroup, and so its tenant's, behind. The process here
// exits only when the test closes its stdin, which it does once remove is
// waiting on that process's pidfd.
func TestRunCgroupRemovalWaitsForTheLastExit(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	c := sb.layers.cg
	if c.base["pids"] == "" {
		t.Skip("no pids cgroup here")
	}
	d := filepath.Join(c.base["pids"], fmt.Sprintf("run-%d-lastexit%s", os.Getpid(), pidNSTag()))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(d) })
	victim := exec.Command("cat")
	in, err := victim.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Process.Kill() })
	reaped := make(chan struct{})
	go func() { victim.Wait(); close(reaped) }()
	if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(victim.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	// remove is waiting once this process holds one more pidfd of the
	// victim than before (os/exec holds one of its own).
	want := fmt.Sprintf("\nPid:\t%d\n", victim.Process.Pid)
	pidfds := func() (n int) {
		fds, _ := filepath.Glob("/proc/self/fdinfo/*")
		for _, f := range fds {
			if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), want) {
				n++
			}
		}
		return n
	}
	before := pidfds()
	r := &runCgroup{dirs: []string{d}}
	removed := make(chan struct{})
	go func() { r.remove(); close(removed) }()
	ctx := testCtx(t)
	for pidfds() <= before {
		select {
		case <-removed:
			t.Fatal("remove returned while the run's process was alive")
		case <-ctx.Done():
			t.Fatal("remove never waited on the run's process")
		case <-time.After(time.Millisecond):
		}
	}
	in.Close() // the victim exits
	<-reaped
	select {
	case <-removed:
	case <-ctx.Done():
		t.Fatal("remove did not return after the run's last process exited")
	}
	if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the run's cgroup %s is still there (%v)", d, err)
	}
}

// A freeze that does not finish names the threads that may hold it up: a
// thawed cgroup's process by name, and no running or interruptibly
// sleeping thread of a frozen one.
func TestUnfrozenNamesTheThreadsOutsideTheFreezer(t *testing.T) {
	sb := newSandbox(t)
	c := sb.layers.cg
	if c.base["freezer"] == "" || c.v2["freezer"] {
		t.Skip("no v1 freezer here")
	}
	victim := exec.Command("sleep", "1000")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(c.base["freezer"], fmt.Sprintf("run-%d-unfrozen%s", os.Getpid(), pidNSTag()))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &runCgroup{byCtrl: map[string]string{"freezer": d}}
	t.Cleanup(func() {
		_ = r.thaw()
		victim.Process.Kill()
		victim.Wait()
		os.Remove(d)
	})
	if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(victim.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if got := describeUnfrozen(r.unfrozen(d)); !strings.Contains(got, "not in the freezer: sleep (") {
		t.Errorf("thawed: %q, want the sleeping process named", got)
	}
	if err := r.freeze(); err != nil {
		t.Fatal(err)
	}
	// Frozen, it reads as D (or is in the refrigerator): never R or S.
	if got := describeUnfrozen(r.unfrozen(d)); strings.Contains(got, "(R ") || strings.Contains(got, "(S ") {
		t.Errorf("frozen: %q, want no running or interruptible thread", got)
	}
}

// A Sandbox made while the main thread is inside a run's cgroup (where
// startInside puts the thread that starts a run, for a moment) takes the
// server's own cgroup for its base, not the run's: once, a test's App
// nested its tenants inside another App's run cgroup.
func TestOwnCgroupsIgnoreAMovedMainThread(t *testing.T) {
	sb := newSandbox(t)
	c := sb.layers.cg
	if c.base["pids"] == "" || c.v2["pids"] {
		t.Skip("no v1 pids hierarchy here")
	}
	want := ownCgroups()["pids"]
	run := filepath.Join(c.base["pids"], fmt.Sprintf("run-%d-moved%s", os.Getpid(), pidNSTag()))
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(v1Mount("pids"), want, "tasks")
	// The main thread (tid = pid) moves into the run's cgroup, as
	// startInside's thread does, and back at the end.
	if err := os.WriteFile(filepath.Join(run, "tasks"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(home, []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			t.Error(err)
		}
		os.Remove(run)
	})
	// Asked from a thread that is not the main one.
	got := make(chan string)
	for {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if unix.Gettid() == os.Getpid() {
				got <- "main"
				return
			}
			got <- ownCgroups()["pids"]
		}()
		if g := <-got; g != "main" {
			if g != want {
				t.Fatalf("own pids cgroup with the main thread moved: %q, want %q", g, want)
			}
			break
		}
	}
}

// A start that fails on the server's own cgroups (a tenant's process
// ceiling the kernel refuses to write) names no host path in the error
// a tenant reads, neither the cgroup's nor the session's directory: it
// says which file and why, and the server log has the whole text.
func TestCgroupStartErrorNamesNoHostPath(t *testing.T) {
	var logged bytes.Buffer
	e := newTenantEnvWith(t, Limits{Tasks: 1 << 40}, &Options{Log: slog.New(slog.NewTextHandler(&logged, nil))})
	if e.sb.layers.cg.base["pids"] == "" {
		t.Skip("no pids controller here")
	}
	dir := e.dir(t, "a", "s1")
	_, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: dir})
	var se *StartError
	if !errors.As(err, &se) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Run = %v, want a StartError the kernel's EINVAL caused", err)
	}
	base := e.sb.layers.cg.base["pids"]
	for _, host := range []string{base, "/sys/fs/cgroup", e.root, TenantCgroupName("", e.a) + "/"} {
		if strings.Contains(err.Error(), host) {
			t.Errorf("the error names the host path %s: %q", host, err)
		}
	}
	if !strings.Contains(err.Error(), "pids.max") || !strings.Contains(err.Error(), "invalid argument") {
		t.Errorf("the error does not say what failed: %q", err)
	}
	if !strings.Contains(logged.String(), filepath.Join(base, TenantCgroupName("", e.a), "pids.max")) {
		t.Errorf("the server log does not have the whole text: %q", logged.String())
	}
}

// A destroyed session's box gives its processes back to the next run of
// its tenant even when the box's end completes between the admission's
// count (which still held them) and its look at the boxes still ending:
// the refusal waits for the boxes that were ending when it counted, and
// counts again. The test lands the end exactly there.
//
// What the count holds is a process of the box's cgroup outside its pid
// namespace, which the box's kill does not end and its end (finish:
// the cgroup's processes killed, the cgroup removed) does, and which
// counts until the test reaps it: the first count holds it whatever the
// kernel's pace. (With the box's own processes, which its kill ends, the
// kernel could have reaped enough of them before the count that the run
// was admitted at once, and the race was not landed.) The box's end in
// the background is held in its slot until that count: left to run, it
// could complete before the admission looked at the ending boxes (3 runs
// in 200 beside stress-ng), and the count then held the test's own
// unreaped process with no box to wait for, a refusal no server gives
// (a box that has ended has no process left in its tenant's cgroup:
// bubblewrap is reaped only after its pid namespace is empty).
func TestCeilingRefusalCountsAgainAfterABoxEndedDuringTheCount(t *testing.T) {
	e := newTenantEnvWith(t, Limits{Tasks: 200}, &Options{SessionBoxes: true})
	s1 := e.dir(t, "a", "s1")
	h := e.hold(t, s1, "echo HELD; exec sleep 1000")
	if !strings.Contains(h.ready, "HELD") {
		t.Fatalf("holder: %q", h.ready+h.rest())
	}
	key := e.session(s1)
	bx := e.sb.Box(key)
	if bx == nil || bx.cg == nil {
		t.Fatal("the holder has no session box with a cgroup")
	}
	extra := exec.Command("sleep", "1000")
	if err := extra.Start(); err != nil {
		t.Fatal(err)
	}
	var reap sync.Once
	reaped := func() { reap.Do(func() { _ = extra.Wait() }) }
	t.Cleanup(func() { _ = extra.Process.Kill(); reaped() })
	if err := bx.cg.join(extra.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// The ceiling: with admission's margin of 8, one process of tenant a
	// refuses a run, none admits it.
	e.aLimits = Limits{Tasks: 9}
	if _, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: e.dir(t, "a", "s2")}); !errors.Is(err, ErrTenantCeiling) {
		t.Fatalf("a run beside the holder: %v, want ErrTenantCeiling", err)
	}
	r := e.sb.boxes
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the sandbox's, which ends the boxes
	r.teardownHook = func(start bool) {
		if start {
			<-gate // the background end waits for the count
		}
	}
	e.sb.EndSession(key)
	e.forget(s1)
	refusals := 0
	e.sb.refused = func() {
		refusals++
		// The box's end completes and it leaves the ending set, as its
		// background goroutine does, after the count that held it; the
		// extra process, killed with the box's cgroup, is reaped.
		release()
		bx.finish()
		reaped()
		r.mu.Lock()
		delete(r.ending, key)
		r.mu.Unlock()
	}
	if _, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: e.dir(t, "a", "s2")}); err != nil {
		t.Fatalf("a run after the session holding the tenant's processes ended: %v", err)
	}
	if refusals != 1 {
		t.Fatalf("the first count was refused %d times, want once: the race was not landed", refusals)
	}
	<-h.done
}

// A destroy gives its processes back to the next start of its tenant at
// once: a run (a new session's box) right after EndSession, with the
// tenant at its process ceiling until the destroyed box's processes have
// gone, is admitted, never refused with the processes of a box that is
// ending or has just ended. The real race, each time: the background
// end, the kernel's teardown of the pid namespace and the admission's
// count run as they come. TestSoakRunAtTheCeilingRightAfterADestroy
// runs it 200 times (make test-soak).
func TestRunAtTheCeilingRightAfterADestroyIsAdmitted(t *testing.T) {
	t.Parallel() // its own sandbox and tenants (tenantEnv)
	destroyThenRunAtTheCeiling(t, 3)
}

func TestSoakRunAtTheCeilingRightAfterADestroy(t *testing.T) {
	soak.Skip(t)
	destroyThenRunAtTheCeiling(t, 200)
}

func destroyThenRunAtTheCeiling(t *testing.T, rounds int) {
	e := newTenantEnvWith(t, Limits{Tasks: 1000}, &Options{SessionBoxes: true})
	for i := range rounds {
		e.aLimits = Limits{Tasks: 1000}
		s := e.dir(t, "a", fmt.Sprintf("held%d", i))
		h := e.hold(t, s, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 1000 & done; echo HELD; wait")
		if !strings.Contains(h.ready, "HELD") {
			t.Fatalf("holder: %q", h.ready+h.rest())
		}
		u, _ := e.sb.TenantUsage(e.a)
		// At the ceiling while the holder's box lives (admission refuses
		// at its count plus a margin of 8; the 4 spare tasks forgive a
		// thread of its box that ends meanwhile), and far below it once
		// the box has gone: room for the next session's box.
		e.aLimits = Limits{Tasks: u.Tasks + 4}
		next := e.dir(t, "a", fmt.Sprintf("next%d", i))
		if _, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: next, Session: e.session(next)}); !errors.Is(err, ErrTenantCeiling) {
			t.Fatalf("a run beside the holder's %d tasks: %v, want ErrTenantCeiling", u.Tasks, err)
		}
		key := e.session(s)
		e.sb.EndSession(key)
		e.forget(s)
		var out bytes.Buffer
		if exit, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"echo", "ran"}, Dir: next, Session: e.session(next), Stdout: &out, Stderr: &out}); err != nil || exit.Code != 0 {
			t.Fatalf("round %d: a run right after the destroy of the session holding %d tasks: %v %+v %q", i, u.Tasks, err, exit, out.String())
		}
		<-h.done
		e.sb.EndSession(e.session(next))
		e.sb.AwaitEnded(e.session(next))
		e.sb.AwaitEnded(key)
	}
}

// A box still ending counts as its tenant's though the session is gone
// from the tenant map (the App forgets a destroyed session's tenant, and
// its row, before its box has ended): a refusal at the tenant's ceiling
// waits for it. CI refused the run after destroy_session in
// TestTenantCeilingAcrossSessionsThroughTheController (internal/app)
// while the destroyed box's processes were still exiting: the box was
// looked up by its directory, which named no tenant any more. The
// background end is held in its slot, so the box is ending when looked
// at.
func TestEndingBoxKeepsItsTenantAfterTheSessionIsGone(t *testing.T) {
	e := newTenantEnvWith(t, Limits{Tasks: 1 << 20}, &Options{SessionBoxes: true})
	s1 := e.dir(t, "a", "s1")
	if _, err := e.sb.Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: s1, Session: e.session(s1)}); err != nil {
		t.Fatal(err)
	}
	key := e.session(s1)
	bx := e.sb.Box(key)
	if bx == nil {
		t.Fatal("no session box after a run")
	}
	r := e.sb.boxes
	held, gate := make(chan struct{}, 1), make(chan struct{})
	r.teardownHook = func(start bool) {
		if start {
			held <- struct{}{}
			<-gate
		}
	}
	e.sb.EndSession(key)
	e.forget(s1)
	<-held
	if ending := e.sb.endingOf(e.a); !slices.Contains(ending, bx) {
		t.Errorf("the ending box is not its tenant's once the session is gone: %d ending", len(ending))
	}
	if ending := e.sb.endingOf(e.b); len(ending) != 0 {
		t.Errorf("tenant b has %d boxes ending, want none", len(ending))
	}
	close(gate)
	e.sb.AwaitEnded(key)
}

// A process that SIGKILL does not end at once stays listed in its cgroup:
// a stale run's process stuck in its exit (this host's had a box's bwrap,
// a zombie, and processes /proc no longer showed, listed for hours), or a
// frozen one. Killing the cgroup reads the listing again only while it
// names a process not signaled yet, so such a process costs one more
// read, not 100 (removeCgroupTree kills up to 1,000 times a cgroup: 12 s
// of CPU at every server start on that host). A v1-frozen process stands
// in for the stuck one here: it is listed, and dies only once thawed.
func TestKillingACgroupWithAStuckProcessReadsItTwice(t *testing.T) {
	sb := newSandbox(t)
	c := sb.layers.cg
	if c.base["freezer"] == "" || c.v2["freezer"] {
		t.Skip("no v1 freezer here (v2 kills with cgroup.kill, and its freezer lets SIGKILL through)")
	}
	victim := exec.Command("sleep", "1000")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	gone := make(chan struct{})
	go func() { waitErr = victim.Wait(); close(gone) }()
	d := filepath.Join(c.base["freezer"], fmt.Sprintf("stuck-test-%d", os.Getpid()))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &runCgroup{byCtrl: map[string]string{"freezer": d}}
	t.Cleanup(func() {
		_ = r.thaw()
		victim.Process.Kill()
		<-gone
		os.Remove(d)
	})
	if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(victim.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := r.freeze(); err != nil {
		t.Fatal(err)
	}
	if reads := killListed(d); reads != 2 {
		t.Errorf("killing a cgroup whose one process stays listed read its listing %d times, want 2", reads)
	}
	// Signaled all the same: thawed, it dies of the SIGKILL.
	if err := r.thaw(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the process ended with %v, want SIGKILL", waitErr)
		}
	case <-testCtx(t).Done():
		t.Fatal("the thawed process did not die of the SIGKILL it was sent")
	}
}
