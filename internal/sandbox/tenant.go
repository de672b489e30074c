package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Tenant cgroups: every run of a tenant is made beneath one cgroup of that
// tenant, quro/tenant-<hash>/run-..., in each hierarchy. The tenant cgroup
// carries the tenant's ceilings (memory with swap, pids, CPU quota), so the
// kernel bounds the sum of everything a tenant runs at once — shells,
// terminals, resident Python workers and the background processes they
// left — not only each run. The hash keeps tenant names (chosen by an
// admin, but still free text) out of paths.

// Tenant names the owner of a run and its ceilings. Only Memory, Tasks and
// CPUPercent of Limits are used; zero leaves one unbounded.
type Tenant struct {
	Name   string // "" for the local tenant
	Limits Limits
	// Refused, when set, refuses every run of the tenant with it: its
	// ceilings are unknown (their stored form cannot be read), and a run
	// never goes ahead under other ones. It wraps ErrTenantUnreadable.
	Refused error
}

// ErrTenantUnreadable is wrapped by the error of a Start refused because
// the tenant's stored ceilings cannot be read (Tenant.Refused).
var ErrTenantUnreadable = errors.New("tenant ceilings unreadable")

// ErrTenantCeiling is wrapped by the error of a Start refused because the
// tenant is at one of its ceilings (a *CeilingError).
var ErrTenantCeiling = errors.New("tenant ceiling reached")

// CeilingError says which ceiling a tenant is at, and what to do.
type CeilingError struct {
	Ceiling string // "memory" or "tasks"
	Message string
}

func (e *CeilingError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrTenantCeiling) true for every CeilingError.
func (e *CeilingError) Is(target error) bool { return target == ErrTenantCeiling }

// TenantCgroupName is the name of a tenant's cgroup beneath quro/, for
// the servers of scope (Options.TenantScope: their data directory). A
// tenant of one data directory shares nothing with the same name in
// another's: two servers on one machine, or the tests of two packages,
// never count against each other's ceilings.
func TenantCgroupName(scope, tenant string) string {
	key := "quro-tenant\x00" + tenant
	if scope != "" {
		key = "quro-tenant\x00" + scope + "\x00" + tenant
	}
	h := sha256.Sum256([]byte(key))
	return "tenant-" + hex.EncodeToString(h[:8])
}

// DisplayTenant is how messages name a tenant.
func DisplayTenant(tenant string) string {
	if tenant == "" {
		return "the local tenant"
	}
	return "tenant " + tenant
}

// tenant makes the tenant's cgroups (once) and writes its ceilings when
// they changed. It returns the cgroup name, relative to each base.
func (c *cgroups) tenant(t *Tenant) (string, error) {
	name := TenantCgroupName(c.scope, t.Name)
	want := Limits{Memory: t.Limits.Memory, Tasks: t.Limits.Tasks, CPUPercent: t.Limits.CPUPercent}
	c.mu.Lock()
	defer c.mu.Unlock()
	if got, ok := c.tenants[name]; ok && got == want {
		return name, nil
	}
	done := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		base := c.base[ctrl]
		if base == "" {
			continue
		}
		dir := filepath.Join(base, name)
		if !done[dir] {
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return "", cgroupError(fmt.Errorf("tenant cgroup %s: %w", ctrl, err))
			}
			done[dir] = true
			if c.v2[ctrl] {
				var plus []string
				for _, x := range cgroupControllers {
					if c.v2[x] {
						plus = append(plus, "+"+x)
					}
				}
				// Unchecked here: a controller left off shows as a missing
				// limit file when the run's cgroup below is limited, and
				// that write's error fails the start.
				_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(plus, " ")), 0)
			}
		}
		if err := writeCeiling(dir, ctrl, c.v2[ctrl], want); err != nil {
			return "", err
		}
		if ctrl == "memory" && !c.v2[ctrl] && c.watches[name] == nil {
			if c.watches == nil {
				c.watches = map[string]*oomWatch{}
			}
			c.watches[name] = watchOOM(dir)
		}
	}
	if c.tenants == nil {
		c.tenants = map[string]Limits{}
	}
	c.tenants[name] = want
	return name, nil
}

