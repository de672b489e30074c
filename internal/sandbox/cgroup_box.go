package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// What a session box needs of its cgroup beyond limits: the OOM kill
// count, usage for get_session_status and /metrics, and the freezer for
// pause and resume.

// oomKills is how many processes the cgroup's memory limit has killed.
func (r *runCgroup) oomKills() uint64 {
	if r.mem == "" {
		return 0
	}
	file := "memory.oom_control"
	if r.v2m {
		file = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(r.mem, file))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		}
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
	start := time.Now()
	retried := start
	for wait := 50 * time.Microsecond; !check(); wait = min(2*wait, 10*time.Millisecond) {
		now := time.Now()
		if now.Sub(start) > freezeTimeout {
			return fmt.Errorf("cgroup freezer: not %s after %s%s", want, freezeTimeout, r.unfrozen(filepath.Dir(file)))
		}
		if on && now.Sub(retried) > freezeRetry {
			retried = now
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

// unfrozen describes the cgroup's threads that may hold a freeze up (at
// most four: command, state, kernel wait channel), for the error of a
// freeze that did not finish. A running or interruptibly sleeping thread
// (R, S) is certainly not frozen and is named first; a frozen thread
// reads as D, as does one stuck in an uninterruptible sleep.
func (r *runCgroup) unfrozen(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "tasks"))
	if len(b) == 0 {
		b, _ = os.ReadFile(filepath.Join(dir, "cgroup.threads"))
	}
	var awake, asleep []string
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
	out := append(awake, asleep...)
	if len(out) == 0 {
		return ""
	}
	return ": threads not in the freezer: " + strings.Join(out[:min(len(out), 4)], ", ")
}
