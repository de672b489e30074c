// Command box measures the session box (one bwrap box per session, whose
// init spawns every process of the session) through the served App, in one
// run (see bench/README.md):
//
//	go run ./bench/box            (or: make bench-box; run as root)
//
// One App is served over REST on a loopback listener with a real token, as
// bench/service serves it. Then:
//
//  1. one-shot run_code {"lang":"sh","code":"true"} over REST on a warm
//     session (its box made), beside `bwrap --unshare-all --ro-bind / /
//     true` and a bare fork-exec of /bin/true, the three alternating in
//     blocks;
//  2. a session's first Python run: create_session, then run_code print(1)
//     (the run alone, and create + run), on fresh sessions each destroyed
//     after;
//  3. pause_session and resume_session of a session holding a 100 MiB
//     Python heap (checked intact after each resume), and the box's CPU
//     time over 1 s of pause while a busy loop runs in it;
//  4. destroy_session of sessions that each have a box: sequential, and
//     from 8 concurrent clients;
//  5. (-idle N) the PSS of N idle sessions, each with its shell and its
//     Python worker resident (-idle-mode: or having run Python only, or
//     nothing); with -idle-release, again after their workers' idle
//     release, and the first run after a release beside resume + run;
//  6. (-churn N, only with -only 6 or -churn set) the server's OS threads
//     and PSS at the start, with N sessions live (each used once), and
//     after all of them are destroyed (churn.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/bench/internal/procs"
)

var (
	nOne      = flag.Int("n", 1000, "1: one-shot runs per path")
	blocks    = flag.Int("blocks", 20, "1: the three paths alternate in this many blocks")
	nFirst    = flag.Int("first", 30, "2: fresh sessions for the first Python run")
	nPause    = flag.Int("pause", 20, "3: pause+resume cycles")
	nDestroy  = flag.Int("destroy", 200, "4: sessions destroyed (sequentially, then again concurrently)")
	clients   = flag.Int("clients", 8, "4, 5: concurrent REST clients for destroying (and making) sessions")
	nIdle     = flag.Int("idle", 0, "5: idle sessions whose PSS is summed (0: skip)")
	only      = flag.String("only", "", "run only these parts, e.g. 1,3 (default: all)")
	install   = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
	disk      = flag.Int64("disk", 0, "each session's disk quota in bytes (0: the default ext4 image per session; -1: none, no loop device)")
	jsonPath  = flag.String("json", "", "also write the figures as JSON to this file")
	treeLines = flag.Int("tree", 0, "5: print this many of the box processes found (pid, parent, command line)")
	idleMode  = flag.String("idle-mode", "used", "5: what each idle session did: used (terminal_exec true and run_code print(1)), python (print(1) only) or fresh (nothing: create_session only; with -prestart, its worker was started)")
	prestart  = flag.Bool("prestart", false, "the App's PrestartPython (quro serve's default, --prestart-python): create_session starts the session's worker")
	release   = flag.Bool("idle-release", false, "5: then release every idle session's Python worker (what --python-idle does), measure again, and time the first run after a release beside resume + run after a pause")
	memProf   = flag.String("memprofile", "", "5: write a heap profile of the server, the idle sessions made, to this file")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the whole run (server and client) to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "box:", err)
		os.Exit(1)
	}
}

func part(n int) bool {
	return *only == "" || slices.Contains(strings.Split(*only, ","), strconv.Itoa(n))
}

type series struct {
	name string
	ds   []time.Duration
	cpu  time.Duration // this process's CPU (client and server) over the calls
}

