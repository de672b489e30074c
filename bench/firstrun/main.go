// Command firstrun measures a fresh data directory's first Python run over
// REST: `quro serve` started on an empty data directory, then run_code
// print(1) in the default session, timed from the server's start to the
// result (see bench/README.md):
//
//	go build -o /tmp/quro-new ./cmd/quro
//	go run ./bench/firstrun -bin /tmp/quro-new [-bin /tmp/quro-old] [-rounds 5]
//
// The data directory is empty but for the token of the runs' tenant
// (-tenant), made by `quro token create` before the server starts. Two
// modes, each on its own fresh data directory:
//
//   - now: the run is sent as soon as the server prints that it listens,
//     while the embedded interpreter's one-time preparation (extraction,
//     which `quro serve` starts in the background) goes on: the run waits
//     for the rest of it;
//   - ready: the run is sent once the preparation has finished (its
//     worker module's completion marker is there, polled every 5 ms), so
//     it pays only for its session's box and worker.
//
// The embedded interpreter is prepared once per machine, in a cache
// shared by data directories ($QURO_PYTHON_CACHE, see
// internal/engine/python's SharedRoot), by binaries that have one (-cache):
//
//   - warm (the default): one cache directory per binary for the whole
//     run, prepared by an unmeasured start of the binary first: a fresh
//     data directory on a machine where quro has run before;
//   - cold: a fresh cache directory for each sample: the first start ever
//     on a machine;
//   - off: no cache (QURO_PYTHON_CACHE=off): the interpreter is prepared
//     in each data directory, as by binaries without the cache.
//
// A binary without the cache ignores the variable and always prepares the
// interpreter in the data directory.
//
// With several -bin, the binaries alternate within each round (their
// order reversed every other round), so that a busy machine weighs on
// each alike. Run as root, like `quro serve` with session boxes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

type binList []string

func (b *binList) String() string     { return strings.Join(*b, ",") }
func (b *binList) Set(s string) error { *b = append(*b, s); return nil }

var (
	bins    binList
	rounds  = flag.Int("rounds", 5, "rounds; each starts every binary in both modes")
	modes   = flag.String("modes", "now,ready", "modes to measure: now (run sent at the server's start), ready (after the preparation)")
	tmpRoot = flag.String("tmp", os.TempDir(), "where the fresh data directories are made")
	timeout = flag.Duration("timeout", 2*time.Minute, "bound of one server's start and first run")
	cache   = flag.String("cache", "warm", "the Python cache of the binaries that have one: warm (one, prepared before the rounds), cold (a fresh one each sample), off")
	tenant  = flag.String("tenant", "bench-firstrun", "tenant of the runs (a token made with `quro token create` before the server starts); empty: the local tenant, with the first admin token")
)

func main() {
	flag.Var(&bins, "bin", "a quro binary to measure (repeat to compare)")
	flag.Parse()
	if len(bins) == 0 {
		fmt.Fprintln(os.Stderr, "firstrun: give at least one -bin")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "firstrun:", err)
		os.Exit(1)
	}
}

// sample is one server start and its first run.
type sample struct {
	total time.Duration // server start → result
	run   time.Duration // request sent → result
	prep  time.Duration // server start → preparation done (ready mode)
	cpu   time.Duration // the server's CPU time (and its waited-for children's) at the result
}

// cacheDirs are the Python caches of the warm runs (-cache warm), one
// per binary: a server removes the trees of other builds that nobody
// uses, so binaries with different trees sharing one cache would find
// each other's removed between samples.
var cacheDirs = map[string]string{}

func run() error {
	ms := strings.Split(*modes, ",")
	got := map[string][]sample{} // bin + " " + mode
	switch *cache {
	case "warm":
		defer func() {
			for _, d := range cacheDirs {
				os.RemoveAll(d)
			}
		}()
		for _, bin := range bins { // prepares the cache: not measured
			d, err := os.MkdirTemp(*tmpRoot, "quro-firstrun-cache-")
			if err != nil {
				return err
			}
			cacheDirs[bin] = d
			if _, err := once(bin, "ready"); err != nil {
				return fmt.Errorf("%s (preparing the cache): %w", bin, err)
			}
		}
	case "cold", "off":
	default:
		return fmt.Errorf("-cache %q: want warm, cold or off", *cache)
	}
	for r := range *rounds {
		order := slices.Clone(bins)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, mode := range ms {
			for _, bin := range order {
				s, err := once(bin, mode)
				if err != nil {
					return fmt.Errorf("%s (%s): %w", bin, mode, err)
				}
				got[bin+" "+mode] = append(got[bin+" "+mode], s)
				fmt.Printf("round %d %-5s %s: start→result %7.1f ms, run %7.1f ms, prep %7.1f ms, server CPU %7.1f ms\n",
					r+1, mode, bin, ms1(s.total), ms1(s.run), ms1(s.prep), ms1(s.cpu))
			}
		}
	}
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	fmt.Printf("\nmedians of %d rounds, Python cache %s (load average at the end: %s)\n", *rounds, *cache, load)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "binary\tmode\tstart→result ms\trun ms\tprep ms\tserver CPU ms\tbinary MB\t")
	for _, bin := range bins {
		size := 0.0
		if fi, err := os.Stat(bin); err == nil {
			size = float64(fi.Size()) / 1e6
		}
		for _, mode := range ms {
			ss := got[bin+" "+mode]
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%.0f\t%.1f\t\n", bin, mode,
				median(ss, func(s sample) time.Duration { return s.total }),
				median(ss, func(s sample) time.Duration { return s.run }),
				median(ss, func(s sample) time.Duration { return s.prep }),
				median(ss, func(s sample) time.Duration { return s.cpu }), size)
		}
	}
	return tw.Flush()
}

