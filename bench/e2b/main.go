// Command e2b measures E2B's own SDK against Quro's E2B-compatible API,
// beside the same work through Quro's own REST, on one real `quro serve`
// in one run (see bench/README.md):
//
//	go run ./bench/e2b            (or: make bench-e2b)
//
// It builds ./cmd/quro (or takes -quro), starts `quro serve` on a fresh
// data directory on 127.0.0.1, makes a tenant's read,exec token, and then,
// in -blocks alternating blocks so that drift of a noisy machine hits both
// alike:
//
//  1. cold: the SDK's Sandbox.create() + runCode('print(1)'), then kill()
//     (@e2b/code-interpreter 2.8.0 in node, bench/e2b/sdk.mjs, with the three
//     variables of docs/e2b.md), beside POST /v1/create_session +
//     POST /v1/run_code print(1), then POST /v1/destroy_session;
//  2. warm: runCode('print(1)') on one sandbox beside POST /v1/run_code
//     print(1) on one session (keep-alive client).
//
// The report gives medians and p95 per step, the SDK/REST ratio of the
// medians, and the goals (create + first run ≤ 100 ms, warm ≤ 5 ms).
// With -files N it instead writes and reads a 50 MB file (-files-mb)
// through the SDK, N rounds, beside curl on the same /files URL
// (bench/e2b/files.mjs).
// Needs test/e2b's SDKs installed (npm ci --prefix test/e2b) and node.
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
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

var (
	nCold    = flag.Int("n", 40, "cold rounds (create + first run + kill) per path")
	nWarm    = flag.Int("m", 1000, "warm runs per path")
	blocks   = flag.Int("blocks", 4, "the paths alternate in this many blocks")
	quroBin  = flag.String("quro", "", "the quro binary (default: go build ./cmd/quro into a temporary directory)")
	modules  = flag.String("modules", "test/e2b/node_modules", "where the E2B SDKs are installed (npm ci --prefix test/e2b)")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
	nFiles   = flag.Int("files", 0, "instead: this many rounds of a large file written and read through the SDK beside curl (bench/e2b/files.mjs)")
	filesMB  = flag.Int("files-mb", 50, "the file of -files, in MB")
	filesDir = flag.String("files-dir", "/home/user", "the sandbox directory of -files' file: /home/user is the workspace (the server's), /tmp the box's (its file helper)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/e2b:", err)
		os.Exit(1)
	}
}

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

// The figures: the SDK's and REST's, step by step.
type figures struct {
	sdkCreate, sdkCreateRun, sdkKill, sdkWarm     series
	restCreate, restCreateRun, restKill, restWarm series
}

func run() error {
	mods, err := filepath.Abs(*modules)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(mods, "@e2b", "code-interpreter")); err != nil {
		return fmt.Errorf("the E2B SDKs are not installed in %s: run npm ci --prefix test/e2b", mods)
	}
	tmp, err := os.MkdirTemp("", "quro-bench-e2b-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := *quroBin
	if bin == "" {
		bin = filepath.Join(tmp, "quro")
		fmt.Fprintln(os.Stderr, "building ./cmd/quro ...")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/quro").CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/quro: %v\n%s", err, out)
		}
	}
	srv, err := startServe(bin, filepath.Join(tmp, "data"))
	if err != nil {
		return err
	}
	defer srv.stop()
	key, err := exec.Command(bin, "token", "create", "--data", srv.data, "--tenant", "bench", "--scopes", "read,exec").Output()
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	rest := &restClient{url: srv.url, token: strings.TrimSpace(string(key)), hc: &http.Client{}}
	ctx := context.Background()
	env := append(os.Environ(), "E2B_API_KEY="+rest.token, "E2B_API_URL="+srv.url+"/e2b", "E2B_SANDBOX_URL="+srv.url, "E2B_NODE_MODULES="+mods)
	if *nFiles > 0 {
		return filesBench(ctx, env)
	}

	// Warm-up: the first Python run of the data directory, connections.
	fmt.Fprintln(os.Stderr, "warming up ...")
	for range 3 {
		if _, _, err := rest.cold(ctx); err != nil {
			return err
		}
	}
	f := &figures{
		sdkCreate: series{name: "SDK Sandbox.create()"}, sdkCreateRun: series{name: "SDK create() + runCode('print(1)')"},
		sdkKill: series{name: "SDK kill()"}, sdkWarm: series{name: "SDK runCode('print(1)'), warm"},
		restCreate: series{name: "REST create_session"}, restCreateRun: series{name: "REST create_session + run_code print(1)"},
		restKill: series{name: "REST destroy_session"}, restWarm: series{name: "REST run_code print(1), warm"},
	}
	nb, mb := max(1, *nCold / *blocks), max(1, *nWarm / *blocks)
	warmSession, err := rest.create(ctx)
	if err != nil {
		return err
	}
	for range 20 {
		if err := rest.run(ctx, warmSession); err != nil {
			return err
		}
	}
	for b := range *blocks {
		fmt.Fprintf(os.Stderr, "block %d/%d: %d cold rounds and %d warm runs per path ...\n", b+1, *blocks, nb, mb)
		if err := sdkBlock(ctx, env, nb, mb, f); err != nil {
			return err
		}
		for range nb {
			t := time.Now()
			create, createRun, err := rest.cold(ctx)
			if err != nil {
				return err
			}
			f.restCreate.ds = append(f.restCreate.ds, create)
			f.restCreateRun.ds = append(f.restCreateRun.ds, createRun)
			f.restKill.ds = append(f.restKill.ds, time.Since(t)-createRun)
		}
		for range mb {
			t := time.Now()
			if err := rest.run(ctx, warmSession); err != nil {
				return err
			}
			f.restWarm.ds = append(f.restWarm.ds, time.Since(t))
		}
	}
	report(f)
	if *jsonPath != "" {
		return writeJSON(*jsonPath, f)
	}
	return nil
}

