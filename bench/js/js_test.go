// Package jsbench measures run_code in JavaScript and TypeScript on a served
// App (bench/internal/benchbed: a real App on a loopback listener, a real
// exec token verified per request), against a warm Python run on the same
// server. Each benchmark reports its median as p50-µs and the CPU of this
// process (client and server, QuickJS included) per call as cpu-µs:
//
//	go test -run '^$' -bench . -benchtime 2000x -count 3 ./bench/js/
//
// "Paced" benchmarks leave 2 ms between calls (-gap), outside the timing,
// as an agent that reads each result before its next call does; that is
// the time the engine uses to prepare its next VM. "BackToBack" ones send
// the next call as soon as the last one is answered.
package jsbench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
)

var (
	gap         = flag.Duration("gap", 2*time.Millisecond, "pause between the calls of the Paced benchmarks")
	tenantTasks = flag.Int64("tenant-tasks", 0, "the tenant's process ceiling (app.TenantLimits.Tasks; 0: the default, -1: none)")
)

// tsSnippet is a small TypeScript snippet: an interface, typed arrow
// functions, a generic, a class with a private field.
const tsSnippet = `interface P { x: number; y: number }
const add = (a: P, b: P): P => ({ x: a.x + b.x, y: a.y + b.y });
function first<T>(xs: T[]): T | undefined { return xs[0]; }
class Counter { #n: number = 0; inc(by: number = 1): number { return this.#n += by; } }
const c = new Counter(); c.inc(); c.inc(2);
[add({ x: 1, y: 2 }, { x: 3, y: 4 }), first<string>(["a"]), c.inc()]
`

const tsOut = "➡️ [\n  {\n    \"x\": 4,\n    \"y\": 6\n  },\n  \"a\",\n  4\n]\n"

var shared struct {
	once sync.Once
	b    *benchbed.Bed
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.b != nil {
		shared.b.Close()
		os.RemoveAll(shared.b.App.DataDir)
	}
	os.Exit(code)
}

func bed(b *testing.B) *benchbed.Bed {
	shared.once.Do(func() {
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "quro-bench-js-")
		if err != nil {
			shared.err = err
			return
		}
		install := filepath.Join(os.TempDir(), "quro-test-python") // shared with the tests
		limits := app.Limits{Tenant: app.TenantLimits{Tasks: *tenantTasks}}
		a, err := app.New(ctx, dir, &app.Options{Python: &python.EmbeddedOptions{InstallRoot: install}, Limits: limits})
		if err != nil {
			shared.err = err
			return
		}
		shared.b, shared.err = benchbed.Serve(ctx, a, false)
	})
	if shared.err != nil {
		b.Fatal(shared.err)
	}
	return shared.b
}

type call struct {
	lang, code, want string
}

var (
	js1Plus1 = call{"js", "1+1", "➡️ 2\n"}
	tsSmall  = call{"ts", tsSnippet, tsOut}
	pyPrint  = call{"python", "print(1)", "1\n"}
)

func (c call) body() []byte {
	b, _ := json.Marshal(app.RunCodeInput{Code: c.code, Lang: c.lang})
	return b
}

func check(c call, r *runcode.Result) error {
	if r.ExitCode != 0 || r.Error != "" || r.Stdout != c.want {
		return fmt.Errorf("%s: exit %d, error %q, stdout %q, stderr %q", c.lang, r.ExitCode, r.Error, r.Stdout, r.Stderr)
	}
	return nil
}

func rest(t *benchbed.Bed, c call) func() error {
	body := c.body()
	return func() error {
		var res runcode.Result
		if err := t.Post(context.Background(), "run_code", body, &res); err != nil {
			return err
		}
		return check(c, &res)
	}
}

func inProcess(t *benchbed.Bed, c call) func() error {
	body := c.body()
	return func() error {
		reply, err := t.App.Controller.Call(context.Background(), t.Caller, "run_code", body)
		if err != nil {
			return err
		}
		return check(c, reply.Output.(*runcode.Result))
	}
}

// loop is benchbed.Loop with an optional pause between calls, outside the
// timing: 20 warm-up calls, then the median as p50-µs and the process's
// CPU per call as cpu-µs.
func loop(b *testing.B, pause time.Duration, f func() error) {
	for range 20 {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	ds := make([]time.Duration, 0, b.N)
	var cpu time.Duration
	b.ResetTimer()
	for b.Loop() {
		if pause > 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
		c0, t := benchbed.CPUTime(), time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t))
		cpu += benchbed.CPUTime() - c0
	}
	b.StopTimer()
	slices.Sort(ds)
	b.ReportMetric(benchbed.Micro(ds[len(ds)/2]), "p50-µs")
	b.ReportMetric(benchbed.Micro(cpu)/float64(len(ds)), "cpu-µs")
}

func BenchmarkJS1Plus1RESTPaced(b *testing.B)      { loop(b, *gap, rest(bed(b), js1Plus1)) }
func BenchmarkJS1Plus1RESTBackToBack(b *testing.B) { loop(b, 0, rest(bed(b), js1Plus1)) }
func BenchmarkJS1Plus1InProcessPaced(b *testing.B) { loop(b, *gap, inProcess(bed(b), js1Plus1)) }
func BenchmarkTSRESTPaced(b *testing.B)            { loop(b, *gap, rest(bed(b), tsSmall)) }
func BenchmarkTSRESTBackToBack(b *testing.B)       { loop(b, 0, rest(bed(b), tsSmall)) }
func BenchmarkTSInProcessPaced(b *testing.B)       { loop(b, *gap, inProcess(bed(b), tsSmall)) }
func BenchmarkPythonRESTPaced(b *testing.B)        { loop(b, *gap, rest(bed(b), pyPrint)) }
func BenchmarkPythonInProcessPaced(b *testing.B)   { loop(b, *gap, inProcess(bed(b), pyPrint)) }
