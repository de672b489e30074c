package sandbox

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The cgroup layer puts every run in a cgroup of its own with a memory limit
// (swap included, so a memory bomb cannot page the machine to death), a
// process limit (a fork bomb stops at pids.max) and a CPU quota, and kills
// the whole cgroup when the run ends.
//
// Each controller is taken from cgroup v2 when the server's own cgroup can
// delegate it, else from a v1 hierarchy: real hosts range from pure v2 to
// hybrid layouts where v2 is mounted without controllers and memory and
// pids live in v1. The run cgroups are created beneath the server's own
// cgroup in each hierarchy, under "quro/".

// cgroupControllers are the controllers Quro uses, in the order they are
// reported.
var cgroupControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// optionalControllers are used where found but not required by the layer:
// CPU accounting (v1: cpuacct; v2's cpu.stat has it) and the freezer that
// pauses a session box (v2: cgroup.freeze, no controller).
var optionalControllers = map[string]bool{"cpuacct": true, "freezer": true}

type cgroups struct {
	base   map[string]string // controller → directory that holds the run cgroups
	v2     map[string]bool   // controller → base is in the unified hierarchy
	mnt    map[string]string // v1 controller → mount point of its hierarchy
	detail string
	seq    atomic.Uint64

	scope string // Options.TenantScope, set before the first run

	mu      sync.Mutex
	tenants map[string]Limits    // tenant cgroup name → the ceilings last written
	watches map[string]*oomWatch // tenant cgroup name → its v1 OOM notifications
	above   *oomWatch            // v1: the OOM notifications of quro/ (limits above the tenants')
}

// forget drops a tenant cgroup from what c made, so that the next run
// makes it again (another server of the scope removed it when it closed).
func (c *cgroups) forget(name string) {
	c.mu.Lock()
	delete(c.tenants, name)
	c.watches[name].close()
	delete(c.watches, name)
	c.mu.Unlock()
}

// releaseTenants removes the tenant cgroups c made that are empty now (no
// process, no run beneath): a server leaves no cgroup behind for its data
// directory. One still in use (a process of another server of the scope)
// stays; that server makes it again if it is gone when it next runs.
func (c *cgroups) releaseTenants() {
	c.mu.Lock()
	names := make([]string, 0, len(c.tenants))
	for name := range c.tenants {
		names = append(names, name)
	}
	c.tenants = nil
	for _, w := range c.watches {
		w.close()
	}
	c.watches = nil
	c.mu.Unlock()
	seen := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		base := c.base[ctrl]
		if base == "" || seen[base] {
			continue
		}
		seen[base] = true
		for _, name := range names {
			_ = os.Remove(filepath.Join(base, name)) // EBUSY while in use
		}
	}
}

// openCgroups finds a hierarchy for each controller and creates the "quro"
// parent there. Controllers that cannot be used are left out; detail says
// what was found.
func openCgroups() *cgroups {
	c := &cgroups{base: map[string]string{}, v2: map[string]bool{}, mnt: map[string]string{}}
	own := ownCgroups()
	var notes []string
	if root := cgroup2Root(); root != "" {
		if dir, ok := own[""]; ok {
			got := setupV2(filepath.Join(root, dir))
			for ctrl, base := range got {
				c.base[ctrl], c.v2[ctrl] = base, true
			}
		}
	}
	ms := mounts() // once, not once per controller: the mount table is long on a busy host
	for _, ctrl := range cgroupControllers {
		if c.base[ctrl] != "" {
			notes = append(notes, ctrl+" v2")
			continue
		}
		mnt := v1MountIn(ms, ctrl)
		dir, ok := own[ctrl]
		if mnt == "" || !ok {
			if !optionalControllers[ctrl] {
				notes = append(notes, ctrl+" missing")
			}
			continue
		}
		base := filepath.Join(mnt, dir, "quro")
		err := os.Mkdir(base, 0o755)
		if err == nil || errors.Is(err, os.ErrExist) {
			err = probeCgroupDir(base)
		}
		if err != nil {
			if !optionalControllers[ctrl] {
				notes = append(notes, fmt.Sprintf("%s v1 not writable (%v)", ctrl, err))
			}
			continue
		}
		c.base[ctrl], c.mnt[ctrl] = base, mnt
		notes = append(notes, ctrl+" v1")
	}
	c.detail = strings.Join(notes, ", ")
	if base := c.base["memory"]; base != "" && !c.v2["memory"] {
		c.above = watchOOM(base)
	}
	reapStaleOnce(c)
	return c
}

