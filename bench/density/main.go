// Command density measures what sessions cost as they accumulate on one
// machine and in a burst (issue 29), in one run (see bench/README.md):
//
//	go run ./bench/density             (or: make bench-density; as root)
//	go run ./bench/density -quick      (100 sessions, fewer samples)
//	go run ./bench/density -n 300 -json /tmp/density.json
//
// One real App with quro serve's defaults (session boxes, a disk image per
// session, the Python worker prestarted, one spare per template, an
// in-session socket per box, the supervisor running) is served over REST
// on 127.0.0.1:0 with a real token and a keep-alive client (benchbed); the
// admission ceilings are lifted so that N sessions fit (-shipped-limits
// keeps them). In order:
//
//  1. create_session + the first run_code print(1) in it (then destroyed),
//     -samples times back to back, at 0 open sessions;
//  2. a probe session at 0: one-shot run_code sh "true" beside `bwrap
//     --unshare-all --ro-bind / / true` alone, and terminal_exec true, the
//     three interleaved in blocks;
//  3. a burst of -burst concurrent create_session (all released at once):
//     total time, creates/s, p50 and p95; then destroyed;
//  4. the PSS baseline with no session of the bench's (the server and every
//     process below it, once the boxes' unused spawners are let go);
//  5. N/2 idle sessions made (created, nothing run), then the samples of 1;
//     N idle sessions, the samples of 1 again, and the probe of 2 again;
//  6. the PSS of the N idle sessions, then of the same once each has run
//     print(1): (PSS − baseline) / N;
//  7. destroy_session of the N, one after the other, each timed;
//  8. a fresh data directory's first result: a new App on an empty data
//     directory (the embedded Python extracted into it, in the background
//     as quro serve does) until its first run_code print(1) answers; beside
//     a Jupyter cold start (start_new_kernel + execute print(1)) when
//     -jupyter-python has ipykernel.
//
// The host's mounts and loop devices (and the server's descendants, fds
// and threads) are counted before the App, with N sessions open, after the
// destroys and after the App closed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/bench/internal/procs"
	"github.com/quro-dev/quro/internal/app"
)

var (
	nSessions = flag.Int("n", 1000, "open sessions at the top level (samples are taken at 0, n/2 and n)")
	quick     = flag.Bool("quick", false, "a quick run: -n 100, 10 samples per level, 100 one-shot runs per path, 1 fresh data directory")
	samples   = flag.Int("samples", 30, "create + first run samples per level")
	pace      = flag.Duration("pace", 0, "pause between two samples (0: back to back, no spare made in between)")
	burstN    = flag.Int("burst", 100, "concurrent create_session calls in the burst")
	burstOnly = flag.Bool("burst-only", false, "only the bursts: -burst concurrent creates, then the first run_code print(1) in each at once, then a terminal_exec true in each (a box and a shell) and as many concurrent destroys, timed until every release ended, with create + first run samples while they go on")
	nOne      = flag.Int("oneshot", 300, "one-shot runs per path (run_code sh true, bwrap alone, terminal_exec true), at 0 and at n")
	blocks    = flag.Int("blocks", 10, "the one-shot paths alternate in this many blocks")
	clients   = flag.Int("clients", 4, "concurrent REST clients making (and using) the n sessions")
	settle    = flag.Duration("settle", 32*time.Second, "wait before each PSS measurement: a box's unused spawner is let go after 30 s")
	fresh     = flag.Int("fresh", 3, "fresh data directories timed to their first result (0: skip)")
	jupyter   = flag.String("jupyter-python", "/usr/bin/python3", "a python3 with ipykernel and jupyter_client for the cold start beside (skipped when it lacks them; empty: skip)")
	install   = flag.String("install", os.TempDir()+"/quro-test-python", "where the embedded interpreter is extracted for the main App (shared with the tests)")
	disk      = flag.Int64("disk", 0, "each session's disk quota in bytes (0: the default; -1: none)")
	shipped   = flag.Bool("shipped-limits", false, "keep the shipped admission ceilings (sessions, tasks, memory, disks) instead of lifting them")
	jsonPath  = flag.String("json", "", "also write the figures as JSON to this file")
	logWarn   = flag.Bool("log", false, "print the App's warnings (an unfit spare, a failed box) on stderr")
	memOnly   = flag.Bool("memory-only", false, "measure only memory (the PSS baseline, n idle, n once Python ran) and the host: no timed samples, burst or one-shot runs, and each run may take 2 minutes (for a loaded machine, where the timed parts say little)")
	commands  = flag.Int("commands", 0, "after the Python run, each session also runs this many one-shot run_code sh true (a spawn each in its box), then PSS is measured again: a session that ran commands")
	heapProf  = flag.String("heapprofile", "", "write the server's heap profile (pprof) at the baseline and with the n idle sessions to FILE.base and FILE.idle")
)

