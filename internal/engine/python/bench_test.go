//go:build !slim

package python

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// reportQuantiles adds the median and p95 of ds (in µs) to b's output.
func reportQuantiles(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.95), "p95-µs")
}

func benchRun(b *testing.B, e runcode.Engine, req *runcode.Request) *runcode.Result {
	res, err := e.Run(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	return res
}

// Warm print(1): one message to a resident worker and its reply, with
// stdout captured.
func BenchmarkWarmPrint(b *testing.B) {
	benchWarmPrint(b, testEng, newSession(b))
}

// benchWarmPrint runs print(1) in s with e once (the worker starts), then
// measures each further run.
func benchWarmPrint(b *testing.B, e runcode.Engine, s *session.Session) {
	var out bytes.Buffer
	req := &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: io.Discard}
	benchRun(b, e, req)
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		out.Reset()
		t := time.Now()
		benchRun(b, e, req)
		ds = append(ds, time.Since(t))
		if out.String() != "1\n" {
			b.Fatalf("out %q", out.String())
		}
	}
	reportQuantiles(b, ds)
}

// The real interpreter binary started for every run, for comparison.
func BenchmarkSpawnPrint(b *testing.B) {
	dir, _, err := testEng.Installed(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	python := dir + "/bin/python3.14"
	var ds []time.Duration
	for b.Loop() {
		t := time.Now()
		out, err := exec.Command(python, "-I", "-c", "print(1)").Output()
		ds = append(ds, time.Since(t))
		if err != nil || string(out) != "1\n" {
			b.Fatal(err, string(out))
		}
	}
	reportQuantiles(b, ds)
}

func benchFirstRun(b *testing.B, e *Embedded) {
	if err := e.Warm(context.Background()); err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	for b.Loop() {
		b.StopTimer()
		<-e.fillSpare()
		s := newSession(b)
		req := &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: io.Discard, Stderr: io.Discard}
		b.StartTimer()
		t := time.Now()
		benchRun(b, e, req)
		ds = append(ds, time.Since(t))
		b.StopTimer()
		e.Stop(s.ID)
		b.StartTimer()
	}
	reportQuantiles(b, ds)
}

// A new session's first run, served by the pre-warmed spare.
func BenchmarkFirstRunSpare(b *testing.B) {
	e := NewEmbedded(testData, testSB, nil)
	defer e.Close()
	benchFirstRun(b, e)
}

// A new session's first run, starting the interpreter.
func BenchmarkFirstRunNoSpare(b *testing.B) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{NoSpare: true})
	defer e.Close()
	benchFirstRun(b, e)
}

// From the cancel (what a timeout does) to the KeyboardInterrupt reply.
func BenchmarkInterrupt(b *testing.B) {
	s := newSession(b)
	var ds []time.Duration
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		var once sync.Once
		var t0 time.Time
		out := writerFunc(func(p []byte) (int, error) {
			once.Do(func() { t0 = time.Now(); cancel() })
			return len(p), nil
		})
		var errb bytes.Buffer
		res, err := testEng.Run(ctx, &runcode.Request{Code: "import time\nprint('go', flush=True)\ntime.sleep(3600)",
			Session: s, Timeout: time.Hour, Stdout: out, Stderr: &errb})
		ds = append(ds, time.Since(t0))
		cancel()
		if err != nil || !res.Interrupted || res.ExitCode != 130 {
			b.Fatalf("%v %+v stderr %q", err, res, errb.String())
		}
	}
	reportQuantiles(b, ds)
}

// Extraction into a new data directory, and the check of an existing one.
func BenchmarkExtractFirst(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		b.StartTimer()
		if inst, err := ensureInstalled(context.Background(), dir, nil); err != nil || !inst.Extracted {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}

func BenchmarkExtractReused(b *testing.B) {
	if _, err := ensureInstalled(context.Background(), testData, nil); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if inst, err := ensureInstalled(context.Background(), testData, nil); err != nil || inst.Extracted {
			b.Fatal(err)
		}
	}
}