// reaped holds the sets of cgroup bases whose stale runs this process
// reaped already (see reapStaleOnce).
var reaped sync.Map

// reapStaleOnce is c.reapStale the first time this process opens cgroups
// with c's bases: a stale run is one of a server process that is gone,
// found when the first sandbox of this process is made; a second sandbox
// of the same process (every App of a test binary) would walk the same
// hierarchies for the few servers that died in between, which the next
// process to start reaps anyway.
func reapStaleOnce(c *cgroups) {
	var key []string
	for _, ctrl := range cgroupControllers {
		key = append(key, c.base[ctrl])
	}
	if _, done := reaped.LoadOrStore(strings.Join(key, "\x00"), true); !done {
		c.reapStale()
	}
}

// setupV2 makes dir/quro a cgroup whose children can use the controllers
// dir delegates. It returns the usable controllers.
func setupV2(dir string) map[string]string {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	avail := strings.Fields(string(b))
	if len(avail) == 0 {
		return nil
	}
	base := filepath.Join(dir, "quro")
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil
	}
	if probeCgroupDir(base) != nil {
		return nil
	}
	got := map[string]string{}
	for _, ctrl := range cgroupControllers {
		if !contains(avail, ctrl) {
			continue
		}
		// Enabling a controller for children fails while dir itself holds
		// processes (the "no internal processes" rule); then v1 is tried.
		_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+ctrl), 0)
		if os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+"+ctrl), 0) == nil {
			got[ctrl] = base
		}
	}
	return got
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ownCgroups maps each v1 controller (and "" for v2) to the server's cgroup
// path, from /proc/thread-self/cgroup: the calling thread's. Not
// /proc/self's, which is the main thread's: startInside moves a thread into
// a run's cgroups for a moment, and when that thread was the main one a
// Sandbox made meanwhile took the run's cgroup for the server's and nested
// its tenants inside it. A thread running an unlocked goroutine, as this
// one, is never in a run's cgroup.
func ownCgroups() map[string]string {
	out := map[string]string{}
	f, err := os.Open("/proc/thread-self/cgroup")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			out[ctrl] = v1Path(ctrl, parts[2])
		}
	}
	return out
}

// v1Roots maps each v1 controller to the root of its hierarchy's mount
// (mountinfo's fourth field): "/" on a host, the container's own cgroup
// in a container whose runtime mounted only that subtree (containerd on
// a cgroup v1 Kubernetes node), where /proc's cgroup paths still name the
// whole hierarchy's path.
var v1Roots = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || g[0] != "cgroup" {
			continue
		}
		for _, ctrl := range strings.Split(g[2], ",") {
			if _, seen := out[ctrl]; !seen {
				out[ctrl] = f[3]
			}
		}
	}
	return out
})

// v1Path is a v1 cgroup path from /proc/*/cgroup as a path below the
// controller's mount: the mount's root taken off when the mount shows only
// a subtree.
func v1Path(ctrl, p string) string { return underRoot(v1Roots()[ctrl], p) }

// underRoot is p, a path in a cgroup hierarchy, below a mount of that
// hierarchy's subtree root.
func underRoot(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	if p == root {
		return "/"
	}
	if rest, ok := strings.CutPrefix(p, root+"/"); ok {
		return "/" + rest
	}
	return p
}

func v1Mount(ctrl string) string { return v1MountIn(mounts(), ctrl) }

// v1MountIn is v1Mount in the mount table ms.
func v1MountIn(ms []mount, ctrl string) string {
	for _, m := range ms {
		if m.fstype == "cgroup" && contains(strings.Split(m.opts, ","), ctrl) {
			return m.dir
		}
	}
	return ""
}

// has reports whether every named controller is usable.
func (c *cgroups) has(ctrls ...string) bool {
	for _, ctrl := range ctrls {
		if c.base[ctrl] == "" {
			return false
		}
	}
	return true
}

