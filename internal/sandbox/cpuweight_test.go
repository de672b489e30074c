package sandbox

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The weight's two scales convert as the kernel converts them: 100 is
// 1024 shares, and every weight cgroup v2 takes comes back from the
// shares v1 is given.
func TestCPUWeightScales(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ weight, shares uint64 }{
		{1, 10}, {39, 399}, {100, 1024}, {200, 2048}, {1600, 16384}, {10000, 102400},
	} {
		if got := sharesOfWeight(c.weight); got != c.shares {
			t.Errorf("cpu.weight %d: cpu.shares %d, want %d", c.weight, got, c.shares)
		}
	}
	for w := uint64(1); w <= CPUWeightMax; w++ {
		if back := weightOfShares(sharesOfWeight(w)); back != w {
			t.Fatalf("cpu.weight %d → cpu.shares %d → cpu.weight %d", w, sharesOfWeight(w), back)
		}
	}
	if got, want := MachineBoxCPUWeight(), min(100*runtime.NumCPU(), CPUWeightMax); got != want {
		t.Errorf("the machine's weight: %d, want %d (100 per CPU)", got, want)
	}
	for _, bad := range []int{0, -1, CPUWeightMax + 1} {
		if CheckCPUWeight(bad) == nil {
			t.Errorf("weight %d taken", bad)
		}
	}
}

