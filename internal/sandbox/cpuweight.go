package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// The boxes' CPU weight: every run cgroup of every server sharing quro/
// sits beneath it, and the kernel's fair scheduler gives quro/ as a whole
// the share its weight says against its siblings — on a host whose server
// runs in the root cgroup, every other thread of the host, each of which
// weighs as much as the kernel's default group weight. Left at that
// default, all the boxes together weigh as one busy host thread; the
// server writes a weight that makes them compete as several.
//
// The weight is given on cgroup v2's cpu.weight scale (1 to 10000, 100
// the default, what one busy nice-0 thread weighs) and written to v1 as
// cpu.shares converted the way the kernel converts between them
// (kernel/sched: cpu.weight reads back shares×100/1024 and is written as
// weight×1024/100, rounded to the closest; systemd's CPUShares= to
// CPUWeight= is the same ratio), so 100 is 1024 shares.

const (
	// CPUWeightDefault is the kernel's default weight of a cgroup, and
	// what one busy nice-0 thread weighs (cpu.shares 1024 on v1).
	CPUWeightDefault = 100
	// CPUWeightMax is the largest cpu.weight cgroup v2 takes.
	CPUWeightMax = 10000
)

// MachineBoxCPUWeight is the boxes' weight by default: as many busy
// threads as the machine has CPUs (100 per CPU), at most CPUWeightMax.
func MachineBoxCPUWeight() int {
	return min(CPUWeightDefault*runtime.NumCPU(), CPUWeightMax)
}

// CheckCPUWeight refuses a weight cgroup v2 would not take.
func CheckCPUWeight(w int) error {
	if w < 1 || w > CPUWeightMax {
		return fmt.Errorf("CPU weight %d: want 1 to %d on cgroup v2's cpu.weight scale (%d is one busy thread of the host)", w, CPUWeightMax, CPUWeightDefault)
	}
	return nil
}

// sharesOfWeight is cgroup v1's cpu.shares for a cpu.weight, as the kernel
// converts: weight×1024/100, rounded to the closest.
func sharesOfWeight(w uint64) uint64 { return (w*1024 + CPUWeightDefault/2) / CPUWeightDefault }

// weightOfShares is the cpu.weight of v1's cpu.shares, as the kernel
// reads it back: shares×100/1024, rounded to the closest.
func weightOfShares(s uint64) uint64 { return (s*CPUWeightDefault + 512) / 1024 }

// CPUWeight is the CPU weight in effect on the group that holds the boxes.
type CPUWeight struct {
	Weight uint64 // on cpu.weight's scale (v1's shares converted)
	Shares uint64 // v1's cpu.shares as written (0 on v2)
	File   string // the file read: <quro/>/cpu.shares or cpu.weight
}

// String says the weight in the words of its hierarchy.
func (w CPUWeight) String() string {
	if w.Shares != 0 {
		return fmt.Sprintf("cpu.shares %d (cpu.weight %d)", w.Shares, w.Weight)
	}
	return fmt.Sprintf("cpu.weight %d", w.Weight)
}

// cpuWeightFile is the weight's file in quro/ of the cpu controller, and
// whether it is v2's; "" without the cpu controller.
func (c *cgroups) cpuWeightFile() (string, bool) {
	base := c.base["cpu"]
	if base == "" {
		return "", false
	}
	if c.v2["cpu"] {
		return filepath.Join(base, "cpu.weight"), true
	}
	return filepath.Join(base, "cpu.shares"), false
}

// setCPUWeight writes w (cpu.weight's scale, checked) as quro/'s weight.
func (c *cgroups) setCPUWeight(w int) error {
	if err := CheckCPUWeight(w); err != nil {
		return err
	}
	file, v2 := c.cpuWeightFile()
	if file == "" {
		return fmt.Errorf("no cpu cgroup controller to weigh the boxes with (%s)", c.detail)
	}
	return writeCPUWeight(file, v2, uint64(w))
}

// writeCPUWeight writes weight w to file, v2's cpu.weight or v1's
// cpu.shares.
func writeCPUWeight(file string, v2 bool, w uint64) error {
	v := w
	if !v2 {
		v = sharesOfWeight(w)
	}
	if err := os.WriteFile(file, []byte(strconv.FormatUint(v, 10)), 0); err != nil {
		return fmt.Errorf("boxes' CPU weight: %w", err)
	}
	return nil
}

// cpuWeight reads the weight in effect on quro/; ok is false without the
// cpu controller or when its file cannot be read.
func (c *cgroups) cpuWeight() (CPUWeight, bool) {
	file, v2 := c.cpuWeightFile()
	if file == "" {
		return CPUWeight{}, false
	}
	return readCPUWeight(file, v2)
}

func readCPUWeight(file string, v2 bool) (CPUWeight, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return CPUWeight{}, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return CPUWeight{}, false
	}
	if v2 {
		return CPUWeight{Weight: n, File: file}, true
	}
	return CPUWeight{Weight: weightOfShares(n), Shares: n, File: file}, true
}

// BoxCPUWeight reports the CPU weight in effect on the group that holds
// the boxes, and what this Sandbox set (Options.BoxCPUWeight; 0: nothing).
func (s *Sandbox) BoxCPUWeight() (now CPUWeight, set int, ok bool) {
	if s.layers.cg == nil {
		return CPUWeight{}, s.cpuWeight, false
	}
	now, ok = s.layers.cg.cpuWeight()
	return now, s.cpuWeight, ok
}

// cpuWeightRow is doctor's row for the boxes' CPU weight.
func (s *Sandbox) cpuWeightRow() Feature {
	f := Feature{Name: "cpu weight"}
	now, set, ok := s.BoxCPUWeight()
	if !ok {
		f.Detail = "no cpu controller: the boxes weigh as the server's own threads"
		return f
	}
	f.Available, f.Used = true, true
	threads := float64(now.Weight) / CPUWeightDefault
	f.Detail = fmt.Sprintf("the boxes of the servers under %s together weigh %s against the host's other work: as %.4g busy host threads", filepath.Dir(now.File), now, threads)
	switch {
	case set != 0 && uint64(set) == now.Weight:
		f.Detail += fmt.Sprintf("; set by this server (--box-cpu-weight %d)", set)
	case set != 0:
		f.Detail += fmt.Sprintf("; this server set %d, another server sharing the group set it since (the last to start wins)", set)
	default:
		f.Detail += fmt.Sprintf("; quro serve --box-cpu-weight sets it (default here %d: 100 per CPU; off leaves it)", MachineBoxCPUWeight())
	}
	return f
}