// writeCeiling writes one controller's ceiling of a tenant cgroup; zero
// writes "unbounded", so a ceiling can be lifted as well as set.
func writeCeiling(dir, ctrl string, v2 bool, lim Limits) error {
	w := func(file, val string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
			return cgroupError(fmt.Errorf("tenant cgroup %s: %w", file, err))
		}
		return nil
	}
	has := func(file string) bool { _, err := os.Stat(filepath.Join(dir, file)); return err == nil }
	switch {
	case ctrl == "memory" && v2:
		v := "max"
		if lim.Memory > 0 {
			v = strconv.FormatUint(lim.Memory, 10)
		}
		if err := w("memory.max", v); err != nil {
			return err
		}
		if has("memory.swap.max") {
			return w("memory.swap.max", "0")
		}
	case ctrl == "memory":
		v := "-1"
		if lim.Memory > 0 {
			v = strconv.FormatUint(lim.Memory, 10)
		}
		if !has("memory.memsw.limit_in_bytes") {
			_ = w("memory.swappiness", "0") // best effort: without memsw nothing caps swap; 0 only makes it rarer
			return lowerable(w("memory.limit_in_bytes", v))
		}
		// memory+swap may never be below memory: raise it first, lower it
		// last.
		_ = w("memory.memsw.limit_in_bytes", v) // fails when lowering; the last write below says
		if err := lowerable(w("memory.limit_in_bytes", v)); err != nil {
			return err
		}
		return lowerable(w("memory.memsw.limit_in_bytes", v))
	case ctrl == "pids":
		v := "max"
		if lim.Tasks > 0 {
			v = strconv.FormatUint(lim.Tasks, 10)
		}
		return w("pids.max", v)
	case ctrl == "cpu" && v2:
		v := "max 100000"
		if lim.CPUPercent > 0 {
			v = fmt.Sprintf("%d 100000", lim.CPUPercent*1000)
		}
		return w("cpu.max", v)
	case ctrl == "cpu":
		if err := w("cpu.cfs_period_us", "100000"); err != nil {
			return err
		}
		v := "-1"
		if lim.CPUPercent > 0 {
			v = strconv.FormatUint(lim.CPUPercent*1000, 10)
		}
		return w("cpu.cfs_quota_us", v)
	}
	return nil
}

// lowerable forgives EBUSY: a memory ceiling lowered below what the tenant
// uses now is refused by the kernel, and the tenant keeps the old (higher)
// one until its usage falls; the next run retries.
func lowerable(err error) error {
	if errors.Is(err, syscall.EBUSY) {
		return nil
	}
	return err
}

// TenantUsage is what a tenant's processes hold now, read from its cgroups.
type TenantUsage struct {
	Memory uint64 // what reclaim cannot give back (resident, shared/tmpfs and kernel memory), bytes; page cache excluded
	Tasks  uint64 // processes and threads
	// MemoryLimit and TasksLimit are the ceilings the kernel enforces now
	// (0: unbounded or unknown).
	MemoryLimit, TasksLimit uint64
	// MemoryPeak is the most memory (page cache included) the tenant's
	// processes held at once since the cgroup was made: at the ceiling,
	// the kernel reclaimed or OOM-killed within the tenant.
	MemoryPeak uint64
	TasksPeak  uint64 // most processes and threads at once (0: unknown)
}

// usage reads a tenant's cgroups.
func (c *cgroups) usage(tenant string) TenantUsage {
	name := TenantCgroupName(c.scope, tenant)
	var u TenantUsage
	if base := c.base["memory"]; base != "" {
		dir := filepath.Join(base, name)
		u.Memory = c.unreclaimable(dir)
		if c.v2["memory"] {
			u.MemoryLimit = readUint(filepath.Join(dir, "memory.max"))
			u.MemoryPeak = readUint(filepath.Join(dir, "memory.peak"))
		} else {
			if l := readUint(filepath.Join(dir, "memory.limit_in_bytes")); l < 1<<62 {
				u.MemoryLimit = l
			}
			u.MemoryPeak = readUint(filepath.Join(dir, "memory.max_usage_in_bytes"))
		}
	}
	if base := c.base["pids"]; base != "" {
		dir := filepath.Join(base, name)
		u.Tasks = readUint(filepath.Join(dir, "pids.current"))
		u.TasksLimit = readUint(filepath.Join(dir, "pids.max"))
		u.TasksPeak = readUint(filepath.Join(dir, "pids.peak"))
	}
	return u
}

