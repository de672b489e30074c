// Command pyrt measures Quro's Python round trips beside a Jupyter kernel
// and a bare interpreter spawn, in one run on one machine:
//
//	go run ./bench/pyrt            (or: make bench-python)
//
// (a) warm print(1) through the controller in-process (run_code),
// (b) the same over REST on loopback (keep-alive client),
// (c) a Jupyter kernel's execute -> execute_reply for print(1), driven by
//
//	jupyter_client (bench/pyrt/jupyter_helper.py, Debian's
//	python3-ipykernel and python3-jupyter-client),
//
// (d) a spawn of the embedded interpreter: python3.14 -I -c 'print(1)',
// (e) interrupt latency: for Quro, from cancelling a run's context (what a
//
//	timeout does; on the embedded engine, app.Python) to its
//	KeyboardInterrupt reply; for Jupyter, interrupt_kernel -> execute_reply.
//
// It prints medians, p95 and ratios. See bench/README.md.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
)

var (
	nWarm    = flag.Int("n", 2000, "warm round trips per path")
	nSpawn   = flag.Int("spawn", 100, "interpreter spawns")
	nInt     = flag.Int("interrupts", 50, "interrupts per engine")
	jupyter  = flag.String("jupyter-python", "/usr/bin/python3", "the Python with jupyter_client and ipykernel (empty: skip Jupyter)")
	install  = flag.String("install", filepath.Join(os.TempDir(), "quro-bench-python"), "where the embedded interpreter is extracted (reused between runs)")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
)

type series struct {
	name string
	ds   []time.Duration
}