// privateCPUGroup makes a cgroup of its own next to where the server's
// quro/ is in the cpu controller's hierarchy, removed when the test ends:
// the weights the test writes reach no box of another server.
func privateCPUGroup(t *testing.T, c *cgroups) string {
	t.Helper()
	base := c.base["cpu"]
	if base == "" {
		t.Skipf("no cpu controller here: %s", c.detail)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	dir := filepath.Join(filepath.Dir(base), fmt.Sprintf("quro-weight-test-%d-%x", os.Getpid(), rnd))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup beside %s: %v", base, err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// The weight lands in the real cgroup file of its hierarchy — cpu.shares
// on v1, converted; cpu.weight on v2 — reads back as written, and a
// weight out of range is refused without a write.
func TestCPUWeightIsWrittenInTheCgroup(t *testing.T) {
	t.Parallel()
	c := openCgroups()
	dir := privateCPUGroup(t, c)
	g := &cgroups{base: map[string]string{"cpu": dir}, v2: map[string]bool{"cpu": c.v2["cpu"]}}
	file := "cpu.shares"
	if c.v2["cpu"] {
		file = "cpu.weight"
	}
	for _, w := range []int{200, 1, CPUWeightMax, 100, 1600} {
		if err := g.setCPUWeight(w); err != nil {
			t.Fatalf("weight %d: %v", w, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprint(w)
		if !c.v2["cpu"] {
			want = fmt.Sprint(sharesOfWeight(uint64(w)))
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Fatalf("weight %d: %s reads %s, want %s", w, file, got, want)
		}
		if now, ok := g.cpuWeight(); !ok || now.Weight != uint64(w) {
			t.Fatalf("weight %d read back as %+v %v", w, now, ok)
		}
	}
	for _, bad := range []int{0, -5, CPUWeightMax + 1} {
		if err := g.setCPUWeight(bad); err == nil {
			t.Fatalf("weight %d taken", bad)
		}
		if now, _ := g.cpuWeight(); now.Weight != 1600 {
			t.Fatalf("a refused weight %d changed the group's to %+v", bad, now)
		}
	}
}

// On a host whose unified hierarchy can give the cpu controller to a
// child of the test's own cgroup, v2's cpu.weight takes the weight as is.
// (A hybrid host, whose cpu controller is bound to v1, has no such cgroup:
// the v1 test above is its whole story.)
func TestCPUWeightV2WhereCPUIsDelegated(t *testing.T) {
	t.Parallel()
	root := cgroup2Root()
	own, ok := ownCgroups()[""]
	if root == "" || !ok {
		t.Skip("no cgroup v2 here")
	}
	parent := filepath.Join(root, own)
	b, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if !strings.Contains(" "+string(b)+" ", " cpu ") && !strings.Contains(string(b), "cpu\n") {
		ctrls, _ := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
		t.Skipf("the unified hierarchy does not give its children cpu here (%s: controllers %q, enabled for children %q): cpu is a v1 controller on this host",
			parent, strings.TrimSpace(string(ctrls)), strings.TrimSpace(string(b)))
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	dir := filepath.Join(parent, fmt.Sprintf("quro-weight-test-%d-%x", os.Getpid(), rnd))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a v2 cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	g := &cgroups{base: map[string]string{"cpu": dir}, v2: map[string]bool{"cpu": true}}
	if err := g.setCPUWeight(250); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cpu.weight")); strings.TrimSpace(string(b)) != "250" {
		t.Fatalf("cpu.weight reads %q, want 250", b)
	}
}

// A Sandbox made with a weight writes it on quro/, the group above every
// tenant, and doctor's row says it; the tenants beneath keep the kernel's
// default weight, equal among themselves; and a box that tries to raise
// its own weight, or its tenant's, or quro/'s, changes none of them.
// The weight written is the machine's default, the one every quro serve
// of this host writes, so that the boxes of other tests share no weight
// this test alone chose; the weight found is put back at the end.
func TestBoxCPUWeightOnTheBoxesGroup(t *testing.T) {
	machine := MachineBoxCPUWeight()
	if file, _ := openCgroups().cpuWeightFile(); file != "" {
		if was, err := os.ReadFile(file); err == nil {
			t.Cleanup(func() { _ = os.WriteFile(file, was, 0) }) // another server's start meanwhile may be undone: the last start wins
		}
	}
	e := newTenantEnvWith(t, Limits{Tasks: 1000}, &Options{BoxCPUWeight: machine, SessionBoxes: true})
	now, set, ok := e.sb.BoxCPUWeight()
	if !ok {
		t.Skipf("no cpu controller here: %s", e.sb.layers.cg.detail)
	}
	if set != machine || now.Weight != uint64(machine) || filepath.Dir(now.File) != e.sb.layers.cg.base["cpu"] {
		t.Fatalf("the boxes' weight: %+v (set %d), want %d on %s", now, set, machine, e.sb.layers.cg.base["cpu"])
	}
	if row := e.sb.cpuWeightRow(); !row.Used || !strings.Contains(row.Detail, now.String()) || !strings.Contains(row.Detail, "set by this server") {
		t.Fatalf("doctor's row: %+v", row)
	}
	// The attack: from inside a box, every cgroup file of the cpu
	// controller a process could name — its own cgroup's and those
	// above it, as /proc/self/cgroup tells it, the hierarchy's usual
	// mounts, and a cgroup filesystem of the box's own mounting.
	attack := `mkdir -p /tmp/cg1 /tmp/cg2
	mount -t cgroup -o cpu none /tmp/cg1 2>/dev/null; mount -t cgroup2 none /tmp/cg2 2>/dev/null
	for f in /sys/fs/cgroup/cpu/cpu.shares /sys/fs/cgroup/cpu.weight /sys/fs/cgroup/cpu,cpuacct/cpu.shares /tmp/cg1/cpu.shares /tmp/cg2/cpu.weight \
		$(sed -n 's/^[0-9]*:[^:]*cpu[^:]*:\(.*\)/\/sys\/fs\/cgroup\/cpu\1\/cpu.shares \/sys\/fs\/cgroup\/cpu\1\/..\/cpu.shares \/sys\/fs\/cgroup\/cpu\1\/..\/..\/cpu.shares/p' /proc/self/cgroup); do
		[ -f "$f" ] && { echo 10000 > "$f"; } 2>/dev/null && echo "WROTE $f"
	done; echo ready; exec sleep 1000`
	ha := e.hold(t, e.dir(t, "a", "s1"), attack)
	hb := e.hold(t, e.dir(t, "b", "s1"), "echo ready; exec sleep 1000")
	if ha.ready != "ready\n" || hb.ready != "ready\n" {
		t.Fatalf("holders: %q %q", ha.ready, hb.ready)
	}
	read := func(dir string) CPUWeight {
		w, ok := readCPUWeight(filepath.Join(dir, filepath.Base(now.File)), e.sb.layers.cg.v2["cpu"])
		if !ok {
			t.Fatalf("no weight in %s", dir)
		}
		return w
	}
	base := e.sb.layers.cg.base["cpu"]
	wa, wb := read(filepath.Join(base, TenantCgroupName("", e.a))), read(filepath.Join(base, TenantCgroupName("", e.b)))
	if wa.Weight != CPUWeightDefault || wb.Weight != CPUWeightDefault {
		t.Fatalf("tenants' weights %v and %v: want the kernel's default, equal", wa, wb)
	}
	if w := read(base); w.Weight != uint64(machine) {
		t.Fatalf("after a box's attempt the boxes' weight is %v, want %d", w, machine)
	}
}
