// Command toolchain measures run_code of compiled languages through the
// served App (see bench/README.md):
//
//	go run ./bench/toolchain                (run as root: session boxes)
//	go run ./bench/toolchain -langs c,go -n 9
//
// One App is served over REST on a loopback listener with a real token (as
// bench/output does), its sessions in session boxes. For each language
// whose toolchain the host has (c: gcc; go: go, also /usr/local/go; rust:
// rustc in the box's PATH — /root/.cargo/bin is not visible in boxes), in
// one warm session, rounds alternating the paths:
//
//  1. cold: REST run_code of a hello program whose source differs each
//     round (a comment), so it is compiled in the session's box, then run;
//  2. warm: the same source again: the cached binary is run, nothing
//     compiles;
//  3. direct: the same compiler spawned by this program on the host,
//     `gcc hello.c -o a.out && ./a.out`, no box, no server.
//
// Go builds share a build cache (GOCACHE): the session's and the direct
// one's are warmed by one build before the rounds, so both measure a
// build of main.go against a warm standard library. It prints the medians.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

var (
	rounds   = flag.Int("n", 7, "rounds; each runs every path once")
	langs    = flag.String("langs", "c,go,rust", "languages to measure (those whose toolchain the host lacks are skipped)")
	install  = flag.String("install", filepath.Join(os.TempDir(), "quro-test-python"), "where the embedded interpreter is extracted (shared with the tests)")
	jsonPath = flag.String("json", "", "also write the figures as JSON to this file")
)

type lang struct {
	name, file, src string
	prog            []string // candidates, first found is used
	build           func(prog, dir string) []string
	env             []string
}

var table = map[string]lang{
	"c": {name: "c", file: "hello.c", src: "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n// %d\n",
		prog:  []string{"gcc"},
		build: func(p, d string) []string { return []string{p, "-O2", "-o", "a.out", "hello.c", "-lm"} }},
	"go": {name: "go", file: "main.go", src: "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n\n// %d\n",
		prog:  []string{"go", "/usr/local/go/bin/go"},
		build: func(p, d string) []string { return []string{p, "build", "-o", "a.out", "main.go"} },
		env:   []string{"GOTOOLCHAIN=local", "GOPROXY=off", "GOTELEMETRY=off"}},
	"rust": {name: "rust", file: "main.rs", src: "fn main() { println!(\"hello\"); }\n// %d\n",
		prog:  []string{"rustc"},
		build: func(p, d string) []string { return []string{p, "-o", "a.out", "main.rs"} }},
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "toolchain:", err)
		os.Exit(1)
	}
}

func run() error {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "toolchain: not root: the sessions run with less isolation than in production; run as root")
	}
	ctx := context.Background()
	data, err := os.MkdirTemp("", "quro-bench-toolchain-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	a, err := app.New(ctx, data, &app.Options{
		Python:    &python.EmbeddedOptions{InstallRoot: *install},
		Sandbox:   &sandbox.Options{BoxReadOnly: []string{*install}},
		AutoPause: -1,
		Limits:    app.Limits{SessionsPerTenant: -1, Tenant: app.TenantLimits{Sessions: -1, Tasks: -1, Memory: -1}},
	})
	if err != nil {
		return err
	}
	b, err := benchbed.Serve(ctx, a, false)
	if err != nil {
		return err
	}
	defer b.Close()
	var s app.SessionInfo
	if err := b.Post(ctx, "create_session", []byte(`{}`), &s); err != nil {
		return err
	}
	figures := map[string]any{"rounds": *rounds}
	for _, name := range strings.Split(*langs, ",") {
		l, ok := table[name]
		if !ok {
			return fmt.Errorf("no language %q here (c, go, rust)", name)
		}
		prog := ""
		for _, p := range l.prog {
			if path, err := exec.LookPath(p); err == nil {
				prog = path
				break
			}
		}
		if prog == "" {
			fmt.Printf("%s: skipped, no %s on this host's PATH (rustup's /root/.cargo/bin is not visible in boxes either)\n", name, l.prog[0])
			continue
		}
		f, err := measure(ctx, b, s.ID, l, prog)
		var nr errNotRun
		if errors.As(err, &nr) {
			// On this host's PATH (say rustup's /root/.cargo/bin) but not
			// in the box's userland.
			fmt.Printf("%s: skipped, %s is on this host's PATH but run_code did not run it: %s\n", name, prog, nr.why)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		figures[name] = f
	}
	if *jsonPath != "" {
		out, _ := json.MarshalIndent(figures, "", "  ")
		return os.WriteFile(*jsonPath, append(out, '\n'), 0o644)
	}
	return nil
}