func (s *series) q(p float64) time.Duration {
	if len(s.ds) == 0 {
		return 0
	}
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

// results gathers what is printed and written as JSON.
type results struct {
	one            []*series // 1
	first          []*series // 2
	pause          []*series // 3
	serverPauseMS  *series   // 3: pause's own took_ms (server side)
	serverResumeMS *series
	heapBytes      uint64
	cpuRunning     float64 // 3: box CPU seconds over 1 s running
	cpuPaused      float64 // 3: over 1 s paused
	cpuResumed     float64 // 3: over 1 s after resume
	pausedFlag     bool
	pyCPU          [3]float64 // 3: the Python worker's own CPU (/proc) over running, paused, resumed, a thread spinning in it
	pyBoxCPU       [3]float64 // the box's cpu_seconds over the same
	destroySeq     *series    // 4
	destroySeqWall time.Duration
	destroySteps   []*series // 4: in-process breakdown
	destroyPar     time.Duration
	destroyParN    int
	idle           *idleResult  // 5
	churn          *churnResult // 6
	outside        uint64       // runs of a session that did not fit its box (sandbox.BoxStats)
}

type idleResult struct {
	N                 int
	Make              time.Duration
	PSS               *pssReport
	AvailBefore       int64 // MemAvailable before making them, bytes
	AvailAfter        int64
	DestroyAll        time.Duration
	ServerBeforeBytes int64
	ServerAfterGC     int64
	HeapBefore        uint64
	HeapInuse         uint64
	GoroutinesBefore  int
	Goroutines        int
	Mode              string
	Released          *pssReport // after the idle release (-idle-release)
	ReleasedN         int        // workers released
	ReleasedGC        int64      // the server's PSS after GC then
	RestoreRelease    *series    // run print(1) after a release
	RestorePause      *series    // resume_session + run print(1) after pause_session
}

var reported bool

func run() error {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "box: not root: the boxes run with less isolation than in production; run as root")
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	data, err := os.MkdirTemp("", "quro-bench-box-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	fmt.Fprintf(os.Stderr, "starting the server (interpreter under %s) ...\n", *install)
	b, err := newBed(ctx, data, *install, *disk)
	if err != nil {
		return err
	}
	defer b.Close()
	if !b.App.Sandbox.SessionBoxes() {
		return fmt.Errorf("the sandbox does not run session boxes here (bwrap missing, or no isolation?)")
	}
	var r results
	defer func() {
		if !reported {
			fmt.Println("(a part failed; what was measured before it:)")
			r.outside = b.App.Sandbox.BoxStats().Outside
			report(&r)
		}
	}()
	if part(1) {
		if err := oneShot(ctx, b, &r); err != nil {
			return fmt.Errorf("1 (one-shot): %w", err)
		}
	}
	if part(2) {
		if err := firstPython(ctx, b, &r); err != nil {
			return fmt.Errorf("2 (first Python run): %w", err)
		}
	}
	if part(3) {
		if err := pauseResume(ctx, b, &r); err != nil {
			return fmt.Errorf("3 (pause/resume): %w", err)
		}
	}
	if part(4) && *nDestroy > 1 {
		if err := destroy(ctx, b, &r); err != nil {
			return fmt.Errorf("4 (destroy): %w", err)
		}
	}
	if part(5) && *nIdle > 0 {
		if err := idle(ctx, b, &r); err != nil {
			return fmt.Errorf("5 (idle memory): %w", err)
		}
	}
	if churnOn() {
		if err := churn(ctx, b, &r); err != nil {
			return fmt.Errorf("6 (threads and memory after sessions go): %w", err)
		}
	}
	r.outside = b.App.Sandbox.BoxStats().Outside
	report(&r)
	reported = true
	if *jsonPath != "" {
		return writeJSON(*jsonPath, &r)
	}
	return nil
}

// 1. One-shot sh true over REST, bwrap alone, fork-exec alone.
func oneShot(ctx context.Context, b *bed, r *results) error {
	id, err := b.CreateSession(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = b.DestroySession(ctx, id) }() // best effort: the measurement's error is the one to report
	body := benchbed.RunBody(id, "sh", "true")
	paths := []struct {
		s *series
		f func() error
	}{
		{&series{name: `REST run_code {"lang":"sh","code":"true"} (warm box)`}, func() error { return b.Run(ctx, body, "") }},
		{&series{name: "bwrap --unshare-all --ro-bind / / true"}, bwrapTrue},
		{&series{name: "fork-exec /bin/true (os/exec)"}, forkTrue},
	}
	for _, p := range paths {
		for range 30 { // the first REST run makes the box; then warm caches and connections
			if err := p.f(); err != nil {
				return fmt.Errorf("%s: %w", p.s.name, err)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "1: %d one-shot runs per path in %d interleaved blocks ...\n", *nOne, *blocks)
	per := max(1, *nOne / *blocks)
	for range *blocks {
		for _, p := range paths {
			c0 := benchbed.CPUTime()
			for range per {
				t := time.Now()
				if err := p.f(); err != nil {
					return fmt.Errorf("%s: %w", p.s.name, err)
				}
				p.s.ds = append(p.s.ds, time.Since(t))
			}
			p.s.cpu += benchbed.CPUTime() - c0
		}
	}
	for _, p := range paths {
		r.one = append(r.one, p.s)
	}
	return nil
}

// 2. A fresh session's first Python run.
func firstPython(ctx context.Context, b *bed, r *results) error {
	runOnly := &series{name: "run_code print(1), a fresh session's first run"}
	both := &series{name: "create_session + that first run_code"}
	create := &series{name: "create_session alone"}
	body := func(id string) []byte { return benchbed.RunBody(id, "", "print(1)") }
	fmt.Fprintf(os.Stderr, "2: first Python run in %d fresh sessions ...\n", *nFirst)
	for i := range *nFirst + 2 {
		t0 := time.Now()
		id, err := b.CreateSession(ctx)
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := b.Run(ctx, body(id), "1\n"); err != nil {
			return err
		}
		t2 := time.Now()
		if err := b.DestroySession(ctx, id); err != nil {
			return err
		}
		if i < 2 { // warm-up
			continue
		}
		create.ds = append(create.ds, t1.Sub(t0))
		runOnly.ds = append(runOnly.ds, t2.Sub(t1))
		both.ds = append(both.ds, t2.Sub(t0))
	}
	// The same run where the box is made already (sh true ran first): the
	// worker's start alone; and the bare interpreter spawned by sh in that
	// box, for its own start-up.
	inBox := &series{name: "run_code print(1), first run, box made before (sh true)"}
	bare := &series{name: "sh: python3.14 -I -c 'print(1)' in a made box"}
	interp, _ := filepath.Glob(filepath.Join(*install, "python", "*", "bin", "python3.14"))
	for i := range *nFirst + 2 {
		id, err := b.CreateSession(ctx)
		if err != nil {
			return err
		}
		if err := b.Run(ctx, benchbed.RunBody(id, "sh", "true"), ""); err != nil {
			return err
		}
		t := time.Now()
		if err := b.Run(ctx, body(id), "1\n"); err != nil {
			return err
		}
		d := time.Since(t)
		var d2 time.Duration
		if len(interp) == 1 {
			t = time.Now()
			if err := b.Run(ctx, benchbed.RunBody(id, "sh", interp[0]+" -I -c 'print(1)'"), "1\n"); err != nil {
				return err
			}
			d2 = time.Since(t)
		}
		if err := b.DestroySession(ctx, id); err != nil {
			return err
		}
		if i >= 2 {
			inBox.ds = append(inBox.ds, d)
			if d2 > 0 {
				bare.ds = append(bare.ds, d2)
			}
		}
	}
	r.first = []*series{runOnly, both, create, inBox, bare}
	return nil
}

// 3. Pause and resume of a session holding 100 MiB; the CPU while paused.
func pauseResume(ctx context.Context, b *bed, r *results) error {
	id, err := b.CreateSession(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = b.DestroySession(ctx, id) }() // best effort: the measurement's error is the one to report
	if err := b.Run(ctx, benchbed.RunBody(id, "", heapCode), heapLen); err != nil {
		return err
	}
	res, err := b.resources(ctx, id)
	if err != nil {
		return err
	}
	r.heapBytes = res.MemoryBytes
	ref := benchbed.RefBody(id)
	if err := pauseCycles(ctx, b, r, id, ref); err != nil {
		return err
	}
	if err := boxCPUOverPause(ctx, b, r, id, ref); err != nil {
		return err
	}
	return workerCPUOverPause(ctx, b, r, id, ref)
}

// pauseCycles times *nPause pause+resume cycles of session id (after 3
// for warm-up), each checked by a run that reads its heap.
func pauseCycles(ctx context.Context, b *bed, r *results, id string, ref []byte) error {
	check := benchbed.RunBody(id, "", "print(len(x))")
	pause := &series{name: "pause_session (REST)"}
	resume := &series{name: "resume_session (REST)"}
	both := &series{name: "pause + resume"}
	r.serverPauseMS = &series{name: "pause, server's took_ms"}
	r.serverResumeMS = &series{name: "resume, server's took_ms"}
	fmt.Fprintf(os.Stderr, "3: %d pause+resume cycles of a session holding %d MiB (box memory) ...\n", *nPause, r.heapBytes>>20)
	for i := range *nPause + 3 {
		t0 := time.Now()
		pr, err := b.pause(ctx, ref)
		if err != nil {
			return err
		}
		t1 := time.Now()
		rr, err := b.resume(ctx, ref)
		if err != nil {
			return err
		}
		t2 := time.Now()
		if err := b.Run(ctx, check, heapLen); err != nil {
			return fmt.Errorf("after resume: %w", err)
		}
		if i < 3 {
			continue
		}
		pause.ds = append(pause.ds, t1.Sub(t0))
		resume.ds = append(resume.ds, t2.Sub(t1))
		both.ds = append(both.ds, t2.Sub(t0))
		r.serverPauseMS.ds = append(r.serverPauseMS.ds, time.Duration(pr.Took*float64(time.Millisecond)))
		r.serverResumeMS.ds = append(r.serverResumeMS.ds, time.Duration(rr.Took*float64(time.Millisecond)))
	}
	r.pause = []*series{pause, resume, both}
	return nil
}

// sessionCPU is the CPU seconds of session id's box, and whether it is
// paused.
func sessionCPU(ctx context.Context, b *bed, id string) (float64, bool, error) {
	res, err := b.resources(ctx, id)
	if err != nil {
		return 0, false, err
	}
	return res.CPUSeconds, res.Paused, nil
}

// boxCPUOverPause measures the CPU of session id's box over 1 s running,
// 1 s paused and 1 s resumed, a busy loop running in its background.
func boxCPUOverPause(ctx context.Context, b *bed, r *results, id string, ref []byte) error {
	fmt.Fprintln(os.Stderr, "3: box CPU time over 1 s of pause with a busy loop in the box ...")
	if err := b.terminalExec(ctx, id, "(while :; do :; done) >/dev/null 2>&1 & echo $! > /tmp/spin.pid"); err != nil {
		return err
	}
	cpu := func() (float64, bool, error) { return sessionCPU(ctx, b, id) }
	c0, _, err := cpu()
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	c1, _, err := cpu()
	if err != nil {
		return err
	}
	if _, err := b.pause(ctx, ref); err != nil {
		return err
	}
	c2, paused, err := cpu()
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	c3, paused2, err := cpu()
	if err != nil {
		return err
	}
	r.pausedFlag = paused && paused2
	if _, err := b.resume(ctx, ref); err != nil {
		return err
	}
	c4, _, err := cpu()
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	c5, _, err := cpu()
	if err != nil {
		return err
	}
	r.cpuRunning, r.cpuPaused, r.cpuResumed = c1-c0, c3-c2, c5-c4
	if err := b.terminalExec(ctx, id, "kill $(cat /tmp/spin.pid)"); err != nil {
		return err
	}
	return nil
}

// workerCPUOverPause measures the same with a thread spinning in session
// id's Python worker, read both from the box and from the worker's own
// /proc entry.
func workerCPUOverPause(ctx context.Context, b *bed, r *results, id string, ref []byte) error {
	fmt.Fprintln(os.Stderr, "3: the same with a thread spinning in the Python worker ...")
	spin := "import threading\ndef _spin():\n    while True:\n        pass\nthreading.Thread(target=_spin, daemon=True).start()\nprint(len(x))"
	if err := b.Run(ctx, benchbed.RunBody(id, "", spin), heapLen); err != nil {
		return err
	}
	both2 := func() (float64, float64, error) {
		c, _, err := sessionCPU(ctx, b, id)
		p, n := cpuOf("python3.14")
		if err == nil && n != 1 {
			err = fmt.Errorf("%d Python workers below the server, want 1", n)
		}
		return c, p, err
	}
	var bx, py [6]float64
	step := func(i int, wait time.Duration, act func() error) error {
		if act != nil {
			if err := act(); err != nil {
				return err
			}
		}
		var err error
		if bx[i], py[i], err = both2(); err != nil {
			return err
		}
		time.Sleep(wait)
		bx[i+1], py[i+1], err = both2()
		return err
	}
	if err := step(0, time.Second, nil); err != nil {
		return err
	}
	if err := step(2, time.Second, func() error { _, err := b.pause(ctx, ref); return err }); err != nil {
		return err
	}
	if err := step(4, time.Second, func() error { _, err := b.resume(ctx, ref); return err }); err != nil {
		return err
	}
	for i := range 3 {
		r.pyBoxCPU[i], r.pyCPU[i] = bx[2*i+1]-bx[2*i], py[2*i+1]-py[2*i]
	}
	return nil
}

// makeSessions creates n sessions from the given number of clients, each
// with a box (and what prime runs in it).
func makeSessions(ctx context.Context, b *bed, n, clients int, prime func(id string) error) ([]string, error) {
	ids := make([]string, n)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				id, err := b.CreateSession(ctx)
				if err == nil {
					ids[i] = id
					err = prime(id)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					next.Store(int64(n)) // stop
					return
				}
				if (i+1)%100 == 0 {
					fmt.Fprintf(os.Stderr, "   %d sessions\n", i+1)
				}
			}
		})
	}
	wg.Wait()
	return ids, firstErr
}

