package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// What a session box needs of its cgroup beyond limits: the OOM kill
// count, usage for get_session_status and /metrics, and the freezer for
// pause and resume.

// oomCounts are the counters a run's OOM kill is told by, read when the
// run starts and when it ends.
type oomCounts struct {
	// kills is how many of the run's processes the kernel OOM-killed,
	// whichever limit it enforced: it counts a kill in the victim's
	// cgroup (v1 there only, v2 in its ancestors too), so a kill at the
	// tenant's ceiling counts here, and one in another session of the
	// tenant does not.
	kills uint64
	// Which limit sent the kernel to the OOM killer. v2: how often each
	// cgroup's own limit did (memory.events.local "oom"), the run's and
	// its tenant's. v1, which has no such count: the OOM notifications
	// (an eventfd on memory.oom_control) of the run's cgroup, of its
	// tenant's and of quro/; the kernel notifies the cgroup whose limit
	// was reached and every cgroup beneath it, so each count holds those
	// of the ones above it.
	run, tenant, above uint64
}

// oomCounts reads the run's counters: the outer ones first, so that a
// notification between two reads is counted for the outer cgroup.
func (r *runCgroup) oomCounts() oomCounts {
	var n oomCounts
	if r.mem == "" {
		return n
	}
	if r.v2m {
		if r.tenant {
			n.tenant = ooms(filepath.Dir(r.mem))
		}
		n.run = ooms(r.mem)
		n.kills = readKV(filepath.Join(r.mem, "memory.events"))["oom_kill"]
		return n
	}
	n.above = r.above.count()
	n.tenant = r.tenantWatch.count()
	n.run = r.watch.count()
	n.kills = readKV(filepath.Join(r.mem, "memory.oom_control"))["oom_kill"]
	return n
}

// oomCountsAfter reads the counters at a run's end: the inner ones
// first, for the same reason.
func (r *runCgroup) oomCountsAfter() oomCounts {
	var n oomCounts
	if r.mem == "" {
		return n
	}
	if r.v2m {
		n.kills = readKV(filepath.Join(r.mem, "memory.events"))["oom_kill"]
		n.run = ooms(r.mem)
		if r.tenant {
			n.tenant = ooms(filepath.Dir(r.mem))
		}
		return n
	}
	n.kills = readKV(filepath.Join(r.mem, "memory.oom_control"))["oom_kill"]
	n.run = r.watch.count()
	n.tenant = r.tenantWatch.count()
	n.above = r.above.count()
	return n
}

// ooms is how often a v2 cgroup's own limit sent the kernel to the OOM
// killer: memory.events.local, or memory.events on a kernel without it
// (the same for a run's cgroup, which has none beneath it).
func ooms(dir string) uint64 {
	if ev := readKV(filepath.Join(dir, "memory.events.local")); len(ev) > 0 {
		return ev["oom"]
	}
	return readKV(filepath.Join(dir, "memory.events"))["oom"]
}

// oomSince reports whether the kernel OOM-killed one of the run's
// processes since before was read, and which of the limits above the
// run were reached meanwhile. session says the run's own limit is its
// session box's.
func (r *runCgroup) oomSince(before oomCounts, session bool) (bool, OOM) {
	now := r.oomCountsAfter()
	if now.kills <= before.kills {
		return false, OOM{}
	}
	d := func(a, b uint64) int64 { return int64(a) - int64(b) }
	run, tenant := d(now.run, before.run), d(now.tenant, before.tenant)
	if !r.v2m {
		// Each count holds the notifications of the cgroups above it.
		above := d(now.above, before.above)
		if r.tenant {
			run, tenant = run-tenant, tenant-above
		} else {
			run -= above
		}
	}
	o := OOM{Own: run > 0, Tenant: r.tenant && tenant > 0, Session: session, hasTenant: r.tenant}
	if o.Own {
		o.OwnBytes = memLimit(r.mem, r.v2m)
	}
	if o.Tenant {
		o.TenantBytes = memLimit(filepath.Dir(r.mem), r.v2m)
	}
	return true, o
}

// oomWatch counts a v1 memory cgroup's OOM notifications: an eventfd
// registered on its memory.oom_control, which the kernel signals each
// time it goes to the OOM killer for the limit of that cgroup or of one
// above it. A read takes what the eventfd holds and adds it up.
type oomWatch struct {
	mu sync.Mutex
	fd int // -1 once closed
	n  uint64
}

// watchOOM registers a watch on the v1 memory cgroup dir; nil when the
// kernel refuses one (then its count reads 0).
func watchOOM(dir string) *oomWatch {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil
	}
	cfd, err := unix.Open(filepath.Join(dir, "memory.oom_control"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(efd)
		return nil
	}
	// The registration holds the cgroup, not cfd: it is closed at once.
	err = os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(fmt.Sprintf("%d %d", efd, cfd)), 0)
	unix.Close(cfd)
	if err != nil {
		unix.Close(efd)
		return nil
	}
	return &oomWatch{fd: efd}
}