// once starts bin serve on a fresh data directory and times its first
// run in mode.
func once(bin, mode string) (s sample, err error) {
	data, err := os.MkdirTemp(*tmpRoot, "quro-firstrun-")
	if err != nil {
		return s, err
	}
	defer os.RemoveAll(data)
	pyCache := cacheDirs[bin]
	switch *cache {
	case "cold":
		if pyCache, err = os.MkdirTemp(*tmpRoot, "quro-firstrun-cache-"); err != nil {
			return s, err
		}
		defer os.RemoveAll(pyCache)
	case "off":
		pyCache = "off"
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var token string
	if *tenant != "" {
		tc := exec.CommandContext(ctx, bin, "--data", data, "token", "create", "--tenant", *tenant, "--scopes", "exec")
		tc.Env = append(os.Environ(), "QURO_PYTHON_CACHE="+pyCache) // as the server's: no other cache made
		out, err := tc.Output()
		if err != nil {
			return s, fmt.Errorf("token create: %w", err)
		}
		token = strings.TrimSpace(string(out))
	}

	cmd := exec.Command(bin, "--data", data, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "QURO_PYTHON_CACHE="+pyCache)
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return s, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return s, err
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()
	admin, url, err := readStart(ctx, out)
	if err != nil {
		return s, err
	}
	if token == "" {
		token = admin
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()

	if mode == "ready" {
		if err := waitPrepared(ctx, data, pyCache); err != nil {
			return s, err
		}
		s.prep = time.Since(start)
	}
	body, _ := json.Marshal(map[string]any{"code": "print(1)"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/run_code", bytes.NewReader(body))
	if err != nil {
		return s, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	s.run, s.total = time.Since(sent), time.Since(start)
	s.cpu = procCPU(cmd.Process.Pid)
	if err != nil {
		return s, err
	}
	var res struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
		Error    string `json:"error"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Stdout != "1\n" {
		return s, fmt.Errorf("run_code: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return s, nil
}

// readStart reads the server's stdout up to "quro listening on URL",
// taking the first admin token printed before it.
func readStart(ctx context.Context, r io.Reader) (token, url string, err error) {
	type result struct{ token, url string }
	ch := make(chan result, 1)
	errc := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		var tok string
		afterToken := false
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case afterToken:
				tok, afterToken = line, false
			case strings.Contains(line, "first admin token"):
				afterToken = true
			case strings.HasPrefix(line, "quro listening on "):
				ch <- result{tok, strings.TrimPrefix(line, "quro listening on ")}
				return
			}
		}
		errc <- fmt.Errorf("the server ended before it listened: %v", sc.Err())
	}()
	select {
	case r := <-ch:
		if r.token == "" && *tenant == "" {
			return "", "", errors.New("no admin token printed")
		}
		return r.token, r.url, nil
	case err := <-errc:
		return "", "", err
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
}

// waitPrepared waits until the interpreter and worker module are in
// place, in the data directory or the cache:
// python/worker/HASH/.quro-complete, the last thing the preparation
// writes (at once in a warm cache).
func waitPrepared(ctx context.Context, data, cache string) error {
	for {
		for _, root := range []string{data, cache} {
			if m, _ := filepath.Glob(filepath.Join(root, "python", "worker", "*", ".quro-complete")); root != "off" && len(m) > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the preparation did not finish: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// procCPU is pid's user and system time with that of its children it
// waited for (/proc/PID/stat utime, stime, cutime, cstime), at the
// clock-tick resolution (10 ms): less noisy than wall time on a shared
// machine. It misses the box processes, which the server does not wait for.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // fields 14-17, counted from 3
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func median(ss []sample, f func(sample) time.Duration) float64 {
	if len(ss) == 0 {
		return 0
	}
	ds := make([]time.Duration, len(ss))
	for i, s := range ss {
		ds[i] = f(s)
	}
	slices.Sort(ds)
	return ms1(ds[len(ds)/2])
}

func ms1(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
