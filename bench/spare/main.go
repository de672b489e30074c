// Command spare measures what spare sessions (app.Options.SpareSessions,
// quro serve --spare-sessions) take off a new session's first Python run,
// on the served, boxed setup: two real Apps served over REST (benchbed),
// one keeping a spare session and one without, in turn. Each round makes a
// session on each (create_session), runs print(1) in it (run_code, its
// first run) and destroys it; only the first two are timed. Before each
// round the App with spares has its spare ready again (the server was
// idle long enough to refill: with -wait=false sessions come back to back,
// and create_session waits for the spare being made).
//
//	go run ./bench/spare -n 30
//
// With -burst N it measures a burst instead: one App (keeping -spares
// spare sessions, the --spare-sessions setting), idle with its spares
// ready, gets N concurrent clients that each make a session and run its
// first print(1) over REST; it prints the burst's total time, creates per
// second and each client's create and create + first run (p50, p95, max).
// -rounds repeats the burst, the App idle with its spares ready again
// between bursts.
//
//	go run ./bench/spare -burst 100 -rounds 3
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	n       = flag.Int("n", 30, "sessions made on each App")
	wait    = flag.Bool("wait", true, "before each session, wait until the App with spares has one ready")
	burst   = flag.Int("burst", 0, "concurrent clients of a burst (0: the rounds of -n instead)")
	rounds  = flag.Int("rounds", 3, "bursts, with -burst")
	stacks  = flag.String("stacks", "", "with -burst, write every goroutine's stack to this file 3 s into the last burst (where the time goes)")
	maxN    = flag.Int("max", 0, "the App's MaxSpareSessions (--max-spare-sessions; 0: its default), with -burst")
	perTen  = flag.Int("per-tenant", 0, "the App's SparesPerTenant (0: its default, a quarter of -max), with -burst")
	spareN  = flag.Int("spares", 1, "the App's spare sessions (--spare-sessions), with -burst")
	install = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "spare:", err)
		os.Exit(1)
	}
}

// serve assembles an App as bench/box does (no disk images, admission
// ceilings lifted, no auto-pause), keeping spares spare sessions.
func serve(ctx context.Context, spares int) (*benchbed.Bed, error) {
	return serveWith(ctx, spares, 0, 0)
}

// serveWith is serve with the pool's bounds (app.Options.MaxSpareSessions
// and SparesPerTenant).
func serveWith(ctx context.Context, spares, maxSpares, perTenant int) (*benchbed.Bed, error) {
	dir, err := os.MkdirTemp("", "quro-bench-spare-")
	if err != nil {
		return nil, err
	}
	a, err := app.New(ctx, dir, &app.Options{
		Python:        &python.EmbeddedOptions{InstallRoot: *install},
		Sandbox:       &sandbox.Options{BoxReadOnly: []string{*install}},
		AutoPause:     -1,
		SpareSessions: spares, MaxSpareSessions: maxSpares, SparesPerTenant: perTenant,
		Limits: app.Limits{SessionsPerTenant: -1,
			Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1, Disk: -1, Runs: -1}},
	})
	if err != nil {
		return nil, err
	}
	return benchbed.Serve(ctx, a, false)
}

type series struct {
	name string
	ds   []time.Duration
}

