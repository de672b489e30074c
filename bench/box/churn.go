package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/bench/internal/procs"
)

// 6. What the server keeps after sessions go: its OS threads and its PSS
// at the start, with -churn sessions live (each used once: terminal_exec
// and run_code print(1)), and after all of them are destroyed.

var (
	nChurn    = flag.Int("churn", 1000, "6: sessions created, used and destroyed")
	churnIdle = flag.Duration("churnidle", 2*time.Minute, "6: at most this long, after the destroys and a GC, for the runtime to give free memory back by itself")
	churnGor  = flag.String("churngoroutines", "", "6: write the goroutines (grouped by stack) with the sessions live to this file")
	churnProf = flag.String("churnprofile", "", "6: write a heap profile of the server, the sessions destroyed, to this file (and with them live to FILE.live)")
)

// churnPoint is the server process at one moment.
type churnPoint struct {
	Threads    int    `json:"threads"`
	PSS        int64  `json:"pss_bytes"`
	HeapInuse  uint64 `json:"heap_inuse_bytes"`
	StackInuse uint64 `json:"stack_inuse_bytes"`
	Goroutines int    `json:"goroutines"`
	// Meta is the runtime's own memory (span structures, GC metadata,
	// profiling buckets, the rest): kept at its peak size, never returned.
	Meta uint64 `json:"runtime_meta_bytes"`
}

type churnResult struct {
	N        int           `json:"sessions"`
	Start    churnPoint    `json:"start"`
	Live     churnPoint    `json:"live"`
	After    churnPoint    `json:"after_gc"`
	Idle     churnPoint    `json:"after_gc_idle"` // once the runtime's scavenger gave the free pages back (bounded)
	IdleFor  time.Duration `json:"idle_ns"`
	Freed    churnPoint    `json:"after_free_os_memory"`
	Make     time.Duration `json:"make_ns"`
	Destroy  time.Duration `json:"destroy_ns"`
	Settle   time.Duration `json:"settle_ns"` // until no box process was left
	Leftover int           `json:"box_processes_left"`
}

// threads is this process's OS thread count (/proc/self/task).
func threads() int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	return len(ents)
}

func point() churnPoint {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p, _, _ := pss(os.Getpid())
	return churnPoint{Threads: threads(), PSS: p, HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, Goroutines: runtime.NumGoroutine(),
		Meta: ms.MSpanSys + ms.MCacheSys + ms.BuckHashSys + ms.GCSys + ms.OtherSys}
}

// boxProcs is how many processes are left below this one.
func boxProcs() int {
	ps, err := procs.Read()
	if err != nil {
		return -1
	}
	return len(procs.Descendants(ps, os.Getpid()))
}

// settle waits (bounded) until no process of a box is left: destroy_session
// has answered, but an ended box's last processes may still be exiting.
func settle() (time.Duration, int) {
	start := time.Now()
	n := boxProcs()
	for n > 0 && time.Since(start) < 30*time.Second {
		time.Sleep(50 * time.Millisecond)
		n = boxProcs()
	}
	return time.Since(start), n
}

