// Command output measures a run's output throughput through the served App
// (see bench/README.md):
//
//	go run ./bench/output          (run as root: session boxes)
//
// One App is served over REST on a loopback listener with a real token, as
// bench/service serves it, its sessions in session boxes. In one run, the
// paths alternating round by round (-n rounds):
//
//  1. REST run_code of `for i in range(10**6): print(i)` (-lines) in a warm
//     session: the Python worker in its box, the output streamed to the
//     run's capture (cut to the response's limit, the whole of it spilled
//     to a workspace file), the response read whole;
//  2. the same interpreter binary started plainly (`python3.14 -I -c CODE`),
//     its stdout a pipe that this program drains (Python's own buffering);
//  3. that binary's start alone (`-c pass`), to read 2 without it.
//
// It prints the medians and the ratios 1/2 and 1/(2-3).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	rounds   = flag.Int("n", 7, "rounds; each runs every path once")
	lines    = flag.Int("lines", 1000000, "lines printed per run")
	install  = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
	control  = flag.Bool("control", false, "run str(i) instead of print(i): no output, the same CPU; tells the box's CPU share from the output path")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "output:", err)
		os.Exit(1)
	}
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func run() error {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "output: not root: the sessions run with less isolation than in production; run as root")
	}
	ctx := context.Background()
	data, err := os.MkdirTemp("", "quro-bench-output-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	a, err := app.New(ctx, data, &app.Options{
		Python: &python.EmbeddedOptions{InstallRoot: *install},
		// The interpreter is outside the data directory (as in bench/box).
		Sandbox:   &sandbox.Options{BoxReadOnly: []string{*install}},
		AutoPause: -1,
		// The tenant's ceilings count what runs on a shared machine too.
		Limits: app.Limits{SessionsPerTenant: -1, Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1}},
	})
	if err != nil {
		return err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return err
	}
	defer b.Close()
	interp, _ := filepath.Glob(filepath.Join(*install, "python", "*", "bin", "python3.14"))
	if len(interp) != 1 {
		return fmt.Errorf("no single interpreter under %s: %q", *install, interp)
	}
	var s app.SessionInfo
	if err := b.Post(ctx, "create_session", []byte(`{}`), &s); err != nil {
		return err
	}
	// The loop, then its own wall and CPU time and the time it waited for a
	// CPU (run queue, /proc/self/schedstat) on stderr, after a flush, so the
	// time includes the writes: where the time goes, inside the
	// interpreter, waiting for a CPU (a box's CPU share), or waiting for the
	// pipe (the rest).
	loop := "for i in range(" + strconv.Itoa(*lines) + "): print(i)"
	if *control {
		loop = "for i in range(" + strconv.Itoa(*lines) + "): str(i)"
	}
	code := "import sys, time\nq = lambda: int(open(\"/proc/self/schedstat\").read().split()[1])\n" +
		"t, c, w = time.perf_counter(), time.process_time(), q()\n" + loop +
		"\nsys.stdout.flush()\nprint(\"%.1f %.1f %.1f\" % ((time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3, (q() - w) / 1e6), file=sys.stderr)"
	var want int64
	for i := range *lines * (1 - b2i(*control)) {
		want += int64(len(strconv.Itoa(i))) + 1
	}
	body, _ := json.Marshal(app.RunCodeInput{Session: s.ID, Code: code, TimeoutMS: 120_000})
	shBody, _ := json.Marshal(app.RunCodeInput{Session: s.ID, Lang: "sh", Code: interp[0] + " -I -c '" + code + "'", TimeoutMS: 120_000})
	var restIn, shIn, plainIn []inner
	rest := func() (time.Duration, error) { return post(ctx, b, body, want, &restIn) }
	sh := func() (time.Duration, error) { return post(ctx, b, shBody, want, &shIn) }
	plain := func(code string, want int64) (time.Duration, error) { return runPlain(interp[0], code, want, &plainIn) }
	// The worker starts on the first run.
	if _, err := rest(); err != nil {
		return err
	}
	if _, err := sh(); err != nil {
		return err
	}
	restIn, shIn = nil, nil
	var restD, shD, pipeD, spawnD []time.Duration
	load0 := loadavg()
	for i := range *rounds {
		d, err := rest()
		if err != nil {
			return err
		}
		restD = append(restD, d)
		if d, err = sh(); err != nil {
			return err
		}
		shD = append(shD, d)
		if d, err = plain(code, want); err != nil {
			return err
		}
		pipeD = append(pipeD, d)
		if d, err = plain("pass", 0); err != nil {
			return err
		}
		spawnD = append(spawnD, d)
		fmt.Fprintf(os.Stderr, "round %d: REST %s, REST sh %s, plain %s, spawn %s\n", i+1, restD[i].Round(time.Millisecond), shD[i].Round(time.Millisecond), pipeD[i].Round(time.Millisecond), d.Round(time.Millisecond))
	}
	med := func(ds []time.Duration) float64 {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1e3
	}
	rm, shm, pm, sm := med(restD), med(shD), med(pipeD), med(spawnD)
	fmt.Printf("%d lines (%d bytes), %d rounds, load average %s → %s\n", *lines, want, *rounds, load0, loadavg())
	fmt.Printf("  REST run_code (worker in its session box)  median %8.1f ms\n", rm)
	fmt.Printf("  REST run_code sh: python3.14 -c, same box  median %8.1f ms\n", shm)
	fmt.Printf("  python3.14 -c, stdout a pipe Go drains     median %8.1f ms\n", pm)
	fmt.Printf("  python3.14 -c pass (start alone)           median %8.1f ms\n", sm)
	fmt.Printf("  ratio REST / plain %.2f, REST / (plain - start) %.2f, REST / REST sh %.2f\n", rm/pm, rm/(pm-sm), rm/shm)
	fmt.Printf("  the loop as timed by itself:\n    in the worker  %s\n    sh in the box  %s\n    plain          %s\n", medInner(restIn), medInner(shIn), medInner(plainIn))
	if *jsonPath != "" {
		out, _ := json.MarshalIndent(map[string]any{
			"lines": *lines, "bytes": want, "rounds": *rounds,
			"rest_ms": rm, "rest_sh_ms": shm, "plain_ms": pm, "start_ms": sm,
			"ratio": rm / pm, "ratio_without_start": rm / (pm - sm), "ratio_sh": rm / shm,
		}, "", "  ")
		return os.WriteFile(*jsonPath, append(out, '\n'), 0o644)
	}
	return nil
}