// unreclaimable is the memory the kernel charges the cgroup dir that
// reclaim cannot give back: what its processes hold (anonymous memory,
// shared memory and tmpfs) and the kernel memory made for them (page
// tables, kernel stacks, slab: a box's namespaces and mounts). The page
// cache of files is left out: the kernel drops it at the ceiling. A
// tenant whose unreclaimable memory reaches its ceiling makes no progress:
// its processes are OOM-killed one by one or, while reclaim keeps
// dropping the file pages they run from, stall; what admission counted
// before (anonymous and shared memory alone) let sessions in until the
// kernel memory of their boxes filled the rest, and creation stalled
// without an error.
func (c *cgroups) unreclaimable(dir string) uint64 {
	st := readKV(filepath.Join(dir, "memory.stat"))
	var used, cache uint64
	if c.v2["memory"] {
		used = readUint(filepath.Join(dir, "memory.current"))
		cache = st["file"] - min(st["shmem"], st["file"]) // file includes shmem, which reclaim cannot drop
	} else {
		// usage_in_bytes counts kernel memory when kmem is accounted
		// (memory.kmem.usage_in_bytes); cache includes shmem.
		used = readUint(filepath.Join(dir, "memory.usage_in_bytes"))
		cache = st["total_cache"] - min(st["total_shmem"], st["total_cache"])
	}
	if used < cache {
		return 0
	}
	return used - cache
}

// Room is what a start needs free under its tenant's ceilings beyond
// admission's margin (a fiftieth of the memory ceiling, 8 tasks): a new
// session asks for what an idle one holds.
type Room struct {
	Memory, Tasks uint64
}

// admit refuses a run when its tenant is at a ceiling already, with a
// message that says which and what to do. The kernel enforces the ceilings
// whatever admit says; admit only turns "the run would die (or stall) at
// once" into an error the caller can read.
func (c *cgroups) admit(t *Tenant, room Room) error {
	// Only the two counters admit needs: this runs before every run.
	var u TenantUsage
	name := TenantCgroupName(c.scope, t.Name)
	if base := c.base["memory"]; base != "" && t.Limits.Memory > 0 {
		u.Memory = c.unreclaimable(filepath.Join(base, name))
	}
	if base := c.base["pids"]; base != "" && t.Limits.Tasks > 0 {
		u.Tasks = readUint(filepath.Join(base, name, "pids.current"))
	}
	who := DisplayTenant(t.Name)
	if lim := t.Limits.Memory; lim > 0 && u.Memory+max(lim/50, room.Memory) >= lim {
		return &CeilingError{"memory", fmt.Sprintf("%s is at its memory ceiling of %s (%s held by its processes and their kernel memory): destroy idle sessions or stop background processes, or ask an admin to raise it (quro tenant limits set --memory)",
			who, humanBytes(lim), humanBytes(u.Memory))}
	}
	if lim := t.Limits.Tasks; lim > 0 && u.Tasks+max(8, room.Tasks) >= lim {
		return &CeilingError{"tasks", fmt.Sprintf("%s is at its process ceiling of %d (%d processes and threads running): stop background processes or destroy idle sessions, or ask an admin to raise it (quro tenant limits set --tasks)",
			who, lim, u.Tasks)}
	}
	return nil
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func readUint(file string) uint64 {
	b, _ := os.ReadFile(file)
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func readKV(file string) map[string]uint64 {
	out := map[string]uint64{}
	b, _ := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			out[f[0]] = n
		}
	}
	return out
}

// reapStale removes the run cgroups left by servers that are gone (killed
// with SIGKILL, or crashed): a run cgroup is named run-<server pid>-..., and
// one whose server pid is not alive is killed (its processes first) and
// removed, directly under quro/ or under a tenant's cgroup. A live pid,
// even one reused by another program, keeps its cgroups: better a stale
// cgroup than killing another server's runs. It returns the directories
// removed.
func (c *cgroups) reapStale() []string {
	// A session paused when its server died left its processes frozen,
	// and a frozen process dies of SIGKILL only once thawed: first every
	// process of every stale run gets SIGKILL and every stale run is
	// thawed, so that they die without running a step of their own (the
	// freezer is one of several hierarchies, and the others' removal
	// waits for those processes to go). The hierarchies are listed once
	// for both steps: every start of a process pays this scan, a read of
	// each tenant's cgroup in each hierarchy, and a run cgroup of a dead
	// server that appeared between the steps is the next start's to reap.
	type run struct {
		dir string
		v2  bool
	}
	var stale []run
	c.eachStale(func(dir string, v2 bool) {
		stale = append(stale, run{dir, v2})
		killTree(dir)
		thawTree(dir, v2)
	})
	var removed []string
	for _, r := range stale {
		if removeCgroupTree(r.dir, r.v2) == nil {
			removed = append(removed, r.dir)
		}
	}
	return removed
}