func main() {
	flag.Parse()
	if *quick {
		setDefault("n", "100")
		setDefault("samples", "10")
		setDefault("oneshot", "100")
		setDefault("fresh", "1")
	}
	if *nSessions < 2 {
		fmt.Fprintln(os.Stderr, "density: -n must be at least 2")
		os.Exit(2)
	}
	r := &results{N: *nSessions, Time: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), UID: os.Geteuid(), Shipped: *shipped}
	err := run(r)
	report(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "density:", err)
	}
	if *jsonPath != "" {
		if werr := writeJSON(*jsonPath, r); werr != nil {
			fmt.Fprintln(os.Stderr, "density: -json:", werr)
		}
	}
	if err != nil {
		os.Exit(1)
	}
}

// writeHeap writes the heap profile of this process (the App and the
// client) to -heapprofile's FILE+suffix after a GC, when the flag is set.
func writeHeap(suffix string) {
	if *heapProf == "" {
		return
	}
	runtime.GC()
	f, err := os.Create(*heapProf + suffix)
	if err == nil {
		err = pprof.WriteHeapProfile(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "density: -heapprofile:", err)
	}
}

// setDefault sets flag name to v unless the command line set it.
func setDefault(name, v string) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if !set {
		_ = flag.Set(name, v) // the names are this file's own
	}
}

// series is one measured quantity.
type series struct {
	Name string          `json:"name"`
	D    []time.Duration `json:"-"`
}

func (s *series) q(p float64) time.Duration {
	if s == nil || len(s.D) == 0 {
		return 0
	}
	d := slices.Clone(s.D)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1)+0.5)]
}

func (s *series) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"name": s.Name, "n": len(s.D),
		"p50_us": benchbed.Micro(s.q(0.5)), "p95_us": benchbed.Micro(s.q(0.95)), "max_us": benchbed.Micro(s.q(1))})
}

// level is the create + first run samples at one count of open sessions.
type level struct {
	Open    int     `json:"open_sessions"`
	Create  *series `json:"create_session"`
	First   *series `json:"first_run"`
	Both    *series `json:"create_and_first_run"`
	Destroy *series `json:"destroy_after_first_run"`
	Spare   bool    `json:"spare_ready_at_start"`
}

// probe is the one-shot runs and terminal_exec at one count.
type probe struct {
	Open  int     `json:"open_sessions"`
	RunSh *series `json:"run_code_sh_true"`
	Bwrap *series `json:"bwrap_true"`
	Texec *series `json:"terminal_exec_true"`
	// Errors counts the calls that failed, by path, and keeps the first
	// message of each: a failure is reported, and the run goes on.
	Errors   map[string]int    `json:"errors,omitempty"`
	FirstErr map[string]string `json:"first_errors,omitempty"`
}

func (p *probe) failed(path string, err error) {
	if p.Errors == nil {
		p.Errors, p.FirstErr = map[string]int{}, map[string]string{}
	}
	if p.Errors[path]++; p.Errors[path] == 1 {
		p.FirstErr[path] = err.Error()
	}
}

type burst struct {
	N       int           `json:"n"`
	Total   time.Duration `json:"total_ns"`
	PerSec  float64       `json:"creates_per_s"`
	Each    *series       `json:"each"`
	Errors  int           `json:"errors"`
	FirstEr string        `json:"first_error,omitempty"`
	// Kinds counts the errors by their text, an internal error's id
	// left out, cut at 160 bytes.
	Kinds map[string]int `json:"error_kinds,omitempty"`
}

var internalID = regexp.MustCompile(`\(id [0-9a-f]+\)`)

// failed counts err.
func (bu *burst) failed(err error) {
	bu.Errors++
	if bu.FirstEr == "" {
		bu.FirstEr = err.Error()
	}
	if bu.Kinds == nil {
		bu.Kinds = map[string]int{}
	}
	k := internalID.ReplaceAllString(err.Error(), "(id …)")
	if len(k) > 160 {
		k = k[:160]
	}
	bu.Kinds[k]++
}