func (s *series) q(p float64) time.Duration {
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

// round makes a session on b, runs its first print(1) and destroys it.
func round(ctx context.Context, b *benchbed.Bed, create, first, both *series) error {
	t0 := time.Now()
	var s app.SessionInfo
	if err := b.Post(ctx, "create_session", []byte(`{}`), &s); err != nil {
		return err
	}
	t1 := time.Now()
	body, _ := json.Marshal(app.RunCodeInput{Session: s.ID, Code: "print(1)"})
	var r runcode.Result
	if err := b.Post(ctx, "run_code", body, &r); err != nil {
		return err
	}
	t2 := time.Now()
	if r.Stdout != "1\n" || r.ExitCode != 0 {
		return fmt.Errorf("run_code: %+v", r)
	}
	ref, _ := json.Marshal(app.SessionRef{Session: s.ID})
	if err := b.Post(ctx, "destroy_session", ref, nil); err != nil {
		return err
	}
	create.ds = append(create.ds, t1.Sub(t0))
	first.ds = append(first.ds, t2.Sub(t1))
	both.ds = append(both.ds, t2.Sub(t0))
	return nil
}

// ready waits until b's App has a spare session ready.
func ready(ctx context.Context, b *benchbed.Bed) error {
	for b.App.SpareSessions() == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("no spare session ready: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// settled waits until b's App has a spare ready and none being made: the
// server was idle long enough to fill its pool.
func settled(ctx context.Context, b *benchbed.Bed) error {
	for {
		st := b.App.SpareStats()
		if st.Ready > 0 && st.Filling == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the spare pool did not settle (%+v): %w", st, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func run() error {
	ctx := context.Background()
	if *burst > 0 {
		return runBurst(ctx)
	}
	fmt.Fprintf(os.Stderr, "starting two servers (interpreter under %s) ...\n", *install)
	with, err := serve(ctx, 1)
	if err != nil {
		return err
	}
	defer with.Close()
	without, err := serve(ctx, 0)
	if err != nil {
		return err
	}
	defer without.Close()
	var rows [2][3]*series
	for i, name := range []string{"spare", "no spare"} {
		rows[i] = [3]*series{{name: "create_session, " + name}, {name: "first run_code print(1), " + name}, {name: "create_session + first run, " + name}}
	}
	fmt.Fprintf(os.Stderr, "%d sessions on each ...\n", *n)
	for i := range *n + 2 {
		var sink [2][3]*series
		for j := range sink {
			sink[j] = [3]*series{{}, {}, {}}
			if i >= 2 { // the first two warm up
				sink[j] = rows[j]
			}
		}
		if *wait {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := ready(wctx, with)
			cancel()
			if err != nil {
				return err
			}
		}
		if err := round(ctx, with, sink[0][0], sink[0][1], sink[0][2]); err != nil {
			return err
		}
		if err := round(ctx, without, sink[1][0], sink[1][1], sink[1][2]); err != nil {
			return err
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("Quro spare sessions: %s, wait=%v, load average %s\n", time.Now().UTC().Format(time.RFC3339), *wait,
		strings.Join(strings.Fields(string(load))[:3], " "))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tmedian\tp95\t")
	for _, j := range []int{0, 1, 2} {
		for i := range rows {
			s := rows[i][j]
			fmt.Fprintf(tw, "%s\t%d\t%.2f ms\t%.2f ms\t\n", s.name, len(s.ds), ms(s.q(0.5)), ms(s.q(0.95)))
		}
	}
	tw.Flush()
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runBurst measures -rounds bursts of -burst concurrent clients on one App
// keeping -spares spare sessions.
func runBurst(ctx context.Context) error {
	fmt.Fprintf(os.Stderr, "starting a server with --spare-sessions %d (interpreter under %s) ...\n", *spareN, *install)
	b, err := serveWith(ctx, *spareN, *maxN, *perTen)
	if err != nil {
		return err
	}
	defer b.Close()
	create, both := &series{name: "create_session"}, &series{name: "create_session + first run_code print(1)"}
	var totals []time.Duration
	for r := range *rounds {
		if *spareN > 0 {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			err := settled(wctx, b)
			cancel()
			if err != nil {
				return err
			}
		}
		fmt.Fprintf(os.Stderr, "burst %d of %d: %d clients, %d spares ready ...\n", r+1, *rounds, *burst, b.App.SpareSessions())
		ids := make([]string, *burst)
		cs, bs := make([]time.Duration, *burst), make([]time.Duration, *burst)
		errs := make([]error, *burst)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range *burst {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				var s app.SessionInfo
				if errs[i] = b.Post(ctx, "create_session", []byte(`{}`), &s); errs[i] != nil {
					return
				}
				ids[i], cs[i] = s.ID, time.Since(t0)
				body, _ := json.Marshal(app.RunCodeInput{Session: s.ID, Code: "print(1)"})
				var res runcode.Result
				if errs[i] = b.Post(ctx, "run_code", body, &res); errs[i] == nil && (res.Stdout != "1\n" || res.ExitCode != 0) {
					errs[i] = fmt.Errorf("run_code: %+v", res)
				}
				bs[i] = time.Since(t0)
			})
		}
		t0 := time.Now()
		close(start)
		if *stacks != "" && r == *rounds-1 {
			time.AfterFunc(3*time.Second, func() {
				if f, err := os.Create(*stacks); err == nil {
					_ = pprof.Lookup("goroutine").WriteTo(f, 1)
					f.Close()
				}
			})
		}
		wg.Wait()
		total := time.Since(t0)
		if err := errors.Join(errs...); err != nil {
			return err
		}
		totals = append(totals, total)
		create.ds = append(create.ds, cs...)
		both.ds = append(both.ds, bs...)
		fmt.Fprintf(os.Stderr, "  %.0f ms, %.1f creates/s; destroying ...\n", ms(total), float64(*burst)/total.Seconds())
		var dwg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, id := range ids {
			dwg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				ref, _ := json.Marshal(app.SessionRef{Session: id})
				if err := b.Post(ctx, "destroy_session", ref, nil); err != nil {
					fmt.Fprintln(os.Stderr, "destroy:", err)
				}
			})
		}
		dwg.Wait()
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("Quro spare sessions, burst: %s, %d concurrent clients x %d bursts, --spare-sessions %d, -max %d, -per-tenant %d, %d CPUs, load average %s\n",
		time.Now().UTC().Format(time.RFC3339), *burst, *rounds, *spareN, *maxN, *perTen, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tmedian\tp95\tmax\t")
	for _, s := range []*series{create, both} {
		fmt.Fprintf(tw, "%s\t%d\t%.1f ms\t%.1f ms\t%.1f ms\t\n", s.name, len(s.ds), ms(s.q(0.5)), ms(s.q(0.95)), ms(s.q(1)))
	}
	tw.Flush()
	for i, t := range totals {
		fmt.Printf("burst %d: all %d served in %.0f ms, %.1f creates/s\n", i+1, *burst, ms(t), float64(*burst)/t.Seconds())
	}
	return nil
}
