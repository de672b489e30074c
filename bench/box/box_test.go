package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
)

// The benchmarks share one served App (see bed.go), so that one
// `go test -bench` run gives every path on the same machine at the same
// time; each reports its median as p50-µs beside ns/op (run as root):
//
//	go test -run '^$' -bench . -benchtime 200x ./bench/box/
//
// and with a CPU profile of server and client together:
//
//	go test -run '^$' -bench RunShREST -benchtime 1000x -cpuprofile /tmp/box.prof ./bench/box/

var shared struct {
	once sync.Once
	b    *bed
	sh   string // a session whose box is made, for sh true
	heap string // a session holding the 100 MiB heap, for pause/resume
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

func testBed(b *testing.B) *bed {
	shared.once.Do(func() {
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "quro-bench-box-")
		if err != nil {
			shared.err = err
			return
		}
		install := filepath.Join(os.TempDir(), "quro-test-python") // shared with the tests
		if shared.b, shared.err = newBed(ctx, dir, install, 0); shared.err != nil {
			return
		}
		t := shared.b
		if shared.sh, shared.err = t.CreateSession(ctx); shared.err != nil {
			return
		}
		if shared.heap, shared.err = t.CreateSession(ctx); shared.err != nil {
			return
		}
		shared.err = t.Run(ctx, benchbed.RunBody(shared.heap, "", heapCode), heapLen)
	})
	if shared.err != nil {
		b.Fatal(shared.err)
	}
	return shared.b
}

// BenchmarkRunShREST is POST /v1/run_code {"lang":"sh","code":"true"} on
// a session whose box is already made.
func BenchmarkRunShREST(b *testing.B) {
	t := testBed(b)
	body := benchbed.RunBody(shared.sh, "sh", "true")
	benchbed.Loop(b, func() error { return t.Run(context.Background(), body, "") })
}

// BenchmarkBwrapTrue is `bwrap --unshare-all --ro-bind / / true` exec'd
// directly: the cost of a box of its own per run.
func BenchmarkBwrapTrue(b *testing.B) {
	testBed(b) // the same machine state as the REST benchmark
	benchbed.Loop(b, bwrapTrue)
}

// BenchmarkForkExecTrue is a bare fork-exec of /bin/true.
func BenchmarkForkExecTrue(b *testing.B) {
	testBed(b)
	benchbed.Loop(b, forkTrue)
}

// BenchmarkPauseResume is pause_session then resume_session over REST of a
// session holding a 100 MiB Python heap; every 50 cycles the heap is
// checked. It reports the median of the pair (p50-µs) and of each call.
func BenchmarkPauseResume(b *testing.B) {
	t := testBed(b)
	ctx := context.Background()
	ref := benchbed.RefBody(shared.heap)
	check := benchbed.RunBody(shared.heap, "", "print(len(x))")
	var pause, resume, both []time.Duration
	cycle := func(i int) {
		t0 := time.Now()
		if _, err := t.pause(ctx, ref); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := t.resume(ctx, ref); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		pause, resume, both = append(pause, t1.Sub(t0)), append(resume, t2.Sub(t1)), append(both, t2.Sub(t0))
		if i%50 == 0 {
			b.StopTimer()
			if err := t.Run(ctx, check, heapLen); err != nil {
				b.Fatalf("after resume: %v", err)
			}
			b.StartTimer()
		}
	}
	for i := range 5 {
		cycle(i + 1)
	}
	pause, resume, both = nil, nil, nil
	b.ResetTimer()
	i := 0
	for b.Loop() {
		cycle(i)
		i++
	}
	b.StopTimer()
	if err := t.Run(ctx, check, heapLen); err != nil {
		b.Fatalf("after the last resume: %v", err)
	}
	b.ReportMetric(p50(both), "p50-µs")
	b.ReportMetric(p50(pause), "pause-p50-µs")
	b.ReportMetric(p50(resume), "resume-p50-µs")
}

func p50(ds []time.Duration) float64 {
	slices.Sort(ds)
	return benchbed.Micro(ds[len(ds)/2])
}

// BenchmarkSessionChurn makes b.N sessions (8 clients), uses each once
// (terminal_exec true, run_code print(1)), destroys them all, and reports
// what the server kept: its OS threads and PSS after (a GC, and the
// give-back a burst of box closes triggers) over before, and the threads
// while all b.N were live. Part 6 of the served bench (-only 6) is the
// same at 1000 with the figures printed:
//
//	go test -run '^$' -bench SessionChurn -benchtime 200x ./bench/box/
func BenchmarkSessionChurn(b *testing.B) {
	t := testBed(b)
	ctx := context.Background()
	use := func(id string) error {
		if err := t.terminalExec(ctx, id, "true"); err != nil {
			return err
		}
		return t.Run(ctx, benchbed.RunBody(id, "", "print(1)"), "1\n")
	}
	// A warm-up round as wide as the clients (the threads a server uses
	// for 8 concurrent calls are made once and kept, by design).
	ids, err := makeSessions(ctx, t, 8, 8, use)
	if derr := destroyAll(ctx, t, ids, 8); err == nil {
		err = derr
	}
	if err != nil {
		b.Fatal(err)
	}
	settle()
	runtime.GC()
	start := point()
	b.ResetTimer()
	ids, err = makeSessions(ctx, t, b.N, 8, use)
	live := point()
	if derr := destroyAll(ctx, t, ids, 8); err == nil {
		err = derr
	}
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	settle()
	runtime.GC()
	debug.FreeOSMemory() // as the server's give-back does 2 s after a burst of ≥ 64 box closes
	after := point()
	b.ReportMetric(float64(live.Threads-start.Threads), "threads-live-growth")
	b.ReportMetric(float64(after.Threads)/float64(start.Threads), "threads-after/start")
	b.ReportMetric(float64(after.PSS)/float64(start.PSS), "pss-after/start")
}
