package app

import (
	"strings"
	"testing"
)

// The defaults derived from a machine's figures: the session ceiling is
// the lowest of what memory, descriptors and kernel tasks hold, says
// which, and 1,000 idle sessions fit the machine (2 CPUs, 24 GiB).
func TestDeriveDefaults(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name                         string
		m                            Machine
		sessions, memory, tasks, cpu int64
		sessionsFrom                 string
	}{
		{"the issue's machine", Machine{CPUs: 2, MemTotal: 24 * gib, OpenFiles: 20000, KernelTasks: 32768},
			1218, 18 * gib, 16384, 200, "open-file limit"},
		{"memory-bound", Machine{CPUs: 4, MemTotal: 4 * gib, OpenFiles: 1 << 20, KernelTasks: 4 << 20},
			256, 3 * gib, 2 << 20, 400, "memory ceiling"},
		{"task-bound", Machine{CPUs: 64, MemTotal: 256 * gib, OpenFiles: 1 << 20, KernelTasks: 32768},
			1365, 192 * gib, 16384, 6400, "task ceiling"},
		{"descriptor-starved", Machine{CPUs: 1, MemTotal: 24 * gib, OpenFiles: 1024, KernelTasks: 32768},
			32, 18 * gib, 16384, 100, "open-file limit"},
		{"nothing known: the fixed fallbacks", Machine{},
			341, DefaultTenantMemory, DefaultTenantTasks, DefaultTenantCPUPercent, "task ceiling"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DeriveDefaults(tc.m)
			if d.Sessions != tc.sessions || d.SessionsPerTenant != tc.sessions || d.SessionDisks != tc.sessions ||
				d.Memory != tc.memory || d.Tasks != tc.tasks || d.CPUPercent != tc.cpu {
				t.Errorf("derived %+v", d)
			}
			if !strings.Contains(d.From["sessions"], tc.sessionsFrom) {
				t.Errorf("sessions from %q, want it to name %q", d.From["sessions"], tc.sessionsFrom)
			}
			for _, key := range []string{"sessions", "sessions_per_tenant", "memory_bytes", "tasks", "cpu_percent", "session_disks"} {
				if d.From[key] == "" {
					t.Errorf("no source for %s", key)
				}
			}
			t.Logf("%s", d.Text())
		})
	}
	// 1,000 idle sessions fit the machine at the defaults: the
	// session ceilings, and the memory and tasks they hold.
	d := DeriveDefaults(Machine{CPUs: 2, MemTotal: 24 * gib, OpenFiles: 20000, KernelTasks: 32768})
	if d.SessionsPerTenant < 1000 || d.Memory < 1000*sessionMemory || d.Tasks < 1000*sessionTasks {
		t.Errorf("1,000 idle sessions do not fit: %+v", d)
	}
}

// This host's figures, as quro doctor shows them (the measure of the
// defaults on the machine the tests run on).
func TestDeriveDefaultsHere(t *testing.T) {
	d := DeriveDefaults(ReadMachine())
	if d.Machine.CPUs <= 0 || d.Machine.MemTotal <= 0 || d.Machine.OpenFiles == 0 || d.Machine.KernelTasks <= 0 {
		t.Errorf("figures not read: %+v", d.Machine)
	}
	t.Logf("%s", d.Text())
}
