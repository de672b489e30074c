package app

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/quota"
)

// Machine is what the default ceilings are derived from (DeriveDefaults):
// the figures of the host the server runs on.
type Machine struct {
	CPUs     int   `json:"cpus" jsonschema:"the CPUs this process may use"`
	MemTotal int64 `json:"mem_total_bytes" jsonschema:"MemTotal of /proc/meminfo"`
	// OpenFiles is the server's open-file limit (RLIMIT_NOFILE, the soft
	// one: quro serve raises it to the hard one first).
	OpenFiles uint64 `json:"open_files" jsonschema:"the server's open-file limit (RLIMIT_NOFILE)"`
	// KernelTasks is the most processes and threads the kernel holds:
	// the lower of kernel.pid_max and kernel.threads-max.
	KernelTasks int64 `json:"kernel_tasks" jsonschema:"the lower of kernel.pid_max and kernel.threads-max"`
}

// What one session costs, which the derivation divides the machine by. An
// idle session holds its box (bubblewrap, the box's init) and a started
// Python worker: 8.34 MiB PSS each at 1,000 (issue 29), ~12 tasks, ~8 of
// the server's descriptors (its in-session socket, the box's pidfd and
// pipes, the worker's pipes).
const (
	sessionMemory = 12 << 20 // with headroom over the 8.34 MiB measured
	sessionTasks  = 12
	sessionFDs    = 8
	// The server's own descriptors (SQLite, logs, listeners) are kept
	// out of the sessions' share; of the rest the sessions get half, the
	// connections (quro serve's --max-conns and the in-session sockets'
	// cap, fitted to the open-file limit too) the other half.
	serverFDs = 512
)

// Sources of the figures, for messages and quro doctor.
const (
	fromMemTotal  = "MemTotal in /proc/meminfo"
	fromOpenFiles = "the open-file limit (RLIMIT_NOFILE)"
	fromTasks     = "kernel.pid_max / kernel.threads-max"
	fromCPUs      = "the CPU count"
)

// ReadMachine reads this host's figures. A figure that cannot be read is
// left zero, and the derivation keeps the fixed fallback for it (the
// source then says so).
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.MemTotal = kb << 10
				break
			}
		}
		f.Close()
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		m.OpenFiles = lim.Cur
	}
	for _, f := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (m.KernelTasks == 0 || n < m.KernelTasks) {
			m.KernelTasks = n
		}
	}
	return m
}

// Defaults are the ceilings derived from a Machine, each with where it
// came from. They are the defaults of quro serve's flags; a flag (or
// Options.Limits) given wins, and quro tenant limits set overrides a
// tenant's.
type Defaults struct {
	Machine Machine `json:"machine"`
	// Sessions caps the sessions of all tenants together (the server's
	// descriptors, the kernel's tasks and the memory they hold are one
	// pool); SessionsPerTenant a tenant's.
	Sessions          int64 `json:"sessions"`
	SessionsPerTenant int64 `json:"sessions_per_tenant"`
	Memory            int64 `json:"memory_bytes" jsonschema:"each tenant's memory ceiling"`
	Tasks             int64 `json:"tasks" jsonschema:"each tenant's ceiling of processes and threads"`
	CPUPercent        int64 `json:"cpu_percent" jsonschema:"each tenant's CPU ceiling, in percent of one CPU"`
	// SessionDisks caps the sessions' disk images (one loop device each).
	SessionDisks int64 `json:"session_disks"`
	// From says, per figure (the json names above), what it was derived
	// from and how.
	From map[string]string `json:"from"`
}