func churn(ctx context.Context, b *bed, r *results) error {
	n := *nChurn
	if *churnProf != "" {
		// A finer heap profile of what is kept: allocations from here on
		// are sampled every 4 KiB instead of 512 KiB.
		runtime.MemProfileRate = 4096
	}
	use := func(id string) error {
		if err := b.terminalExec(ctx, id, "true"); err != nil {
			return err
		}
		return b.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n")
	}
	// A warm-up round as wide as the clients, so that "start" is a server
	// that has served sessions (its pools, caches and code pages in use),
	// not one that has served none.
	fmt.Fprintf(os.Stderr, "6: warm-up: %d sessions made, used and destroyed ...\n", *clients)
	ids, err := makeSessions(ctx, b, *clients, *clients, use)
	if derr := destroyAll(ctx, b, ids, *clients); err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	settle()
	runtime.GC()
	cr := &churnResult{N: n, Start: point()}
	fmt.Fprintf(os.Stderr, "6: making %d sessions (terminal_exec true and run_code print(1) in each) ...\n", n)
	start := time.Now()
	ids, err = makeSessions(ctx, b, n, *clients, use)
	cr.Make = time.Since(start)
	cr.Live = point()
	if *churnProf != "" {
		writeHeapProfile(*churnProf + ".live")
	}
	if *churnGor != "" {
		if f, err := os.Create(*churnGor); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 1) // best effort: a diagnosis aid
			f.Close()
		}
	}
	fmt.Fprintf(os.Stderr, "6: destroying them ...\n")
	start = time.Now()
	if derr := destroyAll(ctx, b, ids, *clients); err == nil {
		err = derr
	}
	cr.Destroy = time.Since(start)
	if err != nil {
		return err
	}
	if left := len(b.App.Sandbox.BoxKeys()); left > 0 {
		return fmt.Errorf("%d boxes still open after destroying every session", left)
	}
	cr.Settle, cr.Leftover = settle()
	runtime.GC()
	cr.After = point()
	// The runtime's background scavenger gives free heap pages back to the
	// kernel by itself, paced (about 1 % of the CPU), down to about the
	// heap goal the last GC set; an idle server gets a GC at least every
	// two minutes. Wait (bounded) until the PSS is back within the goal.
	start = time.Now()
	cr.Idle = cr.After
	for float64(cr.Idle.PSS) > 1.10*float64(cr.Start.PSS) && time.Since(start) < *churnIdle {
		time.Sleep(time.Second)
		cr.Idle = point()
	}
	cr.IdleFor = time.Since(start)
	debug.FreeOSMemory()
	cr.Freed = point()
	if *churnProf != "" {
		writeHeapProfile(*churnProf)
	}
	r.churn = cr
	return nil
}

func reportChurn(cr *churnResult) {
	fmt.Printf("6. %d sessions made and used (%d clients) in %s, destroyed in %s; box processes gone %s later (%d left)\n",
		cr.N, *clients, benchbed.Dur(cr.Make), benchbed.Dur(cr.Destroy), benchbed.Dur(cr.Settle), cr.Leftover)
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server process\tOS threads\tPSS\tGo heap in use\tGo stacks\truntime metadata\tgoroutines\t")
	for _, row := range []struct {
		name string
		p    churnPoint
	}{{"start (after a warm-up round)", cr.Start}, {fmt.Sprintf("%d sessions live", cr.N), cr.Live},
		{"all destroyed, after runtime.GC", cr.After}, {fmt.Sprintf("  then %s idle (the runtime's scavenger)", benchbed.Dur(cr.IdleFor)), cr.Idle},
		{"  then debug.FreeOSMemory", cr.Freed}} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t\n", row.name, row.p.Threads, mib(row.p.PSS), mib(int64(row.p.HeapInuse)),
			mib(int64(row.p.StackInuse)), mib(int64(row.p.Meta)), row.p.Goroutines)
	}
	tw.Flush()
	ratio := func(a, b int64) float64 { return float64(a) / float64(b) }
	th, ps := ratio(int64(cr.Idle.Threads), int64(cr.Start.Threads)), ratio(cr.Idle.PSS, cr.Start.PSS)
	ok := func(x float64) string {
		if x <= 1.10 {
			return "met"
		}
		return "NOT met"
	}
	fmt.Printf("after/start (GC, then %s idle): threads %.2fx, PSS %.2fx (right after the GC %.2fx, after FreeOSMemory %.2fx); goal ≤ 1.10x: threads %s, PSS %s\n\n",
		benchbed.Dur(cr.IdleFor), th, ps, ratio(cr.After.PSS, cr.Start.PSS), ratio(cr.Freed.PSS, cr.Start.PSS), ok(th), ok(ps))
}

// churnJSON adds part 6 to the JSON figures.
func churnJSON(out map[string]any, cr *churnResult) {
	if cr != nil {
		out["churn"] = cr
	}
}

// churnOn: part 6 makes and destroys a thousand sessions (minutes on a
// small machine), so it runs only when asked for: -only 6, or -churn set.
func churnOn() bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "churn" })
	return set || (*only != "" && part(6))
}

// writeHeapProfile writes the heap profile (-churnprofile, and .live with
// the sessions live); a failure is only said.
func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.WriteHeapProfile(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "-churnprofile: %v\n", err)
	}
}