// release runs call(0) … call(N-1) at once, released together, and
// records the time until all returned, each one's time and its errors.
func (bu *burst) release(call func(i int) error) {
	ds := make([]time.Duration, bu.N)
	errs := make([]error, bu.N)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range bu.N {
		wg.Go(func() {
			<-gate
			t := time.Now()
			errs[i] = call(i)
			ds[i] = time.Since(t)
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	bu.Total = time.Since(start)
	for i := range bu.N {
		if errs[i] != nil {
			bu.failed(errs[i])
			continue
		}
		bu.Each.D = append(bu.Each.D, ds[i])
	}
	bu.PerSec = float64(bu.N-bu.Errors) / bu.Total.Seconds()
}

// kinds prints bu's error kinds, most frequent first.
func (bu *burst) kinds() {
	ks := slices.Collect(maps.Keys(bu.Kinds))
	slices.SortFunc(ks, func(a, b string) int { return bu.Kinds[b] - bu.Kinds[a] })
	for _, k := range ks {
		fmt.Printf("  %4d× %s\n", bu.Kinds[k], k)
	}
}

type fill struct {
	From int           `json:"from"`
	To   int           `json:"to"`
	Took time.Duration `json:"took_ns"`
}

type freshResult struct {
	Quro    *series `json:"quro_first_result"`
	Jupyter *series `json:"jupyter_cold_start,omitempty"`
	Skip    string  `json:"jupyter_skipped,omitempty"`
}

type results struct {
	N       int      `json:"n"`
	Time    string   `json:"time"`
	CPUs    int      `json:"cpus"`
	UID     int      `json:"uid"`
	Shipped bool     `json:"shipped_limits"`
	LoadAt  []string `json:"load_average"`

	Levels   []*level `json:"levels"`
	Probes   []*probe `json:"probes"`
	Burst    *burst   `json:"burst,omitempty"`
	Destroys *burst   `json:"destroy_burst,omitempty"`
	// FirstRuns is the first run_code print(1) of each session of the
	// create burst, all sent at once (-burst-only).
	FirstRuns *burst `json:"first_run_burst,omitempty"`
	// During are create + first run samples taken right after the burst
	// of destroys answered, while their teardowns go on.
	During   *series              `json:"create_first_run_during_teardown,omitempty"`
	Fills    []fill               `json:"fills"`
	Baseline *pssPoint            `json:"pss_baseline,omitempty"`
	Idle     *pssPoint            `json:"pss_idle_at_n,omitempty"`
	PyOnce   *pssPoint            `json:"pss_python_once_at_n,omitempty"`
	Busy     *pssPoint            `json:"pss_after_commands_at_n,omitempty"`
	RunAll   time.Duration        `json:"run_print1_in_all_ns"`
	Teardown *series              `json:"destroy_teardown,omitempty"`
	TearWall time.Duration        `json:"destroy_teardown_total_ns"`
	Host     map[string]hostPoint `json:"host"`
	Fresh    *freshResult         `json:"fresh_data_dir,omitempty"`
	Outside  uint64               `json:"runs_outside_their_box"`
	Avail    [2]int64             `json:"mem_available_bytes_before_after_n"`
}

func (r *results) load(when string) { r.LoadAt = append(r.LoadAt, when+": "+procs.LoadAvg()) }

// timedAtZero takes the timed parts with no session of the bench's open:
// create + first run samples, the one-shot paths and the burst (none with
// -memory-only).
func timedAtZero(ctx context.Context, b *bed, r *results) error {
	if *memOnly {
		return nil
	}
	if err := samplesAt(ctx, b, r, 0, 2); err != nil {
		return err
	}
	if err := probeAt(ctx, b, r, 0); err != nil {
		return err
	}
	return doBurst(ctx, b, r)
}

func run(r *results) error {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "density: not root: the boxes run with less isolation than in production; run as root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data, err := os.MkdirTemp("", "quro-bench-density-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	r.Host = map[string]hostPoint{"before": measureHost(data)}
	r.load("start")
	fmt.Fprintf(os.Stderr, "starting the server (interpreter under %s) ...\n", *install)
	opts := appOptions(*install, *shipped, *disk)
	if *logWarn {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	b, err := newBed(ctx, data, opts)
	if err != nil {
		return err
	}
	closeBed := sync.OnceFunc(func() {
		r.Outside = b.App.Sandbox.BoxStats().Outside
		b.Close()
	})
	defer closeBed()
	if !b.App.Sandbox.SessionBoxes() {
		return fmt.Errorf("the sandbox does not run session boxes here (bwrap missing, or no isolation?)")
	}
	b.spareReady(time.Minute)
	if *burstOnly {
		r.load("burst")
		return doBurst(ctx, b, r)
	}

	n := *nSessions
	// 1, 2, 3 at 0 open sessions.
	if err := timedAtZero(ctx, b, r); err != nil {
		return err
	}
	// 4. The baseline.
	b.spareReady(time.Minute)
	fmt.Fprintf(os.Stderr, "baseline: waiting %s for the boxes to go idle ...\n", *settle)
	time.Sleep(*settle)
	if r.Baseline, err = measurePSS(); err != nil {
		return err
	}
	writeHeap(".base")
	r.Avail[0] = procs.MemAvailable()
	// 5. N/2, then N.
	var ids []string
	for _, to := range []int{n / 2, n} {
		more, err := fillTo(ctx, b, r, len(ids), to)
		ids = append(ids, more...)
		if err != nil {
			destroyAll(ctx, b, ids)
			return err
		}
		if *memOnly {
			continue
		}
		if err := samplesAt(ctx, b, r, to, 0); err != nil {
			destroyAll(ctx, b, ids)
			return err
		}
	}
	r.Host["at_n"] = measureHost(data)
	if !*memOnly {
		if err := probeAt(ctx, b, r, n); err != nil {
			destroyAll(ctx, b, ids)
			return err
		}
	}
	// 6. PSS at N: idle, after one Python run each, after commands.
	if err := memoryAtN(ctx, b, r, ids); err != nil {
		destroyAll(ctx, b, ids)
		return err
	}
	r.load("at n")
	// 7. Teardown.
	fmt.Fprintf(os.Stderr, "destroying the %d one after the other ...\n", n)
	r.Teardown = &series{Name: "destroy_session (from n open to 0, sequential)"}
	t := time.Now()
	for _, id := range ids {
		t0 := time.Now()
		if err := b.DestroySession(ctx, id); err != nil {
			return err
		}
		r.Teardown.D = append(r.Teardown.D, time.Since(t0))
	}
	r.TearWall = time.Since(t)
	r.Host["after_destroy"] = measureHost(data)
	closeBed()
	r.Host["after_close"] = measureHost(data)
	// 8. A fresh data directory.
	if *fresh > 0 {
		if err := freshRuns(r); err != nil {
			return err
		}
	}
	r.load("end")
	return nil
}

// memoryAtN measures PSS with the n sessions ids open: idle, once each
// has run print(1), and (-commands) once each has run that many one-shot
// sh runs too. The caller destroys ids on an error.
func memoryAtN(ctx context.Context, b *bed, r *results, ids []string) error {
	fmt.Fprintf(os.Stderr, "%d idle sessions: waiting %s ...\n", len(ids), *settle)
	time.Sleep(*settle)
	var err error
	if r.Idle, err = measurePSS(); err != nil {
		return err
	}
	writeHeap(".idle")
	r.Avail[1] = procs.MemAvailable()
	fmt.Fprintf(os.Stderr, "run_code print(1) in each of the %d ...\n", len(ids))
	t := time.Now()
	if err := parallel(len(ids), *clients, func(i int) error {
		body := benchbed.RunBody(ids[i], "", "print(1)")
		if *memOnly {
			body = benchbed.MustJSON(app.RunCodeInput{Session: ids[i], Code: "print(1)", TimeoutMS: 120_000})
		}
		return b.Run(ctx, body, "1\n")
	}); err != nil {
		return err
	}
	r.RunAll = time.Since(t)
	time.Sleep(*settle)
	if r.PyOnce, err = measurePSS(); err != nil {
		return err
	}
	if *commands > 0 {
		fmt.Fprintf(os.Stderr, "run_code sh true %d times in each of the %d ...\n", *commands, len(ids))
		if err := parallel(len(ids), *clients, func(i int) error {
			body := benchbed.RunBody(ids[i], "sh", "true")
			for range *commands {
				if err := b.Run(ctx, body, ""); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		time.Sleep(*settle)
		if r.Busy, err = measurePSS(); err != nil {
			return err
		}
	}
	return nil
}

// samplesAt takes -samples (plus warm) create + first run samples with
// open sessions open; each sample's session is destroyed at once.
func samplesAt(ctx context.Context, b *bed, r *results, open, warm int) error {
	lv := &level{Open: open, Create: &series{Name: "create_session"}, First: &series{Name: "first run_code print(1)"},
		Both: &series{Name: "create + first run"}, Destroy: &series{Name: "destroy_session after it"}}
	lv.Spare = b.spareReady(time.Minute) // each level starts alike: a spare ready (if one comes within a minute)
	fmt.Fprintf(os.Stderr, "%d open: %d create + first run samples ...\n", open, *samples)
	body := func(id string) []byte { return benchbed.RunBody(id, "", "print(1)") }
	for i := range *samples + warm {
		if i > 0 && *pace > 0 {
			time.Sleep(*pace)
		}
		t0 := time.Now()
		id, err := b.CreateSession(ctx)
		if err != nil {
			return fmt.Errorf("%d open: %w", open, err)
		}
		t1 := time.Now()
		if err := b.Run(ctx, body(id), "1\n"); err != nil {
			return fmt.Errorf("%d open: %w", open, err)
		}
		t2 := time.Now()
		if err := b.DestroySession(ctx, id); err != nil {
			return fmt.Errorf("%d open: %w", open, err)
		}
		t3 := time.Now()
		if i < warm {
			continue
		}
		lv.Create.D = append(lv.Create.D, t1.Sub(t0))
		lv.First.D = append(lv.First.D, t2.Sub(t1))
		lv.Both.D = append(lv.Both.D, t2.Sub(t0))
		lv.Destroy.D = append(lv.Destroy.D, t3.Sub(t2))
	}
	r.Levels = append(r.Levels, lv)
	return nil
}

// probeAt times one-shot runs and terminal_exec in a probe session
// (made, warmed, destroyed after) beside bwrap alone, interleaved.
func probeAt(ctx context.Context, b *bed, r *results, open int) error {
	id, err := b.CreateSession(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = b.DestroySession(ctx, id) }() // best effort: a measurement's error is the one to report
	p := &probe{Open: open, RunSh: &series{Name: `run_code {"lang":"sh","code":"true"}`},
		Bwrap: &series{Name: "bwrap --unshare-all --ro-bind / / true"}, Texec: &series{Name: "terminal_exec true"}}
	sh := benchbed.RunBody(id, "sh", "true")
	tx := benchbed.MustJSON(app.TerminalExecInput{Session: id, Command: "true"})
	paths := []struct {
		s *series
		f func() error
	}{
		{p.RunSh, func() error { return b.Run(ctx, sh, "") }},
		{p.Bwrap, bwrapTrue},
		{p.Texec, func() error { return b.texec(ctx, tx) }},
	}
	for _, pt := range paths {
		for range 20 { // the first run makes the box, the first command the shell
			if err := pt.f(); err != nil {
				p.failed(pt.s.Name, err)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "%d open: %d one-shot runs per path in %d blocks ...\n", open, *nOne, *blocks)
	per := max(1, *nOne / *blocks)
	for range *blocks {
		for _, pt := range paths {
			for range per {
				t := time.Now()
				if err := pt.f(); err != nil {
					p.failed(pt.s.Name, err)
					continue
				}
				pt.s.D = append(pt.s.D, time.Since(t))
			}
		}
	}
	r.Probes = append(r.Probes, p)
	return nil
}

// doBurst releases -burst create_session calls at once, then destroys
// what they made.
func doBurst(ctx context.Context, b *bed, r *results) error {
	k := *burstN
	bu := &burst{N: k, Each: &series{Name: "create_session in the burst"}}
	b.spareReady(time.Minute)
	fmt.Fprintf(os.Stderr, "a burst of %d concurrent create_session ...\n", k)
	ids := make([]string, k)
	bu.release(func(i int) (err error) {
		ids[i], err = b.CreateSession(ctx)
		return err
	})
	r.Burst = bu
	if !*burstOnly {
		destroyAll(ctx, b, ids)
		return nil
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "" })
	firstRunBurst(ctx, b, r, ids)
	return destroyBurst(ctx, b, r, ids)
}

// firstRunBurst sends the first run_code print(1) of each of ids at once,
// right after the create burst (their workers prestarting, a few at a
// time): all answered in, runs/s, each run's answer (p50, p95, max) and
// the errors by kind.
func firstRunBurst(ctx context.Context, b *bed, r *results, ids []string) {
	fmt.Fprintf(os.Stderr, "a burst of %d concurrent first run_code print(1) ...\n", len(ids))
	bu := &burst{N: len(ids), Each: &series{Name: "first run_code print(1) in the burst"}}
	bu.release(func(i int) error {
		return b.Run(ctx, benchbed.RunBody(ids[i], "", "print(1)"), "1\n")
	})
	r.FirstRuns = bu
}

// destroyBurst gives each of ids a box and a shell (terminal_exec true),
// then destroys them all at once: each destroy's answer, and the time
// until every background teardown and release has ended; beside that
// wait, from when the destroys answered, 5 create + first run samples,
// one after the other.
func destroyBurst(ctx context.Context, b *bed, r *results, ids []string) error {
	fmt.Fprintf(os.Stderr, "terminal_exec true in each of the %d ...\n", len(ids))
	if err := parallel(len(ids), *clients, func(i int) error {
		return b.texec(ctx, benchbed.MustJSON(app.TerminalExecInput{Session: ids[i], Command: "true"}))
	}); err != nil {
		destroyAll(ctx, b, ids)
		return err
	}
	b.App.Sessions.WaitReleases()
	fmt.Fprintf(os.Stderr, "a burst of %d concurrent destroy_session ...\n", len(ids))
	bu := &burst{N: len(ids), Each: &series{Name: "destroy_session in the burst"}}
	ds := make([]time.Duration, len(ids))
	errs := make([]error, len(ids))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			<-gate
			t := time.Now()
			errs[i] = b.DestroySession(ctx, ids[i])
			ds[i] = time.Since(t)
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	answered := time.Since(start)
	// The samples run beside the wait for the releases; their own
	// sessions are destroyed only after it.
	r.During = &series{Name: "create + first run during the teardowns"}
	var made []string
	sampled := make(chan error, 1)
	go func() {
		for range 5 {
			t := time.Now()
			id, err := b.CreateSession(ctx)
			if err != nil {
				sampled <- err
				return
			}
			made = append(made, id)
			if err := b.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n"); err != nil {
				sampled <- err
				return
			}
			r.During.D = append(r.During.D, time.Since(t))
		}
		sampled <- nil
	}()
	b.App.Sessions.WaitReleases()
	bu.Total = time.Since(start)
	err := <-sampled
	destroyAll(ctx, b, made)
	if err != nil {
		return err
	}
	for i := range ids {
		if errs[i] != nil {
			bu.failed(errs[i])
			continue
		}
		bu.Each.D = append(bu.Each.D, ds[i])
	}
	bu.PerSec = float64(len(ids)-bu.Errors) / answered.Seconds()
	r.Destroys = bu
	r.load("after the destroy burst")
	return nil
}

// fillTo makes idle sessions (created, nothing run) from -clients
// clients until to sessions of the bench's are open.
func fillTo(ctx context.Context, b *bed, r *results, from, to int) ([]string, error) {
	fmt.Fprintf(os.Stderr, "making idle sessions %d to %d ...\n", from, to)
	ids := make([]string, to-from)
	t := time.Now()
	err := parallel(len(ids), *clients, func(i int) error {
		id, err := b.CreateSession(ctx)
		ids[i] = id
		return err
	})
	r.Fills = append(r.Fills, fill{From: from, To: to, Took: time.Since(t)})
	return slices.DeleteFunc(ids, func(id string) bool { return id == "" }), err
}

// destroyAll destroys ids from -clients clients, best effort (after an
// error, or of sessions no measurement times).
func destroyAll(ctx context.Context, b *bed, ids []string) {
	_ = parallel(len(ids), *clients, func(i int) error {
		if ids[i] == "" {
			return nil
		}
		return b.DestroySession(ctx, ids[i])
	})
}

func report(r *results) {
	fmt.Printf("Quro density benchmark: %s/%s, %d CPUs, %s, %s, uid %d, n=%d\n", runtime.GOOS, runtime.GOARCH, r.CPUs,
		runtime.Version(), r.Time, r.UID, r.N)
	if r.Shipped {
		fmt.Println("admission ceilings: the shipped defaults (-shipped-limits)")
	} else {
		fmt.Println("admission ceilings lifted: " + raisedLimits)
	}
	fmt.Printf("load average: %v; runs of a session outside its box: %d\n\n", r.LoadAt, r.Outside)

	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "create + first run_code print(1)\topen\tn\tp50\tp95\tspare ready\t")
	for _, lv := range r.Levels {
		for _, s := range []*series{lv.Create, lv.First, lv.Both, lv.Destroy} {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%v\t\n", s.Name, lv.Open, len(s.D), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)), lv.Spare)
		}
	}
	tw.Flush()
	if len(r.Levels) == 3 {
		z, h, top := r.Levels[0].Both.q(0.5), r.Levels[1].Both.q(0.5), r.Levels[2].Both.q(0.5)
		fmt.Printf("ratio create + first run p50: %d vs 0 open %.2fx, %d vs 0 %.2fx (goal ≤ 1.2x); p50 ≤ 20 ms at all three: %s\n",
			r.Levels[1].Open, ratio(h, z), r.Levels[2].Open, ratio(top, z),
			verdict(max(z, h, top), 20*time.Millisecond))
	}
	for _, f := range r.Fills {
		fmt.Printf("idle sessions %d→%d made in %s from %d clients (%.1f/s)\n", f.From, f.To, benchbed.Dur(f.Took), *clients,
			float64(f.To-f.From)/f.Took.Seconds())
	}
	fmt.Println()

	if bu := r.Burst; bu != nil {
		fmt.Printf("burst of %d concurrent create_session: all answered in %s, %.1f creates/s, p50 %s, p95 %s, %d errors%s\n",
			bu.N, benchbed.Dur(bu.Total), bu.PerSec, benchbed.Dur(bu.Each.q(0.5)), benchbed.Dur(bu.Each.q(0.95)), bu.Errors, firstErr(bu.FirstEr))
		bu.kinds()
		fmt.Printf("goal all within 2 s: %s; ≥ 50 creates/s: %s\n\n", verdict(bu.Total, 2*time.Second),
			map[bool]string{true: "met", false: "NOT met"}[bu.PerSec >= 50 && bu.Errors == 0])
	}
	if bu := r.FirstRuns; bu != nil {
		fmt.Printf("burst of %d concurrent first run_code print(1), right after the creates: all answered in %s, %.1f runs/s, p50 %s, p95 %s, max %s, %d errors%s\n",
			bu.N, benchbed.Dur(bu.Total), bu.PerSec, benchbed.Dur(bu.Each.q(0.5)), benchbed.Dur(bu.Each.q(0.95)), benchbed.Dur(bu.Each.q(1)), bu.Errors, firstErr(bu.FirstEr))
		bu.kinds()
		fmt.Println()
	}
	if bu := r.Destroys; bu != nil {
		fmt.Printf("burst of %d concurrent destroy_session (each with a box and a shell): answered at %.1f/s, p50 %s, p95 %s, %d errors%s; every teardown and release ended %s after the burst began\n",
			bu.N, bu.PerSec, benchbed.Dur(bu.Each.q(0.5)), benchbed.Dur(bu.Each.q(0.95)), bu.Errors, firstErr(bu.FirstEr), benchbed.Dur(bu.Total))
		bu.kinds()
	}
	if d := r.During; d != nil && len(d.D) > 0 {
		fmt.Printf("create + first run once the destroys answered (%d, one after the other, beside the teardowns): p50 %s, max %s\n\n",
			len(d.D), benchbed.Dur(d.q(0.5)), benchbed.Dur(d.q(1)))
	}

	if len(r.Probes) > 0 {
		tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "one-shot and terminal_exec\topen\tn\tp50\tp95\tratio to bwrap (p50)\t")
		for _, p := range r.Probes {
			bw := p.Bwrap.q(0.5)
			for _, s := range []*series{p.RunSh, p.Bwrap, p.Texec} {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%.2fx\t\n", s.Name, p.Open, len(s.D), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)), ratio(s.q(0.5), bw))
			}
		}
		tw.Flush()
		for _, p := range r.Probes {
			for path, k := range p.Errors {
				fmt.Printf("at %d open: %d calls of %s FAILED (first: %s)\n", p.Open, k, path, p.FirstErr[path])
			}
		}
		for _, p := range r.Probes {
			fmt.Printf("at %d open: run_code sh true ≤ 0.5x bwrap alone: %s; terminal_exec true ≤ 1 ms: %s\n", p.Open,
				verdict(p.RunSh.q(0.5), p.Bwrap.q(0.5)/2), verdict(p.Texec.q(0.5), time.Millisecond))
		}
		fmt.Println()
	}

	reportMemory(r)
	reportRest(r)
}

// byComm prints p's PSS by command, per session (less the baseline's),
// with each command's processes and their mean PSS.
func byComm(r *results, name string, p *pssPoint) {
	if p == nil {
		return
	}
	n := int64(r.N)
	fmt.Printf("per command, %s (PSS per session − baseline; processes, mean PSS each):\n", name)
	comms := make([]string, 0, len(p.ByComm))
	for c := range p.ByComm {
		comms = append(comms, c)
	}
	slices.SortFunc(comms, func(a, b string) int { return int(p.ByComm[b] - p.ByComm[a]) })
	for _, c := range comms {
		fmt.Printf("  %-16s %5d processes  %s  (%s each)\n", c, p.NComm[c], kib((p.ByComm[c]-r.Baseline.ByComm[c])/n), kib(p.ByComm[c]/int64(max(1, p.NComm[c]))))
	}
}

// reportMemory prints the PSS figures.
func reportMemory(r *results) {
	if r.Baseline != nil && r.Idle != nil {
		n := int64(r.N)
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PSS\tserver\tbelow it (processes)\ttotal\tper session (− baseline)\tserver fds\tserver threads\t")
		row := func(name string, p *pssPoint) {
			per := "\t"
			if p != r.Baseline {
				per = mib((p.total()-r.Baseline.total())/n) + "\t"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s (%d)\t%s\t%s%d\t%d\t\n", name, mib(p.Server), mib(p.Boxes), p.Procs, mib(p.total()), per, p.FDs, p.Thr)
		}
		row("baseline (no session of the bench's)", r.Baseline)
		row(fmt.Sprintf("%d idle sessions (created, nothing run)", r.N), r.Idle)
		if r.PyOnce != nil {
			row(fmt.Sprintf("%d sessions, each after one print(1)", r.N), r.PyOnce)
		}
		if r.Busy != nil {
			row(fmt.Sprintf("%d sessions, each after %d run_code sh true too", r.N, *commands), r.Busy)
		}
		tw.Flush()
		idle := (r.Idle.total() - r.Baseline.total()) / n
		fmt.Printf("goal per idle session ≤ 2 MiB: %s", mverdict(idle, 2<<20))
		if r.PyOnce != nil {
			once := (r.PyOnce.total() - r.Baseline.total()) / n
			fmt.Printf("; per session that ran Python once ≤ 4 MiB: %s (print(1) in all %d took %s)", mverdict(once, 4<<20), r.N, benchbed.Dur(r.RunAll))
		}
		fmt.Printf("\nMemAvailable drop over the %d idle sessions (whole machine, noisy): %s per session\n", r.N,
			mib((r.Avail[0]-r.Avail[1])/n))
		byComm(r, "idle at n", r.Idle)
		byComm(r, "after one print(1)", r.PyOnce)
		byComm(r, fmt.Sprintf("after %d run_code sh true", *commands), r.Busy)
		fmt.Println()
	}
}

// reportRest prints the destroys, the host's counts and the fresh data
// directory.
func reportRest(r *results) {
	if s := r.Teardown; s != nil && len(s.D) > 0 {
		fmt.Printf("%s: n %d, p50 %s, p95 %s, all in %s; goal p50 ≤ 3 ms: %s\n\n", s.Name, len(s.D), benchbed.Dur(s.q(0.5)), benchbed.Dur(s.q(0.95)),
			benchbed.Dur(r.TearWall), verdict(s.q(0.5), 3*time.Millisecond))
	}

	if len(r.Host) > 0 {
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "host\tmounts\tof the data dir\tloop devices bound\tto the data dir\tloop nodes\tserver descendants\tserver fds\tthreads\t")
		for _, k := range []string{"before", "at_n", "after_destroy", "after_close"} {
			h, ok := r.Host[k]
			if !ok {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", k, h.Mounts, h.DataMounts, h.Loops, h.DataLoops, h.LoopDevices, h.BoxProcs, h.ServerFDs, h.ServerThr)
		}
		tw.Flush()
		fmt.Println()
	}

	if f := r.Fresh; f != nil {
		fmt.Printf("a fresh data directory's first result (new App → first print(1), Python extracted): n %d, p50 %s, max %s\n",
			len(f.Quro.D), benchbed.Dur(f.Quro.q(0.5)), benchbed.Dur(f.Quro.q(1)))
		if f.Jupyter != nil && len(f.Jupyter.D) > 0 {
			fmt.Printf("Jupyter cold start (start_new_kernel + execute print(1)): n %d, p50 %s; ratio Quro/Jupyter %.2fx\n",
				len(f.Jupyter.D), benchbed.Dur(f.Jupyter.q(0.5)), ratio(f.Quro.q(0.5), f.Jupyter.q(0.5)))
		} else {
			fmt.Printf("Jupyter cold start: skipped (%s)\n", f.Skip)
		}
		fmt.Printf("goal ≤ 1 s: %s\n", verdict(f.Quro.q(0.5), time.Second))
	}
}

func firstErr(s string) string {
	if s == "" {
		return ""
	}
	return " (first: " + s + ")"
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func verdict(got, goal time.Duration) string {
	if got <= goal {
		return "met"
	}
	return fmt.Sprintf("NOT met (%.1fx the goal)", ratio(got, goal))
}

func mverdict(got, goal int64) string {
	if got <= goal {
		return "met"
	}
	return fmt.Sprintf("NOT met (%.1fx the goal)", float64(got)/float64(goal))
}

// summary is the figures: the ratios and per-session costs the
// report's goals are checked against.
func summary(r *results) map[string]any {
	out := map[string]any{}
	if len(r.Levels) == 3 {
		z := r.Levels[0].Both.q(0.5)
		out["create_first_run_p50_us"] = []float64{benchbed.Micro(z), benchbed.Micro(r.Levels[1].Both.q(0.5)), benchbed.Micro(r.Levels[2].Both.q(0.5))}
		out["create_first_run_ratio_half_vs_0"] = ratio(r.Levels[1].Both.q(0.5), z)
		out["create_first_run_ratio_n_vs_0"] = ratio(r.Levels[2].Both.q(0.5), z)
	}
	for _, p := range r.Probes {
		out[fmt.Sprintf("run_sh_true_vs_bwrap_at_%d", p.Open)] = ratio(p.RunSh.q(0.5), p.Bwrap.q(0.5))
		out[fmt.Sprintf("terminal_exec_true_p50_us_at_%d", p.Open)] = benchbed.Micro(p.Texec.q(0.5))
	}
	if r.Baseline != nil && r.Idle != nil {
		out["pss_per_idle_session_bytes"] = (r.Idle.total() - r.Baseline.total()) / int64(r.N)
	}
	if r.Baseline != nil && r.PyOnce != nil {
		out["pss_per_python_once_session_bytes"] = (r.PyOnce.total() - r.Baseline.total()) / int64(r.N)
	}
	if r.Baseline != nil && r.Busy != nil {
		out["pss_per_session_after_commands_bytes"] = (r.Busy.total() - r.Baseline.total()) / int64(r.N)
	}
	if r.Teardown != nil {
		out["destroy_p50_us"] = benchbed.Micro(r.Teardown.q(0.5))
	}
	if r.Burst != nil {
		out["burst_total_us"], out["burst_creates_per_s"] = benchbed.Micro(r.Burst.Total), r.Burst.PerSec
	}
	if r.FirstRuns != nil {
		out["first_run_burst_total_us"], out["first_run_burst_p50_us"] = benchbed.Micro(r.FirstRuns.Total), benchbed.Micro(r.FirstRuns.Each.q(0.5))
		out["first_run_burst_errors"] = r.FirstRuns.Errors
	}
	if r.Fresh != nil {
		out["fresh_first_result_p50_us"] = benchbed.Micro(r.Fresh.Quro.q(0.5))
		if r.Fresh.Jupyter != nil {
			out["jupyter_cold_start_p50_us"] = benchbed.Micro(r.Fresh.Jupyter.q(0.5))
		}
	}
	return out
}

func writeJSON(path string, r *results) error {
	data, err := json.MarshalIndent(struct {
		*results
		Summary map[string]any `json:"summary"`
	}{r, summary(r)}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10)) }
