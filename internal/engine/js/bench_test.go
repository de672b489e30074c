package js

import (
	"context"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// Each benchmark op is a whole run: a fresh VM, the prelude, the code, the
// event loop, the result. Compare with node starting a process:
//
//	go test -run '^$' -bench . -count 5 ./internal/engine/js/

func benchRun(b *testing.B, code string) {
	dir := b.TempDir()
	s := &session.Session{ID: "bench", Name: "bench", Dir: dir}
	eng := New(nil)
	if err := os.MkdirAll(s.Workspace(), 0o755); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := eng.Run(ctx, &runcode.Request{Code: code, Lang: "js", Session: s, Timeout: 30 * time.Second, Stdout: io.Discard, Stderr: io.Discard})
		cancel()
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
}

func BenchmarkConsoleLog(b *testing.B) { benchRun(b, "console.log(1)") }

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