// runCgroup is the cgroup (one directory per hierarchy) of one run.
type runCgroup struct {
	dirs []string // distinct directories, one per hierarchy used
	v2   string   // the unified one, if any
	mem  string   // the directory holding the memory controller
	v2m  bool     // mem is in the unified hierarchy
	// ctrl[i] is a controller of the v1 hierarchy of dirs[i], mnt[i] that
	// hierarchy's mount point ("" for the unified one).
	ctrl, mnt []string
	byCtrl    map[string]string // controller → its directory
	tenant    bool              // made beneath a tenant's cgroup: mem's parent holds the tenant's ceiling
	// tenantName is that tenant's name: its processes count in the
	// tenant's cgroup until they have exited, whatever becomes of the
	// session that made them.
	tenantName string
	// v1: the OOM notifications of mem, of its tenant's cgroup, and of
	// quro/ (nil: none, or v2, which counts OOM events in memory.events).
	watch, tenantWatch, above *oomWatch
}

// create makes the run's cgroups and writes the limits. With a tenant, the
// run's cgroups are made beneath the tenant's (see tenant.go).
func (c *cgroups) create(lim Limits, t *Tenant) (*runCgroup, error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	name := fmt.Sprintf("run-%d-%d-%x%s", os.Getpid(), c.seq.Add(1), rnd, pidNSTag())
	if t != nil {
		tdir, err := c.tenant(t)
		if err != nil {
			return nil, err
		}
		name = filepath.Join(tdir, name)
		r, err := c.make(name, lim)
		if errors.Is(err, os.ErrNotExist) {
			// The tenant's cgroup was removed by another server of the
			// scope as it closed: make it again, once.
			c.forget(tdir)
			if _, err := c.tenant(t); err != nil {
				return nil, err
			}
			r, err = c.make(name, lim)
		}
		if r != nil {
			r.tenant, r.tenantName = true, t.Name
			c.mu.Lock()
			r.tenantWatch = c.watches[tdir]
			c.mu.Unlock()
		}
		return r, err
	}
	return c.make(name, lim)
}

// make makes the run cgroup name in each hierarchy and writes its limits.
func (c *cgroups) make(name string, lim Limits) (*runCgroup, error) {
	r := &runCgroup{byCtrl: map[string]string{}}
	made := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		base := c.base[ctrl]
		if base == "" {
			continue
		}
		dir := filepath.Join(base, name)
		r.byCtrl[ctrl] = dir
		if !made[dir] {
			if err := os.Mkdir(dir, 0o755); err != nil {
				r.remove()
				return nil, cgroupError(fmt.Errorf("cgroup %s: %w", ctrl, err))
			}
			made[dir] = true
			r.dirs = append(r.dirs, dir)
			r.ctrl = append(r.ctrl, ctrl)
			r.mnt = append(r.mnt, c.mnt[ctrl])
			if c.v2[ctrl] {
				r.v2 = dir
			}
		}
		if err := writeLimits(dir, ctrl, c.v2[ctrl], lim); err != nil {
			r.remove()
			return nil, err
		}
		if ctrl == "memory" {
			r.mem, r.v2m = dir, c.v2[ctrl]
			if !r.v2m {
				r.watch, r.above = watchOOM(dir), c.above
			}
		}
	}
	return r, nil
}

func writeLimits(dir, ctrl string, v2 bool, lim Limits) error {
	w := func(file, val string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
			return cgroupError(fmt.Errorf("cgroup %s: %w", file, err))
		}
		return nil
	}
	switch {
	case ctrl == "memory" && lim.Memory > 0 && v2:
		if err := w("memory.max", strconv.FormatUint(lim.Memory, 10)); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			return w("memory.swap.max", "0")
		}
	case ctrl == "memory" && lim.Memory > 0:
		if err := w("memory.limit_in_bytes", strconv.FormatUint(lim.Memory, 10)); err != nil {
			return err
		}
		// memory+swap equal to memory: no swap. Without swap accounting
		// the file is missing; swappiness 0 is the next best thing.
		if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
			return w("memory.memsw.limit_in_bytes", strconv.FormatUint(lim.Memory, 10))
		}
		_ = w("memory.swappiness", "0") // best effort, as above
	case ctrl == "pids" && lim.Tasks > 0:
		return w("pids.max", strconv.FormatUint(lim.Tasks, 10))
	case ctrl == "cpu" && lim.CPUPercent > 0 && v2:
		return w("cpu.max", fmt.Sprintf("%d 100000", lim.CPUPercent*1000))
	case ctrl == "cpu" && lim.CPUPercent > 0:
		if err := w("cpu.cfs_period_us", "100000"); err != nil {
			return err
		}
		return w("cpu.cfs_quota_us", strconv.FormatUint(lim.CPUPercent*1000, 10))
	}
	return nil
}