// sdkBlock runs sdk.mjs for n cold rounds and m warm runs.
func sdkBlock(ctx context.Context, env []string, n, m int, f *figures) error {
	cmd := exec.CommandContext(ctx, nodeBin, "bench/e2b/sdk.mjs", fmt.Sprint(n), fmt.Sprint(m))
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("node bench/e2b/sdk.mjs: %v\n%s", err, stderr.String())
	}
	var r struct{ Create, CreateRun, Kill, Warm []int64 }
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("sdk.mjs: %v: %s", err, out)
	}
	add := func(s *series, us []int64) {
		for _, u := range us {
			s.ds = append(s.ds, time.Duration(u)*time.Microsecond)
		}
	}
	add(&f.sdkCreate, r.Create)
	add(&f.sdkCreateRun, r.CreateRun)
	add(&f.sdkKill, r.Kill)
	add(&f.sdkWarm, r.Warm)
	return nil
}

// serve is a running `quro serve`.
type serve struct {
	cmd  *exec.Cmd
	url  string
	data string
}

func startServe(bin, data string) (*serve, error) {
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data", data)
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &serve{cmd: cmd, data: data}
	br := bufio.NewReader(out)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("quro serve printed no address: %w", err)
		}
		if u, ok := strings.CutPrefix(strings.TrimSpace(line), "quro listening on "); ok {
			s.url = u
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, br) }() // the rest of its output, unread
	return s, nil
}

func (s *serve) stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	_ = s.cmd.Wait()
}

// restClient calls Quro's own REST API with a bearer token (keep-alive).
type restClient struct {
	url, token string
	hc         *http.Client
}

func (c *restClient) post(ctx context.Context, capability string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/"+capability, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: HTTP %d: %s", capability, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

func (c *restClient) create(ctx context.Context) (string, error) {
	var s struct{ ID string }
	if err := c.post(ctx, "create_session", map[string]any{}, &s); err != nil {
		return "", err
	}
	if s.ID == "" {
		return "", errors.New("create_session answered no id")
	}
	return s.ID, nil
}

func (c *restClient) run(ctx context.Context, session string) error {
	var r struct{ Stdout string }
	if err := c.post(ctx, "run_code", map[string]any{"code": "print(1)", "session": session}, &r); err != nil {
		return err
	}
	if r.Stdout != "1\n" {
		return fmt.Errorf("run_code print(1): stdout %q", r.Stdout)
	}
	return nil
}

// cold is create_session + run_code, then destroy_session: it returns the
// time to the session's creation and to the end of its first run.
func (c *restClient) cold(ctx context.Context) (create, createRun time.Duration, err error) {
	t := time.Now()
	id, err := c.create(ctx)
	if err != nil {
		return 0, 0, err
	}
	create = time.Since(t)
	if err := c.run(ctx, id); err != nil {
		return 0, 0, err
	}
	createRun = time.Since(t)
	return create, createRun, c.post(ctx, "destroy_session", map[string]any{"session": id}, nil)
}

func report(f *figures) {
	fmt.Printf("Quro E2B benchmark: E2B's SDK (@e2b/code-interpreter 2.8.0, node %s) beside Quro's REST on one quro serve;\n%s/%s, %d CPUs, %s, %s\n\n",
		nodeVersion(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tSDK n\tSDK median\tSDK p95\tREST median\tREST p95\tSDK/REST (median)\t")
	for _, p := range [][2]series{
		{f.sdkCreate, f.restCreate},
		{f.sdkCreateRun, f.restCreateRun},
		{f.sdkKill, f.restKill},
		{f.sdkWarm, f.restWarm},
	} {
		s, r := p[0], p[1]
		fmt.Fprintf(tw, "%s | %s\t%d\t%s\t%s\t%s\t%s\t%.2fx\t\n", s.name, r.name, len(s.ds), fmtD(s.q(0.5)), fmtD(s.q(0.95)),
			fmtD(r.q(0.5)), fmtD(r.q(0.95)), float64(s.q(0.5))/float64(r.q(0.5)))
	}
	tw.Flush()
	goal := func(what string, got, want time.Duration) {
		verdict := "met"
		if got > want {
			verdict = "NOT met"
		}
		fmt.Printf("goal %s ≤ %s: %s (median %s)\n", what, fmtD(want), verdict, fmtD(got))
	}
	fmt.Println()
	goal("SDK create + first runCode", f.sdkCreateRun.q(0.5), 100*time.Millisecond)
	goal("SDK warm runCode", f.sdkWarm.q(0.5), 5*time.Millisecond)
}

func nodeVersion() string {
	out, err := exec.Command(nodeBin, "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func writeJSON(path string, f *figures) error {
	out := map[string]any{}
	for _, s := range []series{f.sdkCreate, f.sdkCreateRun, f.sdkKill, f.sdkWarm, f.restCreate, f.restCreateRun, f.restKill, f.restWarm} {
		out[s.name] = map[string]any{"n": len(s.ds), "median_us": micro(s.q(0.5)), "p95_us": micro(s.q(0.95))}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func micro(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func fmtD(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", micro(d))
	}
	return fmt.Sprintf("%.2f ms", micro(d)/1e3)
}

// nodeBin is the node test/e2b pins (20.20.2 from npm: the SDKs need
// node >= 20.18.1, Debian 12's is 18).
const nodeBin = "test/e2b/node_modules/.bin/node"