// eachStale calls fn with every run cgroup of a server that is gone, in
// every hierarchy: directly under quro/ or under a tenant's cgroup.
func (c *cgroups) eachStale(fn func(dir string, v2 bool)) {
	seen := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		base := c.base[ctrl]
		if base == "" || seen[base] {
			continue
		}
		seen[base] = true
		parents := []string{base}
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), "tenant-") {
				parents = append(parents, filepath.Join(base, e.Name()))
			}
		}
		for _, parent := range parents {
			runs, _ := os.ReadDir(parent)
			for _, e := range runs {
				pid, ok := runOwner(e.Name())
				if !e.IsDir() || !ok || pid == os.Getpid() || alive(pid) {
					continue
				}
				fn(filepath.Join(parent, e.Name()), c.v2[ctrl])
			}
		}
	}
}

// killTree sends SIGKILL once to every process in dir and the cgroups
// beneath it (never the server itself).
func killTree(dir string) {
	subs, _ := os.ReadDir(dir)
	for _, e := range subs {
		if e.IsDir() {
			killTree(filepath.Join(dir, e.Name()))
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, p := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(p); err == nil && n != os.Getpid() {
			_ = syscall.Kill(n, syscall.SIGKILL) // gone already is fine
		}
	}
}

// thawTree thaws dir and the cgroups beneath it, where they can be frozen
// (a v1 freezer.state, or v2's cgroup.freeze).
func thawTree(dir string, v2 bool) {
	subs, _ := os.ReadDir(dir)
	for _, e := range subs {
		if e.IsDir() {
			thawTree(filepath.Join(dir, e.Name()), v2)
		}
	}
	if v2 {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0) // absent where the kernel has no v2 freezer
	} else {
		_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0) // only the freezer hierarchy has it
	}
}

// runOwner parses the server pid out of a run cgroup's name,
// run-<pid>-<seq>-<random>[-n<pid namespace>]. A cgroup made by a server
// of another pid namespace (another container sharing the hierarchy) is
// never ours to judge: its pid means nothing here.
func runOwner(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "run-")
	if !ok {
		return 0, false
	}
	p, tail, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	if i := strings.LastIndex(tail, "-n"); i >= 0 && "-n"+tail[i+2:] != pidNSTag() {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// pidNSTag is "-n<inode of the server's pid namespace>", or "" when it
// cannot be read.
var pidNSTag = sync.OnceValue(func() string {
	var st syscall.Stat_t
	if syscall.Stat("/proc/self/ns/pid", &st) != nil {
		return ""
	}
	return fmt.Sprintf("-n%d", st.Ino)
})

func alive(pid int) bool {
	return syscall.Kill(pid, 0) != syscall.ESRCH
}

// removeCgroupTree kills every process in dir and its children and
// removes them, deepest first.
func removeCgroupTree(dir string, v2 bool) error {
	subs, _ := os.ReadDir(dir)
	for _, e := range subs {
		if e.IsDir() {
			_ = removeCgroupTree(filepath.Join(dir, e.Name()), v2) // dir's own removal below fails if a child stayed
		}
	}
	r := &runCgroup{dirs: []string{dir}}
	if v2 {
		r.v2 = dir
	}
	r.kill()
	var err error
	// The kernel lets a cgroup go once its last process has been reaped by
	// its parent (here, another program or init): bounded retries.
	for i := 0; i < 1000; i++ {
		if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		r.kill()
		time.Sleep(time.Millisecond)
	}
	return err
}

// TenantUsage reads what a tenant's processes hold now; ok is false
// without the cgroups layer.
func (s *Sandbox) TenantUsage(tenant string) (u TenantUsage, ok bool) {
	if !s.layers.ok(LayerCgroups) {
		return u, false
	}
	return s.layers.cg.usage(tenant), true
}

// ReleaseTenants removes the tenant cgroups this Sandbox made that are
// empty now. Call it when the server is done (its boxes closed), so that
// no cgroup of its data directory is left behind.
func (s *Sandbox) ReleaseTenants() {
	if s.layers.ok(LayerCgroups) {
		s.layers.cg.releaseTenants()
	}
}

// Admit reports whether a run of t would be refused now (a *CeilingError,
// or t.Refused),
// for callers that refuse a call before they start anything.
func (s *Sandbox) Admit(t Tenant) error {
	return s.AdmitWith(t, Room{})
}

// AdmitWith is Admit for a start that needs room free under t's ceilings
// (a new session: what an idle one holds).
func (s *Sandbox) AdmitWith(t Tenant, room Room) error {
	if t.Refused != nil {
		return t.Refused
	}
	if !s.layers.ok(LayerCgroups) {
		return nil
	}
	return s.admitAwaiting(&t, room)
}