// destroyAll destroys ids from clients concurrent clients.
func destroyAll(ctx context.Context, b *bed, ids []string, clients int) error {
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				if ids[i] == "" {
					continue
				}
				if err := b.DestroySession(ctx, ids[i]); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// 4. Destroying sessions that each have a box.
func destroy(ctx context.Context, b *bed, r *results) error {
	m := *nDestroy
	prime := func(id string) error { return b.Run(ctx, benchbed.RunBody(id, "sh", "true"), "") }
	fmt.Fprintf(os.Stderr, "4: making %d sessions, each with a box ...\n", m)
	ids, err := makeSessions(ctx, b, m, *clients, prime)
	if err != nil {
		_ = destroyAll(ctx, b, ids, *clients) // best effort: err is the one to report
		return err
	}
	if n := len(b.App.Sandbox.BoxKeys()); n < m {
		return fmt.Errorf("%d sessions made but only %d boxes open", m, n)
	}
	// Where a destroy's time goes: the same steps as destroy_session (App.destroySession),
	// called in-process one by one and timed, on the first few sessions
	// (while the others are still there: some steps cost more with more
	// sessions); the rest are destroyed over REST.
	k := min(30, m/2) // the rest (at least half) go through REST
	fmt.Fprintf(os.Stderr, "4: destroying %d of them step by step (in-process) ...\n", k)
	a := b.App
	steps := []*series{{name: "  Sandbox.CloseBox (kill the box, wait, cgroup)"}, {name: "  Python.Stop"},
		{name: "  Terminals.CloseSession"}, {name: "  Sessions.Delete (row, disk, files, uids)"}, {name: "    of which Disk.Release (umount, loop)"}}
	release := a.Sessions.Disk.Release
	var relD time.Duration
	if release != nil {
		a.Sessions.Disk.Release = func(dir string) error {
			t := time.Now()
			err := release(dir)
			relD = time.Since(t)
			return err
		}
		defer func() { a.Sessions.Disk.Release = release }()
	}
	for _, id := range ids[:k] {
		s, err := a.Sessions.ByIDAnyTenant(ctx, id)
		if err != nil {
			return err
		}
		fs := []func(){func() { a.Sandbox.CloseBox(s.ID) }, func() { a.Python.Stop(s.ID) }, func() { a.Terminals.CloseSession(s) },
			func() {
				if err := a.Sessions.Delete(ctx, s); err != nil {
					fmt.Fprintln(os.Stderr, "delete:", err)
				}
			}}
		for i, f := range fs {
			t := time.Now()
			f()
			steps[i].ds = append(steps[i].ds, time.Since(t))
		}
		steps[4].ds = append(steps[4].ds, relD)
	}
	r.destroySteps = steps

	fmt.Fprintf(os.Stderr, "4: destroying the other %d one after the other ...\n", m-k)
	r.destroySeq = &series{name: "destroy_session, sequential"}
	start := time.Now()
	for _, id := range ids[k:] {
		t := time.Now()
		if err := b.DestroySession(ctx, id); err != nil {
			return err
		}
		r.destroySeq.ds = append(r.destroySeq.ds, time.Since(t))
	}
	r.destroySeqWall = time.Since(start)

	fmt.Fprintf(os.Stderr, "4: making %d sessions again ...\n", m)
	if ids, err = makeSessions(ctx, b, m, *clients, prime); err != nil {
		_ = destroyAll(ctx, b, ids, *clients) // best effort: err is the one to report
		return err
	}
	fmt.Fprintf(os.Stderr, "4: destroying them from %d concurrent clients ...\n", *clients)
	start = time.Now()
	if err := destroyAll(ctx, b, ids, *clients); err != nil {
		return err
	}
	r.destroyPar, r.destroyParN = time.Since(start), m
	if left := len(b.App.Sandbox.BoxKeys()); left > 0 {
		return fmt.Errorf("%d boxes still open after destroying every session", left)
	}
	return nil
}

// 5. The memory of idle sessions.
// spawnerWait outlasts a box's unused spawner (boxinit.spawnerIdle, 30 s)
// and a prestarted worker that ran nothing (python.DefaultUnusedTimeout,
// 30 s from its start, which may come a few seconds after the session's).
const spawnerWait = 40 * time.Second

func idle(ctx context.Context, b *bed, r *results) error {
	n := *nIdle
	ir := &idleResult{N: n, AvailBefore: procs.MemAvailable()}
	before, err := measurePSS()
	if err != nil {
		return err
	}
	ir.ServerBeforeBytes = before.Server
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	ir.HeapBefore, ir.GoroutinesBefore = ms.HeapInuse, runtime.NumGoroutine()
	ir.Mode = *idleMode
	fmt.Fprintf(os.Stderr, "5: making %d idle sessions (%s) ...\n", n, *idleMode)
	start := time.Now()
	ids, err := makeSessions(ctx, b, n, *clients, func(id string) error {
		switch *idleMode {
		case "fresh":
			return nil
		case "python":
		case "used":
			if err := b.terminalExec(ctx, id, "true"); err != nil {
				return err
			}
		default:
			return fmt.Errorf("-idle-mode %q: want used, python or fresh", *idleMode)
		}
		return b.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n")
	})
	ir.Make = time.Since(start)
	if err != nil {
		_ = destroyAll(ctx, b, ids, *clients) // best effort: err is the one to report
		return err
	}
	// Idle means idle: a box keeps a spawner (a restricted init child that
	// forks its programs) for 30 s after its last spawn; wait until they
	// are let go.
	fmt.Fprintf(os.Stderr, "5: waiting %s for the boxes' spawners to be let go ...\n", spawnerWait)
	time.Sleep(spawnerWait)
	ir.AvailAfter = procs.MemAvailable()
	if ir.PSS, err = measurePSS(); err != nil {
		return err
	}
	runtime.ReadMemStats(&ms)
	ir.HeapInuse, ir.Goroutines = ms.HeapInuse, runtime.NumGoroutine()
	debug.FreeOSMemory() // a GC, then the heap's free pages back to the kernel
	if *memProf != "" {
		f, err := os.Create(*memProf)
		if err == nil {
			err = pprof.WriteHeapProfile(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil { // say so, and still destroy the sessions
			fmt.Fprintf(os.Stderr, "-memprofile: %v\n", err)
		}
	}
	if after, err := measurePSS(); err == nil {
		ir.ServerAfterGC = after.Server
	}
	if *release {
		if err := releaseIdle(ctx, b, ir, ids); err != nil {
			_ = destroyAll(ctx, b, ids, *clients) // best effort: err is the one to report
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "5: destroying them ...\n")
	start = time.Now()
	err = destroyAll(ctx, b, ids, *clients)
	ir.DestroyAll = time.Since(start)
	r.idle = ir
	return err
}

// releaseIdle releases every session's Python worker as its idle timer
// would, measures again, then times the way back on up to 20 of them: a
// run after a release (a new worker) beside resume + run after a pause.
func releaseIdle(ctx context.Context, b *bed, ir *idleResult, ids []string) error {
	rel, ok := any(b.App.Python).(interface{ ReleaseIdle(string) bool })
	if !ok {
		return fmt.Errorf("-idle-release: this build's Python engine has no ReleaseIdle")
	}
	for _, id := range ids {
		if rel.ReleaseIdle(id) {
			ir.ReleasedN++
		}
	}
	var err error
	if ir.Released, err = measurePSS(); err != nil {
		return err
	}
	debug.FreeOSMemory()
	if after, err := measurePSS(); err == nil {
		ir.ReleasedGC = after.Server
	}
	ir.RestoreRelease = &series{name: "run print(1) after the release"}
	ir.RestorePause = &series{name: "resume + run print(1) after a pause"}
	some := ids[:min(len(ids), 20)]
	for _, id := range some {
		t := time.Now()
		if err := b.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n"); err != nil {
			return err
		}
		ir.RestoreRelease.ds = append(ir.RestoreRelease.ds, time.Since(t))
	}
	for _, id := range some {
		if _, err := b.pause(ctx, benchbed.RefBody(id)); err != nil {
			return err
		}
		t := time.Now()
		if _, err := b.resume(ctx, benchbed.RefBody(id)); err != nil {
			return err
		}
		if err := b.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n"); err != nil {
			return err
		}
		ir.RestorePause.ds = append(ir.RestorePause.ds, time.Since(t))
	}
	return nil
}

func verdict(got, goal time.Duration) string {
	if got <= goal {
		return "met"
	}
	return fmt.Sprintf("NOT met (%.1fx)", float64(got)/float64(goal))
}

func report(r *results) {
	fmt.Printf("Quro session-box benchmark: %s/%s, %d CPUs, %s, %s, load average %s, uid %d\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format(time.RFC3339), procs.LoadAvg(), os.Geteuid())
	fmt.Printf("runs of a session outside its box (did not fit it): %d\n\n", r.outside)
	if len(r.one) == 3 {
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "1. one-shot `true`\tn\tmedian\tp95\tratio to bwrap (median)\tratio to fork-exec\tGo CPU/call\t")
		bw, fk := r.one[1].q(0.5), r.one[2].q(0.5)
		for _, s := range r.one {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2fx\t%.1fx\t%s\t\n", s.name, len(s.ds), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)),
				float64(s.q(0.5))/float64(bw), float64(s.q(0.5))/float64(fk), benchbed.Dur(s.cpu/time.Duration(len(s.ds))))
		}
		tw.Flush()
		rest := r.one[0].q(0.5)
		fmt.Printf("goal REST sh true ≤ 3 ms: %s; ≤ 0.5× bwrap alone (%s): %s\n\n", verdict(rest, 3*time.Millisecond),
			benchbed.Dur(bw/2), verdict(rest, bw/2))
	}
	if len(r.first) > 0 {
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "2. a fresh session's first Python run\tn\tmedian\tp95\t")
		for _, s := range r.first {
			if len(s.ds) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", s.name, len(s.ds), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)))
		}
		tw.Flush()
		fmt.Printf("goal first run ≤ 20 ms: run_code alone %s; create + run %s\n\n",
			verdict(r.first[0].q(0.5), 20*time.Millisecond), verdict(r.first[1].q(0.5), 20*time.Millisecond))
	}
	if len(r.pause) > 0 {
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "3. pause/resume, %d MiB in the box\tn\tmedian\tp95\t\n", r.heapBytes>>20)
		for _, s := range append(slices.Clone(r.pause), r.serverPauseMS, r.serverResumeMS) {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", s.name, len(s.ds), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)))
		}
		tw.Flush()
		fmt.Printf("goal pause + resume ≤ 10 ms: %s (each ≤ 10 ms: pause %s, resume %s)\n",
			verdict(r.pause[2].q(0.5), 10*time.Millisecond), verdict(r.pause[0].q(0.5), 10*time.Millisecond), verdict(r.pause[1].q(0.5), 10*time.Millisecond))
		fmt.Printf("box CPU with a busy loop: %.3f s over 1 s running, %.3f s over 1 s paused (status paused=%v), %.3f s over 1 s after resume: %s\n\n",
			r.cpuRunning, r.cpuPaused, r.pausedFlag, r.cpuResumed, frozen(r))
		fmt.Printf("a thread spinning in the Python worker: box %.3f s / worker %.3f s over 1 s running, %.3f s / %.3f s over 1 s paused, %.3f s / %.3f s over 1 s after resume\n\n",
			r.pyBoxCPU[0], r.pyCPU[0], r.pyBoxCPU[1], r.pyCPU[1], r.pyBoxCPU[2], r.pyCPU[2])
	}
	if r.destroySeq != nil {
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "4. destroy sessions with a box\tsessions\tper session (median)\tp95\ttotal\t1000 at this rate\t")
		s := r.destroySeq
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", s.name, len(s.ds), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)), benchbed.Dur(r.destroySeqWall),
			benchbed.Dur(r.destroySeqWall*1000/time.Duration(len(s.ds))))
		fmt.Fprintf(tw, "destroy_session, %d concurrent clients\t%d\t%s (wall/n)\t\t%s\t%s\t\n", *clients, r.destroyParN,
			benchbed.Dur(r.destroyPar/time.Duration(r.destroyParN)), benchbed.Dur(r.destroyPar), benchbed.Dur(r.destroyPar*1000/time.Duration(r.destroyParN)))
		if len(r.destroySteps) > 0 && len(r.destroySteps[0].ds) > 0 {
			fmt.Fprintf(tw, "in-process, step by step, first %d of them (the others still open):\t\t\t\t\t\t\n", len(r.destroySteps[0].ds))
		}
		for _, st := range r.destroySteps {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\t\t\n", st.name, len(st.ds), benchbed.Dur(st.q(0.5)), benchbed.Dur(st.q(0.95)))
		}
		tw.Flush()
		fmt.Printf("goal ≤ 5 ms per session: %s; 1000 in ≤ 5 s: sequential %s, concurrent %s (extrapolated from %d)\n\n",
			verdict(s.q(0.5), 5*time.Millisecond), verdict(r.destroySeqWall*1000/time.Duration(len(s.ds)), 5*time.Second),
			verdict(r.destroyPar*1000/time.Duration(r.destroyParN), 5*time.Second), r.destroyParN)
	}
	if ir := r.idle; ir != nil {
		p := ir.PSS
		fmt.Printf("5. %d idle sessions (%s), made in %s, destroyed in %s (%d clients)\n", ir.N,
			map[string]string{"used": "shell + Python worker each", "python": "print(1) run in each", "fresh": "nothing run"}[ir.Mode],
			benchbed.Dur(ir.Make), benchbed.Dur(ir.DestroyAll), *clients)
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PSS\tprocesses\ttotal\tper session\tprivate per session\tthreads per session\t")
		fmt.Fprintf(tw, "server process (before: %s)\t1\t%s\t%s (growth)\t\t\t\n", mib(ir.ServerBeforeBytes), mib(p.Server),
			kib((p.Server-ir.ServerBeforeBytes)/int64(ir.N)))
		fmt.Fprintf(tw, "  server after runtime.GC + FreeOSMemory\t1\t%s\t%s (growth)\t\t\n", mib(ir.ServerAfterGC),
			kib((ir.ServerAfterGC-ir.ServerBeforeBytes)/int64(ir.N)))
		fmt.Fprintf(tw, "  server Go heap in use, goroutines\t\t%s, %d\t%s, %.1f (growth)\t\t\n", mib(int64(ir.HeapInuse)), ir.Goroutines,
			kib((int64(ir.HeapInuse)-int64(ir.HeapBefore))/int64(ir.N)), float64(ir.Goroutines-ir.GoroutinesBefore)/float64(ir.N))
		var comms []string
		for c := range p.ByComm {
			comms = append(comms, c)
		}
		sort.Slice(comms, func(i, j int) bool { return p.ByComm[comms[i]] > p.ByComm[comms[j]] })
		for _, c := range comms {
			fmt.Fprintf(tw, "  in the boxes: %s\t%d\t%s\t%s\t%s\t%.1f\t\n", c, p.NComm[c], mib(p.ByComm[c]), kib(p.ByComm[c]/int64(ir.N)),
				kib(p.PrivComm[c]/int64(ir.N)), float64(p.Threads[c])/float64(ir.N))
		}
		fmt.Fprintf(tw, "every box process\t%d\t%s\t%s\t\t\n", p.Procs, mib(p.Boxes), kib(p.Boxes/int64(ir.N)))
		all := p.Boxes + p.Server
		fmt.Fprintf(tw, "boxes + server\t%d\t%s\t%s\t\t\n", p.Procs+1, mib(all), kib(all/int64(ir.N)))
		fmt.Fprintf(tw, "MemAvailable drop (whole machine, noisy)\t\t%s\t%s\t\t\n", mib(ir.AvailBefore-ir.AvailAfter),
			kib((ir.AvailBefore-ir.AvailAfter)/int64(ir.N)))
		tw.Flush()
		at1000 := all
		how := "measured"
		if ir.N != 1000 {
			at1000 = (p.Boxes+p.Server-ir.ServerBeforeBytes)/int64(ir.N)*1000 + ir.ServerBeforeBytes
			how = fmt.Sprintf("extrapolated from %d: (box PSS + server growth) per session × 1000 + the server before", ir.N)
		}
		fmt.Printf("goal 1000 idle sessions ≤ 4 GiB PSS: %s at 1000, %s (%s)\n\n", gib(at1000), how,
			map[bool]string{true: "met", false: "NOT met"}[at1000 <= 4<<30])
		if q := ir.Released; q != nil {
			fmt.Printf("5b. after the idle release of %d workers (what --python-idle does)\n", ir.ReleasedN)
			tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "PSS\tprocesses\ttotal\tper session\t")
			fmt.Fprintf(tw, "server process (growth over the start; after GC %s)\t1\t%s\t%s\t\n", kib((ir.ReleasedGC-ir.ServerBeforeBytes)/int64(ir.N)),
				mib(q.Server), kib((q.Server-ir.ServerBeforeBytes)/int64(ir.N)))
			for c, v := range q.ByComm {
				fmt.Fprintf(tw, "  in the boxes: %s\t%d\t%s\t%s\t\n", c, q.NComm[c], mib(v), kib(v/int64(ir.N)))
			}
			fmt.Fprintf(tw, "every box process\t%d\t%s\t%s\t\n", q.Procs, mib(q.Boxes), kib(q.Boxes/int64(ir.N)))
			per := (q.Boxes + q.Server - ir.ServerBeforeBytes) / int64(ir.N)
			fmt.Fprintf(tw, "boxes + server growth\t\t\t%s\t\n", kib(per))
			tw.Flush()
			for _, s := range []*series{ir.RestoreRelease, ir.RestorePause} {
				fmt.Printf("  %s: p50 %s, p95 %s (%d sessions)\n", s.name, benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)), len(s.ds))
			}
			fmt.Println()
		}
	}
	if r.churn != nil {
		reportChurn(r.churn)
	}
}

