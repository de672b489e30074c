package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/quro-dev/quro/internal/sandbox"
)

// cpuWeightFlag is --box-cpu-weight: the CPU weight of all the boxes
// together against the host's other work, on cgroup v2's cpu.weight scale
// (100: one busy host thread). "auto" is sandbox.MachineBoxCPUWeight,
// "off" (or 0) leaves the weight the group has.
type cpuWeightFlag struct{ v *int }

func (f cpuWeightFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return "off"
	}
	return strconv.Itoa(*f.v)
}

func (f cpuWeightFlag) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		*f.v = sandbox.MachineBoxCPUWeight()
		return nil
	case "off", "0":
		*f.v = 0
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q: want auto, off or a weight from 1 to %d", s, sandbox.CPUWeightMax)
	}
	if err := sandbox.CheckCPUWeight(n); err != nil {
		return fmt.Errorf("%q: %w; or auto, or off", s, err)
	}
	*f.v = n
	return nil
}

func (f cpuWeightFlag) Type() string { return "weight" }

// boxCPUWeightUsage is --box-cpu-weight's help.
func boxCPUWeightUsage() string {
	return fmt.Sprintf("CPU weight of all the boxes together (the cgroup quro/ that holds them) against the host's other work, on cgroup v2's cpu.weight scale: 100 weighs as one busy thread of the host, and cgroup v1 gets cpu.shares = weight×1024/100, as the kernel converts; auto: 100 per CPU (%d here), so the boxes compete like as many busy threads as the machine has CPUs; off: leave the group's weight (the kernel's default, 100, as one thread); 1 to %d. Servers in one cgroup share quro/: the last to start sets it. Tenants weigh the same beneath it; quro doctor shows the weight in effect",
		sandbox.MachineBoxCPUWeight(), sandbox.CPUWeightMax)
}