// count is how many notifications w has seen; 0 for a nil watch.
func (w *oomWatch) count() uint64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		var b [8]byte
		if n, err := unix.Read(w.fd, b[:]); err == nil && n == len(b) {
			w.n += binary.NativeEndian.Uint64(b[:])
		}
	}
	return w.n
}

// close ends the watch; its count stays what it was.
func (w *oomWatch) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}

// memLimit is a cgroup's memory limit in bytes, 0 when it has none.
func memLimit(dir string, v2 bool) uint64 {
	if v2 {
		return readUint(filepath.Join(dir, "memory.max")) // "max" reads as 0
	}
	if n := readUint(filepath.Join(dir, "memory.limit_in_bytes")); n < 1<<62 {
		return n
	}
	return 0
}

// dir returns the cgroup directory holding ctrl, and whether it is in the
// unified hierarchy.
func (r *runCgroup) dir(ctrl string) (string, bool) {
	d := r.byCtrl[ctrl]
	return d, d != "" && d == r.v2
}

// Usage is what a box's processes use now, from its cgroup; a zero field
// is unknown (no such controller here).
type Usage struct {
	MemoryBytes uint64  // memory charged to the box (page cache included)
	Tasks       uint64  // processes and threads
	CPUSeconds  float64 // CPU time used since the box started
}

func (r *runCgroup) usage() Usage {
	var u Usage
	if d, v2 := r.dir("memory"); d != "" {
		if v2 {
			u.MemoryBytes = readUint(filepath.Join(d, "memory.current"))
		} else {
			u.MemoryBytes = readUint(filepath.Join(d, "memory.usage_in_bytes"))
		}
	}
	if d, _ := r.dir("pids"); d != "" {
		u.Tasks = readUint(filepath.Join(d, "pids.current"))
	}
	if d, v2 := r.dir("cpu"); d != "" && v2 {
		b, _ := os.ReadFile(filepath.Join(d, "cpu.stat"))
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
				n, _ := strconv.ParseUint(f[1], 10, 64)
				u.CPUSeconds = float64(n) / 1e6
			}
		}
	} else if d, _ := r.dir("cpuacct"); d != "" {
		u.CPUSeconds = float64(readUint(filepath.Join(d, "cpuacct.usage"))) / 1e9
	}
	return u
}

// canFreeze reports whether the cgroup can be frozen: cgroup.freeze in
// the unified hierarchy, or a v1 freezer.
func (r *runCgroup) canFreeze() bool {
	if r.v2 != "" {
		if _, err := os.Stat(filepath.Join(r.v2, "cgroup.freeze")); err == nil {
			return true
		}
	}
	d, _ := r.dir("freezer")
	return d != ""
}

// errNoFreezer: neither cgroup v2's cgroup.freeze nor a v1 freezer.
var errNoFreezer = errors.New("this machine gives Quro no cgroup freezer (cgroup v2 cgroup.freeze or the v1 freezer controller)")

// ErrFreezeStalled is a freeze the kernel did not finish in time (a
// process sleeping in the kernel, e.g. on heavy I/O, holds it up): the
// box was thawed again and runs on, so a later try may succeed.
var ErrFreezeStalled = errors.New("the kernel did not stop every process of the box in time")

// freeze stops every process of the cgroup and waits until the kernel
// reports them all frozen (bounded: a process in uninterruptible sleep
// freezes when it leaves it).
func (r *runCgroup) freeze() error { return r.setFrozen(true) }

// thaw lets the cgroup's processes run again.
func (r *runCgroup) thaw() error { return r.setFrozen(false) }

