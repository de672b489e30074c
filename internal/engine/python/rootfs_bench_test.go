//go:build !slim

package python

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
)

// Warm print(1) in a rootfs session: one message to the resident worker of
// the rootfs's python3 (3.11) in the session's box. Compare with
// BenchmarkWarmPrint (the embedded 3.14) and BenchmarkRootfsOneShotPrint
// (what the rootfs tier did before: a box and a python3 per run).
func BenchmarkRootfsWarmPrint(b *testing.B) {
	e := NewRootfsWorker(testData, testSB, sharedRootfs(b), nil)
	defer e.Close()
	s := newSession(b)
	s.Rootfs = rootfs.DefaultName
	benchWarmPrint(b, e, s)
}

// A rootfs session's first run: the worker starts (box, python3 3.11 with
// site, the worker module compiled in memory) and runs print(1).
func BenchmarkRootfsFirstRun(b *testing.B) {
	e := NewRootfsWorker(testData, testSB, sharedRootfs(b), nil)
	defer e.Close()
	var ds []time.Duration
	for b.Loop() {
		b.StopTimer()
		s := newSession(b)
		s.Rootfs = rootfs.DefaultName
		var out bytes.Buffer
		req := &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: io.Discard}
		b.StartTimer()
		t := time.Now()
		benchRun(b, e, req)
		ds = append(ds, time.Since(t))
		b.StopTimer()
		e.Stop(s.ID)
		b.StartTimer()
		if out.String() != "1\n" {
			b.Fatalf("out %q", out.String())
		}
	}
	reportQuantiles(b, ds)
}

// The former rootfs tier: `python3 -I -u -` in a new box per run
// (python_run's path still, through Rootfs.RunIn).
func BenchmarkRootfsOneShotPrint(b *testing.B) {
	e := NewRootfs(testSB, sharedRootfs(b))
	s := newSession(b)
	var ds []time.Duration
	for b.Loop() {
		var out bytes.Buffer
		t := time.Now()
		res, err := e.RunIn(context.Background(), rootfs.DefaultName, &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: io.Discard}, ViaStdin)
		ds = append(ds, time.Since(t))
		if err != nil || res.ExitCode != 0 || out.String() != "1\n" {
			b.Fatal(err, res, out.String())
		}
	}
	reportQuantiles(b, ds)
}
