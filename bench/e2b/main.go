// Command e2b measures E2B's own SDK against Quro's E2B-compatible API,
// beside the same work through Quro's own REST, on one real `quro serve`
// in one run (see bench/README.md):
//
//	go run ./bench/e2b            (or: make bench-e2b)
//
// It builds ./cmd/quro (or takes -quro), starts `quro serve` on a fresh
// data directory on 127.0.0.1, makes a tenant's read,exec token, starts
// the SDK's side (bench/e2b/sdk.mjs: @e2b/code-interpreter 2.8.0 over
// e2b 2.51.0 in node, with the three variables of docs/e2b.md) and then
// alternates, round by round, each SDK step with its peers, so that drift
// of a noisy machine hits both alike (which goes first alternates too):
//
//  1. cold (-n): Sandbox.create() + runCode('print(1)'), then kill(),
//     beside POST /v1/create_session (-network, internet as E2B's default)
//     + /v1/run_code print(1), then
//     /v1/destroy_session;
//  2. warm (-m): runCode('print(1)') on one sandbox beside
//     /v1/run_code print(1) on one session (a keep-alive client);
//  3. commands (-c): commands.run('true') beside /v1/start_process
//     {command: "true"} (which answers when it ends) and
//     /v1/terminal_exec true;
//  4. files (-files, of -files-mb MB): files.write and files.read (bytes)
//     beside curl on the same /files URL with the same headers (POST, GET,
//     GET --compressed) and /v1/write_file + /v1/read_file (base64, in
//     parts of 8 MiB, the most one call takes or gives).
//
// With -before BIN, two builds are served side by side instead (the
// -quro one and BIN, each on a fresh data directory with its own SDK
// process) and steps 1–3 of the SDK, and REST's start_process, alternate
// between them round by round: a before/after comparison under one load;
// with -files, so do the SDK's files.read and curl's GET of the file
// (beside curl from a plain Go file server, in each round).
//
// The report gives medians and p95 per step, the SDK/peer ratio of the
// medians, the load average while each part ran, and issue 28's goals:
// create + first run ≤ 50 ms, warm runCode ≤ 2 ms, commands.run ≤ 10 ms,
// files.read of 50 MB ≤ 2× curl.
// Needs test/e2b's SDKs installed (npm ci --prefix test/e2b), node and curl.
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
	nWarm    = flag.Int("m", 1000, "warm runCode rounds per path")
	nCmd     = flag.Int("c", 300, "commands.run('true') rounds per path")
	nFiles   = flag.Int("files", 3, "rounds of a large file written and read per path (0: none)")
	filesMB  = flag.Int("files-mb", 50, "the file of -files, in MB")
	filesDir = flag.String("files-dir", "/home/user", "the sandbox directory of -files' file: /home/user is the workspace (the server's), /tmp the box's (its file helper)")
	quroBin  = flag.String("quro", "", "the quro binary (default: go build ./cmd/quro into a temporary directory)")
	modules  = flag.String("modules", "test/e2b/node_modules", "where the E2B SDKs are installed (npm ci --prefix test/e2b)")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
	before   = flag.String("before", "", "a quro binary to compare -quro (or ./cmd/quro's build) with: both served side by side, each SDK step alternating between them round by round (cold, warm, commands; of files the reads: the SDK's, curl's, and curl's from a plain Go file server), instead of the SDK beside REST")
	network  = flag.String("network", "internet", "REST's create_session network: internet is what an E2B sandbox gets by default (allowInternetAccess), so both paths make the same box")
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

func (s *series) add(d time.Duration) { s.ds = append(s.ds, d) }

