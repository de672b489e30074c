package sandbox

import (
	"fmt"
	"strconv"
	"strings"
)

// Limits are the resource limits applied to a sandboxed process with
// setrlimit(2) just before it execs the user program. Zero leaves a limit as
// the server has it.
type Limits struct {
	CPUSeconds   uint64 // RLIMIT_CPU: CPU time in seconds
	AddressSpace uint64 // RLIMIT_AS: virtual memory in bytes
	OpenFiles    uint64 // RLIMIT_NOFILE
	FileSize     uint64 // RLIMIT_FSIZE: largest file the process may write, in bytes
	Processes    uint64 // RLIMIT_NPROC: counted per uid, so ignored for root (see doctor)

	// Applied by the cgroup layer (not rlimits); zero leaves them unlimited.
	Memory     uint64 // memory of the whole run in bytes, swap not allowed
	Tasks      uint64 // processes and threads of the whole run (pids.max)
	CPUPercent uint64 // CPU quota in percent of one CPU
}

// DefaultLimits are the limits used when a Spec leaves Limits zero.
func DefaultLimits() Limits {
	return Limits{
		CPUSeconds:   600,
		AddressSpace: 16 << 30, // V8 reserves 10 GiB per WebAssembly memory (Node's fetch parses HTTP with one)
		OpenFiles:    1024,
		FileSize:     1 << 30,
		Memory:       1 << 30,
		Tasks:        512,
		CPUPercent:   100,
	}
}

// rlimits returns only the limits the init child applies.
func (l Limits) rlimits() Limits {
	return Limits{CPUSeconds: l.CPUSeconds, AddressSpace: l.AddressSpace, OpenFiles: l.OpenFiles,
		FileSize: l.FileSize, Processes: l.Processes}
}

// rlimitOrder fixes the wire order of the limits passed to the init child.
var rlimitOrder = []struct {
	name string // as boxinit's applyLimits knows it
	get  func(*Limits) *uint64
}{
	{"cpu", func(l *Limits) *uint64 { return &l.CPUSeconds }},
	{"as", func(l *Limits) *uint64 { return &l.AddressSpace }},
	{"nofile", func(l *Limits) *uint64 { return &l.OpenFiles }},
	{"fsize", func(l *Limits) *uint64 { return &l.FileSize }},
	{"nproc", func(l *Limits) *uint64 { return &l.Processes }},
}

// encode renders the limits as "cpu=1,as=2,..." for the init child's argv.
func (l Limits) encode() string {
	var b strings.Builder
	for i, r := range rlimitOrder {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%d", r.name, *r.get(&l))
	}
	return b.String()
}

func decodeLimits(s string) (Limits, error) {
	var l Limits
	for _, kv := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return l, fmt.Errorf("bad limit %q", kv)
		}
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return l, fmt.Errorf("bad limit %q: %v", kv, err)
		}
		found := false
		for _, r := range rlimitOrder {
			if r.name == name {
				*r.get(&l) = n
				found = true
			}
		}
		if !found {
			return l, fmt.Errorf("unknown limit %q", name)
		}
	}
	return l, nil
}
