package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/soak"
	"github.com/quro-dev/quro/internal/store"
)

// TestSessionsHeldAtOnceLeaveNothing makes sessions, runs print(1) in
// each, holds them all open at once, destroys them all and then finds
// nothing of them left (issue 29's density): no mount under the data
// directory, no loop device bound to its images, no cgroup this process
// made, no process below this one, no process under any of their uids and
// none of their uids still reserved, and every count of
// TestSessionsLeaveNothing back to where it was. make test-soak does it
// with 1,000 sessions (TestSoakSessionsHeldAtOnceLeaveNothing).
func TestSessionsHeldAtOnceLeaveNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("real boxes")
	}
	// 10: a leak of one goroutine or descriptor a session is past the
	// count's slack (3 and 2) three times over, and each host count
	// (mounts, loop devices, cgroups, processes, uids) is exact; 4
	// callers still hold 10 sessions open at once. 20 cost twice the CPU
	// for the same proof; the density is the soak's.
	heldAtOnceLeaveNothing(t, 10)
}

// TestSoakSessionsHeldAtOnceLeaveNothing is
// TestSessionsHeldAtOnceLeaveNothing over 1,000 sessions open at once
// (make test-soak).
func TestSoakSessionsHeldAtOnceLeaveNothing(t *testing.T) {
	soak.Skip(t)
	heldAtOnceLeaveNothing(t, 1000)
}

