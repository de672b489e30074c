// Command service measures what Quro's HTTP access paths add to a run, on
// one real server in one run (see bench/README.md):
//
//	go run ./bench/service            (or: make bench-service)
//
// One App is served on a loopback listener as `quro serve` serves it (token
// authentication on every request, REST under /v1/, MCP streamable HTTP at
// /mcp). Then:
//
//  1. latency: run_code {"code":"print(1)"} warm, (a) in-process through
//     Controller.Call as the token's caller, (b) POST /v1/run_code with a
//     keep-alive client and the bearer token, (c) tools/call run_code with
//     the official Go MCP SDK client on one session. The three paths are
//     interleaved in blocks so that drift of a noisy machine hits all
//     three alike; the report gives medians, p95, overhead against
//     in-process and ratios.
//  2. throughput: -clients concurrent REST clients (16) issue -requests
//     requests in all: run_code print(1) with a session per client, the
//     same with every client on the default session (runs of one session
//     queue), and terminal_exec `true` with a session per client. The
//     report gives requests/s, p50, p99 and errors (the loss rate).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
)

var (
	nLat     = flag.Int("n", 2000, "warm round trips per path (latency)")
	blocks   = flag.Int("blocks", 20, "latency: the paths alternate in this many blocks")
	clients  = flag.Int("clients", 16, "throughput: concurrent REST clients")
	requests = flag.Int("requests", 4000, "throughput: requests per variant, over all clients")
	runs     = flag.Int("runs-per-tenant", 0, "the controller's exec calls in flight per tenant (0: the default, 16)")
	install  = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
	tenant   = flag.String("tenant", "", "the bench token's tenant (\"\": the local tenant)")
	cpuProf  = flag.String("cpuprofile", "", "write a CPU profile of the whole run (server and clients: one process) to this file")
)

func main() {
	flag.Parse()
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "service: cpu profile:", err)
			os.Exit(1)
		}
	}
	err := run()
	pprof.StopCPUProfile() // a no-op without -cpuprofile
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		os.Exit(1)
	}
}

type series struct {
	name string
	ds   []time.Duration
	cpu  time.Duration // this process's CPU time (client and server, user+system) over the calls
	db   store.Stats   // the store's SQLite work over the calls
}

func (s *series) addDB(before, after store.Stats) {
	s.db.ConnsOpened += after.ConnsOpened - before.ConnsOpened
	s.db.Statements += after.Statements - before.Statements
	s.db.AuditBatches += after.AuditBatches - before.AuditBatches
}

// perCall is SQLite statements per call (audit batches aside), and
// audit batches per call.
func (s series) perCall() (stmts, audits float64) {
	if len(s.ds) == 0 {
		return 0, 0
	}
	n := float64(len(s.ds))
	return float64(s.db.Statements) / n, float64(s.db.AuditBatches) / n
}