// startInside runs start (which forks the run's first process) on an OS
// thread that has moved itself into the run's cgroups first, so the child
// is born in them and never has to be moved: moving a process (writing its
// pid to cgroup.procs) takes the kernel's global threadgroup lock, whose
// writer waits for an RCU grace period (about 10 ms per run), while a
// thread that moves only itself ("0" to a v1 tasks file) skips that lock.
// With ns, the thread also enters that network namespace first, so the
// child is born in it (bubblewrap has no option to join one). With mnt,
// the thread enters the mount namespace mnt makes first (mountView.enter)
// and leaves it after the start. The thread moves back before it serves
// any other goroutine.
//
// r may be nil. It reports ok=false when the child was not born in r's
// cgroups (r is nil, a unified hierarchy is in use, or the thread could not
// move): then the caller joins the process to them after the start. Without
// ns and mnt it has then done nothing, and the caller starts the process
// itself. An
// error is start's, that the thread could not enter ns, or that the
// thread could not move back (before or after the start); such a thread
// is parked for the process's life (parkThread), never ended: every box
// it started would get its parent-death signal. The run must not go on.
func (r *runCgroup) startInside(ns *Netns, mnt func() (leave func() error, err error), start func() error) (ok bool, err error) {
	v1 := r != nil && r.v2 == "" && len(r.dirs) > 0
	if !v1 && ns == nil && mnt == nil {
		return false, nil
	}
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	goLocked(func() {
		if mnt != nil {
			leave, err := mnt()
			if err != nil {
				done <- result{err: err}
				if errors.Is(err, errNamespaceStuck) {
					parkThread()
				}
				runtime.UnlockOSThread()
				return
			}
			start = withLeave(start, leave)
		}
		var home map[string]string
		if v1 {
			var herr error
			if home, herr = threadCgroups(); herr != nil {
				v1 = false
			}
		}
		moved := 0
		back := func() bool {
			for i := 0; i < moved; i++ {
				dir := filepath.Join(r.mnt[i], home[r.ctrl[i]])
				if os.WriteFile(filepath.Join(dir, "tasks"), []byte("0"), 0) != nil {
					return false
				}
			}
			return true
		}
		for i := 0; v1 && i < len(r.dirs); i++ {
			if _, known := home[r.ctrl[i]]; !known || r.mnt[i] == "" {
				break
			}
			if os.WriteFile(filepath.Join(r.dirs[i], "tasks"), []byte("0"), 0) != nil {
				break
			}
			moved++
		}
		if v1 && moved < len(r.dirs) {
			if !back() {
				done <- result{err: errors.New("cgroup: the starting thread could not leave the run's cgroups")}
				parkThread() // never serves another goroutine; the boxes it started live on
			}
			moved, v1 = 0, false
		}
		if !v1 && ns == nil && mnt == nil {
			runtime.UnlockOSThread()
			done <- result{}
			return
		}
		var err error
		if ns != nil {
			err = ns.enterThenBack(start)
		} else {
			err = start()
		}
		if !back() {
			if err == nil {
				err = errors.New("cgroup: the starting thread could not leave the run's cgroups")
			}
			done <- result{ok: v1, err: err}
			parkThread()
		}
		done <- result{ok: v1, err: err}
		if errors.Is(err, errNamespaceStuck) || errors.Is(err, errNetnsStuck) {
			parkThread() // see parkThread: the boxes it started live on
		}
		runtime.UnlockOSThread()
	})
	res := <-done
	return res.ok, res.err
}

// withLeave is start, then leave (which must run whatever start did).
func withLeave(start func() error, leave func() error) func() error {
	return func() error {
		err := start()
		return errors.Join(err, leave())
	}
}