func heldAtOnceLeaveNothing(t *testing.T, n int) {
	ctx := session.WithTenant(context.Background(), "")
	dir := t.TempDir()
	// quro serve's defaults, with the admission ceilings lifted so that n
	// sessions fit whatever the machine (the ceilings have tests of their
	// own).
	// The spare pool stays at one spare: grown by the burst it would
	// hold more after it than before, by design (its own tests show it
	// shrinks back).
	a, err := New(context.Background(), dir, &Options{Python: testPython, PrestartPython: true, SpareSessions: 1,
		MaxSpareSessions: 1, SparesPerTenant: 1,
		Limits: Limits{Sessions: -1, SessionsPerTenant: -1, SessionDisks: -1, Tenant: TenantLimits{Sessions: -1, Tasks: -1, Memory: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	// The baseline: the default session and the spare, their boxes and
	// workers, after one session came and went.
	mustCall(t, a, "create_session", CreateSessionInput{Name: "warm"})
	runCode(t, a, RunCodeInput{Session: "warm", Code: "print(1)"})
	mustCall(t, a, "destroy_session", SessionRef{Session: "warm"})
	// Taken once the warm-up has settled: warm's background release
	// ended and the spare its create claimed made again (the pool's
	// refill). Taken before, a spare still being made was missing from
	// the baseline (its box, worker, run cgroup, processes) and read as
	// a leak once the count after, which waits, had it.
	a.Sessions.WaitReleases()
	waitSettled(t, a)
	before := a.holdings(t, dir)
	beforeHost := hostHoldings(t)

	// n sessions, each used once, made from 4 callers; all of them open
	// at once.
	uids := make([]int, n)
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := a.makeAndUse(ctx, fmt.Sprintf("d%d", i), &uids[i]); err != nil {
					t.Errorf("session %d: %v", i, err)
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	held := a.holdings(t, dir)
	if !failed.Load() && held.Sessions < before.Sessions+n {
		t.Errorf("%d sessions listed with %d made, %d before", held.Sessions, n, before.Sessions)
	}
	// Every session made is destroyed, also after a failure.
	next.Store(0)
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if uids[i] == 0 { // never made
					continue
				}
				if _, err := call(t, a, "destroy_session", SessionRef{Session: fmt.Sprintf("d%d", i)}); err != nil {
					t.Errorf("destroy session %d: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// The destroys answered once the boxes were sent their kills; the
	// rest of each teardown (the box's exit, its cgroup's removal, the
	// disk's release) goes on in the background: wait for all of it,
	// then release the uids of the destroyed sessions now (a release does
	// so at most once a second).
	a.Sessions.WaitReleases()
	a.Sessions.ReapUIDs(ctx)
	waitSettled(t, a) // the pool's refill after the last claims: its spare is in the baseline
	// What winds down after (goroutines, fds): the wait is for those
	// events, bounded by a minute.
	var after holdings
	var afterHost hostCounts
	released := func() bool {
		runtime.GC()
		after, afterHost = a.holdings(t, dir), hostHoldings(t)
		return after.settled(before) && afterHost.settled(beforeHost)
	}
	deadline := time.Now().Add(time.Minute) // generous: the machine may be busy
	for !released() {
		if time.Now().After(deadline) {
			t.Fatalf("everything released: not after a minute\nbefore %+v %+v\nafter  %+v %+v\ndescriptors: %s", before, beforeHost, after, afterHost, fdTargets())
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, as waitFor's
	}
	retired, err := a.Store.RetiredUIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	made := map[int]bool{}
	for _, u := range uids {
		made[u] = true
	}
	for _, r := range retired {
		if made[r.UID] {
			t.Errorf("uid %d of a destroyed session is still reserved (session %s)", r.UID, r.SessionID)
		}
	}
	for _, u := range serverUIDs(t) {
		if made[u] {
			t.Errorf("a process below the server still runs as uid %d of a destroyed session", u)
		}
	}
	if n := a.Sandbox.BoxStats().Outside; n != 0 {
		t.Errorf("%d runs of a session ran outside its box", n)
	}
	t.Logf("held at once: %d sessions; before %+v %+v; held %+v; after %+v %+v", n, before, beforeHost, held, after, afterHost)
}

// makeAndUse creates session name, runs print(1) in it and records its
// uid. It is called from several goroutines, so it returns its error
// rather than failing the test.
func (a *App) makeAndUse(ctx context.Context, name string, uid *int) error {
	in, _ := json.Marshal(CreateSessionInput{Name: name})
	if _, err := a.Controller.Call(ctx, admin, "create_session", in); err != nil {
		return fmt.Errorf("create_session: %w", err)
	}
	s, err := a.Sessions.Get(ctx, name)
	if err != nil {
		return err
	}
	*uid = s.UID
	in, _ = json.Marshal(RunCodeInput{Session: name, Code: "print(1)"})
	reply, err := a.Controller.Call(ctx, admin, "run_code", in)
	if err != nil {
		return fmt.Errorf("run_code: %w", err)
	}
	if r := reply.Output.(*runcode.Result); r.Stdout != "1\n" || r.ExitCode != 0 {
		return fmt.Errorf("run_code: %+v", r)
	}
	return nil
}

// hostCounts are what the server holds on the host outside the App's own
// books: the run cgroups it made (named run-PID-…, beneath quro/ in each
// hierarchy of its own cgroup) and the processes below it.
type hostCounts struct {
	Cgroups, Procs int
}

func (h hostCounts) settled(before hostCounts) bool {
	return h.Cgroups <= before.Cgroups && h.Procs <= before.Procs
}

func hostHoldings(t *testing.T) hostCounts {
	t.Helper()
	return hostCounts{Cgroups: runCgroups(t), Procs: len(serverProcs(t))}
}

// runCgroups counts the run cgroups of this process: quro/run-PID-* and
// quro/*/run-PID-* in every cgroup hierarchy, below this thread's cgroup.
func runCgroups(t *testing.T) int {
	t.Helper()
	own := map[string]string{} // controller ("" for v2) → this thread's cgroup
	data, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(data)) {
		f := strings.SplitN(strings.TrimSpace(l), ":", 3)
		if len(f) != 3 {
			continue
		}
		for c := range strings.SplitSeq(f[1], ",") {
			own[strings.TrimPrefix(c, "name=")] = f[2]
		}
	}
	prefix := fmt.Sprintf("run-%d-", os.Getpid())
	seen := map[string]bool{}
	n := 0
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent dev root mountpoint opts... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		path, found := "", false
		if g[0] == "cgroup2" {
			path, found = own[""]
		} else {
			for o := range strings.SplitSeq(g[2], ",") {
				if p, ok := own[strings.TrimPrefix(o, "name=")]; ok {
					path, found = p, true
					break
				}
			}
		}
		if !found {
			continue
		}
		rel, err := filepath.Rel(f[3], path) // the mount's root within its hierarchy
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		base := filepath.Join(f[4], rel, "quro")
		if seen[base] {
			continue
		}
		seen[base] = true
		top, _ := os.ReadDir(base)
		for _, e := range top {
			if !e.IsDir() {
				continue
			}
			if strings.HasPrefix(e.Name(), prefix) {
				n++
				continue
			}
			sub, _ := os.ReadDir(filepath.Join(base, e.Name()))
			for _, s := range sub {
				if s.IsDir() && strings.HasPrefix(s.Name(), prefix) {
					n++
				}
			}
		}
	}
	return n
}

// serverProcs are the pids of every process below this one.
func serverProcs(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	kids := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		kids[ppid] = append(kids[ppid], pid)
	}
	var out []int
	queue := slices.Clone(kids[os.Getpid()])
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, pid)
		queue = append(queue, kids[pid]...)
	}
	return out
}

// serverUIDs are the session uids (store.UIDFirst up to store.UIDLimit)
// that processes below this one run as (real, effective, saved or
// filesystem).
func serverUIDs(t *testing.T) []int {
	t.Helper()
	var out []int
	for _, pid := range serverProcs(t) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // gone
		}
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				for _, f := range strings.Fields(v) {
					if u, err := strconv.Atoi(f); err == nil && u >= store.UIDFirst && u < store.UIDLimit {
						out = append(out, u)
					}
				}
			}
		}
	}
	return out
}

// fdTargets lists what this process's descriptors point at, for a
// failure's message.
func fdTargets() string {
	fds, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, fd := range fds {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		fmt.Fprintf(&b, "%s→%s ", fd.Name(), l)
	}
	return b.String()
}