func (s *series) q(p float64) time.Duration {
	if len(s.ds) == 0 {
		return 0
	}
	d := slices.Clone(s.ds)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

// tail is the p95, or the maximum of fewer than 20.
func (s *series) tail() time.Duration {
	if len(s.ds) < 20 {
		return s.q(1)
	}
	return s.q(0.95)
}

// A part is one kind of step: the SDK's series beside its peers', and the
// load average seen while its rounds ran.
type part struct {
	title string
	sdk   []*series
	peers [][]*series // peers[i] are the peers of sdk[i]
	load  loadRange
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
	ctx := context.Background()
	if *before != "" {
		return abRun(ctx, tmp, mods, *before, bin)
	}
	sd, err := startSide(ctx, tmp, "data", bin, mods)
	if err != nil {
		return err
	}
	defer sd.stop()
	sdk, rest, session := sd.sdk, sd.rest, sd.session

	var parts []*part
	if *nCold > 0 {
		p, err := coldPart(ctx, sdk, rest)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nWarm > 0 {
		p, err := warmPart(ctx, sdk, rest, session)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nCmd > 0 {
		p, err := cmdPart(ctx, sdk, rest, session)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nFiles > 0 {
		p, err := filesPart(ctx, sdk, rest, session, tmp, sd.srv.url)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	report(parts)
	if *jsonPath != "" {
		return writeJSON(*jsonPath, parts)
	}
	return nil
}

// side is one served build with its REST client, its SDK driver and a
// warm REST session.
type side struct {
	srv     *serve
	rest    *restClient
	sdk     *sdkDriver
	session string
}

func (sd *side) stop() {
	if sd.sdk != nil {
		sd.sdk.quit()
	}
	sd.srv.stop()
}

// startSide serves bin on a fresh data directory tmp/name, warms it (the
// first Python run of a data directory, connections) and starts the
// SDK's side against it.
func startSide(ctx context.Context, tmp, name, bin, mods string) (*side, error) {
	srv, err := startServe(bin, filepath.Join(tmp, name))
	if err != nil {
		return nil, err
	}
	sd := &side{srv: srv}
	key, err := exec.Command(bin, "token", "create", "--data", srv.data, "--tenant", "bench", "--scopes", "read,exec").Output()
	if err != nil {
		sd.stop()
		return nil, fmt.Errorf("token create: %w", err)
	}
	sd.rest = &restClient{url: srv.url, token: strings.TrimSpace(string(key)), hc: &http.Client{}}
	fmt.Fprintln(os.Stderr, "warming up ...")
	for range 3 {
		if _, _, err := sd.rest.cold(ctx); err != nil {
			sd.stop()
			return nil, err
		}
	}
	env := append(os.Environ(), "E2B_API_KEY="+sd.rest.token, "E2B_API_URL="+srv.url+"/e2b", "E2B_SANDBOX_URL="+srv.url, "E2B_NODE_MODULES="+mods)
	if sd.sdk, err = startSDK(ctx, env); err != nil {
		sd.stop()
		return nil, err
	}
	if sd.session, err = sd.rest.create(ctx); err != nil {
		sd.stop()
		return nil, err
	}
	for range 20 {
		if err := sd.rest.run(ctx, sd.session); err != nil {
			sd.stop()
			return nil, err
		}
	}
	return sd, nil
}

// abRun serves two builds side by side and alternates each SDK step (and
// REST's start_process, the command's own path) between them round by
// round, so that both see the same load: the report's SDK rows are
// this build's (-quro), the peers the -before build's.
func abRun(ctx context.Context, tmp, mods, beforeBin, afterBin string) error {
	a, err := startSide(ctx, tmp, "after", afterBin, mods)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := startSide(ctx, tmp, "before", beforeBin, mods)
	if err != nil {
		return err
	}
	defer b.stop()
	pair := func(step string) (*series, *series) {
		return &series{name: "this build: " + step}, &series{name: "-before build: " + step}
	}
	var parts []*part
	if *nCold > 0 {
		aRun, bRun := pair("SDK create() + runCode('print(1)')")
		aKill, bKill := pair("SDK kill()")
		p := &part{title: "cold", sdk: []*series{aRun, aKill}, peers: [][]*series{{bRun}, {bKill}}}
		cold := func(sd *side, run, kill *series) func() error {
			return func() error {
				var r struct{ Create, CreateRun, Kill int64 }
				if err := sd.sdk.step("cold", &r); err != nil {
					return err
				}
				run.add(micros(r.CreateRun))
				kill.add(micros(r.Kill))
				return nil
			}
		}
		if err := interleave("cold", *nCold, &p.load, cold(a, aRun, aKill), cold(b, bRun, bKill)); err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nWarm > 0 {
		aw, bw := pair("SDK runCode('print(1)'), warm")
		p := &part{title: "warm", sdk: []*series{aw}, peers: [][]*series{{bw}}}
		if err := interleave("warm runCode", *nWarm, &p.load, func() error { return a.sdk.timed("warm", aw) }, func() error { return b.sdk.timed("warm", bw) }); err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nCmd > 0 {
		ac, bc := pair("SDK commands.run('true')")
		as, bs := pair("REST start_process true")
		p := &part{title: "commands", sdk: []*series{ac, as}, peers: [][]*series{{bc}, {bs}}}
		start := func(sd *side, s *series) error {
			var pr struct {
				Running  bool
				ExitCode int `json:"exit_code"`
			}
			t := time.Now()
			if err := sd.rest.post(ctx, "start_process", map[string]any{"session": sd.session, "command": "true"}, &pr); err != nil {
				return err
			}
			s.add(time.Since(t))
			if pr.Running || pr.ExitCode != 0 {
				return fmt.Errorf("start_process true: running %v, exit code %d", pr.Running, pr.ExitCode)
			}
			return nil
		}
		if err := interleave("commands.run", *nCmd, &p.load, func() error {
			if err := a.sdk.timed("cmd", ac); err != nil {
				return err
			}
			return start(a, as)
		}, func() error {
			if err := b.sdk.timed("cmd", bc); err != nil {
				return err
			}
			return start(b, bs)
		}); err != nil {
			return err
		}
		parts = append(parts, p)
	}
	if *nFiles > 0 {
		p, err := abFilesPart(tmp, a, b)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	report(parts)
	if *jsonPath != "" {
		return writeJSON(*jsonPath, parts)
	}
	return nil
}

// interleave runs n rounds of the SDK's step and its peer's, the SDK first
// in even rounds and second in odd ones, and notes the load average.
func interleave(title string, n int, load *loadRange, sdk, peer func() error) error {
	fmt.Fprintf(os.Stderr, "%s: %d rounds per path ...\n", title, n)
	load.sample()
	for i := range n {
		first, second := sdk, peer
		if i%2 == 1 {
			first, second = peer, sdk
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		if i%max(1, n/8) == 0 {
			load.sample()
		}
	}
	load.sample()
	return nil
}

func coldPart(ctx context.Context, sdk *sdkDriver, rest *restClient) (*part, error) {
	sCreate, sRun, sKill := &series{name: "SDK Sandbox.create()"}, &series{name: "SDK create() + runCode('print(1)')"}, &series{name: "SDK kill()"}
	rCreate, rRun, rKill := &series{name: "REST create_session"}, &series{name: "REST create_session + run_code print(1)"}, &series{name: "REST destroy_session"}
	p := &part{title: "cold", sdk: []*series{sCreate, sRun, sKill}, peers: [][]*series{{rCreate}, {rRun}, {rKill}}}
	err := interleave("cold", *nCold, &p.load, func() error {
		var r struct{ Create, CreateRun, Kill int64 }
		if err := sdk.step("cold", &r); err != nil {
			return err
		}
		sCreate.add(micros(r.Create))
		sRun.add(micros(r.CreateRun))
		sKill.add(micros(r.Kill))
		return nil
	}, func() error {
		t := time.Now()
		create, createRun, err := rest.cold(ctx)
		if err != nil {
			return err
		}
		rCreate.add(create)
		rRun.add(createRun)
		rKill.add(time.Since(t) - createRun)
		return nil
	})
	return p, err
}

func warmPart(ctx context.Context, sdk *sdkDriver, rest *restClient, session string) (*part, error) {
	s, r := &series{name: "SDK runCode('print(1)'), warm"}, &series{name: "REST run_code print(1), warm"}
	p := &part{title: "warm", sdk: []*series{s}, peers: [][]*series{{r}}}
	err := interleave("warm runCode", *nWarm, &p.load, func() error {
		return sdk.timed("warm", s)
	}, func() error {
		t := time.Now()
		if err := rest.run(ctx, session); err != nil {
			return err
		}
		r.add(time.Since(t))
		return nil
	})
	return p, err
}

func cmdPart(ctx context.Context, sdk *sdkDriver, rest *restClient, session string) (*part, error) {
	s := &series{name: "SDK commands.run('true')"}
	rStart, rTerm := &series{name: "REST start_process true"}, &series{name: "REST terminal_exec true"}
	p := &part{title: "commands", sdk: []*series{s}, peers: [][]*series{{rStart, rTerm}}}
	err := interleave("commands.run", *nCmd, &p.load, func() error {
		return sdk.timed("cmd", s)
	}, func() error {
		var pr struct {
			Running  bool
			ExitCode int `json:"exit_code"`
		}
		t := time.Now()
		if err := rest.post(ctx, "start_process", map[string]any{"session": session, "command": "true"}, &pr); err != nil {
			return err
		}
		rStart.add(time.Since(t))
		if pr.Running || pr.ExitCode != 0 {
			return fmt.Errorf("start_process true: running %v, exit code %d", pr.Running, pr.ExitCode)
		}
		var tr struct {
			Running  bool
			ExitCode int `json:"exit_code"`
		}
		t = time.Now()
		if err := rest.post(ctx, "terminal_exec", map[string]any{"session": session, "command": "true"}, &tr); err != nil {
			return err
		}
		rTerm.add(time.Since(t))
		if tr.Running || tr.ExitCode != 0 {
			return fmt.Errorf("terminal_exec true: running %v, exit code %d", tr.Running, tr.ExitCode)
		}
		return nil
	})
	return p, err
}

// sdkDriver is a running bench/e2b/sdk.mjs: a step per line.
type sdkDriver struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
}

func startSDK(ctx context.Context, env []string) (*sdkDriver, error) {
	d := &sdkDriver{cmd: exec.CommandContext(ctx, nodeBin, "bench/e2b/sdk.mjs")}
	d.cmd.Env = env
	d.cmd.Stderr = &d.stderr
	var err error
	if d.in, err = d.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	d.out = bufio.NewScanner(out)
	d.out.Buffer(nil, 1<<20)
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("node bench/e2b/sdk.mjs: %w", err)
	}
	var ready struct{ Ready bool }
	if err := d.read(&ready); err != nil {
		d.quit()
		return nil, err
	}
	return d, nil
}

func (d *sdkDriver) read(v any) error {
	if !d.out.Scan() {
		return fmt.Errorf("node bench/e2b/sdk.mjs ended: %v\n%s", d.out.Err(), d.stderr.String())
	}
	line := d.out.Bytes()
	var e struct{ Error string }
	if err := json.Unmarshal(line, &e); err != nil {
		return fmt.Errorf("sdk.mjs answered %q: %w", line, err)
	}
	if e.Error != "" {
		return fmt.Errorf("sdk.mjs: %s", e.Error)
	}
	return json.Unmarshal(line, v)
}

func (d *sdkDriver) step(line string, v any) error {
	if _, err := io.WriteString(d.in, line+"\n"); err != nil {
		return fmt.Errorf("sdk.mjs: %w\n%s", err, d.stderr.String())
	}
	return d.read(v)
}

// timed runs a step that answers its duration and adds it to s.
func (d *sdkDriver) timed(line string, s *series) error {
	var r struct{ Us int64 }
	if err := d.step(line, &r); err != nil {
		return err
	}
	s.add(micros(r.Us))
	return nil
}

func (d *sdkDriver) quit() {
	_, _ = io.WriteString(d.in, "quit\n")
	_ = d.in.Close()
	_ = d.cmd.Wait()
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
	if err := c.post(ctx, "create_session", map[string]any{"network": *network}, &s); err != nil {
		return "", err
	}
	if s.ID == "" {
		return "", errors.New("create_session answered no id")
	}
	return s.ID, nil
}

func (c *restClient) run(ctx context.Context, session string) error {
	var r map[string]any
	if err := c.post(ctx, "run_code", map[string]any{"code": "print(1)", "session": session}, &r); err != nil {
		return err
	}
	if r["stdout"] != "1\n" {
		// The whole answer: a timeout or an engine's error says why.
		return fmt.Errorf("run_code print(1): %v", r)
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

func report(parts []*part) {
	beside := "beside Quro's REST (and curl) on one quro serve"
	if *before != "" {
		beside = "on this build (SDK rows) beside the -before build (peers), two quro serve side by side"
	}
	fmt.Printf("Quro E2B benchmark: E2B's SDK (@e2b/code-interpreter 2.8.0 / e2b 2.51.0, node %s) %s,\nround by round; %s/%s, %d CPUs, %s, %s\n\n",
		nodeVersion(), beside, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tn\tmedian\tp95 (max if n < 20)\tSDK/peer (median)\tload average\t")
	for _, p := range parts {
		for i, s := range p.sdk {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\t%s\t\n", s.name, len(s.ds), fmtD(s.q(0.5)), fmtD(s.tail()), p.load)
			for _, r := range p.peers[i] {
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%.2fx\t\t\n", r.name, len(r.ds), fmtD(r.q(0.5)), fmtD(r.tail()), ratio(s, r))
			}
		}
	}
	tw.Flush()
	fmt.Println()
	goal := func(what string, s *series, want time.Duration, load loadRange) {
		if s == nil || len(s.ds) == 0 {
			return
		}
		verdict := "met"
		if s.q(0.5) > want {
			verdict = "NOT met"
		}
		fmt.Printf("goal %s ≤ %s: %s (median %s, load average %s)\n", what, fmtD(want), verdict, fmtD(s.q(0.5)), load)
	}
	for _, p := range parts {
		switch p.title {
		case "cold":
			for _, s := range p.sdk {
				if strings.Contains(s.name, "runCode") {
					goal("SDK create + first runCode", s, 50*time.Millisecond, p.load)
				}
			}
		case "warm":
			goal("SDK warm runCode", p.sdk[0], 2*time.Millisecond, p.load)
		case "commands":
			goal("SDK commands.run('true')", p.sdk[0], 10*time.Millisecond, p.load)
		case "files":
			read, curl := p.sdk[1], p.peers[1][0]
			if *before != "" { // abFilesPart: this build's read, then its curl
				read, curl = p.sdk[0], p.sdk[1]
			}
			verdict := "met"
			if read.q(0.5) > 2*curl.q(0.5) {
				verdict = "NOT met"
			}
			fmt.Printf("goal SDK files.read of %d MB ≤ 2× curl: %s (%s against %s: %.2fx, load average %s)\n",
				*filesMB, verdict, fmtD(read.q(0.5)), fmtD(curl.q(0.5)), ratio(read, curl), p.load)
		}
	}
}

func ratio(a, b *series) float64 { return float64(a.q(0.5)) / float64(b.q(0.5)) }

func nodeVersion() string {
	out, err := exec.Command(nodeBin, "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func writeJSON(path string, parts []*part) error {
	out := map[string]any{}
	put := func(s *series, load loadRange) {
		out[s.name] = map[string]any{"n": len(s.ds), "median_us": micro(s.q(0.5)), "p95_us": micro(s.q(0.95)), "load": load.String()}
	}
	for _, p := range parts {
		for i, s := range p.sdk {
			put(s, p.load)
			for _, r := range p.peers[i] {
				put(r, p.load)
			}
		}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

func micro(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func fmtD(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", micro(d))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", micro(d)/1e3)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// loadRange is the lowest and highest one-minute load average seen.
type loadRange struct{ lo, hi float64 }

func (l *loadRange) sample() {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	var v float64
	if _, err := fmt.Sscan(string(data), &v); err != nil {
		return
	}
	if l.hi == 0 || v < l.lo {
		l.lo = v
	}
	l.hi = max(l.hi, v)
}

func (l loadRange) String() string {
	if l.hi == 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f–%.1f", l.lo, l.hi)
}

// nodeBin is the node test/e2b pins (20.20.2 from npm: the SDKs need
// node >= 20.18.1, Debian 12's is 18).
const nodeBin = "test/e2b/node_modules/.bin/node"