func (r *runCgroup) setFrozen(on bool) error {
	var file, want, thawed string
	var check func() bool
	if r.v2 != "" && exists(filepath.Join(r.v2, "cgroup.freeze")) {
		file, want, thawed = filepath.Join(r.v2, "cgroup.freeze"), "0", "0"
		if on {
			want = "1"
		}
		events := filepath.Join(r.v2, "cgroup.events")
		check = func() bool {
			b, _ := os.ReadFile(events)
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "frozen" {
					return f[1] == want
				}
			}
			return false
		}
	} else if d, _ := r.dir("freezer"); d != "" {
		file, want, thawed = filepath.Join(d, "freezer.state"), "THAWED", "THAWED"
		if on {
			want = "FROZEN"
		}
		check = func() bool {
			b, _ := os.ReadFile(file)
			return strings.TrimSpace(string(b)) == want
		}
	} else {
		return errNoFreezer
	}
	if err := os.WriteFile(file, []byte(want), 0); err != nil {
		return fmt.Errorf("cgroup freezer: %w", err)
	}
	// The kernel freezes asynchronously: FREEZING, then FROZEN. A freeze
	// can stall: a thread sleeping uninterruptibly on what a frozen one
	// holds never reaches the freezer. As runc does, a stalled freeze is
	// thawed for a moment and tried again, and given up at the deadline.
	// Only a stalled one: a thread that is merely waiting for a CPU (a
	// loaded machine) freezes once it runs, and a thaw would send every
	// thread frozen so far back to the run queue to start over.
	start := time.Now()
	retried := start
	for wait := 50 * time.Microsecond; !check(); wait = min(2*wait, 10*time.Millisecond) {
		now := time.Now()
		if now.Sub(start) > freezeTimeout {
			if check() {
				return nil // it finished as the time ran out
			}
			err := fmt.Errorf("cgroup freezer: not %s after %s%s", want, freezeTimeout, describeUnfrozen(r.unfrozen(filepath.Dir(file))))
			if on {
				err = fmt.Errorf("%w: %w", ErrFreezeStalled, err)
			}
			return err
		}
		if on && now.Sub(retried) > freezeRetry {
			retried = now
			if _, asleep := r.unfrozen(filepath.Dir(file)); len(asleep) == 0 {
				_ = os.WriteFile(file, []byte(want), 0) // not stalled: written again, as below
				time.Sleep(wait)
				continue
			}
			_ = os.WriteFile(file, []byte(thawed), 0) // the check is the answer
			time.Sleep(time.Millisecond)
			_ = os.WriteFile(file, []byte(want), 0)
		} else if on {
			// v1 retries a stuck freeze when written again.
			_ = os.WriteFile(file, []byte(want), 0) // the check above is the answer
		}
		time.Sleep(wait)
	}
	return nil
}

// How long a freeze may take, and how long it may stall before it is
// thawed and tried again.
const (
	freezeTimeout = 10 * time.Second
	freezeRetry   = time.Second
)

// unfrozen is the cgroup's threads outside the freezer (command, state,
// kernel wait channel): awake, running or interruptibly sleeping (R, S:
// certainly not frozen, and they freeze once they run), and asleep, in an
// uninterruptible sleep (D, as a frozen thread reads too, but not in the
// freezer's wait: they can stall a freeze).
func (r *runCgroup) unfrozen(dir string) (awake, asleep []string) {
	b, _ := os.ReadFile(filepath.Join(dir, "tasks"))
	if len(b) == 0 {
		b, _ = os.ReadFile(filepath.Join(dir, "cgroup.threads"))
	}
	for _, tid := range strings.Fields(string(b)) {
		wchan, _ := os.ReadFile("/proc/" + tid + "/wchan")
		if strings.Contains(string(wchan), "refrigerator") || strings.Contains(string(wchan), "do_freezer_trap") {
			continue
		}
		stat, _ := os.ReadFile("/proc/" + tid + "/stat")
		// comm is in parentheses and may hold spaces; the state follows.
		s := string(stat)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i || j+3 > len(s) {
			continue
		}
		desc := fmt.Sprintf("%s (%c in %s)", s[i+1:j], s[j+2], wchan)
		if s[j+2] == 'D' {
			asleep = append(asleep, desc)
		} else {
			awake = append(awake, desc)
		}
	}
	return awake, asleep
}

// describeUnfrozen names at most four threads of unfrozen's, the awake
// first, for the error of a freeze that did not finish.
func describeUnfrozen(awake, asleep []string) string {
	out := append(awake, asleep...)
	if len(out) == 0 {
		return ""
	}
	return ": threads not in the freezer: " + strings.Join(out[:min(len(out), 4)], ", ")
}

// OOMMark is a reading of a process's OOM counters, for OOMSince.
type OOMMark struct{ c oomCounts }

// OOMMark reads the OOM counters of the cgroup p runs in (its session
// box's, or its own), to tell later with OOMSince whether the kernel
// OOM-killed something there meanwhile: what a long-lived process (a
// resident shell) asks around each command it runs.
func (p *Process) OOMMark() OOMMark {
	if cg, _ := p.oomCgroup(); cg != nil {
		return OOMMark{cg.oomCounts()}
	}
	return OOMMark{}
}

// OOMSince reports whether the kernel OOM-killed a process in p's cgroup
// since m was read, and which limits were reached (as Exit.OOM). In a
// session box that may be any process of the session.
func (p *Process) OOMSince(m OOMMark) (bool, OOM) {
	cg, session := p.oomCgroup()
	if cg == nil {
		return false, OOM{}
	}
	return cg.oomSince(m.c, session)
}

func (p *Process) oomCgroup() (*runCgroup, bool) {
	if p.bx != nil {
		return p.bx.cg, true
	}
	return p.cg, false
}