// runPlain times interp -I -c code, its stdout a pipe Go drains, which
// must carry want bytes; unless code is "pass", the loop's own figures
// (on its stderr) are appended to plainIn.
func runPlain(interp, code string, want int64, plainIn *[]inner) (time.Duration, error) {
	cmd := exec.Command(interp, "-I", "-c", code)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	t := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var c counter
	if _, err := io.CopyBuffer(&c, out, make([]byte, 64<<10)); err != nil {
		return 0, err
	}
	if err := cmd.Wait(); err != nil || c.n != want {
		return 0, fmt.Errorf("python3.14 -c: %v, %d bytes (want %d): %s", err, c.n, want, errb.String())
	}
	d := time.Since(t)
	if code != "pass" {
		in, err := parseInner(errb.String())
		if err != nil {
			return 0, err
		}
		*plainIn = append(*plainIn, in)
	}
	return d, nil
}

// post is run_code with body over REST; the run must exit 0 with want
// bytes of stdout. The loop's own timing is added to in.
func post(ctx context.Context, b *benchbed.Bed, body []byte, want int64, in *[]inner) (time.Duration, error) {
	var r runcode.Result
	t := time.Now()
	if err := b.Post(ctx, "run_code", body, &r); err != nil {
		return 0, err
	}
	d := time.Since(t)
	if r.ExitCode != 0 || r.Error != "" || r.StdoutBytes != want {
		return 0, fmt.Errorf("run_code: exit %d, error %q, %d bytes of stdout (want %d), stderr %q", r.ExitCode, r.Error, r.StdoutBytes, want, r.Stderr)
	}
	got, err := parseInner(r.Stderr)
	if err != nil {
		return 0, err
	}
	*in = append(*in, got)
	return d, nil
}

// inner is the loop's own wall and CPU time in ms, from its stderr.
type inner struct{ wall, cpu, wait float64 }

func parseInner(s string) (inner, error) {
	var in inner
	if _, err := fmt.Sscanf(s, "%f %f %f", &in.wall, &in.cpu, &in.wait); err != nil {
		return in, fmt.Errorf("the loop's own figures (wall, cpu, wait ms) on its stderr: %q: %w", s, err)
	}
	return in, nil
}

// medInner is the medians of the loop's own figures.
func medInner(xs []inner) string {
	if len(xs) == 0 {
		return "-"
	}
	var w, c, q []float64
	for _, x := range xs {
		w, c, q = append(w, x.wall), append(c, x.cpu), append(q, x.wait)
	}
	m := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	return fmt.Sprintf("%.0f ms (CPU %.0f, waiting for a CPU %.0f)", m(w), m(c), m(q))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil || len(b) < 14 {
		return "?"
	}
	return string(bytes.Join(bytes.Fields(b)[:3], []byte(" ")))
}