// DeriveDefaults derives the default ceilings from m, so that the
// defaults fit the machine: on 2 CPUs and 24 GiB (open-file limit 20,000,
// pid_max 32,768) they admit 1,218 idle sessions. The session ceiling is
// the lowest of what the memory, the descriptors and the kernel's tasks
// hold; a tenant may use three quarters of the memory, half the kernel's
// tasks and every CPU, and have every session (an operator with tenants
// that must not crowd each other out sets their shares).
func DeriveDefaults(m Machine) Defaults {
	d := Defaults{Machine: m, From: map[string]string{}}
	d.Memory, d.From["memory_bytes"] = DefaultTenantMemory, "fixed (MemTotal unknown)"
	if m.MemTotal > 0 {
		d.Memory = max(m.MemTotal/4*3, 64<<20)
		d.From["memory_bytes"] = "3/4 of " + fromMemTotal + " (" + quota.Human(m.MemTotal) + ")"
	}
	d.Tasks, d.From["tasks"] = DefaultTenantTasks, "fixed (pid_max unknown)"
	if m.KernelTasks > 0 {
		d.Tasks = max(m.KernelTasks/2, 256)
		d.From["tasks"] = fmt.Sprintf("1/2 of %s (%d)", fromTasks, m.KernelTasks)
	}
	d.CPUPercent, d.From["cpu_percent"] = DefaultTenantCPUPercent, "fixed (CPU count unknown)"
	if m.CPUs > 0 {
		d.CPUPercent = 100 * int64(m.CPUs)
		d.From["cpu_percent"] = fmt.Sprintf("every CPU: 100 × %s (%d)", fromCPUs, m.CPUs)
	}
	// Sessions: the lowest of the three.
	type bound struct {
		n    int64
		from string
	}
	bounds := []bound{{d.Memory / sessionMemory, fmt.Sprintf("the tenant memory ceiling (%s) / %s per idle session", quota.Human(d.Memory), quota.Human(sessionMemory))},
		{d.Tasks / sessionTasks, fmt.Sprintf("the tenant task ceiling (%d) / %d tasks per idle session", d.Tasks, sessionTasks)}}
	if m.OpenFiles > 0 {
		fds := int64(min(m.OpenFiles, 1<<30))
		bounds = append(bounds, bound{max(fds-serverFDs, 0) / 2 / sessionFDs,
			fmt.Sprintf("half of %s (%d) less %d kept by the server / %d descriptors per session", fromOpenFiles, fds, serverFDs, sessionFDs)})
	}
	low := bounds[0]
	for _, b := range bounds[1:] {
		if b.n < low.n {
			low = b
		}
	}
	d.Sessions, d.From["sessions"] = max(low.n, 1), low.from
	d.SessionsPerTenant, d.From["sessions_per_tenant"] = d.Sessions, "every session of the server's"
	d.SessionDisks, d.From["session_disks"] = d.Sessions, "one per session"
	return d
}

// Text lists the figures and their sources, one a line.
func (d *Defaults) Text() string {
	num := func(v int64) string {
		if v <= 0 {
			return "none"
		}
		return fmt.Sprint(v)
	}
	bytesOrNone := func(v int64) string {
		if v <= 0 {
			return "none"
		}
		return quota.Human(v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "of a machine with %d CPUs, %s of memory, an open-file limit of %d and %d kernel tasks:\n",
		d.Machine.CPUs, quota.Human(d.Machine.MemTotal), d.Machine.OpenFiles, d.Machine.KernelTasks)
	for _, r := range []struct {
		name, key, v string
	}{
		{"sessions (all tenants)", "sessions", num(d.Sessions)},
		{"sessions per tenant", "sessions_per_tenant", num(d.SessionsPerTenant)},
		{"memory per tenant", "memory_bytes", bytesOrNone(d.Memory)},
		{"tasks per tenant", "tasks", num(d.Tasks)},
		{"CPU per tenant", "cpu_percent", num(d.CPUPercent) + "%"},
		{"session disks", "session_disks", num(d.SessionDisks)},
	} {
		fmt.Fprintf(&b, "  %s: %s (%s)\n", r.name, r.v, d.From[r.key])
	}
	return strings.TrimRight(b.String(), "\n")
}

// effectiveCeilings are the ceilings in force: d where the operator set
// none, else what was set (its source then says so). Zero: no ceiling.
func effectiveCeilings(d Defaults, tenant TenantLimits, sessions, disks int) Defaults {
	e := d
	e.From = maps.Clone(d.From)
	set := func(key string, v *int64, now int64) {
		if now < 0 {
			now = 0
		}
		if *v != now {
			*v, e.From[key] = now, "set by the operator (quro serve)"
		}
	}
	set("sessions", &e.Sessions, int64(sessions))
	set("sessions_per_tenant", &e.SessionsPerTenant, tenant.Sessions)
	set("memory_bytes", &e.Memory, tenant.Memory)
	set("tasks", &e.Tasks, tenant.Tasks)
	set("cpu_percent", &e.CPUPercent, tenant.CPUPercent)
	set("session_disks", &e.SessionDisks, int64(disks))
	return e
}