func (s series) q(p float64) time.Duration {
	if len(s.ds) == 0 {
		return 0
	}
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

type load struct {
	name     string
	n, errs  int
	firstErr error
	wall     time.Duration
	lat      series
}

func (l load) rps() float64 { return float64(l.n-l.errs) / l.wall.Seconds() }

func run() error {
	benchbed.Tenant = *tenant
	ctx := session.WithTenant(context.Background(), *tenant)
	data, err := os.MkdirTemp("", "quro-bench-service-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	fmt.Fprintf(os.Stderr, "starting the server (interpreter under %s) ...\n", *install)
	b, err := newBed(ctx, data, *install, app.Limits{RunsPerTenant: *runs})
	if err != nil {
		return err
	}
	defer b.Close()

	// 1. Latency, the three paths interleaved.
	args := runArgs("")
	mcpArgs := map[string]any{"code": "print(1)"}
	paths := []struct {
		name string
		f    func() error
	}{
		{"in-process (Controller.Call)", func() error { return b.InProcess(ctx, args) }},
		{"REST POST /v1/run_code", func() error { return b.REST(ctx, "run_code", args) }},
		{"MCP tools/call (Go SDK, streamable HTTP)", func() error { return b.MCP(ctx, mcpArgs) }},
	}
	lat := make([]series, len(paths))
	for i, p := range paths {
		lat[i].name = p.name
		for range 50 { // the first Python run starts the worker; then warm caches and connections
			if err := p.f(); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "latency: %d round trips per path in %d interleaved blocks ...\n", *nLat, *blocks)
	per := max(1, *nLat / *blocks)
	for range *blocks {
		for i, p := range paths {
			c0, db0 := benchbed.CPUTime(), b.App.Store.Stats()
			for range per {
				t := time.Now()
				if err := p.f(); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				lat[i].ds = append(lat[i].ds, time.Since(t))
			}
			lat[i].cpu += benchbed.CPUTime() - c0
			lat[i].addDB(db0, b.App.Store.Stats())
		}
	}

	// 2. Throughput over REST.
	var sessions []string
	for i := range *clients {
		s, err := b.App.Sessions.Create(ctx, fmt.Sprintf("bench-%d", i))
		if err != nil {
			return err
		}
		sessions = append(sessions, s.Name)
	}
	own := func(capability string, mk func(session string) []byte) func(client int) (string, []byte) {
		bodies := make([][]byte, len(sessions))
		for i, s := range sessions {
			bodies[i] = mk(s)
		}
		return func(client int) (string, []byte) { return capability, bodies[client] }
	}
	shared := runArgs("")
	variants := []struct {
		name string
		req  func(client int) (string, []byte)
	}{
		{"run_code print(1), a session per client", own("run_code", runArgs)},
		{"run_code print(1), all on the default session", func(int) (string, []byte) { return "run_code", shared }},
		{"terminal_exec true, a session per client", own("terminal_exec", func(s string) []byte {
			b, _ := json.Marshal(app.TerminalExecInput{Command: "true", Session: s})
			return b
		})},
	}
	var loads []load
	for _, v := range variants {
		// Warm: each client's session gets its worker or shell first.
		for c := range *clients {
			name, body := v.req(c)
			if err := b.REST(ctx, name, body); err != nil {
				return fmt.Errorf("%s (warm-up): %w", v.name, err)
			}
		}
		fmt.Fprintf(os.Stderr, "throughput: %s, %d clients, %d requests ...\n", v.name, *clients, *requests)
		db0 := b.App.Store.Stats()
		l := hammer(v.name, *clients, *requests, func(c int) error {
			name, body := v.req(c)
			return b.REST(ctx, name, body)
		})
		l.lat.addDB(db0, b.App.Store.Stats())
		loads = append(loads, l)
	}

	report(lat, loads)
	if *jsonPath != "" {
		return writeJSON(*jsonPath, lat, loads)
	}
	return nil
}

// hammer runs n calls of f from clients goroutines (each its own client
// index) and times each.
func hammer(name string, clients, n int, f func(client int) error) load {
	var (
		next   atomic.Int64
		mu     sync.Mutex
		l      = load{name: name, n: n}
		wg     sync.WaitGroup
		starts = time.Now()
	)
	for c := range clients {
		wg.Go(func() {
			var ds []time.Duration
			var errs int
			var first error
			for next.Add(1) <= int64(n) {
				t := time.Now()
				err := f(c)
				ds = append(ds, time.Since(t))
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
				}
			}
			mu.Lock()
			l.lat.ds = append(l.lat.ds, ds...)
			l.errs += errs
			if l.firstErr == nil {
				l.firstErr = first
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	l.wall = time.Since(starts)
	return l
}

func report(lat []series, loads []load) {
	fmt.Printf("Quro service benchmark: %s/%s, %d CPUs, %s, %s; runs per tenant %s\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format(time.RFC3339), runsLimit())
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run_code print(1)\tn\tmedian\tp95\toverhead (median)\tratio (median)\tGo CPU/call\tSQLite stmts/call\taudit batches/call\tconns opened\t")
	base := lat[0].q(0.5)
	for i, s := range lat {
		over, ratio := "", ""
		if i > 0 {
			over = fmtSigned(s.q(0.5) - base)
			ratio = fmt.Sprintf("%.2fx", float64(s.q(0.5))/float64(base))
		}
		st, ab := s.perCall()
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%d\t\n", s.name, len(s.ds), fmtD(s.q(0.5)), fmtD(s.q(0.95)), over, ratio,
			fmtD(s.cpu/time.Duration(len(s.ds))), st, ab, s.db.ConnsOpened)
	}
	tw.Flush()
	fmt.Println("(Go CPU/call: this process's user+system CPU, client and server, per call; the Python worker is another process.")
	fmt.Println(" SQLite stmts/call: statements and transactions the store ran, audit batches aside; audit batches/call: the audit")
	fmt.Println(" writer's transactions, off the request path; conns opened: new SQLite connections)")
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "REST, %d concurrent clients\trequests\trequests/s\tp50\tp99\terrors\tSQLite stmts/call\taudit batches/call\tconns opened\t\n", *clients)
	for _, l := range loads {
		st, ab := l.lat.perCall()
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%d (%.2f%%)\t%.3f\t%.3f\t%d\t\n", l.name, l.n, l.rps(), fmtD(l.lat.q(0.5)), fmtD(l.lat.q(0.99)),
			l.errs, 100*float64(l.errs)/float64(l.n), st, ab, l.lat.db.ConnsOpened)
	}
	tw.Flush()
	for _, l := range loads {
		if l.firstErr != nil {
			fmt.Printf("first error of %q: %v\n", l.name, l.firstErr)
		}
	}
}

func runsLimit() string {
	switch {
	case *runs == 0:
		return "16 (default)"
	case *runs < 0:
		return "no cap"
	}
	return fmt.Sprint(*runs)
}

func writeJSON(path string, lat []series, loads []load) error {
	out := map[string]any{}
	for _, s := range lat {
		st, ab := s.perCall()
		out[s.name] = map[string]any{"n": len(s.ds), "median_us": benchbed.Micro(s.q(0.5)), "p95_us": benchbed.Micro(s.q(0.95)),
			"go_cpu_per_call_us":         benchbed.Micro(s.cpu / time.Duration(len(s.ds))),
			"sqlite_statements_per_call": st, "audit_batches_per_call": ab, "sqlite_conns_opened": s.db.ConnsOpened}
	}
	for _, l := range loads {
		st, ab := l.lat.perCall()
		m := map[string]any{"requests": l.n, "errors": l.errs, "rps": l.rps(),
			"p50_us": benchbed.Micro(l.lat.q(0.5)), "p99_us": benchbed.Micro(l.lat.q(0.99)),
			"sqlite_statements_per_call": st, "audit_batches_per_call": ab, "sqlite_conns_opened": l.lat.db.ConnsOpened}
		if l.firstErr != nil {
			m["first_error"] = l.firstErr.Error()
		}
		out[l.name] = m
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func fmtD(d time.Duration) string {
	if d < time.Millisecond && d > -time.Millisecond {
		return fmt.Sprintf("%.0f µs", benchbed.Micro(d))
	}
	return fmt.Sprintf("%.2f ms", benchbed.Micro(d)/1e3)
}

func fmtSigned(d time.Duration) string {
	if d >= 0 {
		return "+" + fmtD(d)
	}
	return fmtD(d)
}