func (s series) q(p float64) time.Duration {
	if len(s.ds) == 0 {
		return 0
	}
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pyrt:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	data, err := os.MkdirTemp("", "quro-pyrt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	a, err := app.New(ctx, data, &app.Options{Python: &python.EmbeddedOptions{InstallRoot: *install}})
	if err != nil {
		return err
	}
	defer a.Close()
	fmt.Fprintf(os.Stderr, "preparing the embedded interpreter under %s ...\n", *install)
	if err := a.Python.Warm(ctx); err != nil {
		return err
	}
	dir, _, err := a.Python.Installed(ctx)
	if err != nil {
		return err
	}

	// Each path is measured in turn (not in parallel: on a small machine
	// they would disturb each other), all in this one invocation.
	var out []series

	// (a) in-process controller.
	admin := controller.Caller{Path: "bench", Scope: capability.ScopeAdmin}
	args, _ := json.Marshal(app.RunCodeInput{Code: "print(1)", Lang: "python"})
	call := func() error {
		reply, err := a.Controller.Call(ctx, admin, "run_code", args)
		if err != nil {
			return err
		}
		res := reply.Output.(*runcode.Result)
		if res.ExitCode != 0 || res.Stdout != "1\n" {
			return fmt.Errorf("unexpected result %+v", res)
		}
		return nil
	}
	s, err := measure("quro run_code in-process (controller)", *nWarm, call)
	if err != nil {
		return err
	}
	out = append(out, s)

	// (b) REST on loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: rest.New(a.Controller, nil)}
	go func() { _ = srv.Serve(ln) }() // http.ErrServerClosed, at Close
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	url := "http://" + ln.Addr().String() + "/v1/run_code"
	post := func() error {
		resp, err := client.Post(url, "application/json", bytes.NewReader(args))
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var res runcode.Result
		if resp.StatusCode != 200 || json.Unmarshal(body, &res) != nil || res.Stdout != "1\n" {
			return fmt.Errorf("REST %d: %s", resp.StatusCode, body)
		}
		return nil
	}
	s, err = measure("quro run_code over REST (loopback, keep-alive)", *nWarm, post)
	if err != nil {
		return err
	}
	out = append(out, s)

	// (d) spawn of the embedded interpreter binary.
	py := filepath.Join(dir, "bin", "python3.14")
	s, err = measure("spawn "+filepath.Base(py)+" -I -c 'print(1)'", *nSpawn, func() error {
		b, err := exec.Command(py, "-I", "-c", "print(1)").Output()
		if err != nil || string(b) != "1\n" {
			return fmt.Errorf("%v %q", err, b)
		}
		return nil
	})
	if err != nil {
		return err
	}
	out = append(out, s)

	// (e) Quro interrupt: cancel at the run's first output -> reply.
	qi, err := quroInterrupt(ctx, a)
	if err != nil {
		return err
	}

	// (c) and Jupyter's interrupt.
	var j jupyterFigures
	if *jupyter != "" {
		if j, err = runJupyter(data); err != nil {
			return err
		}
		out = append(out, j.reply, j.idle)
	}
	out = append(out, qi)
	if len(j.interrupt.ds) > 0 {
		out = append(out, j.interrupt)
	}
	return report(out, j, qi, dir)
}

// quroInterrupt times *nInt interrupts of a run in the default session:
// from the cancel, at the run's first output, to its reply.
func quroInterrupt(ctx context.Context, a *app.App) (series, error) {
	sess, err := a.Sessions.Default(ctx)
	if err != nil {
		return series{}, err
	}
	var qi series
	qi.name = "quro interrupt (cancel -> KeyboardInterrupt reply)"
	for range *nInt {
		rctx, cancel := context.WithCancel(ctx)
		var once sync.Once
		var t0 time.Time
		w := writerFunc(func(p []byte) (int, error) {
			once.Do(func() { t0 = time.Now(); cancel() })
			return len(p), nil
		})
		res, err := a.Python.Run(rctx, &runcode.Request{Code: "import time\nprint('go', flush=True)\ntime.sleep(3600)",
			Lang: "python", Session: sess, Timeout: time.Hour, Stdout: w, Stderr: io.Discard})
		d := time.Since(t0)
		cancel()
		if err != nil || !res.Interrupted || res.ExitCode != 130 {
			return series{}, fmt.Errorf("interrupt: %v %+v", err, res)
		}
		qi.ds = append(qi.ds, d)
	}
	return qi, nil
}

// jupyterFigures are the Jupyter kernel's round trips and interrupts, and
// the version of its Python.
type jupyterFigures struct {
	reply, idle, interrupt series
	python                 string
}

// runJupyter drives a Jupyter kernel with the helper script (written
// under data), run by the -jupyter interpreter.
func runJupyter(data string) (jupyterFigures, error) {
	fmt.Fprintln(os.Stderr, "driving a Jupyter kernel ...")
	helper := filepath.Join(data, "jupyter_helper.py")
	if err := os.WriteFile(helper, jupyterHelper, 0o644); err != nil {
		return jupyterFigures{}, err
	}
	cmd := exec.Command(*jupyter, helper, fmt.Sprint(*nWarm), fmt.Sprint(*nInt))
	cmd.Env = append(os.Environ(), "PYDEVD_DISABLE_FILE_VALIDATION=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return jupyterFigures{}, fmt.Errorf("jupyter helper: %v\n%s", err, stderr.String())
	}
	var r struct {
		Reply     []float64 `json:"execute_reply_us"`
		Idle      []float64 `json:"execute_output_idle_us"`
		Interrupt []float64 `json:"interrupt_us"`
		Python    string    `json:"python"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return jupyterFigures{}, fmt.Errorf("jupyter helper output: %v: %s", err, b)
	}
	return jupyterFigures{
		reply:     series{"jupyter execute -> execute_reply (print(1))", us(r.Reply)},
		idle:      series{"jupyter execute -> output + idle (print(1))", us(r.Idle)},
		interrupt: series{"jupyter interrupt_kernel -> execute_reply", us(r.Interrupt)},
		python:    r.Python,
	}, nil
}

// report prints the table of every path's median and p95 and the ratios
// between them; with -json, writes the figures there too.
func report(out []series, j jupyterFigures, qi series, dir string) error {
	fmt.Printf("Python round trips: %s/%s, %d CPUs, %s; embedded CPython in %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339), dir)
	if j.python != "" {
		fmt.Printf("; Jupyter kernel on Python %s", j.python)
	}
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tn\tmedian\tp95\t")
	for _, s := range out {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", s.name, len(s.ds), fmtD(s.q(0.5)), fmtD(s.q(0.95)))
	}
	tw.Flush()
	fmt.Println()
	ratio := func(label string, a, b series) {
		if len(a.ds) == 0 || len(b.ds) == 0 {
			return
		}
		fmt.Printf("%-62s %7.1fx (median)  %7.1fx (p95)\n", label,
			float64(a.q(0.5))/float64(b.q(0.5)), float64(a.q(0.95))/float64(b.q(0.95)))
	}
	ratio("jupyter execute_reply / quro in-process:", j.reply, out[0])
	ratio("jupyter execute_reply / quro REST:", j.reply, out[1])
	ratio("jupyter output+idle / quro in-process:", j.idle, out[0])
	ratio("interpreter spawn / quro in-process:", out[2], out[0])
	ratio("interpreter spawn / quro REST:", out[2], out[1])
	ratio("jupyter interrupt / quro interrupt:", j.interrupt, qi)

	if *jsonPath != "" {
		m := map[string]map[string]float64{}
		for _, s := range out {
			m[s.name] = map[string]float64{"n": float64(len(s.ds)), "median_us": micro(s.q(0.5)), "p95_us": micro(s.q(0.95))}
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		if err := os.WriteFile(*jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// measure runs f a few times to warm up, then n times, timing each.
func measure(name string, n int, f func() error) (series, error) {
	fmt.Fprintf(os.Stderr, "measuring %s ...\n", name)
	for range min(20, n) {
		if err := f(); err != nil {
			return series{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	s := series{name: name, ds: make([]time.Duration, 0, n)}
	for range n {
		t := time.Now()
		if err := f(); err != nil {
			return series{}, fmt.Errorf("%s: %w", name, err)
		}
		s.ds = append(s.ds, time.Since(t))
	}
	return s, nil
}

func us(v []float64) []time.Duration {
	ds := make([]time.Duration, len(v))
	for i, x := range v {
		ds[i] = time.Duration(x * 1e3)
	}
	return ds
}

func micro(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func fmtD(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1f µs", micro(d))
	}
	return fmt.Sprintf("%.2f ms", micro(d)/1e3)
}

//go:embed jupyter_helper.py
var jupyterHelper []byte

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