func frozen(r *results) string {
	if r.cpuRunning < 0.1 {
		return "INCONCLUSIVE (the loop did not run)"
	}
	if r.cpuPaused <= 0.01 && r.pausedFlag {
		return "frozen (no CPU while paused)"
	}
	return "NOT frozen"
}

func writeJSON(path string, r *results) error {
	out := map[string]any{"load_average": procs.LoadAvg(), "outside_runs": r.outside, "time": time.Now().UTC().Format(time.RFC3339), "uid": os.Geteuid()}
	put := func(s *series) {
		if s != nil && len(s.ds) > 0 {
			out[s.name] = map[string]any{"n": len(s.ds), "median_us": benchbed.Micro(s.q(0.5)), "p95_us": benchbed.Micro(s.q(0.95))}
		}
	}
	for _, s := range r.one {
		put(s)
	}
	for _, s := range r.first {
		put(s)
	}
	for _, s := range r.pause {
		put(s)
	}
	put(r.serverPauseMS)
	put(r.serverResumeMS)
	if len(r.pause) > 0 {
		out["box_memory_bytes_with_heap"] = r.heapBytes
		out["box_cpu_seconds"] = map[string]any{"running_1s": r.cpuRunning, "paused_1s": r.cpuPaused, "resumed_1s": r.cpuResumed, "status_paused": r.pausedFlag}
		out["python_thread_cpu_seconds"] = map[string]any{"box": r.pyBoxCPU, "worker": r.pyCPU, "phases": "1 s each: running, paused, resumed"}
	}
	put(r.destroySeq)
	for _, st := range r.destroySteps {
		put(st)
	}
	if r.destroySeq != nil {
		out["destroy_sequential_total_us"] = benchbed.Micro(r.destroySeqWall)
		out["destroy_concurrent"] = map[string]any{"clients": *clients, "sessions": r.destroyParN, "total_us": benchbed.Micro(r.destroyPar)}
	}
	if r.idle != nil {
		out["idle"] = r.idle
	}
	churnJSON(out, r.churn)
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10)) }
func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