// Memory of one idle worker after a run: RSS and PSS (shared pages of
// libpython counted by share) in MiB.
func BenchmarkIdleWorkerMemory(b *testing.B) {
	e := NewEmbedded(testData, testSB, &EmbeddedOptions{NoSpare: true})
	defer e.Close()
	var sessions []string
	for range 8 {
		s := newSession(b)
		benchRun(b, e, &runcode.Request{Code: "x = 1", Session: s, Timeout: time.Minute, Stdout: io.Discard, Stderr: io.Discard})
		sessions = append(sessions, s.ID)
	}
	var rss, pss float64
	for _, id := range sessions {
		sl, _ := e.slot(id)
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(sl.worker().pid) + "/smaps_rollup")
		rss += kbField(string(st), "Rss:")
		pss += kbField(string(st), "Pss:")
	}
	for b.Loop() {
	}
	n := float64(len(sessions))
	b.ReportMetric(rss/n/1024, "RSS-MiB")
	b.ReportMetric(pss/n/1024, "PSS-MiB")
	b.ReportMetric(4096/(pss/n/1024), "workers/4GiB")
}

func kbField(s, name string) float64 {
	for _, line := range strings.Split(s, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// printLoopCode is the loop: a million lines, about 6.9 MB.
const printLoopCode = "for i in range(10**6): print(i)"

// countWriter counts what it is given, as a sink that keeps up with any
// producer.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// The print loop through a resident worker in its box (the engine's Run,
// output streamed to a sink) against the same interpreter binary started
// plainly, its stdout a pipe that Go drains (Python's own buffering), and
// the same started in a box of the same sandbox (same limits and cgroup
// placement: on a loaded machine a box's CPU share is far below a plain
// process's), in the same run and alternating. Reported: the medians (the
// plain ones include the interpreter's start; a spawn-print is reported
// too) and the ratios.
//
//	go test -run '^$' -bench PrintLoop -benchtime 7x ./internal/engine/python/
func BenchmarkPrintLoop(b *testing.B) {
	dir, _, err := testEng.Installed(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	python := dir + "/bin/python3.14"
	s := newSession(b)
	const want = 6888890
	runWorker := func() time.Duration {
		var out countWriter
		var errb bytes.Buffer
		t := time.Now()
		res := benchRun(b, testEng, &runcode.Request{Code: printLoopCode, Session: s, Timeout: 10 * time.Minute, Stdout: &out, Stderr: &errb})
		d := time.Since(t)
		if res.ExitCode != 0 || out.n != want {
			b.Fatalf("worker: exit %d, %d bytes, stderr %q", res.ExitCode, out.n, errb.String())
		}
		return d
	}
	runPlain := func(code string, n int64) time.Duration {
		cmd := exec.Command(python, "-I", "-c", code)
		r, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		t := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		var out countWriter
		buf := make([]byte, 64<<10)
		if _, err := io.CopyBuffer(&out, r, buf); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || out.n != n {
			b.Fatalf("plain: %v, %d bytes", err, out.n)
		}
		return time.Since(t)
	}
	runBoxed := func() time.Duration {
		var out countWriter
		t := time.Now()
		p, err := testSB.Start(context.Background(), &sandbox.Spec{
			Args: []string{python, "-I", "-c", printLoopCode}, Dir: s.Workspace(), TmpDir: s.TmpDir(),
			ReadOnly: []string{dir}, Stdout: &out,
		})
		if err != nil {
			b.Fatal(err)
		}
		if e := p.Wait(); e.Code != 0 || out.n != want {
			b.Fatalf("boxed: %+v, %d bytes", e, out.n)
		}
		return time.Since(t)
	}
	runWorker() // the worker starts
	var ws, ps, bs, ss []time.Duration
	for b.Loop() {
		ws = append(ws, runWorker())
		ps = append(ps, runPlain(printLoopCode, want))
		bs = append(bs, runBoxed())
		ss = append(ss, runPlain("print(1)", 2))
	}
	med := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1e3
	}
	w, p, bx, sp := med(ws), med(ps), med(bs), med(ss)
	b.ReportMetric(w, "worker-ms")
	b.ReportMetric(p, "pipe-ms")
	b.ReportMetric(bx, "boxed-pipe-ms")
	b.ReportMetric(w/bx, "worker/boxed-pipe")
	b.ReportMetric(sp, "spawn-ms")
	b.ReportMetric(w/p, "worker/pipe")
	b.ReportMetric(w/(p-sp), "worker/(pipe-spawn)")
}