func measure(ctx context.Context, b *benchbed.Bed, sess string, l lang, prog string) (map[string]float64, error) {
	call := func(code string, wantCached bool) (time.Duration, *runcode.Result, error) {
		body, _ := json.Marshal(app.RunCodeInput{Session: sess, Lang: l.name, Code: code, TimeoutMS: 120_000, CompileTimeoutMS: 600_000})
		var res runcode.Result
		t := time.Now()
		if err := b.Post(ctx, "run_code", body, &res); err != nil {
			return 0, nil, err
		}
		d := time.Since(t)
		if strings.HasPrefix(res.Engine, "render/") {
			return 0, nil, errNotRun{strings.Join(res.Notes, "; ")}
		}
		if res.Stdout != "hello\n" || res.ExitCode != 0 || res.Cached != wantCached {
			return 0, nil, fmt.Errorf("run_code: cached %v (want %v), exit %d, stdout %q, stderr %q, error %q, engine %s",
				res.Cached, wantCached, res.ExitCode, res.Stdout, res.Stderr, res.Error, res.Engine)
		}
		return d, &res, nil
	}
	dir, err := os.MkdirTemp("", "quro-bench-direct-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env := append(os.Environ(), "GOCACHE="+filepath.Join(dir, "gocache"), "GOPATH="+filepath.Join(dir, "gopath"))
	env = append(env, l.env...)
	direct := func(code string) (time.Duration, error) {
		if err := os.WriteFile(filepath.Join(dir, l.file), []byte(code), 0o644); err != nil {
			return 0, err
		}
		t := time.Now()
		args := l.build(prog, dir)
		c := exec.Command(args[0], args[1:]...)
		c.Dir, c.Env = dir, env
		if out, err := c.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%v: %v\n%s", args, err, out)
		}
		r := exec.Command("./a.out")
		r.Dir = dir
		out, err := r.Output()
		if err != nil || string(out) != "hello\n" {
			return 0, fmt.Errorf("./a.out: %v, %q", err, out)
		}
		return time.Since(t), nil
	}
	// Warm-up: the first build of a session (Go: the standard library
	// into its GOCACHE), the version probe, the direct compiler's caches.
	t := time.Now()
	_, first, err := call(fmt.Sprintf(l.src, -1), false)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "%s: first run in the session %s (%s)\n", l.name, time.Since(t).Round(time.Millisecond), first.Toolchain)
	if _, err := direct(fmt.Sprintf(l.src, -1)); err != nil {
		return nil, err
	}
	var cold, warm, dir2 []time.Duration
	for i := range *rounds {
		code := fmt.Sprintf(l.src, i)
		c, _, err := call(code, false)
		if err != nil {
			return nil, err
		}
		w, _, err := call(code, true)
		if err != nil {
			return nil, err
		}
		d, err := direct(code)
		if err != nil {
			return nil, err
		}
		cold, warm, dir2 = append(cold, c), append(warm, w), append(dir2, d)
		fmt.Fprintf(os.Stderr, "%s round %d: cold %s, warm %s, direct %s\n", l.name, i+1, c.Round(time.Millisecond), w.Round(time.Millisecond), d.Round(time.Millisecond))
	}
	med := func(ds []time.Duration) float64 {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1e3
	}
	f := map[string]float64{"cold_ms": med(cold), "warm_ms": med(warm), "direct_ms": med(dir2)}
	fmt.Printf("%s (%s), %d rounds, load average %s\n", l.name, first.Toolchain, *rounds, loadavg())
	fmt.Printf("  REST run_code cold (compile + run in the box)  median %8.1f ms\n", f["cold_ms"])
	fmt.Printf("  REST run_code warm (cached binary)             median %8.1f ms\n", f["warm_ms"])
	fmt.Printf("  direct: compile && ./a.out, no box             median %8.1f ms\n", f["direct_ms"])
	return f, nil
}

// errNotRun: run_code showed the code instead of running it (no
// toolchain in the box's userland).
type errNotRun struct{ why string }

func (e errNotRun) Error() string { return "not run: " + e.why }

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