// threadCgroups maps each v1 controller of the calling thread to its
// cgroup path, from /proc/thread-self/cgroup.
func threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			out[ctrl] = v1Path(ctrl, parts[2])
		}
	}
	return out, nil
}

// join moves pid into every cgroup of the run.
func (r *runCgroup) join(pid int) error {
	for _, dir := range r.dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// kill kills every process left in the run's cgroups: cgroup.kill where
// the kernel has it, else SIGKILL to each listed process until none is left.
func (r *runCgroup) kill() {
	if r.v2 != "" {
		if os.WriteFile(filepath.Join(r.v2, "cgroup.kill"), []byte("1"), 0) == nil {
			return
		}
	}
	for _, dir := range r.dirs {
		killListed(dir)
	}
}

// killListed sends SIGKILL to every process dir's cgroup.procs lists,
// reading it again while a listing names a process not signaled yet (one
// forked before the kill reached its parent), at most 100 times; it
// returns how many listings it read. A process already signaled that is
// listed again is signaled again, but does not make another read: a
// zombie stays listed until its parent reaps it, which may be never (a
// stale run's box reparented to a pid 1 that reaps nothing), and each
// listing of one used to read the file again, 100 times a call, which
// removeCgroupTree makes up to 1,000 times a cgroup: 12 s of CPU at every
// server's start on such a host (issue 29).
func killListed(dir string) (reads int) {
	signaled := map[int]bool{}
	for reads < 100 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		reads++
		fresh := 0
		for _, p := range strings.Fields(string(b)) {
			// Never the server: a thread of it that could not leave
			// after starting the run (see startInside) lists it here.
			if n, err := strconv.Atoi(p); err == nil && n != os.Getpid() {
				syscall.Kill(n, syscall.SIGKILL)
				if !signaled[n] {
					signaled[n] = true
					fresh++
				}
			}
		}
		if err != nil || fresh == 0 {
			break
		}
	}
	return reads
}

// remove deletes the run's cgroups. A cgroup can only be removed once its
// last process has left it: remove waits for the exit of each process still
// listed (killed already) on a pidfd, the kernel's event for it, within
// removeWait in all, then retries a removal the kernel still refuses for a
// bounded time and leaves the cgroup otherwise. A fixed count of retries
// was not enough: at a load of 20, a killed box's processes took longer to
// exit than 200 retries, and the run's cgroup, left behind, kept its
// tenant's cgroup from being removed.
func (r *runCgroup) remove() {
	r.watch.close()
	until := time.Now().Add(removeWait)
	for _, dir := range r.dirs {
		awaitEmpty(dir, until)
		for i := 0; i < 200; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// removeWait bounds remove's wait for a run's processes to exit: generous
// for a loaded machine, short enough that a process that cannot die (one
// in a freezer that could not be thawed) does not hold its caller for long.
const removeWait = 20 * time.Second

// awaitEmpty waits until no process but the server is listed in dir's
// cgroup.procs, or until. It waits on each listed process's pidfd, which
// the kernel makes readable once the process has exited (after it has
// left its cgroups). A pid is waited on only while it is still listed
// after its pidfd was opened: a live pid names one process, so a pid
// reused by a process outside the cgroup is never waited on.
func awaitEmpty(dir string, until time.Time) {
	self := os.Getpid()
	procs := func() map[int]bool {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return nil
		}
		m := map[int]bool{}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != self {
				m[pid] = true
			}
		}
		return m
	}
	for listed := procs(); len(listed) > 0 && time.Now().Before(until); listed = procs() {
		for pid := range listed {
			fd, err := unix.PidfdOpen(pid, 0)
			if errors.Is(err, unix.ESRCH) {
				continue // gone already
			}
			if err != nil {
				time.Sleep(time.Millisecond) // no pidfds here: look again shortly
				break
			}
			if procs()[pid] {
				awaitPidfd(fd, until)
			}
			unix.Close(fd)
		}
	}
}

// awaitPidfd waits until the process of pidfd fd has exited, or until.
func awaitPidfd(fd int, until time.Time) {
	for {
		ms := time.Until(until).Milliseconds()
		if ms <= 0 {
			return
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(ms))
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
	}
}
