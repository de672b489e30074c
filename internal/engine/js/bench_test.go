package js

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// Each benchmark op is a whole run as run_code makes it: the workspace
// opened, a VM with the prelude, the code, the event loop, the result.
// Compare with node starting a process:
//
//	go test -run '^$' -bench . -count 5 ./internal/engine/js/
//
// The run-overhead figures (issue 16) are BenchmarkRun1Plus1 and
// BenchmarkRunTS:
//
//	go test -run '^$' -bench 'Run1Plus1|RunTS' -count 10 ./internal/engine/js/

func benchRun(b *testing.B, code string) { benchRunLang(b, code, "js", false) }

// benchRunLang times runs of code. With idle, the Engine's background work
// (see settle) is done between runs, outside the timer: the latency of a
// run on a machine that is not busy with runs, as for an agent that calls
// one at a time. Without, runs follow each other at once and the figure is
// the CPU of a run, wherever it is spent.
func benchRunLang(b *testing.B, code, lang string, idle bool) { benchRunOpts(b, code, lang, idle, nil) }

func benchRunOpts(b *testing.B, code, lang string, idle bool, opts *Options) {
	dir := b.TempDir()
	s := &session.Session{ID: "bench", Name: "bench", Dir: dir}
	eng := New(opts)
	if err := os.MkdirAll(s.Workspace(), 0o755); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := eng.Run(ctx, &runcode.Request{Code: code, Lang: lang, Session: s, Timeout: 30 * time.Second, Stdout: io.Discard, Stderr: io.Discard})
		cancel()
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("run: %v %+v", err, res)
		}
		if idle {
			b.StopTimer()
			settle(eng)
			b.StartTimer()
		}
	}
}

func BenchmarkConsoleLog(b *testing.B) { benchRun(b, "console.log(1)") }

// BenchmarkRun1Plus1 is the engine's cost for the smallest run: its result
// is printed as "➡️ 2".
func BenchmarkRun1Plus1(b *testing.B) { benchRunLang(b, "1+1", "js", true) }

// BenchmarkRun1Plus1BackToBack is BenchmarkRun1Plus1 with no pause between
// runs.
func BenchmarkRun1Plus1BackToBack(b *testing.B) { benchRunLang(b, "1+1", "js", false) }

// benchTS is a small TypeScript snippet: an interface, typed arrow
// functions, a generic, a class with a private field.
const benchTS = `interface P { x: number; y: number }
const add = (a: P, b: P): P => ({ x: a.x + b.x, y: a.y + b.y });
function first<T>(xs: T[]): T | undefined { return xs[0]; }
class Counter { #n: number = 0; inc(by: number = 1): number { return this.#n += by; } }
const c = new Counter(); c.inc(); c.inc(2);
[add({ x: 1, y: 2 }, { x: 3, y: 4 }), first<string>(["a"]), c.inc()]
`

// BenchmarkRunTS runs the same small TypeScript snippet every time (the
// case a transpile cache serves).
func BenchmarkRunTS(b *testing.B) { benchRunLang(b, benchTS, "ts", true) }

// BenchmarkRunTSUncached runs the snippet with no transpile cache: every
// run pays esbuild's transform, in its child process (internal/transpile).
func BenchmarkRunTSUncached(b *testing.B) {
	benchRunOpts(b, benchTS, "ts", true, &Options{TranspileCache: -1})
}

// BenchmarkRunTSBackToBack is BenchmarkRunTS with no pause between runs.
func BenchmarkRunTSBackToBack(b *testing.B) { benchRunLang(b, benchTS, "ts", false) }

func BenchmarkLoop1e6(b *testing.B) {
	benchRun(b, "let s = 0; for (let i = 0; i < 1e6; i++) s += i; s")
}

func benchNode(b *testing.B, code string) {
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("node is not installed")
	}
	for b.Loop() {
		if out, err := exec.Command(node, "-e", code).CombinedOutput(); err != nil {
			b.Fatalf("node: %v: %s", err, out)
		}
	}
}

func BenchmarkNodeConsoleLog(b *testing.B) { benchNode(b, "console.log(1)") }

func BenchmarkNodeLoop1e6(b *testing.B) {
	benchNode(b, "let s = 0; for (let i = 0; i < 1e6; i++) s += i; console.log(s)")
}

// BenchmarkPrepare is the cost of one prepared VM (made and closed), the
// work the pool moves off the run's path, and its memory: the resident
// memory of 100 prepared VMs held at once, per VM (bytes/VM).
//
//	go test -run '^$' -bench Prepare -benchtime 200x ./internal/engine/js/
func BenchmarkPrepare(b *testing.B) {
	eng := New(&Options{Spares: -1})
	const held = 100
	runtime.GC()
	before := rss(b)
	var vms []*prepared
	for range held {
		p, err := eng.prepare()
		if err != nil {
			b.Fatal(err)
		}
		vms = append(vms, p)
	}
	after := rss(b)
	for _, p := range vms {
		p.close()
	}
	b.ResetTimer()
	for b.Loop() {
		p, err := eng.prepare()
		if err != nil {
			b.Fatal(err)
		}
		p.close()
	}
	b.ReportMetric(float64(after-before)/held, "bytes/VM")
}

// rss is the process's resident memory, in bytes.
func rss(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Skip(err)
	}
	var size, res int64
	if _, err := fmt.Sscan(string(data), &size, &res); err != nil {
		b.Fatal(err)
	}
	return res * int64(os.Getpagesize())
}
